"""`dgrpo demo --quick`: the whole pipeline, its files, its table, and the paper's structural claim."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_quick(tmp_path):
    out = tmp_path / "demo"
    r = subprocess.run(
        [sys.executable, "-m", "dgrpo", "demo", "--quick", "--out", str(out), "--set", "threads=2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    for f in ("results.json", "results.md", "eval_accuracy.png", "reward_std.png"):
        assert (out / f).exists(), f
    res = json.loads((out / "results.json").read_text())
    arms = {"sft", "grpo_deterministic", "reinforce_ema", "grpo_sampling", "dropout_grpo", "dropout_grpo_mc_vote"}
    assert set(res["arms"]) == arms
    for arm in arms:
        for split in ("test", "ood_steps", "ood_numbers"):
            d = res["arms"][arm][split]
            assert 0.0 <= d["mean"] <= 1.0 and d["n"] > 0 and len(d["per_seed"]) == 1
    table = (out / "results.md").read_text()
    assert "Coconut + Dropout-GRPO (ours)" in table and "Coconut + GRPO (deterministic rollout)" in table
    det = [v for run in res["reward_std_trace"]["grpo_deterministic"] for _, v in run]
    ours = [v for run in res["reward_std_trace"]["dropout_grpo"] for _, v in run]
    assert det and all(v == 0.0 for v in det)  # deterministic rollouts: identical within every group
    assert any(v > 0.0 for v in ours)  # shared-mask dropout: diversity
    # deterministic GRPO never updates, so it stays exactly at the SFT accuracy
    for split in ("test", "ood_steps", "ood_numbers"):
        assert res["arms"]["grpo_deterministic"][split]["mean"] == res["arms"]["sft"][split]["mean"]
        assert res["arms"]["grpo_deterministic"][split]["flips_vs_sft"] == [[0, 0]]  # not one item changes
    assert "Coconut SFT scores" in r.stdout
    assert "Paired with the SFT checkpoint" in table


def test_paired_difference_against_hand_computed_values():
    import math

    import pytest

    from dgrpo.demo import flips, paired_diff

    assert flips([True, False, True, False], [True, True, False, False]) == [1, 1]
    d, se = paired_diff(3, 1, 10)  # d_i: three +1, one -1, six 0 -> mean 0.2, var 0.4 - 0.04
    assert d == pytest.approx(0.2) and se == pytest.approx(math.sqrt(0.36 / 10))
    with pytest.raises(ValueError):
        flips([True], [True, False])
