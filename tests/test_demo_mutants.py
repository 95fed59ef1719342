"""Mutation tests of the demo (demo/stats.py, demo/report.py, demo/pipeline.py): each test kills mutants that
tests/test_demo.py and tests/test_demo_stats.py let live. The statistics against closed forms and hand-computed
values, the report's files and figures from stand-in stage results, and the pipeline's pieces with its training and
evaluation replaced by stand-ins (the real demo takes minutes)."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from dgrpo.config import Config, to_dict
from dgrpo.demo import report
from dgrpo.demo.report import (
    command_line,
    comparison_table,
    results_markdown,
    sft_table,
    summary_paragraph,
    write_results,
)
from dgrpo.demo.stats import CLAIMS, betainc, claim_verdicts, compare, t_quantile, verdict

T, F = True, False


# --- statistics -------------------------------------------------------------------------------------------------


def test_an_interval_of_a_greater_claim_reaching_0_from_below_does_not_contradict_it():
    """A > B is contradicted only when the interval of A - B lies strictly below 0: [-2, 0] keeps A = B possible
    (the mirror of [0, 2], which does not resolve it)."""
    assert verdict("greater", -2.0, 0.0) == "not resolved"
    assert verdict("greater", -2.0, -1e-9) == "contradicted"


def binomial_tail(a: int, b: int, x: float) -> float:
    """I_x(a, b) for integers a, b: P(Binomial(a + b - 1, x) >= a)."""
    n = a + b - 1
    return math.fsum(math.comb(n, j) * x**j * (1 - x) ** (n - j) for j in range(a, n + 1))


@pytest.mark.parametrize(("a", "b", "x"), [(40, 40, 0.3), (40, 40, 0.49), (40, 40, 0.6), (60, 25, 0.7), (7, 90, 0.05)])
def test_betainc_of_large_parameters_matches_the_binomial_tail(a, b, x):
    """Parameters of tens (the t CDF of tens of degrees of freedom) need tens of terms of the continued fraction,
    near the switch point x = (a + 1) / (a + b + 2) most: each against the exact binomial sum."""
    assert betainc(a, b, x) == pytest.approx(binomial_tail(a, b, x), abs=1e-12)


def test_t_quantile_reaches_far_tails():
    """df 1 (Cauchy): the 1 - 1e-5 quantile is tan(pi (1/2 - 1e-5)) = 31830.99 (a bisection capped at 1e3 said 1e3)."""
    p = 1 - 1e-5
    assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-6)
    assert t_quantile(1 - p, 1) == pytest.approx(-math.tan(math.pi * (p - 0.5)), rel=1e-6)


# --- the report -------------------------------------------------------------------------------------------------


def test_a_comparison_without_pairs_is_left_out_of_the_table():
    """With only some arms run (``valid_demo.py --arms``), the other comparisons have no pairs: no row for them (a
    row of "no pairs" read their missing counts)."""
    c = compare({(0, 0): [T, T, F, F]}, {0: [T, F, F, F]})
    none = {"a": "grpo_null", "b": "sft", "checkpoint": "best", "split": "test", "pairs": [], "n_pairs": 0}
    rows = [{"a": "dropout_grpo", "b": "sft", "checkpoint": "best", "split": "test", **c}, none]
    table = comparison_table({"analysis": {"comparisons": rows}}, "test")
    assert table[2:] == ["| Dropout-GRPO vs SFT | best-valid | +25.00 no interval (1 SFT seed) | 1 | +1 / -0 (n=4) |"]


def test_the_sft_table_marks_a_seed_without_a_dropout_grpo_pair():
    """SFT seed 1 has no Dropout-GRPO run: its difference cells say "-" (they were empty)."""
    sft = {
        s: {"arm": "sft", "sft_seed": s, "valid_accuracy": 0.5, "splits": {"test": {"accuracy": 0.25}}} for s in (0, 1)
    }
    c = compare({(0, 0): [T, T, F, F]}, {0: [T, F, F, F], 1: [T, F, F, F]})
    comparisons = [{"a": "dropout_grpo", "b": "sft", "checkpoint": k, "split": "test", **c} for k in ("best", "final")]
    res = {
        "splits": {"test": 4},
        "headline": "test",
        "models": list(sft.values()),
        "analysis": {"comparisons": comparisons},
    }
    assert sft_table(res)[2:] == [
        "| 0 | 50.0% | 25.00% | +25.00 / +25.00 | - / - |",
        "| 1 | 50.0% | 25.00% | - / - | - / - |",
    ]


def exact_claim_results() -> dict:
    """Results whose claim 1 is resolved at the best-valid checkpoint (every item equal) and not at the final one
    (one item lost in one pair of two)."""
    sft = {0: [T, F, F], 1: [T, T, F]}
    det = {"best": {(0, 0): [T, F, F], (1, 0): [T, T, F]}, "final": {(0, 0): [T, F, F], (1, 0): [T, F, F]}}
    comparisons = [
        {"a": "grpo_deterministic", "b": "sft", "checkpoint": k, "split": "test", **compare(det[k], sft)} for k in det
    ]
    claims = claim_verdicts(comparisons, {"grpo_deterministic": 0.0}, "test")
    analysis = {"claims": claims, "accuracy": {"test": {"sft": {"final": [1 / 3, 2 / 3]}}}}
    analysis["reward_std_max"] = {"grpo_deterministic": 0.0}
    return {"analysis": analysis, "headline": "test", "n_sft": 2, "n_rl": 1, "splits": {"test": 3}} | {
        "wall_s": {"total": 1.0}
    }


def test_summary_gives_claim_1_at_the_best_valid_checkpoint():
    """summary.txt's claim 1 is the paper's protocol, the best-valid checkpoint: its verdict and its items, not the
    final checkpoint's (not resolved, 0.5 items lost per pair)."""
    summary = summary_paragraph(exact_claim_results())
    assert (
        "(1) deterministic GRPO = SFT exactly: resolved (0 items gained and 0 lost per pair; reward std identically 0)"
        in summary
    )


def test_the_figures_group_runs_by_arm_and_mark_the_sft_mean(monkeypatch):
    """eval_accuracy.png: every arm with runs (by its short name, in SHORT's order; none for an arm without runs),
    the SFT checkpoints' mean validation accuracy as the reference; reward_std.png the std and kept panels."""
    calls = []
    monkeypatch.setattr(report.plotting, "load_run", lambda d: f"run:{d}")
    monkeypatch.setattr(report.plotting, "plot_runs", lambda groups, out, **kw: calls.append((groups, out, kw)) or out)
    monkeypatch.setattr(report.plotting, "describe", lambda desc: f"drew {Path(desc).name}")
    runs = [
        {"arm": "dropout_grpo", "dir": "d0"},
        {"arm": "grpo_null", "dir": "n0"},
        {"arm": "dropout_grpo", "dir": "d1"},
    ]
    models = [{"arm": "sft", "valid_accuracy": v} for v in (0.2, 0.3)] + [
        {"arm": "dropout_grpo", "valid_accuracy": 0.9}
    ]
    out = Path("o")
    said = report.plot_figures({"runs": runs, "models": models}, out)
    assert said == ["drew eval_accuracy.png", "drew reward_std.png"]
    groups = {"null control": ["run:n0"], "Dropout-GRPO": ["run:d0", "run:d1"]}
    assert [(g, o) for g, o, _ in calls] == [(groups, out / "eval_accuracy.png"), (groups, out / "reward_std.png")]
    assert list(calls[0][0]) == ["null control", "Dropout-GRPO"]  # (SHORT's order, whatever the runs' order)
    assert calls[0][2] == {"panels": ("eval",), "reference": {"Coconut SFT (mean of 2 seeds)": pytest.approx(0.25)}}
    assert calls[1][2] == {"panels": ("reward_std", "kept")}
    calls.clear()
    report.plot_figures({"runs": runs, "models": models[:1]}, out)
    assert calls[0][2]["reference"] == {"Coconut SFT (1 seed)": 0.2}


def stand_in_demo(tmp_path: Path) -> SimpleNamespace:
    """A finished demo of 1 SFT seed and one Dropout-GRPO run, its test splits listed headline first."""

    def model(items: str, **ident) -> dict:
        return {**ident, "splits": {s: {"accuracy": items.count("1") / 4, "items": items} for s in ("test", "shift")}}

    models = [model("1000", arm="sft", sft_seed=0, rl_seed=None, checkpoint="sft", valid_accuracy=0.25)]
    models += [
        model(v, arm="dropout_grpo", sft_seed=0, rl_seed=0, checkpoint=k)
        for k, v in (("best", "1100"), ("final", "1000"))
    ]
    keys = ("reward_std", "frac_groups_kept", "distinct_answers", "reward_mean")
    run = {"arm": "dropout_grpo", "sft_seed": 0, "rl_seed": 0, "dir": "x", "reward_std_max": 0.5, "updates": 3}
    runs = [run | dict.fromkeys(keys, [0.5, 0.25]) | {"best_step": 2}]
    base = Config()
    base.grpo.steps = 3
    tests = {"test": [None] * 4, "shift": [None] * 4}
    return SimpleNamespace(
        base=base,
        out=tmp_path,
        valid=[None] * 7,
        tests=tests,
        models=models,
        runs=runs,
        wall={"total": 1.0},
        read_back=[],
    )


def test_write_results_writes_the_files_from_the_demo(tmp_path, monkeypatch, capsys):
    """results.json holds the demo's facts (the headline split is the first test split, the validation problems'
    count, the RL steps, the base config), results.md and summary.txt what the report functions write from it (the
    summary a line), and the figures' lines are said unless ``quiet``."""
    monkeypatch.setattr(report, "plot_figures", lambda res, out: ["figure one", "figure two"])
    demo = stand_in_demo(tmp_path)
    res = write_results(demo, "dgrpo demo", 1, 1)
    assert capsys.readouterr().out == "[demo] figure one\n[demo] figure two\n"
    stored = json.loads((tmp_path / "results.json").read_text())
    assert stored == json.loads(json.dumps(res))
    assert (stored["headline"], stored["n_valid"], stored["steps"], stored["splits"]) == (
        "test",
        7,
        3,
        {"test": 4, "shift": 4},
    )
    assert stored["config"] == json.loads(json.dumps(to_dict(demo.base))) and stored["config"]["grpo"]["steps"] == 3
    assert [c["verdict"] for c in stored["analysis"]["claims"]] == ["not resolved"] * 2 * len(CLAIMS)
    assert (tmp_path / "results.md").read_text() == results_markdown(res)
    assert (tmp_path / "summary.txt").read_text() == summary_paragraph(res) + "\n"
    write_results(demo, "dgrpo demo", 1, 1, quiet=True)
    assert capsys.readouterr().out == ""


def test_the_command_line_gives_full_sft_seeds_and_a_scripts_own_options_before_out():
    """``--full --sft-seeds 3`` (and ``--workers`` when given) are written back, and a script's own options
    (``extra``) come before ``--out``."""
    args = SimpleNamespace(quick=False, full=True, sft_seeds=3, seeds=None, config=[], overrides=[], out="runs/a b")
    assert command_line(args, "python experiments/valid_demo.py", ["--arms dropout_grpo"]) == (
        "python experiments/valid_demo.py --full --sft-seeds 3 --arms dropout_grpo --out 'runs/a b'"
    )
    args.workers = 2  # (it sets each task's threads, so the last float bits: it was left out)
    assert command_line(args) == "dgrpo demo --full --sft-seeds 3 --workers 2 --out 'runs/a b'"


# --- the pipeline's pieces --------------------------------------------------------------------------------------


def test_the_shifted_split_is_one_operation_shorter_and_half_the_test_problems():
    """The built-in task of 4 operations: a "3 operations" split of n_test // 2 problems of 3 steps, listed after
    the headline ``test`` split (the claims are judged on the first); a 2-step task's is "1 operation" (singular),
    and a 1-step task's the 1-step chain itself."""
    from dgrpo.config import TaskConfig
    from dgrpo.data.synthetic import generate_split
    from dgrpo.demo.pipeline import demo_splits, shifted_split

    task = TaskConfig(n_train=10, n_valid=10, n_test=11)
    splits = demo_splits(task)
    assert list(splits) == ["test", "3 operations"]
    assert len(splits["test"]) == 11 and len(splits["3 operations"]) == 5
    assert {len(r.steps) for r in splits["3 operations"]} == {3} and {len(r.steps) for r in splits["test"]} == {4}
    assert splits["test"] == generate_split(task, "test")
    assert [(n, len(recs)) for n, recs in (shifted_split(TaskConfig(n_steps=k, n_test=3)) for k in (2, 1))] == [
        ("1 operation", 1),
        ("1 operation", 1),
    ]
    assert {len(r.steps) for r in shifted_split(TaskConfig(n_steps=1, n_test=3))[1]} == {1}


def test_the_validation_split_is_cut_to_eval_limit():
    """``data.eval_limit`` N: the first N validation problems (every periodic evaluation reads them); unset: all."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.demo.pipeline import valid_split

    cfg = Config()
    cfg.task.n_valid = 9
    assert valid_split(cfg) == generate_split(cfg.task, "valid")
    cfg.data.eval_limit = 4
    assert valid_split(cfg) == generate_split(cfg.task, "valid")[:4]


def test_items_are_one_character_per_item():
    """Per-item correctness as 0/1, one character per item (results.json), read back by items_of."""
    from dgrpo.demo.pipeline import items_of, items_str

    assert items_str([T, F, F, T]) == "1001" and items_of("1001") == [T, F, F, T]
    assert items_str(iter([F, F])) == "00"


def test_each_sft_and_rl_seed_pair_gets_its_own_rl_seed():
    """rl_seed is 100 x SFT seed + r: distinct over 4 SFT seeds x 100 RL seeds (what --seeds allows)."""
    from dgrpo.demo.pipeline import MAX_RL_SEEDS, rl_seed

    seeds = [rl_seed(s, r) for s in range(4) for r in range(MAX_RL_SEEDS)]
    assert len(set(seeds)) == len(seeds) and (rl_seed(0, 0), rl_seed(2, 7)) == (0, 207)


def test_an_arms_config_has_its_seed_and_reinforce_the_grouped_arms_rollout_budget():
    """Each arm's config carries the run's seed; REINFORCE (K = 1, EMA baseline) gets prompts_per_step x K of the base
    config (the grouped arms' rollouts per step), the grouped arms keep their own."""
    from dgrpo.demo.pipeline import arm_config

    base = Config()
    base.grpo.prompts_per_step, base.grpo.group_size = 3, 4
    cfgs = {arm: arm_config(base, arm, 17) for arm in ("reinforce_ema", "dropout_grpo", "grpo_sampling")}
    assert {c.seed for c in cfgs.values()} == {17} and base.seed != 17
    assert (cfgs["reinforce_ema"].grpo.group_size, cfgs["reinforce_ema"].grpo.prompts_per_step) == (1, 12)
    assert [(c.grpo.group_size, c.grpo.prompts_per_step) for c in (cfgs["dropout_grpo"], cfgs["grpo_sampling"])] == [
        (4, 3),
        (4, 3),
    ]


def test_same_weights_needs_every_parameter_equal_to_the_bit():
    """Equal parameters: the same greedy answers; one value off by 1e-6, or another set of parameters, is not."""
    import torch

    from dgrpo.model.verified import same_weights

    torch.manual_seed(0)
    a = torch.nn.Linear(3, 2)
    b = torch.nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    assert same_weights(a, b)
    with torch.no_grad():
        b.bias[0] += 1e-6
    assert not same_weights(a, b)
    c = torch.nn.Linear(3, 2, bias=False)
    c.weight.data.copy_(a.weight.data)
    assert not same_weights(a, c) and not same_weights(c, a)


def write_metrics(run_dir: Path, rows: list[dict]) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_run_diagnostics_by_hand(tmp_path):
    """12 training steps (evaluation rows between them are not steps): the reward std's maximum (not its last), the
    steps that updated (one skipped), and means over the first 10 and the last 10 steps, of the values logged."""
    from dgrpo.demo.pipeline import run_diagnostics

    rows = []
    for step in range(12):
        std = None if step == 0 else [0.1, 0.9, 0.2][step % 3]
        rows.append({"step": step, "reward_mean": step / 10, "reward_std": std, "skipped": int(step == 5)})
        rows[-1] |= {"frac_groups_kept": 1.0 if step < 6 else 0.5, "distinct_answers": float(step)}
        if step % 4 == 3:
            rows.append({"step": step, "eval/valid/accuracy": 0.5})
    d = run_diagnostics(write_metrics(tmp_path / "run", rows))
    assert d["reward_std_max"] == 0.9 and d["updates"] == 11
    assert d["distinct_answers"] == [pytest.approx(4.5), pytest.approx(6.5)]  # steps 0-9, steps 2-11
    assert d["frac_groups_kept"] == [pytest.approx(0.8), pytest.approx(0.7)]
    # steps 1-9's std (step 0 logged none): 0.9, 0.2, 0.1 three times; steps 2-11: 0.2, 0.1, 0.9 x 3, and 0.2
    assert d["reward_std"] == [pytest.approx(3.6 / 9), pytest.approx(3.8 / 10)]
    assert d["reward_mean"] == [pytest.approx(0.45), pytest.approx(0.65)]


def test_an_sft_runs_validation_accuracy_is_its_last_evaluation(tmp_path):
    """The SFT checkpoint's validation accuracy is the run's last evaluation row (the end of its final stage), none
    without one."""
    from dgrpo.demo.pipeline import _last_eval

    rows = [{"step": 1, "loss": 1.0}, {"step": 1, "eval/valid/accuracy": 0.2}, {"step": 2, "loss": 0.5}]
    rows += [{"step": 2, "eval/valid/accuracy": 0.4}]
    assert _last_eval(write_metrics(tmp_path / "a", rows)) == 0.4
    assert _last_eval(write_metrics(tmp_path / "b", rows[:1])) is None


class StandIn:
    """The RL stage replaced: a model is a one-parameter torch module whose value decides its test answers (value
    v: the first v of 4 items right); ``train_grpo`` keeps a best/ checkpoint of ``best_value`` at ``best_step``."""

    def __init__(self, monkeypatch, tmp_path: Path, best_step, best_value=None, final_value: float = 2.0):
        import torch

        from dgrpo.demo import pipeline

        self.loaded: list[str] = []
        self.tested: list[float] = []  # the weight of each model evaluated on test

        def model(v: float) -> torch.nn.Module:
            m = torch.nn.Linear(1, 1, bias=False)
            m.weight.data.fill_(v)
            return m

        def from_pretrained(path):
            self.loaded.append(Path(path).name)
            return model(1.0 if Path(path).name == "final" else best_value)  # (SFT's checkpoint: 1 item right)

        def train_grpo(policy, cfg, train, run_dir, **kw):
            policy.weight.data.fill_(final_value)
            if best_value is not None:
                (run_dir / "best").mkdir(parents=True)
            return {"best_step": best_step}

        def evaluate(lm, recs, **kw):
            self.tested.append(lm.weight.item())
            k = int(lm.weight.item())
            return SimpleNamespace(accuracy=k / 4, predictions=[{"correct": i < k} for i in range(4)])

        monkeypatch.setattr(pipeline.LatentLM, "from_pretrained", staticmethod(from_pretrained))
        monkeypatch.setattr(pipeline, "train_grpo", train_grpo)
        monkeypatch.setattr(pipeline, "evaluate", evaluate)
        monkeypatch.setattr(pipeline, "run_diagnostics", lambda run_dir: {"reward_std_max": 0.0})
        base = Config()
        base.grpo.steps = 6
        self.demo = pipeline.Demo(base, tmp_path, [], [], {"test": [None] * 4})  # type: ignore[list-item]
        pipeline.run_arm(self.demo, "dropout_grpo", 1, 2, tmp_path / "sft" / "seed1" / "final")
        self.rows = {m["checkpoint"]: (m["step"], m["splits"]["test"]["items"]) for m in self.demo.models}


@pytest.mark.parametrize(
    ("best_step", "best_value", "best", "read", "tested"),
    [
        (3, 3.0, (3, "1110"), ["final", "best"], [2.0, 3.0]),  # an earlier best checkpoint: tested on its own
        (3, 2.0, (3, "1100"), ["final", "best"], [2.0]),  # the same weights as the final model: its answers, its step
        (6, 2.0, (6, "1100"), ["final"], [2.0]),  # the best is the last step: the final model, best/ not read
        (None, None, (6, "1100"), ["final"], [2.0]),  # none kept: the final model, at the last step
    ],
)
def test_an_rl_runs_best_checkpoint_is_tested_only_when_it_differs(
    monkeypatch, tmp_path, best_step, best_value, best, read, tested
):
    """run_arm records the final model (step = grpo.steps) and the best-valid one: tested when best/ is an earlier,
    different model, else the final model's answers under the best's step; the run's row carries that step, and
    the run lives in arms/<arm>/sft<SFT seed>_rl<r>."""
    run = StandIn(monkeypatch, tmp_path, best_step, best_value)
    assert run.rows == {"final": (6, "1100"), "best": best} and run.loaded == read
    assert run.tested == tested  # (a best/ of the final model's weights is not read out on test again)
    assert [(m["arm"], m["sft_seed"], m["rl_seed"]) for m in run.demo.models] == [("dropout_grpo", 1, 2)] * 2
    assert run.demo.runs == [
        {
            "arm": "dropout_grpo",
            "sft_seed": 1,
            "rl_seed": 2,
            "dir": str(tmp_path / "arms" / "dropout_grpo" / "sft1_rl2"),
        }
        | {"reward_std_max": 0.0, "best_step": best[0]}
    ]
    assert list(run.demo.wall) == ["dropout_grpo/sft1_rl2"]


def test_the_in_process_pipeline_runs_each_seeds_sft_then_its_arms_and_reports_after_each_seed(monkeypatch, tmp_path):
    """workers = 1: SFT seed 0, its RL runs (only ``arms``, each from its own SFT checkpoint), then seed 1;
    ``after_seed`` gets the seeds done so far after each."""
    from dgrpo.demo import pipeline

    done, said = [], []
    monkeypatch.setattr(pipeline, "run_sft", lambda demo, s: done.append(("sft", s)))
    monkeypatch.setattr(pipeline, "run_arm", lambda demo, arm, s, r, ckpt: done.append((arm, s, r, ckpt)))
    demo = pipeline.Demo(Config(), tmp_path, [], [], {})
    pipeline.run_pipeline(
        demo, 2, 2, arms=["grpo_null"], after_seed=lambda seeds: said.append((list(seeds), len(done)))
    )
    ckpt = [tmp_path / "sft" / f"seed{s}" / "final" for s in (0, 1)]
    assert done == [
        ("sft", 0),
        ("grpo_null", 0, 0, ckpt[0]),
        ("grpo_null", 0, 1, ckpt[0]),
        ("sft", 1),
        ("grpo_null", 1, 0, ckpt[1]),
        ("grpo_null", 1, 1, ckpt[1]),
    ]
    assert said == [([0], 3), ([0, 1], 6)]


def demo_args(tmp_path: Path, *sets: str, seeds=None, sft_seeds=None, quick=True, full=False) -> SimpleNamespace:
    return SimpleNamespace(
        quick=quick,
        full=full,
        config=[],
        overrides=list(sets),
        seeds=seeds,
        sft_seeds=sft_seeds,
        out=str(tmp_path / "o"),
    )


def test_demo_config_takes_its_bounds_inclusive(tmp_path):
    """--seeds 100 (MAX_RL_SEEDS) and grpo.warmup_steps = grpo.steps (best/ kept from the last step's evaluation on)
    are accepted; --seeds 0 is refused; --sft-seeds and --seeds are read, each preset's counts otherwise."""
    from dgrpo.config import ConfigError
    from dgrpo.demo.pipeline import demo_config

    assert demo_config(demo_args(tmp_path, seeds=100, sft_seeds=3))[1:] == (3, 100)
    assert demo_config(demo_args(tmp_path))[1:] == (2, 1)  # --quick: 2 SFT seeds x 1 RL seed
    assert demo_config(demo_args(tmp_path, quick=False, full=True))[1:] == (4, 1)  # --full: 4 SFT seeds (README)
    assert demo_config(demo_args(tmp_path, quick=False))[1:] == (1, 1)
    assert demo_config(demo_args(tmp_path, "grpo.warmup_steps=4"))[0].grpo.warmup_steps == 4  # (tiny: 4 steps)
    with pytest.raises(ConfigError, match="grpo.warmup_steps=5 is past grpo.steps=4"):  # (one past: no best/)
        demo_config(demo_args(tmp_path, "grpo.warmup_steps=5"))
    with pytest.raises(ConfigError, match="--sft-seeds and --seeds must be >= 1, got 2 and 0"):
        demo_config(demo_args(tmp_path, seeds=0))


def test_the_default_workers_are_one_per_cpu_and_one_on_an_accelerator(monkeypatch):
    """CPU: one worker per CPU the process may use; cuda or mps: 1 (the processes would share it)."""
    from dgrpo.demo import pipeline

    monkeypatch.setattr(pipeline, "available_cpus", lambda: 6)
    cfg = Config()
    for device, workers in (("cpu", 6), ("cuda", 1), ("cuda:1", 1), ("mps", 1)):
        cfg.device = device
        assert pipeline.default_workers(cfg) == workers, device


def test_the_periodic_evaluation_counts_correct_answers_at_the_runs_latent_count(monkeypatch):
    """Demo.count_correct (SFT's and RL's validation): greedy at the stage's n_latent when the trainer gives its
    settings, the model's own count otherwise; the demo's seed and eval settings."""
    from dgrpo.demo import pipeline

    calls = []

    def evaluate(lm, recs, **kw):
        calls.append(kw)
        return SimpleNamespace(correct=len(recs) - 1)

    monkeypatch.setattr(pipeline, "evaluate", evaluate)
    demo = pipeline.Demo(Config(), Path("o"), [], [], {})
    assert demo.count_correct(None, [1, 2, 3], SimpleNamespace(n_latent=2)) == 2
    assert demo.count_correct(None, [1, 2]) == 1
    assert [c["n_latent"] for c in calls] == [2, None]
    assert all(c["seed"] == demo.base.seed and c["progress"] is False for c in calls)


def test_an_sft_seed_is_trained_tested_and_recorded_as_the_sft_checkpoint(monkeypatch, tmp_path):
    """run_sft: the seed's model trained into sft/seed<s>, its final checkpoint tested (arm sft, checkpoint "sft",
    no RL seed), and its validation accuracy the run's last evaluation (eval_each_stage) or, without one, counted."""
    import torch

    from dgrpo.demo import pipeline

    trained = []

    def train_sft(lm, train, cfg, out, **kw):
        trained.append((cfg.seed, out))
        write_metrics(
            out,
            [
                {"step": 1, "loss": 1.0},
                {"step": 1, "eval/valid/accuracy": 0.3},
                {"step": 2, "eval/valid/accuracy": 0.6},
            ],
        )

    model = torch.nn.Linear(1, 1, bias=False)
    model.weight.data.fill_(1.0)
    monkeypatch.setattr(pipeline, "load_model", lambda *a, **kw: model)
    monkeypatch.setattr(pipeline, "train_sft", train_sft)
    monkeypatch.setattr(pipeline.LatentLM, "from_pretrained", staticmethod(lambda path: model))
    monkeypatch.setattr(
        pipeline,
        "evaluate",
        lambda lm, recs, **kw: SimpleNamespace(accuracy=0.5, correct=1, predictions=[{"correct": T}, {"correct": F}]),
    )
    base = Config()
    base.sft.eval_each_stage = True
    demo = pipeline.Demo(base, tmp_path, [], [None] * 4, {"test": [None] * 2})
    assert pipeline.run_sft(demo, 3) == "SFT seed 3: valid 0.600, test 0.500 (0 s)"
    assert (
        trained == [(3, tmp_path / "sft" / "seed3")]
        and pipeline.sft_checkpoint(demo, 3) == tmp_path / "sft/seed3/final"
    )
    row = {"arm": "sft", "sft_seed": 3, "rl_seed": None, "checkpoint": "sft", "valid_accuracy": 0.6}
    assert demo.models == [row | {"splits": {"test": {"accuracy": 0.5, "items": "10"}}}]
    base.sft.eval_each_stage = False
    pipeline.run_sft(demo, 4)
    assert demo.models[-1]["valid_accuracy"] == 0.25  # 1 of the 4 validation problems


def test_run_demo_writes_partial_results_after_each_seed_but_the_last_and_releases_its_out(
    monkeypatch, tmp_path, capsys
):
    """``dgrpo demo --quick --workers 3 --set threads=1``: torch's threads set, the pipeline run with the given
    workers; after SFT seed 0 of 2 the results so far are written quietly, labelled partial; at the end once in full
    and printed; --out's lock is released (a second demo may start); a worker that died is one line, exit code 1."""
    import dgrpo.demo as demo_pkg
    from dgrpo.training.out_dir import RunLock

    writes, ran = [], []

    def run_pipeline(demo, n_sft, n_rl, after_seed, workers):
        ran.append((n_sft, n_rl, workers))
        for s in range(n_sft):
            after_seed(list(range(s + 1)))

    monkeypatch.setattr(demo_pkg, "run_pipeline", run_pipeline)
    monkeypatch.setattr(
        demo_pkg, "write_results", lambda demo, cmd, n_sft, n_rl, quiet=False: writes.append((cmd, n_sft, quiet)) or {}
    )
    monkeypatch.setattr(demo_pkg, "results_markdown", lambda res: "TABLE")
    monkeypatch.setattr(demo_pkg, "summary_paragraph", lambda res: "SUMMARY")
    threads = []
    monkeypatch.setattr(demo_pkg.torch, "set_num_threads", threads.append)
    args = demo_args(tmp_path, "threads=1")
    args.workers = 3
    assert demo_pkg.run_demo(args) == 0
    cmd = demo_pkg.command_line(args)
    assert ran == [(2, 1, 3)] and threads == [1]
    assert writes == [(cmd + "  (partial: SFT seeds 0 of 2)", 1, True), (cmd, 2, False)]
    assert capsys.readouterr().out == "TABLE\nSUMMARY\n"
    RunLock(Path(args.out)).release()  # (the demo's lock is gone)

    def dies(*a, **kw):
        raise demo_pkg.WorkerDied("a worker process of the demo ended abruptly")

    monkeypatch.setattr(demo_pkg, "run_pipeline", dies)
    assert demo_pkg.run_demo(args) == 1
    assert capsys.readouterr().err == "dgrpo: error: a worker process of the demo ended abruptly\n"
    RunLock(Path(args.out)).release()
