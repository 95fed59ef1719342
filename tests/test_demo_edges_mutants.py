"""A second mutation pass over the demo (demo/stats.py, demo/report.py, demo/pipeline.py, demo/task_records.py,
demo/__init__.py): each test kills mutants that the other demo tests let live. Statistics at their edges, the claims'
wording in summary.txt, the arms' reward std as claim 1 reads it, and a demo's records read back from another place,
the stages replaced by stand-ins (the real demo takes minutes)."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

from dgrpo.config import Config
from dgrpo.demo import pipeline, task_records
from dgrpo.demo.report import analyse, summary_paragraph
from dgrpo.demo.stats import betainc, claim_verdicts, compare, t_cdf
from dgrpo.demo.task_records import RECORD, fingerprint, read_record
from dgrpo.model.verified import write_manifest

T, F = True, False


# --- statistics -------------------------------------------------------------------------------------------------


def test_the_t_cdf_of_an_infinite_t_is_0_or_1():
    """I_0(a, b) = 0 and I_1(a, b) = 1: t = +-inf (x = df / (df + t^2) = 0) is the CDF's 1 and 0, t = 0 its 0.5."""
    assert betainc(2.0, 0.5, 0.0) == 0.0 and betainc(2.0, 0.5, 1.0) == 1.0
    assert (t_cdf(math.inf, 3), t_cdf(-math.inf, 3), t_cdf(0.0, 3)) == (1.0, 0.0, 0.5)


# --- the report -------------------------------------------------------------------------------------------------


def summary_results(std: float | None, pairs: bool = True) -> dict:
    """Results of 2 SFT seeds whose deterministic arm answers as SFT (claim 1), with its reward std ``std``; every
    other claim's comparison has no pairs (its arms not run), or, ``pairs`` False, none at all."""
    sft = {0: [T, F, F, F], 1: [T, T, F, F]}
    det = {(s, 0): v for s, v in sft.items()}
    comparisons = [
        {"a": "grpo_deterministic", "b": "sft", "checkpoint": k, "split": "test", **compare(det if pairs else {}, sft)}
        for k in ("best", "final")
    ]
    analysis = {
        "claims": claim_verdicts(comparisons, {"grpo_deterministic": std}, "test"),
        "accuracy": {"test": {"sft": {"final": [0.25, 0.5]}}},
        "reward_std_max": {"grpo_deterministic": std},
    }
    return {"analysis": analysis, "headline": "test", "n_sft": 2, "n_rl": 1, "splits": {"test": 4}, "wall_s": {}} | {
        "wall_s": {"total": 2.0}
    }


def test_a_small_nonzero_reward_std_is_not_called_identically_0():
    """Claim 1 needs a within-group reward std of exactly 0: 1e-4 is said as such (and claim 1 is not resolved),
    only 0 is "identically 0"."""
    small = summary_paragraph(summary_results(1e-4))
    assert (
        "(1) deterministic GRPO = SFT exactly: not resolved (0 items gained and 0 lost per pair; reward std up to "
        "0.0001)" in small
    )
    zero = summary_paragraph(summary_results(0.0))
    assert "resolved (0 items gained and 0 lost per pair; reward std identically 0)" in zero
    assert "reward std not logged" in summary_paragraph(summary_results(None))


def test_the_summary_says_a_claim_without_pairs_has_none():
    """A claim whose arms did not run (``valid_demo.py --arms``) reads "no pairs" in summary.txt, not a number."""
    summary = summary_paragraph(summary_results(0.0))
    assert "(3) Dropout-GRPO > SFT: best-valid checkpoint no pairs not resolved; final no pairs not resolved" in summary
    assert "(1) deterministic GRPO = SFT exactly: not resolved (0 items gained and 0 lost per pair" in (
        summary_paragraph(summary_results(0.0, pairs=False))
    )


def std_demo(stds: list[float | None]) -> SimpleNamespace:
    """2 SFT seeds, the deterministic arm answering as SFT from each, its runs' reward std maxima ``stds``."""
    items = {0: "1000", 1: "1100"}

    def row(v: str, **ident) -> dict:
        return {**ident, "splits": {"test": {"accuracy": v.count("1") / 4, "items": v}}}

    models = [row(v, arm="sft", sft_seed=s) for s, v in items.items()]
    for s, v in items.items():
        models += [row(v, arm="grpo_deterministic", sft_seed=s, rl_seed=0, checkpoint=k) for k in ("best", "final")]
    runs = [{"arm": "grpo_deterministic", "sft_seed": s, "rl_seed": 0, "reward_std_max": v} for s, v in enumerate(stds)]
    return SimpleNamespace(models=models, runs=runs, tests={"test": [None] * 4})


def test_an_arms_reward_std_is_its_runs_largest_and_unknown_when_one_run_logged_none():
    """Claim 1 needs every run's std shown to be 0: a run that logged none leaves the arm's std unknown (None, "not
    logged"), whichever run it is; otherwise the arm's std is its runs' largest."""
    for stds in ([0.0, None], [None, 0.0]):
        an = analyse(std_demo(stds))
        assert an["reward_std_max"] == {"grpo_deterministic": None}
        assert [r["verdict"] for r in an["claims"] if r["id"] == 1] == ["not resolved"] * 2
    an = analyse(std_demo([0.0, 0.0]))
    assert an["reward_std_max"] == {"grpo_deterministic": 0.0}
    assert [r["verdict"] for r in an["claims"] if r["id"] == 1] == ["resolved"] * 2
    assert analyse(std_demo([0.25, 0.5]))["reward_std_max"] == {"grpo_deterministic": 0.5}
    assert analyse(std_demo([0.5, 0.0]))["reward_std_max"] == {"grpo_deterministic": 0.5}


# --- the tasks' records -----------------------------------------------------------------------------------------


def test_a_tasks_fingerprint_changes_with_each_thing_its_results_depend_on(monkeypatch, tmp_path):
    """The same inputs give the same fingerprint; another question, steps or answer of a problem, other settings,
    threads, versions, or another (or no) SFT checkpoint manifest each give another: a record made under them is not
    read back."""
    from dgrpo.data.records import Record

    problem = Record("What is 2 + 3?", ["2 + 3 = 5"], "5")
    ckpt = tmp_path / "final"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"weights")
    write_manifest(ckpt)

    def fp(rec: Record = problem, settings: dict | None = None, threads: int = 1, sft: Path | None = ckpt) -> str:
        return fingerprint(settings or {"seed": 0}, {"test": [rec]}, threads, sft)

    base = fp()
    assert fp() == base and fp(Record("What is 2 + 3?", ["2 + 3 = 5"], "5")) == base
    others = [
        fp(Record("What is 2 + 4?", ["2 + 3 = 5"], "5")),
        fp(Record("What is 2 + 3?", ["2 + 3 = 6"], "5")),
        fp(Record("What is 2 + 3?", ["2 + 3 = 5"], "6")),
        fp(settings={"seed": 1}),
        fp(threads=2),
        fp(sft=None),
        fp(sft=tmp_path / "gone"),
    ]
    (ckpt / "model.safetensors").write_bytes(b"other weights")
    write_manifest(ckpt)
    others.append(fp())
    monkeypatch.setattr(task_records, "versions", lambda: {"torch": "0.0"})
    others.append(fp(sft=None))
    assert len({base, *others}) == 1 + len(others)


def test_a_record_without_a_wall_time_mapping_is_not_read_back(tmp_path):
    """A record of the right fingerprint is read back only whole: models and runs lists and a wall-time mapping (a
    record whose ``wall`` is missing or a list failed the demo where it merged it, instead of running the task)."""
    body = {"fingerprint": "fp", "line": "done", "models": [], "runs": [], "wall": {"sft/seed0": 1.0}}
    (tmp_path / RECORD).write_text(json.dumps(body))
    assert read_record(tmp_path, "fp") == body and read_record(tmp_path, "other") is None
    for wall in ([], None):
        (tmp_path / RECORD).write_text(json.dumps(body | {"wall": wall}))
        assert read_record(tmp_path, "fp") is None
    (tmp_path / RECORD).write_text(json.dumps({k: v for k, v in body.items() if k != "wall"}))
    assert read_record(tmp_path, "fp") is None


# --- the pipeline -----------------------------------------------------------------------------------------------


def test_the_test_and_validation_reads_use_the_configs_eval_settings(monkeypatch):
    """Every test split is read out, and every validation counted, with the config's batch size, generation length
    and scorer (the scorer decides which answers count as right: the claims rest on it)."""
    calls = []

    def evaluate(lm, recs, **kw):
        calls.append(kw)
        return SimpleNamespace(correct=1, accuracy=0.5, predictions=[{"correct": True}, {"correct": False}])

    monkeypatch.setattr(pipeline, "evaluate", evaluate)
    base = Config()
    base.eval.batch_size, base.eval.max_new_tokens, base.eval.scorer = 3, 17, "exact"
    demo = pipeline.Demo(base, Path("o"), [], [], {"test": [None] * 2, "shifted": [None] * 2})
    row = demo.test_model(None, arm="sft", sft_seed=0)
    demo.count_correct(None, [None] * 2)
    assert row["splits"] == {"test": {"accuracy": 0.5, "items": "10"}, "shifted": {"accuracy": 0.5, "items": "10"}}
    assert [c["dataset"] for c in calls[:2]] == ["test", "shifted"] and demo.models == [row]
    assert all((c["batch_size"], c["max_new_tokens"], c["scorer"]) == (3, 17, "exact") for c in calls)
    assert len(calls) == 3


def test_merging_a_seed_keeps_what_was_read_back_and_the_wall_times_in_sft_seed_order(tmp_path):
    """Seed 0's part merged after seed 1's (a pool's finishing order): the tasks read back and the wall times come
    out in SFT-seed order, the demo's total (no seed) last."""
    demo = pipeline.Demo(Config(), tmp_path, [], [], {})
    demo.read_back, demo.wall = ["sft/seed1"], {"sft/seed1": 1.0, "total": 9.0}
    part = pipeline.Demo(Config(), tmp_path, [], [], {})
    part.read_back, part.wall = ["grpo_null/sft0_rl0"], {"sft/seed0": 2.0, "grpo_null/sft0_rl0": 3.0}
    pipeline.merge_seed(demo, part)
    assert demo.read_back == ["grpo_null/sft0_rl0", "sft/seed1"]
    assert list(demo.wall) == ["sft/seed0", "grpo_null/sft0_rl0", "sft/seed1", "total"]


def test_run_demo_resumes_unless_told_never_and_times_the_whole_demo_at_the_end(monkeypatch, tmp_path):
    """``--resume auto`` (or no --resume: the library's callers) reads back finished tasks, ``never`` does not; the
    results at the end carry the whole demo's wall time, the partial ones the time so far (a clock of 5 s a read)."""
    import dgrpo.demo as demo_pkg

    seen, walls = [], []
    clock = iter(range(0, 1000, 5))
    monkeypatch.setattr(demo_pkg, "time", SimpleNamespace(time=lambda: float(next(clock))))
    monkeypatch.setattr(
        demo_pkg,
        "run_pipeline",
        lambda demo, n_sft, n_rl, after_seed, workers: seen.append(demo.resume) or after_seed([0]),
    )
    monkeypatch.setattr(demo_pkg, "write_results", lambda demo, *a, **kw: walls.append(dict(demo.wall)) or {})
    monkeypatch.setattr(demo_pkg, "results_markdown", lambda res: "")
    monkeypatch.setattr(demo_pkg, "summary_paragraph", lambda res: "")
    args = SimpleNamespace(quick=True, config=[], overrides=[], seeds=None, sft_seeds=None, out=str(tmp_path / "o"))
    args.workers = 1
    assert demo_pkg.run_demo(args) == 0  # (no resume attribute)
    assert walls == [{"total": 5.0}, {"total": 10.0}]  # after SFT seed 0 of 2, then at the end
    for resume in ("auto", "never"):
        args.resume = resume
        assert demo_pkg.run_demo(args) == 0
    assert seen == [True, True, False]


def test_the_headline_split_is_the_demos_first_test_split_whatever_its_name(tmp_path, monkeypatch):
    """experiments/valid_demo.py reads its models out on a validation split, listed first: results.json's headline,
    the claims' split and summary.txt's are that split's (not a split named "test")."""
    from dgrpo.demo import report

    monkeypatch.setattr(report, "plot_figures", lambda res, out: [])

    def model(items: str, **ident) -> dict:
        return {**ident, "splits": {s: {"accuracy": items.count("1") / 4, "items": items} for s in ("valid", "test")}}

    models = [model("1000", arm="sft", sft_seed=0, rl_seed=None, checkpoint="sft", valid_accuracy=0.25)]
    models += [model("1100", arm="dropout_grpo", sft_seed=0, rl_seed=0, checkpoint=k) for k in ("best", "final")]
    tests = {"valid": [None] * 4, "test": [None] * 4}
    demo = SimpleNamespace(base=Config(), out=tmp_path, valid=[], tests=tests, models=models, runs=[], read_back=[])
    demo.wall = {"total": 1.0}
    res = report.write_results(demo, "dgrpo demo", 1, 1, quiet=True)
    assert res["headline"] == "valid" and "## Claims (valid split)" in (tmp_path / "results.md").read_text()
    assert "on the built-in valid split (n=4" in (tmp_path / "summary.txt").read_text()
