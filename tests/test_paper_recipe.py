"""The paper's full-scale recipe (paper/ configs) runs end to end on CPU: a tiny plain HF checkpoint stands in for
Qwen2.5-1.5B and the built-in task for GSM8K-Aug / GSM-Hard, both through ``--set``; every other setting is the
recipe's own (c = 3, stages 0..2 -> T = 6, grad_accum 4, bf16 weights, K = 32, p = 0.1 on attention, clip
0.10/0.12, annealed beta, Huber delta 5, filter [0.2, 0.95], reference renewal, adamw8bit -> AdamW on CPU)."""

import json

import pytest

from dgrpo.config import resolve_config_path
from dgrpo.model.tiny import build_tiny_model

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
            {**TINY_DATA, "sft.batch_size": 32, "sft.epochs_per_stage": 1, "sft.num_epochs": 3, "sft.warmup_steps": 1}
        ),
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    latent = json.loads((sft / "final" / "latent_config.json").read_text())
    assert latent["c_thought"] == 3 and latent["stage"] == 2 and latent["n_latent"] == 6  # the paper's T = 6
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
    steps = [json.loads(x) for x in (grpo / "metrics.jsonl").read_text().splitlines() if '"reward_mean"' in x]
    assert [s["step"] for s in steps] == [0, 1]
    assert all(s["n_rollouts_kept"] % 32 == 0 for s in steps)  # whole groups of K = 32 rollouts
    assert (grpo / "final" / "model.safetensors").exists()
    assert json.loads((grpo / "final" / "latent_config.json").read_text())["n_latent"] == 6
