"""How a refusal names what to do: the command line's options (``--init PATH``) while the command line runs a
trainer (:func:`command_line_words`), else the Python API's arguments (``LatentLM.from_pretrained('PATH')``).

At the bottom of the layers (it imports nothing of dgrpo), so that any part can word its lines for the caller:
``dgrpo.training.wording`` re-exports it. The command line holds the flag only while ``dgrpo sft`` / ``dgrpo grpo``
run their trainer, not while they load the model (dgrpo.cli.train): a line raised before that reads False."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

#: True while the command line runs a trainer (:func:`command_line_words`): a run directory's refusals then name the
#: command line's options only, not the Python API's arguments beside them
_COMMAND_LINE: ContextVar[bool] = ContextVar("dgrpo_command_line", default=False)


def in_command_line() -> bool:
    """Whether the command line runs the trainer now (within :func:`command_line_words`)."""
    return _COMMAND_LINE.get()


@contextmanager
def command_line_words() -> Iterator[None]:
    """Within the block (``dgrpo sft`` / ``dgrpo grpo`` calling its trainer), ``RunDir``'s refusals say
    ``--resume never`` and ``--allow-config-change``, without ``resume='never'`` / ``allow_config_change=True``."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def init_named(path: Path | None, cli: bool) -> str:
    """How to start a new run from the model in ``path`` (a run directory means its final/): ``--init PATH``, or
    from Python the model ``LatentLM.from_pretrained('PATH')`` loads (without ``path``: the option, the method)."""
    if path is None:
        return "--init" if cli else "LatentLM.from_pretrained"
    return f"--init {path}" if cli else f"LatentLM.from_pretrained({str(path)!r}) as a new run's model"


def setting_named(key: str, cli_value: str, python_value: str, cli: bool, allow: bool = False) -> str:
    """How to run with the config's ``key`` set to a value: ``--set KEY=VALUE`` (``cli_value``, as ``--set`` reads
    it), or from Python ``the config's KEY = VALUE`` (``python_value``, as Python writes it); ``allow``: a resume
    that changes the config, ``--allow-config-change`` (``allow_config_change=True``) with it."""
    how = settings_named([(key, cli_value, python_value)], cli)
    if not allow:
        return how
    return how + (" --allow-config-change" if cli else " and allow_config_change=True")


def settings_named(settings: Sequence[tuple[str, str, str]], cli: bool) -> str:
    """How to run with several of the config's settings, each ``(key, cli_value, python_value)`` as
    :func:`setting_named` takes them: ``--set A=1 B=false``, or from Python ``the config's A = 1 and B = False``."""
    if cli:
        return "--set " + " ".join(f"{key}={value}" for key, value, _ in settings)
    return "the config's " + " and ".join(f"{key} = {value}" for key, _, value in settings)
