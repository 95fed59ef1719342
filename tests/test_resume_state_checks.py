"""What a checkpoint holds beyond its manifest, checked when it is read (before anything is applied), so that a bad
one is a damaged checkpoint's line and the previous one is tried: the sections of ``state.json`` a command's resume
reads (GRPO's ``trainer`` and ``loop``, SFT's ``progress``), and weights or optimizer moments that are not finite."""

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dgrpo.model.verified import CheckpointError, write_manifest
from dgrpo.training.checkpoint import StateSection, read_checkpoint, save_checkpoint

from conftest import tiny_config

STEP_1, STEP_2 = "step-00000001", "step-00000002"


class StubReadLM:
    """What save_checkpoint and read_checkpoint use of a LatentLM without weights (no adapter, on the CPU)."""

    checkpoint_files = ("config.json",)
    peft, revision, device = None, None, "cpu"

    def save_pretrained(self, path: Path, state_dict=None, weights: bool = True) -> None:
        path.mkdir()
        (path / "config.json").write_text("{}")

    def read_weights_dir(self, path: Path) -> dict:
        return {}


def _rewritten(ckpt: Path, change) -> Path:
    """``ckpt`` with ``change(state)`` applied to its state.json and its manifest rewritten to match (as a checkpoint
    edited by hand, or written by another dgrpo, is consistent)."""
    state = json.loads((ckpt / "state.json").read_text())
    change(state)
    (ckpt / "state.json").write_text(json.dumps(state))
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)
    return ckpt


def _grpo_sections():
    from dgrpo.training.grpo import LOOP_STATE, GRPOTrainer

    return {"trainer": GRPOTrainer.STATE, "loop": LOOP_STATE}


#: a GRPO checkpoint's sections as train_grpo writes them (the loop of an unstopped run: _loop_record)
TRAINER = {
    "step_idx": 2,
    "ema_baseline": 0.5,
    "order": [3, 1],
    "data_rng": [3, [0x80000000] + [0] * 623 + [624], None],  # (a Python random state: the values are checked too)
    "nonfinite_skips": 0,
    "nonfinite_streak": 0,
    "train_data": "4:abc",
    "reward": ["correct = dgrpo.reward.exact * 1"],
}
LOOP = {"best_step": None, "best_accuracy": -1.0, "skipped": 0, "skip_streak": 0, "last_eval": None, "started": 1.5}


def _del(section: str, key: str):
    return lambda state: state[section].pop(key)


def _set(section: str, key: str, value):
    return lambda state: state[section].__setitem__(key, value)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_del("trainer", "step_idx"), "state.json: its trainer lacks step_idx"),
        (_del("loop", "best_accuracy"), "state.json: its loop lacks best_accuracy"),
        (
            _set("loop", "best_f1", 0.3),
            "state.json: its loop holds best_f1, which this dgrpo does not read (written by another version, or "
            "edited)",
        ),
        (
            _set("trainer", "sampler", {}),
            "state.json: its trainer holds sampler, which this dgrpo does not read (written by another version, or "
            "edited)",
        ),
        (_set("trainer", "step_idx", "2"), 'state.json: its trainer\'s step_idx is "2", not int'),
        (_set("trainer", "order", None), "state.json: its trainer's order is null, not list"),
        (_set("loop", "skipped", True), "state.json: its loop's skipped is true, not int"),
        (_set("loop", "last_eval", "high"), 'state.json: its loop\'s last_eval is "high", not int or float or null'),
        (lambda state: state.__setitem__("loop", [1]), "state.json: its loop is not a JSON object"),
    ],
)
def test_a_grpo_state_section_that_the_resume_cannot_read_is_refused_when_read(tmp_path, change, said):
    """A key of ``trainer`` or ``loop`` missing, one this dgrpo does not know, or a value of another type: one line
    when the checkpoint is read (a KeyError's or a TypeError's traceback once the weights were applied); the
    sections as written (with the optional keys a run writes only when set, or only since a later dgrpo, left out)
    read."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    state = {"trainer": TRAINER, "loop": LOOP, "metrics_lines": 2}
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state=state)
    read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt, sections=_grpo_sections())
    older = _rewritten(ckpt, lambda s: [s["trainer"].pop(k) for k in ("train_data", "reward")])
    read_checkpoint(older, lm=StubReadLM(), optimizer=opt, sections=_grpo_sections())
    _rewritten(ckpt, change)
    with pytest.raises(CheckpointError, match=f"^{said}$".replace("(", r"\(").replace(")", r"\)")):
        read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt, sections=_grpo_sections())


def test_the_sections_allow_what_the_trainers_write(tmp_path):
    """A LoopState and a Progress saved as the trainers save them (every field set, mean scores and a pending
    evaluation included) are what the checks allow: the checks follow their dataclasses' fields and types."""
    from dataclasses import asdict

    from dgrpo.training.curriculum import Progress
    from dgrpo.training.grpo import LOOP_STATE, LoopState, _loop_record
    from dgrpo.training.sft import PROGRESS_STATE

    loop = LoopState(best_step=3, best_accuracy=0.5, best_mean_score=0.25, last_mean_score=0.5, eval_pending=True)
    LOOP_STATE.check("loop", json.loads(json.dumps(_loop_record(loop))))
    LOOP_STATE.check("loop", json.loads(json.dumps(_loop_record(LoopState()))))
    PROGRESS_STATE.check("progress", json.loads(json.dumps(asdict(Progress(stage_prev=1)))))
    assert set(PROGRESS_STATE.required) == set(asdict(Progress()))
    with pytest.raises(CheckpointError, match=r"^state.json: its progress's stage_prev is 1.5, not int or null$"):
        PROGRESS_STATE.check("progress", {**asdict(Progress()), "stage_prev": 1.5})


def test_a_section_of_a_dataclass_takes_its_fields_types():
    """StateSection.of: a float field takes a JSON integer, an ``int | None`` one null, a bool one a bool only."""
    from dataclasses import dataclass

    @dataclass
    class Record:
        a: int = 0
        b: float = 0.0
        c: int | None = None
        d: bool = False

    section = StateSection.of(Record, ("a",))
    assert section.required == {"a": (int,)}
    assert section.optional == {"b": (int, float), "c": (int, type(None)), "d": (bool,)}


@pytest.mark.parametrize("where", ["exp_avg", "ref"])
def test_optimizer_moments_or_a_reference_that_are_not_finite_are_refused_when_read(tmp_path, where):
    """A NaN in the optimizer's moments (the next step's update NaN: the run stopped as if its lr were too high) or
    an infinity in the reference model's weights (every KL term infinite), the manifest consistent: one line naming
    the tensor when the checkpoint is read."""
    p = torch.nn.Parameter(torch.ones(2))
    opt, ref = torch.optim.AdamW([p], lr=0.1), torch.nn.Linear(2, 2)
    p.grad = torch.ones(2)
    opt.step()
    if where == "exp_avg":
        opt.state[p]["exp_avg"][1] = float("nan")
    else:
        with torch.no_grad():
            ref.weight[0, 0] = float("inf")
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state={}, extra_models={"ref": ref})
    said = (
        r"^optimizer.pt: the exp_avg of parameter 0 holds NaN or infinite values$"
        if where == "exp_avg"
        else r"^ref.safetensors: weight holds NaN or infinite values$"
    )
    with pytest.raises(CheckpointError, match=said):
        read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt, extra_models={"ref": torch.nn.Linear(2, 2)})


def test_finite_values_whose_norm_overflows_and_an_infinite_buffer_are_no_damage(tmp_path):
    """Moments whose float32 norm overflows (values near float32's largest) are finite: the check looks at the
    elements of a tensor whose norm is not finite before it refuses; a model's buffer (an attention mask of -inf) is
    not a weight, and is not checked."""
    p = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([p], lr=0.1)
    p.grad = torch.ones(4)
    opt.step()
    opt.state[p]["exp_avg_sq"].fill_(3e38)
    ref = torch.nn.Linear(2, 2)
    ref.register_buffer("mask", torch.full((2,), float("-inf")))
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state={}, extra_models={"ref": ref})
    read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt, extra_models={"ref": ref})


# ---------------------------------------------------------------------------------------------- whole runs


def _train_grpo(out: Path, log) -> None:
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.grpo import train_grpo

    cfg = tiny_config(
        **{"grpo.steps": 2, "grpo.prompts_per_step": 2, "grpo.save_every": 1, "grpo.eval_every": 0, "data.test": "[]"}
    )
    torch.manual_seed(0)
    lm = load_model(cfg.model, cfg.task, seed=0)
    train_grpo(lm, cfg, generate_split(cfg.task, "train")[:16], out, progress=False, log=log)


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    """A 2-step GRPO run of the built-in tiny model, a checkpoint at each step, stopped before its end (final/ and
    summary.json removed: the same command resumes from step 2)."""
    out = tmp_path_factory.mktemp("grpo") / "run"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "the model's latent markers")
        _train_grpo(out, log=lambda m: None)
    shutil.rmtree(out / "final")
    (out / "summary.json").unlink()
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [STEP_1, STEP_2]
    return out


def _nan_in_weights(ckpt: Path) -> None:
    weights = load_file(str(ckpt / "model" / "model.safetensors"))
    weights["model.embed_tokens.weight"][0, 0] = float("nan")
    save_file(weights, str(ckpt / "model" / "model.safetensors"), metadata={"format": "pt"})
    _rewritten(ckpt, lambda state: None)


@pytest.mark.filterwarnings("ignore:the model's latent markers")
@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (
            lambda ckpt: _rewritten(ckpt, _set("loop", "best_f1", 0.5)),
            "state.json: its loop holds best_f1, which this dgrpo does not read (written by another version, or "
            "edited)",
        ),
        (lambda ckpt: _rewritten(ckpt, _del("trainer", "step_idx")), "state.json: its trainer lacks step_idx"),
        (_nan_in_weights, "model/: model.embed_tokens.weight holds NaN or infinite values"),
    ],
    ids=["unknown-loop-key", "missing-trainer-key", "nan-weights"],
)
def test_a_grpo_checkpoint_damaged_past_its_manifest_falls_back_to_the_previous_one(grpo_run, tmp_path, damage, said):
    """The newest checkpoint, its manifest consistent, with a loop key this dgrpo does not know (another version's),
    a trainer key missing (a TypeError's or KeyError's traceback once the weights were applied), or a NaN weight (it
    resumed without a word): skipped in one line, the run resumed from the previous checkpoint."""
    out = tmp_path / "run"
    shutil.copytree(grpo_run, out)
    damage(out / "checkpoints" / STEP_2)
    lines: list[str] = []
    _train_grpo(out, log=lines.append)
    skipped = f"dgrpo: skipping checkpoint {out / 'checkpoints' / STEP_2}: {said}; falling back to the previous one"
    assert skipped in lines
    assert f"dgrpo: resumed from {out / 'checkpoints' / STEP_1} (step 1)" in lines
    assert (out / "final").is_dir() and (out / "checkpoints" / f"damaged-{STEP_2}").is_dir()


def test_an_sft_checkpoint_without_its_step_is_refused_not_resumed_from_step_0(tmp_path):
    """An SFT checkpoint whose progress lacks global_step (the manifest consistent) resumed without a word, its step
    count back at 0 (Progress's default: the next checkpoints named and rotated as steps 1, 2, ...); it is a damaged
    checkpoint's line."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    sets = {"sft.num_epochs": 1, "sft.batch_size": 16, "sft.warmup_steps": 0, "sft.save_every": 1}
    cfg = tiny_config(**sets, **{"data.test": "[]", "data.valid": "''"})
    train = generate_split(cfg.task, "train")[:16]
    out = tmp_path / "run"
    torch.manual_seed(0)
    train_sft(load_model(cfg.model, cfg.task, seed=0), train, cfg, out, progress=False, log=lambda m: None)
    shutil.rmtree(out / "final")
    ckpt = _rewritten(next((out / "checkpoints").iterdir()), _del("progress", "global_step"))
    lines: list[str] = []
    with pytest.raises(CheckpointError, match=r"\(step-\d+: state.json: its progress lacks global_step\); start over"):
        train_sft(load_model(cfg.model, cfg.task, seed=0), train, cfg, out, progress=False, log=lines.append)
    assert f"dgrpo: skipping checkpoint {ckpt}: state.json: its progress lacks global_step; no earlier one is left" in (
        lines
    )
