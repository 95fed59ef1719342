"""Checkpoints read and applied as a Python caller resumes them (read_checkpoint, LoadedCheckpoint.apply,
GRPOTrainer.load_state): the optimizer's hyperparameters, the float32 masters and the trainer's state checked and
applied as the command line's resume applies them."""

import json

import pytest
import torch

from dgrpo.model.verified import CheckpointError
from dgrpo.training.checkpoint import read_checkpoint, save_checkpoint
from dgrpo.training.master_weights import MasterWeightAdamW

from conftest import make_lm


def _trained(lm, optimizer: torch.optim.Optimizer) -> None:
    """One optimizer step, so that the optimizer has a state (moments, masters) to save."""
    optimizer.zero_grad()
    sum(p.float().pow(2).sum() for p in lm.model.parameters()).backward()
    optimizer.step()


def test_a_resumed_optimizer_steps_with_the_runs_hyperparameters_not_the_checkpoints(tokenizer, tmp_path):
    """A resume allowed to change grpo.weight_decay / adam_betas (allow_config_change) gets the new values: torch's
    load_state_dict put the saved parameter groups' betas and weight decay in place of the optimizer's, and the run
    stepped with the checkpoint's values while its config said others. The moments are the checkpoint's."""
    lm = make_lm(tokenizer, seed=1)
    opt = torch.optim.AdamW(lm.model.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95))
    _trained(lm, opt)
    ckpt = save_checkpoint(tmp_path, 1, lm=lm, optimizer=opt, state={})
    lm2 = make_lm(tokenizer, seed=2)
    opt2 = torch.optim.AdamW(lm2.model.parameters(), lr=1e-3, weight_decay=0.0, betas=(0.8, 0.99), eps=1e-6)
    read_checkpoint(ckpt, lm=lm2, optimizer=opt2).apply(lm2, opt2)
    group = opt2.param_groups[0]
    assert (group["weight_decay"], group["betas"], group["eps"], group["lr"]) == (0.0, (0.8, 0.99), 1e-6, 1e-3)
    saved, loaded = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert saved.keys() == loaded.keys()
    assert all(torch.equal(saved[i]["exp_avg_sq"], loaded[i]["exp_avg_sq"]) for i in saved)


def _bf16_checkpoint(tokenizer, tmp_path, damage=None):
    """A bf16 model stepped once through MasterWeightAdamW and saved (``damage`` applied to each master first, as a
    tool or another program might have written them: the manifest consistent); a fresh model and optimizer to
    read it into."""
    lm = make_lm(tokenizer, seed=1).to(torch.bfloat16)
    opt = MasterWeightAdamW(lm.model.parameters(), lr=1e-2)
    _trained(lm, opt)
    for state in opt.state.values():
        if damage is not None:
            state["master"] = damage(state["master"])
    ckpt = save_checkpoint(tmp_path, 1, lm=lm, optimizer=opt, state={})
    lm2 = make_lm(tokenizer, seed=2).to(torch.bfloat16)
    return ckpt, lm2, MasterWeightAdamW(lm2.model.parameters(), lr=1e-2)


def test_honest_float32_masters_resume(tokenizer, tmp_path):
    """Masters whose bf16 rounding is the saved weight (what every step leaves) are read and put back in float32."""
    ckpt, lm, opt = _bf16_checkpoint(tokenizer, tmp_path)
    read_checkpoint(ckpt, lm=lm, optimizer=opt).apply(lm, opt)
    masters = [s["master"] for s in opt.state.values()]
    assert masters and all(m.dtype == torch.float32 for m in masters)


@pytest.mark.parametrize(
    "damage, said",
    [
        (torch.zeros_like, "the float32 master of model.embed_tokens.weight is not that weight ("),
        (lambda m: m * 1.5, "values round to other torch.bfloat16 values than model/'s): the first step would put"),
        (lambda m: m.bfloat16(), "the master of model.embed_tokens.weight is torch.bfloat16, not float32"),
    ],
)
def test_masters_that_are_not_the_saved_weights_are_refused_before_anything_is_applied(
    tokenizer, tmp_path, damage, said
):
    """All-zero masters (or another weight's, or not float32) beside intact bf16 weights passed the checks, and the
    resumed run's first step put them in the weights' place: a model of zeros, without a word."""
    ckpt, lm, opt = _bf16_checkpoint(tokenizer, tmp_path, damage)
    before = [p.detach().clone() for p in lm.model.parameters()]
    with pytest.raises(CheckpointError, match="optimizer.pt: ") as e:
        read_checkpoint(ckpt, lm=lm, optimizer=opt)
    assert said in str(e.value)
    assert all(torch.equal(a, p) for a, p in zip(before, lm.model.parameters())) and not opt.state


@pytest.mark.parametrize(
    "change, said",
    [
        ({"order": [-1]}, "its trainer's order holds -1, not the index of a training row of the 8 it was trained on"),
        ({"step_idx": "3"}, 'its trainer\'s step_idx is "3", not int'),
        ({"data_rng": [3, [2**33] * 625, None]}, "its trainer's data_rng holds an integer out of"),
        ({"order": [1, 1]}, "its trainer's order holds 1 twice"),
    ],
)
def test_grpo_trainer_load_state_called_from_python_refuses_a_state_no_run_wrote(tokenizer, task_records, change, said):
    """GRPOTrainer.load_state, called from Python (a notebook taking a run up again), took a damaged or hand-made
    state as it was (a negative index: a row from the end; a string step: a TypeError steps later), where the
    command line's resume refused it in one line: it now checks it as that resume does, the trainer left as it was."""
    from dgrpo.training.grpo import GRPOTrainer

    from conftest import tiny_config

    cfg = tiny_config(**{"grpo.prompts_per_step": 3, "grpo.beta0": 0})
    tr = GRPOTrainer(make_lm(tokenizer), cfg, task_records[:8], reward_fn=lambda c, r: [1.0] * len(c))
    saved = json.loads(json.dumps(tr.state()))
    before = json.dumps(tr.state())
    with pytest.raises(CheckpointError) as e:
        tr.load_state({**saved, **change})
    assert said in str(e.value)
    assert json.dumps(tr.state()) == before
    tr.load_state(saved)  # (what state() wrote loads)


def test_the_refusal_of_another_optimizers_state_names_the_python_call_to_a_python_caller(tmp_path):
    """train_grpo resumed from Python (resume=, out_dir=) on a checkpoint of another optimizer was told to start a new
    run with --init, an option a Python caller never types: it is told LatentLM.from_pretrained(PATH), the command
    line still --init PATH."""
    from dgrpo.config import ConfigError
    from dgrpo.training.checkpoint import check_same_optimizer
    from dgrpo.training.wording import command_line_words

    (tmp_path / "model").mkdir()
    state = {"optimizer_kind": "bitsandbytes.optim.adamw.AdamW8bit"}
    adamw = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(ConfigError) as e:
        check_same_optimizer(tmp_path, state, adamw)
    assert str(e.value).endswith(
        f"start a new run with LatentLM.from_pretrained({str(tmp_path / 'model')!r}) as a new run's model"
    )
    assert "--init" not in str(e.value)
    with command_line_words(), pytest.raises(ConfigError) as e:
        check_same_optimizer(tmp_path, state, adamw)
    assert str(e.value).endswith(f"start a new run with --init {tmp_path / 'model'}")
