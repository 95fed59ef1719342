"""Checkpoints read and applied as a Python caller resumes them (read_checkpoint, LoadedCheckpoint.apply,
GRPOTrainer.load_state): the optimizer's hyperparameters, the float32 masters and the trainer's state checked and
applied as the command line's resume applies them."""

import torch

from dgrpo.training.checkpoint import read_checkpoint, save_checkpoint

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
