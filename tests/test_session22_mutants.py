"""Tests that kill mutants of session 22's code which its own tests let survive: the float32 masters' check of a
checkpoint, rewards' None/NaN (TRL's "does not apply"), the W&B tracker's WANDB_RUN_ID and lost rows, the stop
before the first training step, the wording of a refusal (command line or Python) and the checks made on the model
built without its weights. Each test's docstring names the behaviour and the mutant it kills.

Equivalent mutants (no behaviour tells them apart), left alive:

- out_dir.release_leaving_nothing: ``lock.release()`` before ``remove_made``: the lock file this run made is
  unlinked first, so the flock still held on it excludes no one (a second run opens a new file either way).
- out_dir.remove_made: ``break`` -> ``pass`` on an OSError: a folder that is not empty keeps its parent non-empty, so
  every rmdir above it fails too (only a folder removed by someone else meanwhile would tell them apart).
- run.RunDir: ``topmost_missing(...) if dist.is_main else None`` -> ``topmost_missing(...)``: a rank other than 0
  holds no lock, and ``close`` removes nothing without one.
- run.RunDir.close: ``os.listdir(OUT) == [LOCK_FILE]`` -> ``True``: a directory holding more than the lock is not
  empty, so nothing of it is removed; only its lock file (unlinked while locked) goes, which no run reads.
- run.RunDir.close: ``self.made = self.lock = None`` -> ``self.made = None``: RunLock.release is idempotent.
- checkpoint.read_checkpoint: ``if weights and lm.peft is None`` -> ``if weights`` / ``if lm.peft is None``: an
  adapter's weights are named as PEFT saves them, so no master finds its weight; a sharded checkpoint's weights are
  ``{}``, so none does either.
- checkpoint._state_names: the ``sharded`` branch (``{k: k ...}`` -> ``{}``) is never reached: a sharded checkpoint
  reads no weights, so _check_masters is not called for it (dead code); ``sorted(ids)``: torch numbers the state's
  parameters in order across groups; ``names.get(id(p), "")`` -> ``"x"``: no weight has either name.
- checkpoint._check_masters: dropping ``not isinstance(master, torch.Tensor)`` or ``weight.dtype not in
  LOW_PRECISION``: MasterWeightAdamW keeps a master for each low-precision parameter and none for a float32 one.
- tracking.wandb_run_id: ``store and (run_id != stored or not resume)`` -> ``store and run_id != stored`` or
  ``store``: without ``resume`` nothing is stored-and-read (``stored`` is ''), and writing the same id again changes
  nothing. WandbTracker: ``stored = ... if resume else ""`` -> always read, and ``if self.fresh:`` -> ``if True:``
  (the id stored is the one there, or a run without resume has no kept rows to give); dropping the ``return`` after
  ``run.log`` failed (``_floor`` is not read once W&B failed).
- preemption.within_step: ``begun = begun or installed`` -> ``begun = installed``: ``installed`` does not change
  within a run; sigterm_stops: dropping the reset of ``begun``/``leaving`` on entry (its ``finally`` resets them).
"""

from __future__ import annotations

import math
import sys
import types
import warnings
from typing import Any

import pytest
import torch

from dgrpo.data.records import Record
from dgrpo.eval.scoring import SCORERS, RewardError, RewardPart, Rewards, call_checked
from dgrpo.model.verified import CheckpointError
from dgrpo.training.checkpoint import read_checkpoint, save_checkpoint
from dgrpo.training.master_weights import MasterWeightAdamW

from conftest import make_lm


def _bf16_checkpoint(tokenizer, tmp_path, damage):
    """A bf16 model stepped once through MasterWeightAdamW, saved with ``damage`` applied to its masters; a fresh
    model and optimizer to read it into."""
    lm = make_lm(tokenizer, seed=1).to(torch.bfloat16)
    opt = MasterWeightAdamW(lm.model.parameters(), lr=1e-2)
    opt.zero_grad()
    sum(p.float().pow(2).sum() for p in lm.model.parameters()).backward()
    opt.step()
    for state in opt.state.values():
        state["master"] = damage(state["master"])
    ckpt = save_checkpoint(tmp_path, 1, lm=lm, optimizer=opt, state={})
    lm2 = make_lm(tokenizer, seed=2).to(torch.bfloat16)
    return ckpt, lm2, MasterWeightAdamW(lm2.model.parameters(), lr=1e-2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_a_master_of_another_float_dtype_than_float32_is_refused(tokenizer, tmp_path, dtype):
    """Masters saved as float16 or float64 (not what MasterWeightAdamW keeps) are refused, naming the dtype, even
    where they round to the weights. Kills ``master.dtype != torch.float32`` -> ``master.dtype == torch.bfloat16``
    in _check_masters."""
    ckpt, lm, opt = _bf16_checkpoint(tokenizer, tmp_path, lambda m: m.to(dtype))
    with pytest.raises(CheckpointError, match=rf"the master of \S+ is {dtype}, not float32"):
        read_checkpoint(ckpt, lm=lm, optimizer=opt)


def test_a_master_one_value_of_which_is_not_its_weights_is_refused(tokenizer, tmp_path):
    """One master value changed past its weight's rounding (a single corrupted entry) is refused, counting it. Kills
    ``if differ:`` -> ``if differ > 1:`` in _check_masters."""

    def one_changed(master: torch.Tensor) -> torch.Tensor:
        master = master.clone()
        master.view(-1)[0] += 1.0
        return master

    ckpt, lm, opt = _bf16_checkpoint(tokenizer, tmp_path, one_changed)
    with pytest.raises(CheckpointError, match=r"is not that weight \(1 of its \d+ values round to other"):
        read_checkpoint(ckpt, lm=lm, optimizer=opt)


def test_a_refusal_names_the_new_runs_model_as_its_caller_gives_one(tmp_path):
    """A resume switching model.master_weights of a bf16 run is refused, its line naming how to start a new run from
    the model: from Python ``LatentLM.from_pretrained``, from the command line ``--init``. Kills, in
    wording.init_named, ``"--init" if cli else "LatentLM.from_pretrained"`` -> ``"--init"`` (without a path)."""
    import json

    from test_resume import _fake_checkpoint, _run_dir

    from dgrpo.config import ConfigError, to_dict
    from dgrpo.training.wording import command_line_words

    from conftest import tiny_config

    out = tmp_path / "run"
    _fake_checkpoint(out / "checkpoints" / "step-00000004")
    bf16 = {"model.dtype": "bfloat16"}
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config(**bf16))))
    switched = tiny_config(**bf16, **{"model.master_weights": "true"})
    with pytest.raises(ConfigError, match=r"start a new run with LatentLM\.from_pretrained on its final/") as e:
        _run_dir(out, cfg=switched, allow_config_change=True)
    assert "--init" not in str(e.value)
    with command_line_words(), pytest.raises(ConfigError, match=r"start a new run with --init on its final/"):
        _run_dir(out, cfg=switched, allow_config_change=True)


def test_init_named_names_the_path_for_the_command_line_or_python():
    """``init_named(path, cli)``: ``--init PATH`` for the command line, ``LatentLM.from_pretrained('PATH')`` for
    Python. Kills ``if cli`` -> ``if not cli`` in the with-a-path line of wording.init_named."""
    from pathlib import Path

    from dgrpo.training.wording import init_named

    assert init_named(Path("runs/a/final"), True) == "--init runs/a/final"
    assert init_named(Path("runs/a/final"), False) == "LatentLM.from_pretrained('runs/a/final') as a new run's model"


_RECORDS = [Record(question=f"q{i}", steps=[], answer=str(i)) for i in range(3)]
_COMPLETIONS = ["#### 0", "#### 1", "#### 2"]


def test_a_column_of_nans_is_refused_as_a_2d_array_not_taken_as_none():
    """A reward returning ``torch.full((n, 1), nan)`` (one more dimension, every value NaN) is refused naming the
    array's shape; its rows are tensors, not the NaN of "does not apply". Kills dropping ``getattr(v, "ndim", 0) ==
    0`` from call_checked's None/NaN test (each 1-element row was then taken as None, the run trained on zeros)."""
    with pytest.raises(RewardError, match=r"it returned an array of shape \(3, 1\); one number per completion is 1-D"):
        call_checked(lambda c, r: torch.full((len(c), 1), math.nan), "nan2d", _COMPLETIONS, _RECORDS)


def test_only_a_plug_in_part_may_abstain():
    """frac_none/<name> is logged for the parts that may return None: a plug-in's, not a built-in scorer's (which
    scores every completion). Kills ``may_abstain`` -> ``True``."""
    assert not RewardPart("numeric", SCORERS["numeric"]).may_abstain
    assert RewardPart("mine", lambda c, r: [1.0] * len(c)).may_abstain


def test_the_smoke_tests_none_warning_leaves_the_rollouts_own_once():
    """A reward that applies to no row is warned of for the gold answers of the smoke test, and again for the first
    rollouts (the warning's once-per-run starts after the smoke test). Kills dropping ``self._warned_none = False``
    in Rewards.smoke_test."""
    rewards = Rewards([RewardPart("never", lambda c, r: [None] * len(c))])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rewards.smoke_test(_RECORDS, check_filter=False)
    assert any(str(w.message).startswith("every reward (never) returned None or NaN") for w in caught)
    with pytest.warns(UserWarning, match=r"every reward \(never\) returned None or NaN .* for row 0"):
        rewards(_COMPLETIONS, _RECORDS)


def test_a_weighted_total_of_inf_minus_inf_is_refused():
    """Two parts of finite weights whose products overflow to +inf and -inf sum to NaN: refused as a total past
    float32's range, not trained on as NaN. Kills ``not abs(t) <= FLOAT32_MAX`` -> ``abs(t) > FLOAT32_MAX`` in
    Rewards.__call__ (False for a NaN)."""
    big = lambda c, r: [1e10] * len(c)  # noqa: E731
    rewards = Rewards([RewardPart("up", big, 1e300), RewardPart("down", big, -1e300)])
    with pytest.raises(RewardError, match=r"^the weighted total of the rewards is nan for row 0 .*past float32's"):
        rewards(_COMPLETIONS, _RECORDS)


def test_a_reward_just_past_float32s_range_is_refused():
    """3.5e38 (past float32's largest, 3.4028e38; inf once stored as float32) is refused; 3.4e38 is taken. Kills
    ``abs(x) > FLOAT32_MAX`` -> ``abs(x) > FLOAT32_MAX * 2`` in call_checked."""
    with pytest.raises(RewardError, match=r"^reward big returned 3\.5e\+38 for row 0 .*past float32's range"):
        call_checked(lambda c, r: [3.5e38] * len(c), "big", _COMPLETIONS, _RECORDS)
    assert call_checked(lambda c, r: [-3.4e38] * len(c), "big", _COMPLETIONS, _RECORDS) == [-3.4e38] * 3


def _stand_in_wandb(monkeypatch: pytest.MonkeyPatch, init: Any) -> None:
    """A ``wandb`` module whose ``init`` is ``init`` (its errors RuntimeError), in place of the real one."""
    module = types.ModuleType("wandb")
    module.init = init  # type: ignore[attr-defined]
    module.errors = types.SimpleNamespace(Error=RuntimeError)  # type: ignore[attr-defined]
    module.teardown = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)


def test_a_stored_run_id_wandb_refuses_names_the_file_not_wandb_run_id(tmp_path, monkeypatch):
    """A resumed run whose OUT/wandb_run_id holds an id W&B refuses (edited by hand), WANDB_RUN_ID unset: the line
    names that file, not the variable the user never set. Kills ``"WANDB_RUN_ID" if env("WANDB_RUN_ID") else`` ->
    ``if True`` in WandbTracker._start."""
    from dgrpo.config import ConfigError
    from dgrpo.run_layout import WANDB_ID_FILE
    from dgrpo.training.tracking import WandbTracker

    def init(**kwargs: Any) -> None:
        raise RuntimeError(f"Invalid Run ID: {kwargs['id']}; Run ID cannot contain: /")

    _stand_in_wandb(monkeypatch, init)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    (tmp_path / WANDB_ID_FILE).write_text("team/run\n")
    with pytest.raises(ConfigError, match=rf"^{tmp_path / WANDB_ID_FILE}: W&B refuses the run id 'team/run'"):
        WandbTracker(tmp_path)


def test_wandbs_failure_is_warned_of_by_its_first_line_cut_short(tmp_path, monkeypatch):
    """``run.log`` raising an error of several lines (a long first one): the warning is one line, the error's first
    line cut to 300 characters. Kills ``text[0]`` -> ``text[-1]`` and dropping ``[:300]`` in tracking._one_line."""
    from dgrpo.training.tracking import WandbTracker

    class Run:
        id, starting_step, offline, disabled, dir = "", 0, True, False, "/nonexistent"

        def log(self, values: dict[str, Any], step: int) -> None:
            raise ConnectionResetError("x" * 400 + "\nTraceback of the service")

        def finish(self, exit_code: int = 0) -> None:
            pass

    def init(**kwargs: Any) -> Run:
        run = Run()
        run.id = kwargs["id"]
        return run

    _stand_in_wandb(monkeypatch, init)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    t = WandbTracker(tmp_path)
    with pytest.warns(UserWarning) as caught:
        t.log({"loss": 1.0}, 0)
    t.close()
    assert t.failed == f"at step 0 (ConnectionResetError: {'x' * 300})"
    assert "Traceback" not in str(caught[0].message)


def test_the_model_without_weights_of_a_run_directory_is_its_final_and_none_for_remote_code(lora_base_dirs, tmp_path):
    """``--init RUN`` (a run directory) is built without weights from RUN/final, as the load reads it; a model that
    runs its repository's own code (model.trust_remote_code) is not built so (None: checked once loaded). Kills
    ``resolve_checkpoint(local)`` -> ``local`` and dropping ``or cfg.model.trust_remote_code`` in
    cli.common.model_without_weights."""
    import shutil

    from dgrpo.cli.common import model_without_weights
    from dgrpo.config import Config

    run = tmp_path / "run"
    shutil.copytree(lora_base_dirs / "gpt2", run / "final")
    cfg = Config()
    lm = model_without_weights(str(run), cfg)
    assert lm is not None and lm.context_length == model_without_weights(str(run / "final"), cfg).context_length
    cfg.model.trust_remote_code = True
    assert model_without_weights(str(run / "final"), cfg) is None


def test_the_evaluation_check_counts_its_answer_tokens(lora_base_dirs):
    """check_evaluation_fits refuses a set whose prompt fits but not with ``max_new_tokens`` answer tokens after it,
    and takes it with a few. Kills ``max_new_tokens`` -> ``1`` in check_evaluation_fits."""
    from dgrpo.cli.common import model_without_weights
    from dgrpo.config import Config, ConfigError
    from dgrpo.eval.evaluate import check_evaluation_fits

    lm = model_without_weights(str(lora_base_dirs / "gpt2"), Config())
    records = [Record(question="1 + 2 ?", steps=[], answer="3")]
    check_evaluation_fits(lm, records, max_new_tokens=8)
    with pytest.raises(ConfigError, match="does not fit the model's context"):
        check_evaluation_fits(lm, records, max_new_tokens=lm.context_length)


@pytest.fixture
def gpt2_unloaded(lora_base_dirs):
    """The tiny GPT-2 on disk as dgrpo sft/grpo build it before its weights load."""
    from dgrpo.cli.common import model_without_weights
    from dgrpo.config import Config

    return model_without_weights(str(lora_base_dirs / "gpt2"), Config())


def test_sfts_last_stage_past_the_context_is_refused_before_the_load_without_test_sets(gpt2_unloaded):
    """dgrpo sft with no test set: the last stage's thoughts past the context are refused on the model without its
    weights (train_sft's start check), naming sft.c_thought. Kills dropping check_last_stage_fits from
    cli.train.check_fits_before_training, and ``final_settings(cfg).n_latent`` -> ``0`` in sft.check_last_stage_fits."""
    from dgrpo.cli.train import check_fits_before_training
    from dgrpo.config import ConfigError
    from dgrpo.training.curriculum import final_settings

    from conftest import tiny_config

    cfg = tiny_config(**{"sft.c_thought": gpt2_unloaded.context_length})
    assert final_settings(cfg).n_latent >= gpt2_unloaded.context_length
    with pytest.raises(ConfigError, match=r"sft\.c_thought"):
        check_fits_before_training(gpt2_unloaded, cfg, "sft", {}, None)
    check_fits_before_training(gpt2_unloaded, tiny_config(), "sft", {}, None)


def test_grpo_n_latent_0_is_no_thoughts_not_the_models_own(gpt2_unloaded):
    """grpo.n_latent=0 (rollouts without thoughts) is checked as 0, not as the model's own count (which would not
    fit here). Kills ``cfg.grpo.n_latent >= 0`` -> ``> 0`` in cli.train.check_fits_before_training."""
    from dataclasses import replace

    from dgrpo.cli.train import check_fits_before_training
    from dgrpo.config import ConfigError

    from conftest import tiny_config

    gpt2_unloaded.settings = replace(gpt2_unloaded.settings, n_latent=gpt2_unloaded.context_length)
    check_fits_before_training(gpt2_unloaded, tiny_config(**{"grpo.n_latent": 0}), "grpo", {}, None)
    with pytest.raises(ConfigError, match=r"grpo\.n_latent"):
        check_fits_before_training(gpt2_unloaded, tiny_config(), "grpo", {}, None)


def test_sfts_validation_set_is_checked_only_where_sft_validates(gpt2_unloaded):
    """A validation set too long for the context is refused before the load when SFT validates (each stage or every
    epoch), not when it does not (it is never answered). Kills dropping ``(cfg.sft.eval_each_stage or
    cfg.sft.eval_every_epoch)`` in cli.train.check_fits_before_training."""
    from dgrpo.cli.train import check_fits_before_training
    from dgrpo.config import ConfigError

    from conftest import tiny_config

    valid = [Record(question="1 + " * 300 + "1 ?", steps=[], answer="301")]
    off = {"sft.eval_each_stage": "false", "sft.eval_every_epoch": "false", "data.max_question_tokens": 0}
    check_fits_before_training(gpt2_unloaded, tiny_config(**off), "sft", {}, valid)
    with pytest.raises(ConfigError, match="does not fit"):
        check_fits_before_training(
            gpt2_unloaded, tiny_config(**{**off, "sft.eval_each_stage": "true"}), "sft", {}, valid
        )


def test_the_part_metrics_are_means_over_numbers_and_shares_of_none():
    """``reward/<name>`` is each part's mean over the rows that gave a number (None when none did), ``frac_none/<name>``
    the share of the step's rows it gave None for, logged for a plug-in part only. Kills, in
    GRPOTrainer._part_metrics, the mean over every row (``given`` -> ``len(values)``), ``if given else None`` dropped,
    ``len(values) - len(numbers)`` -> ``len(numbers)``, and frac_none for every part."""
    from types import SimpleNamespace

    from dgrpo.training.distributed import Dist
    from dgrpo.training.grpo import GRPOTrainer

    rewards = Rewards(
        [
            RewardPart("numeric", SCORERS["numeric"]),
            RewardPart("fmt", lambda c, r: [1.0, None, 0.5, None]),
            RewardPart("never", lambda c, r: [None] * len(c), 0.0),
        ]
    )
    rewards(["#### 0", "#### 1", "#### 9", "x"], [Record(question="q", steps=[], answer=str(i)) for i in range(4)])
    got = GRPOTrainer._part_metrics(SimpleNamespace(dist=Dist.single(), rewards=rewards), 4)
    assert got == {
        "reward/numeric": 0.5,
        "reward/fmt": 0.75,
        "frac_none/fmt": 0.5,
        "reward/never": None,
        "frac_none/never": 1.0,
    }
