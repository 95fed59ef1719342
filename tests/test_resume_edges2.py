"""Resume edges: a stuck (all-zero) Mersenne Twister state in a checkpoint, float32 masters left stale by a resume
under another dtype, the data and reward compared by GRPOTrainer.load_state called from Python, and the refusals
worded for the caller (the command line's options, or the Python call)."""

import json
import re

import pytest
import torch
from test_resume_state_checks import StubReadLM

from dgrpo.model.verified import CheckpointError, write_manifest
from dgrpo.training.checkpoint import read_checkpoint, save_checkpoint


def _rewritten(ckpt, change) -> None:
    """``ckpt``'s state.json changed by ``change`` (a function of the parsed state), its manifest written again."""
    state = json.loads((ckpt / "state.json").read_text())
    change(state)
    (ckpt / "state.json").write_text(json.dumps(state))
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)


def _stuck_python(state: dict) -> None:
    state["rng"]["python"][1][:624] = [0x7FFFFFFF] + [0] * 623  # (the first word's low 31 bits are never read)


def _stuck_numpy(state: dict) -> None:
    state["rng"]["numpy"][1] = [0] * 624


@pytest.mark.parametrize(("change", "name"), [(_stuck_python, "python"), (_stuck_numpy, "numpy")])
def test_an_all_zero_mersenne_twister_state_is_refused_as_a_damaged_checkpoint(tmp_path, change, name):
    """``rng.python`` / ``rng.numpy`` holding an all-zero state (no seeding makes one) passed every check: the
    resumed run's generator drew 0 forever (its shuffles and draws no longer random), without a word. It is now a
    damaged checkpoint's line when the checkpoint is read, as the other damaged random states are."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state={})
    read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt)
    _rewritten(ckpt, change)
    said = f"state.json: its rng's {name} holds an all-zero Mersenne Twister state (a generator that draws 0 forever"
    with pytest.raises(CheckpointError, match=re.escape(said)):
        read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt)


def test_a_generator_state_with_a_single_live_bit_is_no_stuck_state():
    """Only the first word's top bit and the other words count: one bit set there is a state a generator can hold."""
    from dgrpo.training.checkpoint import numpy_random_state, python_random_state, stuck_generator

    assert stuck_generator([0x7FFFFFFF] + [0] * 623) and stuck_generator([0] * 624)
    assert not stuck_generator([0x80000000] + [0] * 623) and not stuck_generator([0] * 623 + [1])
    python_random_state([3, [0x80000000] + [0] * 623 + [624], None])
    numpy_random_state(["MT19937", [0] * 623 + [1], 624, 0, 0.0])
