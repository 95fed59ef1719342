"""Datasets: one record type, loaders for the public math sets, the built-in synthetic task."""

from __future__ import annotations

from pathlib import Path

from .loaders import load_dataset
from .records import DataError, Record
from .synthetic import load_builtin


def load_spec(spec: str, task=None) -> list[Record]:
    """Load ``name``, ``name:split``, a file path, or several joined by ``+`` (``gsm_hard+svamp``).

    ``task`` (a TaskConfig) parameterises ``builtin`` names."""
    if "+" in spec and not Path(spec).exists():
        return [r for part in spec.split("+") if part.strip() for r in load_spec(part.strip(), task)]
    if spec.startswith("builtin"):
        return load_builtin(spec, None, task)
    if Path(spec).exists():
        return load_dataset(spec)
    name, _, split = spec.partition(":")
    return load_dataset(name, split or None)


__all__ = ["DataError", "Record", "load_spec"]
