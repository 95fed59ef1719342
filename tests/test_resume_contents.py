"""The values a resume reads from a checkpoint's ``state.json``, checked when the checkpoint is read (before anything
is applied), beyond their keys and types: GRPO's rest of the epoch (``order``: distinct indices of the rows it was
trained on) and its data generator (``data_rng``), the counts of every section, and the Python random state of
``rng``. A damaged value is a damaged checkpoint's line, and the previous checkpoint is tried; it was a traceback
once the weights were applied, or a resume that went on from another place without a word."""

import json
import random
from pathlib import Path

import pytest
import torch
from test_resume_state_checks import StubReadLM

from dgrpo.model.verified import CheckpointError, write_manifest
from dgrpo.training.checkpoint import read_checkpoint, save_checkpoint


def _data_rng(seed: int = 7) -> list:
    """A data generator's state as GRPOTrainer.state writes it."""
    v, words, gauss = random.Random(seed).getstate()
    return [v, list(words), gauss]


def _trainer(**over) -> dict:
    """A GRPO checkpoint's ``trainer`` section as train_grpo writes it (4 training rows), with ``over`` changed."""
    section = {
        "step_idx": 2,
        "ema_baseline": 0.5,
        "order": [3, 0],
        "data_rng": _data_rng(),
        "nonfinite_skips": 0,
        "nonfinite_streak": 0,
        "train_data": "4:0123456789abcdef",
        "reward": ["correct = dgrpo.reward.exact * 1"],
    }
    return {**section, **over}


LOOP = {"best_step": None, "best_accuracy": -1.0, "skipped": 0, "skip_streak": 0, "last_eval": None, "started": 1.5}


def _grpo_checkpoint(tmp_path: Path, trainer: dict, loop: dict | None = None):
    from dgrpo.training.grpo import LOOP_STATE, GRPOTrainer

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    state = {"trainer": trainer, "loop": loop or LOOP, "metrics_lines": 2}
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state=state)
    sections = {"trainer": GRPOTrainer.STATE, "loop": LOOP_STATE}
    return lambda: read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt, sections=sections)


def _exactly(said: str) -> str:
    return "^" + "".join("\\" + c if c in "()[]." else c for c in said) + "$"


def _words(change) -> list:
    state = _data_rng()
    change(state[1])
    return state


@pytest.mark.parametrize(
    ("over", "said"),
    [
        ({"order": ["3"]}, 'order holds "3", not the index of a training row of the 4 it was trained on'),
        ({"order": [1.0]}, "order holds 1.0, not the index of a training row of the 4 it was trained on"),
        ({"order": [True]}, "order holds true, not the index of a training row of the 4 it was trained on"),
        ({"order": [2, -1]}, "order holds -1, not the index of a training row of the 4 it was trained on"),
        ({"order": [4]}, "order holds 4, not the index of a training row of the 4 it was trained on"),
        ({"order": [1, 3, 1]}, "order holds 1 twice (each training row comes once in an epoch)"),
        ({"data_rng": [3, [1, 2], None]}, "data_rng does not hold the 625 integers of a Python random state"),
        ({"data_rng": _words(lambda w: w.pop())}, "data_rng does not hold the 625 integers of a Python random state"),
        (
            {"data_rng": _words(lambda w: w.__setitem__(5, 2**40))},
            "data_rng holds an integer out of a Python random state's range",
        ),
        (
            {"data_rng": _words(lambda w: w.__setitem__(624, 625))},
            "data_rng holds an integer out of a Python random state's range",
        ),
        ({"data_rng": [2, *_data_rng()[1:]]}, "data_rng has version 2, not 3 (a Python random state)"),
        ({"data_rng": [*_data_rng()[:2], "x"]}, 'data_rng has the gauss "x", not a finite number or null'),
        ({"data_rng": _data_rng()[:2]}, "data_rng is not [version, state, gauss] (a Python random state)"),
        ({"step_idx": -1}, "step_idx is -1, not a count (0 or more)"),
        ({"nonfinite_streak": -2}, "nonfinite_streak is -2, not a count (0 or more)"),
    ],
)
def test_a_trainer_section_whose_values_the_resume_cannot_take_is_refused_when_read(tmp_path, over, said):
    """An ``order`` holding a string (a TypeError's traceback once the weights were applied), a float (one at the
    next step's draw), a bool, a negative index (a row from the end), an index past the rows the checkpoint was
    trained on or one twice (a row trained twice in the epoch); a ``data_rng`` that ``random.setstate`` refuses
    (a traceback once the weights were applied) or takes without a word (a word past 32 bits, a gauss that is no
    number); a negative count: one line when the checkpoint is read, naming the section and the key."""
    read = _grpo_checkpoint(tmp_path, _trainer(**over))
    with pytest.raises(CheckpointError, match=_exactly(f"state.json: its trainer's {said}")):
        read()


def test_a_trainer_section_as_written_reads(tmp_path):
    """What GRPOTrainer.state writes reads: the order of an epoch under way, an empty one (an epoch just ended), a
    generator with a cached gauss, and an older checkpoint's order without its data's count (nothing to bound it
    by: indices past the data given now are left out by load_state, as on other data)."""
    rng = random.Random(3)
    rng.gauss(0.0, 1.0)
    v, words, gauss = rng.getstate()
    assert gauss is not None
    for trainer in (
        _trainer(),
        _trainer(order=[]),
        _trainer(order=list(range(4)), data_rng=[v, list(words), gauss]),
        {k: v for k, v in _trainer(order=[9, 0]).items() if k not in ("train_data", "reward")},
    ):
        _grpo_checkpoint(tmp_path / str(len(list(tmp_path.iterdir()))), json.loads(json.dumps(trainer)))()


def test_the_trainers_own_state_reads(sft_checkpoint):
    """A GRPOTrainer's state (through JSON, as a checkpoint keeps it), mid-epoch, passes the checks."""
    from test_grpo_step_mutants import trainer

    from dgrpo.training.grpo import GRPOTrainer

    tr = trainer(sft_checkpoint, **{"grpo.beta0": 0})
    tr.next_prompts()
    assert 0 < len(tr.order) < len(tr.train_data)
    GRPOTrainer.STATE.check("trainer", json.loads(json.dumps(tr.state())))


@pytest.mark.parametrize(("key", "value"), [("skipped", -1), ("skip_streak", -3), ("best_step", -5)])
def test_a_negative_count_of_the_loop_is_refused_when_read(tmp_path, key, value):
    read = _grpo_checkpoint(tmp_path, _trainer(), {**LOOP, key: value})
    with pytest.raises(
        CheckpointError, match=_exactly(f"state.json: its loop's {key} is {value}, not a count (0 or more)")
    ):
        read()


@pytest.mark.parametrize("key", ["epoch", "batch", "global_step", "step_in_sched", "sched_total", "stage_prev"])
def test_a_negative_sft_progress_is_refused_when_read(tmp_path, key):
    """A negative epoch trained one more epoch (``range(-1, num_epochs)``), a negative batch took its batch from the
    end of the epoch's order, ...: each refused when the checkpoint is read; the progress as written reads."""
    from dataclasses import asdict

    from dgrpo.training.curriculum import Progress
    from dgrpo.training.sft import PROGRESS_STATE

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    progress = asdict(Progress(epoch=1, batch=2, global_step=9, step_in_sched=3, sched_total=8, stage_prev=0))
    state = {"progress": progress, "nonfinite_skips": 0, "metrics_lines": 1}
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state=state)
    read = lambda: read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt, sections={"progress": PROGRESS_STATE})  # noqa: E731
    read()
    state = json.loads((ckpt / "state.json").read_text())
    state["progress"][key] = -1
    (ckpt / "state.json").write_text(json.dumps(state))
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)
    with pytest.raises(
        CheckpointError, match=_exactly(f"state.json: its progress's {key} is -1, not a count (0 or more)")
    ):
        read()


def test_a_python_random_state_out_of_range_is_refused_when_read(tmp_path):
    """``state.json``'s ``rng.python`` holding a word past 32 bits (``random.setstate`` takes it without a word: a
    generator no run had) is refused when the checkpoint is read, as a truncated one is."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state={})
    read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt)
    state = json.loads((ckpt / "state.json").read_text())
    state["rng"]["python"][1][0] = 2**40
    (ckpt / "state.json").write_text(json.dumps(state))
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)
    said = "state.json: its rng's python holds an integer out of a Python random state's range"
    with pytest.raises(CheckpointError, match=_exactly(said)):
        read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt)


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("metrics_lines", "12", 'metrics_lines is "12", not int'),
        ("metrics_lines", -1, "metrics_lines is -1, not a count (0 or more)"),
        ("nonfinite_skips", 1.5, "nonfinite_skips is 1.5, not int"),
        ("time_s", "3 s", 'time_s is "3 s", not int or float'),
        ("train_data", 12, "train_data is 12, not str"),
        ("best", 3, "best is 3, not str or null"),
        ("world_size", -2, "world_size is -2, not a count (0 or more)"),
        ("step", "1", 'step is "1", not int'),
    ],
)
def test_a_top_level_value_the_resume_cannot_take_is_refused_when_read(tmp_path, key, value, said):
    """state.json's own keys beside the sections (an SFT checkpoint's: the metrics' row count, the non-finite skips,
    the clock, the data's fingerprint, best/'s record; save_checkpoint's step and world size) of another type, or a
    negative count: one line when the checkpoint is read (a string was a TypeError's traceback once the weights were
    applied: the metrics file cut to it, SFT's clock; or at the first skipped step); as written, they read."""
    from dataclasses import asdict

    from dgrpo.training.curriculum import Progress
    from dgrpo.training.sft import PROGRESS_STATE

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    state = {
        "progress": asdict(Progress()),
        "nonfinite_skips": 0,
        "metrics_lines": 1,
        "train_data": "4:0123456789abcdef",
        "time_s": 12.5,
        "best": None,
    }
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state=state)
    keys = ("nonfinite_skips", "metrics_lines")
    read = lambda: read_checkpoint(  # noqa: E731
        ckpt, lm=StubReadLM(), optimizer=opt, state_keys=keys, sections={"progress": PROGRESS_STATE}
    )
    read()
    state = json.loads((ckpt / "state.json").read_text())
    state[key] = value
    (ckpt / "state.json").write_text(json.dumps(state))
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)
    with pytest.raises(CheckpointError, match=_exactly(f"state.json's {said}")):
        read()


def _rng_file_changed(ckpt: Path, change) -> None:
    """``ckpt``'s rng.pt with ``change(states)`` applied, its manifest rewritten to match."""
    states = torch.load(ckpt / "rng.pt", weights_only=True)
    change(states)
    torch.save(states, ckpt / "rng.pt")
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)


@pytest.mark.parametrize(
    ("key", "value"),
    [("torch_cuda_x", torch.zeros(16, dtype=torch.uint8)), ("torch_cuda_0", torch.zeros(16)), ("torch_cuda_1", 5)],
)
def test_a_cuda_random_state_restore_rng_cannot_put_back_is_refused_when_read(tmp_path, key, value):
    """rng.pt holding, under a CUDA state's name, what restore_rng cannot put back (a name without a device's number:
    a ValueError's traceback once the weights were applied, on a GPU; floats, a number): one line when the
    checkpoint is read, wherever it is read."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state={})
    _rng_file_changed(ckpt, lambda states: states.__setitem__(key, value))
    said = f"rng.pt: its {key} is not a CUDA device's random state (bytes, torch_cuda_<number>)"
    with pytest.raises(CheckpointError, match=_exactly(said)):
        read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_truncated_cuda_random_state_is_refused_when_read(tmp_path):
    """A CUDA device's random state cut short (its manifest rewritten to match): one line when the checkpoint is
    read (torch.cuda.set_rng_state_all raised once the weights were applied); as written, it reads."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state={})
    read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt)
    _rng_file_changed(ckpt, lambda states: states.__setitem__("torch_cuda_0", states["torch_cuda_0"][:3]))
    with pytest.raises(CheckpointError, match=r"^a random state does not load \(RuntimeError: .*\)$"):
        read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt)


@pytest.mark.parametrize(
    ("index", "value", "said"),
    [
        (2, 700, "has the position 700 and has_gauss 0, not 0 to 624 and 0 or 1 (a NumPy random state)"),
        (2, -1, "has the position -1 and has_gauss 0, not 0 to 624 and 0 or 1 (a NumPy random state)"),
        (3, 5, "has the position 624 and has_gauss 5, not 0 to 624 and 0 or 1 (a NumPy random state)"),
        (4, "x", 'has the gauss "x", not a finite number (a NumPy random state)'),
        (0, "PCG64", 'names the generator "PCG64", not MT19937 (a NumPy random state)'),
        (1, [5], "does not hold the 624 32-bit integers of a NumPy random state"),
    ],
)
def test_a_damaged_numpy_random_state_is_refused_when_read(tmp_path, index, value, said):
    """``state.json``'s ``rng.numpy`` damaged: a position past the 624 words, or before them, and a has_gauss of 5
    were taken by ``np.random.set_state`` without a word (the generator then read memory past its words); the
    others were a traceback's line. Each is one line naming it when the checkpoint is read."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state={})
    read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt)
    state = json.loads((ckpt / "state.json").read_text())
    state["rng"]["numpy"][2:4] = [624, 0]  # (the position and has_gauss said when another field is damaged)
    state["rng"]["numpy"][index] = value
    (ckpt / "state.json").write_text(json.dumps(state))
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)
    with pytest.raises(CheckpointError, match=_exactly(f"state.json: its rng's numpy {said}")):
        read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt)
