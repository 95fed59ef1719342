"""Out-of-memory advice: a device out-of-memory error raised in a training phase comes back naming the phase, the
setting that bounds that phase's memory and a value of it to try (bench/RESULTS.md has the paper recipe's peaks)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .wording import in_command_line, setting_named

#: the start of the line this module adds to an out-of-memory message
MARK = "dgrpo: out of device memory"


@contextmanager
def oom_advice(
    phase: str, setting: str, value: int, why: str, *, to_try: int | None = None, first: str = ""
) -> Iterator[None]:
    """Within the block, a ``torch.OutOfMemoryError`` is raised again (the same type, chained) with one line after
    its first: the ``phase``, ``setting=value``, ``first`` (cheaper levers to try before it, worded for the caller:
    '--set key=value (why)' or 'the config's key = value (why)', :func:`~.wording.settings_named`) then ``setting``
    set to ``to_try`` (default: half of ``value``; left out when it is ``value``) and ``why``. The setting is named
    as the caller sets it (:func:`~.wording.in_command_line`): ``--set setting=to_try`` on the command line, the
    config's ``setting = to_try`` from Python (a trainer called from Python was told ``--set``, which it never
    types). An error that already has the line, from a phase inside this one, passes unchanged."""
    to_try = max(1, value // 2) if to_try is None else to_try
    try:
        yield
    except torch.OutOfMemoryError as e:
        message = str(e)
        if MARK in message:
            raise
        head, _, rest = message.partition("\n")
        advice = f"{MARK} in the {phase} at {setting}={value}: "
        how = setting_named(setting, str(to_try), str(to_try), in_command_line())
        lever = f"try {how} ({why})" if to_try != value else why
        advice += f"try {first} first; then {lever}" if first else lever
        raise torch.OutOfMemoryError("\n".join(part for part in (head, advice, rest) if part)) from e
