"""The paper's full-scale recipe (paper/ configs) runs end to end on CPU: a tiny plain HF checkpoint stands in for
Qwen2.5-1.5B and the built-in task for GSM8K-Aug / GSM-Hard, both through ``--set``; every other setting is the
recipe's own (c = 3, stages 0..2 then the all-latent stage -> T = 6, grad_accum 4, bf16 weights, K = 32, p = 0.1 on
attention, clip 0.10/0.12, annealed beta, the paper's KL form, Huber delta 5, filter [0.2, 0.95], reference renewal,
adamw8bit -> AdamW on CPU). The fast test checks the recipe's curriculum without training."""

import json
import re

import pytest

from dgrpo.config import Config, load_config, resolve_config_path
from dgrpo.model.tiny import build_tiny_model
from dgrpo.training.curriculum import Curriculum, curriculum_stage, final_settings, latent_layout, stage_of_epoch

from conftest import dgrpo, sets

TINY_DATA = {
    "data.train": "builtin:train",
    "data.valid": "builtin:valid",
    "data.test": "[builtin:test]",
    "task.n_train": 64,
    "task.n_valid": 16,
    "task.n_test": 16,
    "data.eval_limit": 16,
    "threads": 2,
}


def test_sft_recipe_ends_in_the_all_latent_stage():
    """Hao et al.'s curriculum to its end: the final stage writes no step and thinks with T = 6 latents (c = 3)."""
    cfg = load_config(Config, "paper/sft_coconut.yaml")
    s = cfg.sft
    last = stage_of_epoch(s.num_epochs - 1, cfg)
    assert last > s.max_latent_stage  # past the last stage that still writes steps
    for n_steps in (1, 2, 8):  # a record with 8 steps (and short ones: padded to the same T)
        replaced, n_latent = latent_layout(last, n_steps, cfg)
        assert (replaced, n_latent) == (n_steps, 6)  # every step latent: nothing written before the answer
    assert latent_layout(s.max_latent_stage, 8, cfg) == (2, 6)  # the last mixed stage still writes 6 of 8 steps
    settings = final_settings(cfg)
    assert (settings.stage, settings.n_latent, settings.c_thought) == (last, 6, 3)
    # 3 epochs for each of stages 0, 1, 2; every later epoch is all-latent
    stages = [stage_of_epoch(e, cfg) for e in range(s.num_epochs)]
    assert [stages.count(k) for k in range(3)] == [3, 3, 3]
    assert all(latent_layout(k, 8, cfg) == (8, 6) for k in stages[9:]) and len(stages[9:]) == 16


def test_stage_epochs_give_each_stage_its_own_length():
    """sft.stage_epochs: stage k takes stage_epochs[k] epochs, later stages epochs_per_stage each; empty = Coconut."""
    assert [curriculum_stage(e, [], 2) for e in range(6)] == [0, 0, 1, 1, 2, 2]
    assert [curriculum_stage(e, [1, 1, 2], 2) for e in range(7)] == [0, 1, 2, 2, 3, 3, 4]
    assert [curriculum_stage(e, [3], 1) for e in range(5)] == [0, 0, 0, 1, 2]
    cfg = load_config(Config, None, ["sft.stage_epochs=[1,1,2]", "sft.num_epochs=4"])
    plan = Curriculum(cfg, steps_per_epoch=10)
    assert [plan.schedule_length(k) for k in range(3)] == [10, 10, 20]  # one warmup + cosine per stage
    assert [plan.last_of_stage(e) for e in range(4)] == [True, True, False, True]
    assert final_settings(cfg).stage == 2
    overrides = ["sft.stage_epochs=[1,1,2]", "sft.num_epochs=4", "sft.mode=no_curriculum"]
    no_curriculum = load_config(Config, None, overrides)
    assert {stage_of_epoch(e, no_curriculum) for e in range(4)} == {2}


def test_the_start_reads_each_epochs_stage_once(monkeypatch):
    """The warmup check before the first step counted each stage's epochs by a pass over every epoch, once per stage:
    sft.num_epochs=10000 with one-epoch stages took 28 s before anything was printed (quadratic)."""
    from dgrpo.training import curriculum, sft

    cfg = load_config(Config, None, ["sft.num_epochs=3000", "sft.epochs_per_stage=1", "sft.max_latent_stage=2"])
    calls = []
    real = curriculum.stage_of_epoch
    monkeypatch.setattr(curriculum, "stage_of_epoch", lambda e, c: calls.append(e) or real(e, c))
    assert "sft.warmup_steps=30" in sft._warmup_line(64 * 10, cfg)  # (10 steps per one-epoch stage)
    assert 3000 <= len(calls) <= 2 * 3000  # (each epoch's stage read: the count goes through the patched function)
    plan = Curriculum(cfg, steps_per_epoch=10)
    assert [plan.schedule_length(k) for k in (0, 2999, 3000)] == [10, 10, 0]


def test_coconut_run_py_optimizer_regime(tmp_path, monkeypatch):
    """sft.reset_every: epoch, lr_schedule: constant, adam_betas: [0.9, 0.999] is Coconut's run.py: a new AdamW at
    every epoch (within a stage too), torch's default betas, the lr constant from the first step."""
    import torch

    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training import sft
    from dgrpo.training.schedules import constant_lr_at

    from conftest import tiny_config

    assert [constant_lr_at(s, 1e-4, 0) for s in (0, 7)] == [1e-4, 1e-4]
    assert [constant_lr_at(s, 1.0, 4) for s in (0, 3, 9)] == [0.25, 1.0, 1.0]
    runpy = {"sft.reset_every": "epoch", "sft.lr_schedule": "constant", "sft.adam_betas": "[0.9, 0.999]"}
    cfg = tiny_config(**runpy, **{"task.n_train": 64, "sft.batch_size": 32, "sft.warmup_steps": 0})
    assert [Curriculum(cfg, 2).schedule_length(k) for k in range(2)] == [2, 2]  # an epoch's steps
    made: list[torch.optim.Optimizer] = []
    monkeypatch.setattr(
        sft,
        "new_optimizer",
        lambda params, c, previous=None, warn=True: (
            made.append(torch.optim.AdamW(params, betas=tuple(c.sft.adam_betas))) or made[-1]
        ),
    )
    lm = load_model(cfg.model, cfg.task, seed=0)
    sft.train_sft(lm, generate_split(cfg.task, "train"), cfg, tmp_path / "run", log=lambda *a: None, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if '"lr"' in x]
    assert cfg.sft.num_epochs == 4 and len(made) == 1 + 4  # the state a resume loads into, then one per epoch
    assert all(o.param_groups[0]["betas"] == (0.9, 0.999) for o in made)
    assert {r["lr"] for r in rows} == {cfg.sft.lr} and {r["epoch"] for r in rows} == {0, 1, 2, 3}


def test_grpo_recipe_uses_the_papers_kl_form():
    """Eq. 6 as the paper writes it (x = log pi - log pi_ref); the library default is the ablation file."""
    assert load_config(Config, "paper/grpo_dropout.yaml").grpo.kl_form == "paper"
    assert load_config(Config, "paper/grpo_kl_unbiased.yaml").grpo.kl_form == "unbiased"
    assert Config().grpo.kl_form == "unbiased"


def test_the_recipes_advice_for_smaller_cards_follows_the_out_of_memory_message():
    """grpo_dropout.yaml's advice for 40-48 GiB cards names the levers in the order a run out of memory gives them
    (README too): the memory held between steps (the latent chain's pool, then the kept decoders), then half the
    micro-batch. It named the chain, then 256, leaving out grpo.keep_graphs (3.5 GiB)."""
    from types import SimpleNamespace

    from dgrpo.training.grpo import GRPOTrainer
    from dgrpo.training.wording import command_line_words

    text = resolve_config_path("paper/grpo_dropout.yaml").read_text()
    entry = text.split("\n  micro_batch_size:", 1)[1].split("\n  recompute:", 1)[0]
    comment = " ".join(" ".join(line.split("#", 1)[1] for line in entry.splitlines()).split())
    advice = comment.split("40-48 GiB cards")[1]
    with command_line_words():  # (the recipe's comment names the settings as --set does)
        held = GRPOTrainer._held_memory(SimpleNamespace(chain_latents=True, keep_graphs=True))
    levers = [f"{key} {value}" for key, value in re.findall(r"grpo\.(\w+)=(\w+)", held)]
    half = load_config(Config, "paper/grpo_dropout.yaml").grpo.micro_batch_size // 2
    assert levers == ["update_latent_graphs false", "keep_graphs false"], held
    where = [advice.find(lever) for lever in [*levers, f"then {half}"]]
    assert -1 not in where and where == sorted(where), (where, advice)


@pytest.mark.slow
def test_paper_recipe_runs_two_steps_with_a_tiny_model(tmp_path, tokenizer):
    base = tmp_path / "tiny-qwen2"  # a plain HF checkpoint: no latent tokens yet, as the hub model would be
    build_tiny_model(
        "qwen2", len(tokenizer), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64
    ).save_pretrained(base)
    tokenizer.save_pretrained(base)

    sft = tmp_path / "sft"
    r = dgrpo(
        "sft",
        "--config",
        resolve_config_path("paper/sft_coconut.yaml"),
        "--out",
        sft,
        "--set",
        f"model.name_or_path={base}",
        *sets(
            {**TINY_DATA, "sft.batch_size": 32, "sft.epochs_per_stage": 1, "sft.num_epochs": 4, "sft.warmup_steps": 1}
        ),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    latent = json.loads((sft / "final" / "latent_config.json").read_text())
    # one epoch per stage: stages 0, 1, 2, then the recipe's all-latent stage 3, which thinks with the paper's T = 6
    assert latent["c_thought"] == 3 and latent["stage"] == 3 and latent["n_latent"] == 6
    sft_cfg = json.loads((sft / "config.json").read_text())
    assert sft_cfg["sft"]["grad_accum"] == 4 and sft_cfg["model"]["dtype"] == "bfloat16"

    grpo = tmp_path / "grpo"
    r = dgrpo(
        "grpo",
        "--config",
        resolve_config_path("paper/grpo_dropout.yaml"),
        "--init",
        sft,
        "--out",
        grpo,
        *sets(
            {
                **TINY_DATA,
                "grpo.steps": 2,
                "grpo.prompts_per_step": 2,
                "grpo.max_new_tokens": 16,
                "grpo.warmup_steps": 1,
                "grpo.eval_every": 1,
                "eval.max_new_tokens": 16,
            }
        ),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "adamw8bit" in r.stderr  # the 8-bit optimizer needs CUDA: a clear warning, then torch AdamW
    cfg = json.loads((grpo / "config.json").read_text())
    g, p = cfg["grpo"], cfg["perturbation"]
    assert (g["group_size"], g["lr"], g["eps_low"], g["eps_high"], g["beta0"], g["huber_delta"]) == (
        32,
        1e-5,
        0.1,
        0.12,
        5e-3,
        5.0,
    )
    assert (g["alpha_min"], g["alpha_max"], g["ref_renewal_every"], g["optimizer"], g["replay"]) == (
        0.2,
        0.95,
        500,
        "adamw8bit",
        "seed",
    )
    assert (p["kind"], p["p"], p["sites"]) == ("locked", 0.1, ["attn"])
    assert g["kl_form"] == "paper"
    steps = [json.loads(x) for x in (grpo / "metrics.jsonl").read_text().splitlines() if '"reward_mean"' in x]
    assert [s["step"] for s in steps] == [0, 1]
    assert all(s["n_rollouts_kept"] % 32 == 0 for s in steps)  # whole groups of K = 32 rollouts
    assert (grpo / "final" / "model.safetensors").exists()
    assert json.loads((grpo / "final" / "latent_config.json").read_text())["n_latent"] == 6
