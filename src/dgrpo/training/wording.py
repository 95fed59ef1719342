"""How a refusal names what to do, worded for the caller: :mod:`dgrpo.wording`, re-exported here for the trainers
and for callers that imported it from here (it moved to the bottom of the layers, where the model's modules can
import it too)."""

from __future__ import annotations

from ..wording import command_line_words, in_command_line, init_named, setting_named, settings_named

__all__ = ["command_line_words", "in_command_line", "init_named", "setting_named", "settings_named"]
