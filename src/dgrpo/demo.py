"""``dgrpo demo``: the paper's claims measured at CPU scale on the built-in task, with the paper's protocol.

1. **Several SFT checkpoints.** Coconut curriculum SFT once per SFT seed (``--sft-seeds``): the SFT seed moves
   the accuracy by several points, so one checkpoint cannot carry a comparison.
2. **Every arm from each SFT checkpoint** (``ARMS``: each arm is its packaged file merged over the demo's base
   config, ``builtin/demo.yaml``), for ``--seeds`` RL seeds per SFT seed. The deterministic arm runs once per SFT
   checkpoint: it cannot update, whatever the seed.
3. **Test, read once per model**, greedily and without dropout, on the same items for every model: the SFT
   checkpoint, each run's final checkpoint, and its best post-warmup validation checkpoint (``best/``, what the
   paper reports).
4. **Paired statistics.** A comparison "A vs B" pairs each (SFT seed, RL seed) run of A with the run of B from the
   same SFT checkpoint and RL seed (or with that SFT checkpoint itself), takes the accuracy difference on the same
   items, and reports the mean over pairs with a 95% t-interval over the pair differences, with the items gained
   and lost. Each of the paper's claims (``CLAIMS``) is then resolved, not resolved or contradicted at 95%.
5. results.json, results.md, summary.txt, and two figures drawn by :mod:`dgrpo.plotting`.

``--quick`` runs the same pipeline on the tiny config (``tiny.yaml``): a smoke test whose numbers mean nothing.
The statistics are small pure functions (:func:`t_quantile`, :func:`mean_ci`, :func:`flips`, :func:`compare`,
:func:`verdict`, :func:`claim_verdicts`) so that they can be checked by hand.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from . import plotting
from .config import Config, ConfigError, TaskConfig, load_config, merge_file, to_dict
from .data.records import Record
from .data.synthetic import generate_split
from .eval.evaluate import evaluate
from .model.factory import load_model
from .model.latent_lm import LatentLM
from .training.grpo import train_grpo
from .training.sft import train_sft

#: arm -> (label in the tables, packaged config merged over the demo's base config; None = the SFT checkpoint)
ARMS: dict[str, tuple[str, str | None]] = {
    "sft": ("Coconut SFT (baseline)", None),
    "grpo_deterministic": ("Coconut + GRPO (deterministic rollout)", "builtin/grpo_deterministic.yaml"),
    "reinforce_ema": ("Coconut + REINFORCE + dropout (EMA)", "builtin/reinforce_ema.yaml"),
    "grpo_sampling": ("Coconut + GRPO (token sampling, no dropout)", "builtin/grpo_sampling.yaml"),
    "grpo_null": ("Null control: Dropout-GRPO, rewards shuffled in each group", "builtin/grpo_null.yaml"),
    "dropout_grpo": ("Coconut + Dropout-GRPO (ours)", "builtin/dropout_grpo.yaml"),
}
#: the arms' names in the figures (the well-known ones get dgrpo.plotting's fixed colours)
SHORT = {
    "grpo_deterministic": "deterministic",
    "reinforce_ema": "REINFORCE + EMA",
    "grpo_sampling": "token sampling",
    "grpo_null": "null control",
    "dropout_grpo": "Dropout-GRPO",
}
#: preset -> (config files applied before --config, SFT seeds, RL seeds per SFT seed). The SFT seed moves accuracy
#: more than the RL seed, so --full adds SFT seeds; its first two SFT seeds are the default's runs, to the last digit
PRESETS: dict[str, tuple[tuple[str, ...], int, int]] = {
    "quick": (("tiny.yaml",), 2, 1),
    "default": (("builtin/demo.yaml",), 2, 1),
    "full": (("builtin/demo.yaml",), 4, 1),
}
#: the comparisons reported, A minus B (every one on every test split, for both checkpoints)
COMPARISONS: tuple[tuple[str, str], ...] = (
    ("grpo_deterministic", "sft"),
    ("dropout_grpo", "sft"),
    ("dropout_grpo", "grpo_sampling"),
    ("dropout_grpo", "grpo_null"),
    ("dropout_grpo", "reinforce_ema"),
    ("grpo_null", "sft"),
    ("grpo_sampling", "sft"),
    ("reinforce_ema", "sft"),
)
CHECKPOINTS = ("best", "final")  # best = the best post-warmup validation checkpoint (the paper's protocol)
LEVEL = 0.95


@dataclass(frozen=True)
class Claim:
    """One claim of the paper as a paired comparison: ``a`` vs ``b`` on the headline split.

    ``kind``: ``exact`` (a equals b on every item of every pair, and a's within-group reward std is identically 0),
    ``greater`` (a > b: resolved when the CI lies above 0) or ``not_greater`` (a <= b: resolved when the CI lies
    at or below 0, i.e. the data rule out any gain of a over b)."""

    id: int
    text: str
    kind: str
    a: str
    b: str


CLAIMS = (
    Claim(1, "deterministic GRPO = SFT exactly", "exact", "grpo_deterministic", "sft"),
    Claim(2, "Dropout-GRPO > token-sampling GRPO", "greater", "dropout_grpo", "grpo_sampling"),
    Claim(3, "Dropout-GRPO > SFT", "greater", "dropout_grpo", "sft"),
    Claim(4, "null control <= SFT", "not_greater", "grpo_null", "sft"),
    Claim(5, "REINFORCE + EMA below Dropout-GRPO", "greater", "dropout_grpo", "reinforce_ema"),
)


# ------------------------------------------------------------------------------------------ statistics (pure)
def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for num in (even, odd):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t (``t_quantile(0.975, 2)`` = 4.3027), by bisection on :func:`t_cdf`."""
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1e7
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return 0.5 * (lo + hi)


@dataclass
class CI:
    """A mean with its two-sided t-interval (``lo``/``hi`` are None with fewer than 2 values)."""

    mean: float
    lo: float | None
    hi: float | None
    n: int
    sd: float


def mean_ci(xs: Sequence[float], level: float = LEVEL) -> CI:
    """Mean of ``xs`` and its ``level`` t-interval: mean +- t_{(1+level)/2, n-1} * sd / sqrt(n)."""
    if not xs:
        raise ValueError("mean_ci needs at least one value")
    n, mean = len(xs), statistics.fmean(xs)
    if n < 2:
        return CI(mean, None, None, n, 0.0)
    sd = statistics.stdev(xs)
    half = t_quantile((1.0 + level) / 2.0, n - 1) * sd / math.sqrt(n)
    return CI(mean, mean - half, mean + half, n, sd)


def flips(base: Sequence[bool], new: Sequence[bool]) -> tuple[int, int]:
    """(gained, lost): items the new model gets right that the baseline got wrong, and the reverse."""
    if len(base) != len(new):
        raise ValueError(f"paired comparison needs the same items ({len(base)} vs {len(new)})")
    return sum(n and not b for b, n in zip(base, new)), sum(b and not n for b, n in zip(base, new))


PairKey = tuple[int, int]  # (SFT seed, RL seed)


def compare(a: Mapping[PairKey, Sequence[bool]], b: Mapping[PairKey | int, Sequence[bool]]) -> dict[str, Any]:
    """A vs B, paired: per (SFT seed, RL seed) key of ``a``, B's model with the same key, or B keyed by the SFT seed
    alone (the SFT checkpoint); the accuracy difference in points on the same items, items gained and lost; then
    the mean difference with its 95% t-interval over the pairs. Keys without a partner are left out."""
    pairs = []
    for key in sorted(a):
        other = b.get(key, b.get(key[0]))
        if other is None:
            continue
        gained, lost = flips(other, a[key])
        n = len(a[key])
        pairs.append({"sft_seed": key[0], "rl_seed": key[1], "diff": 100.0 * (gained - lost) / n, "gained": gained})
        pairs[-1]["lost"] = lost
    if not pairs:
        return {"pairs": [], "n_pairs": 0}
    ci = mean_ci([p["diff"] for p in pairs])
    return {
        "pairs": pairs,
        "n_pairs": len(pairs),
        "n_items": len(next(iter(a.values()))),
        "mean": ci.mean,
        "lo": ci.lo,
        "hi": ci.hi,
        "sd": ci.sd,
        "gained": statistics.fmean(p["gained"] for p in pairs),
        "lost": statistics.fmean(p["lost"] for p in pairs),
    }


def verdict(kind: str, lo: float | None, hi: float | None) -> str:
    """``resolved`` / ``not resolved`` / ``contradicted`` for a ``greater`` (A > B) or ``not_greater`` (A <= B) claim
    from the interval [lo, hi] of A - B (None: fewer than 2 pairs, nothing is resolved)."""
    if lo is None or hi is None:
        return "not resolved"
    if kind == "greater":
        return "resolved" if lo > 0 else "contradicted" if hi < 0 else "not resolved"
    if kind == "not_greater":
        return "resolved" if hi <= 0 else "contradicted" if lo > 0 else "not resolved"
    raise ValueError(f"unknown claim kind {kind!r}")


def exact_verdict(comparison: Mapping[str, Any], reward_std_max: float | None) -> str:
    """Claim (1): resolved when not one item differs in any pair and the within-group reward std was 0 throughout."""
    pairs = comparison.get("pairs", [])
    same = bool(pairs) and all(p["gained"] == 0 and p["lost"] == 0 for p in pairs)
    return "resolved" if same and reward_std_max == 0 else "not resolved"


def claim_verdicts(
    comparisons: Sequence[Mapping[str, Any]], reward_std_max: Mapping[str, float | None], split: str
) -> list[dict[str, Any]]:
    """Every claim's verdict for each checkpoint, from the comparisons on ``split`` (``reward_std_max``: the largest
    within-group reward std each arm logged, over all its runs and steps)."""
    out = []
    for claim in CLAIMS:
        for ckpt in CHECKPOINTS:
            key = (claim.a, claim.b, ckpt, split)
            found = [c for c in comparisons if (c["a"], c["b"], c["checkpoint"], c["split"]) == key]
            c: Mapping[str, Any] = found[0] if found else {"pairs": [], "n_pairs": 0}
            if claim.kind == "exact":
                v = exact_verdict(c, reward_std_max.get(claim.a))
            else:
                v = verdict(claim.kind, c.get("lo"), c.get("hi"))
            row = {"id": claim.id, "text": claim.text, "kind": claim.kind, "checkpoint": ckpt, "verdict": v}
            out.append({**row, **{k: c.get(k) for k in ("mean", "lo", "hi", "n_pairs", "gained", "lost")}})
    return out


# ------------------------------------------------------------------------------------------ the data
def shifted_split(task: TaskConfig) -> tuple[str, list[Record]]:
    """The shifted test split: chains one operation shorter than in training (``n_steps - 1``; 3 for the built-in
    task), ``task.n_test // 2`` problems. Reported, not judged: of the demo's 4 SFT seeds only one is above chance on
    it (docs/builtin_task.md), as on every other shift tried. With a 1-step task it is the 1-step chain itself."""
    n = max(1, task.n_steps - 1)
    return f"{n} operations", generate_split(replace(task, n_steps=n), "test")[: max(1, task.n_test // 2)]


def demo_splits(task: TaskConfig) -> dict[str, list[Record]]:
    """The demo's test splits: the built-in ``test`` split (the claims are judged on it) and the shifted split."""
    name, recs = shifted_split(task)
    return {"test": generate_split(task, "test"), name: recs}


def items_str(correct: Iterable[bool]) -> str:
    """Per-item correctness as a string of 0/1 (compact in results.json)."""
    return "".join("1" if c else "0" for c in correct)


def items_of(s: str) -> list[bool]:
    return [c == "1" for c in s]


# ------------------------------------------------------------------------------------------ running
@dataclass
class Demo:
    """What every stage of a demo run shares: the base config, the data, the output folder, the evaluations."""

    base: Config
    out: Path
    train: list[Record]
    valid: list[Record]
    tests: dict[str, list[Record]]
    models: list[dict[str, Any]] = field(default_factory=list)  # every model evaluated on test
    runs: list[dict[str, Any]] = field(default_factory=list)  # every RL run's diagnostics
    wall: dict[str, float] = field(default_factory=dict)

    def count_correct(self, lm: LatentLM, recs: list[Record], settings: Any = None) -> int:
        """Greedy, no dropout: how many of ``recs`` are right (the periodic validation evaluation)."""
        n_lat = settings.n_latent if settings is not None else None
        return evaluate(lm, recs, n_latent=n_lat, seed=self.base.seed, progress=False, **self.eval_kw()).correct

    def eval_kw(self) -> dict[str, Any]:
        return {"batch_size": self.base.eval.batch_size, "max_new_tokens": self.base.eval.max_new_tokens}

    def test_model(self, lm: LatentLM, **ident: Any) -> dict[str, Any]:
        """Read every test split once for this model; record accuracy and per-item correctness."""
        row: dict[str, Any] = {**ident, "splits": {}}
        for name, recs in self.tests.items():
            r = evaluate(lm, recs, dataset=name, seed=self.base.seed, progress=False, **self.eval_kw())
            row["splits"][name] = {"accuracy": r.accuracy, "items": items_str(p["correct"] for p in r.predictions)}
        self.models.append(row)
        return row


def demo_config(args: Any) -> tuple[Config, int, int]:
    """The base config (the preset's files, then --config, then --set) and the numbers of SFT and RL seeds."""
    preset = "quick" if args.quick else "full" if getattr(args, "full", False) else "default"
    files, n_sft, n_rl = PRESETS[preset]
    base = load_config(Config, [*files, *args.config], args.overrides)
    n_sft = args.sft_seeds if getattr(args, "sft_seeds", None) is not None else n_sft
    n_rl = args.seeds if args.seeds is not None else n_rl
    if n_sft < 1 or n_rl < 1:
        raise ConfigError(f"--sft-seeds and --seeds must be >= 1, got {n_sft} and {n_rl}")
    return base, n_sft, n_rl


def rl_seed(sft_seed: int, r: int) -> int:
    """The RL run's seed: distinct over (SFT seed, RL seed index) pairs, the same for every arm of a pair."""
    return 100 * sft_seed + r


def arm_config(base: Config, arm: str, seed: int) -> Config:
    """The arm's config: its file merged over the demo's base config, with the arm's seed."""
    cfg = copy.deepcopy(base)
    cfg.seed = seed
    file = ARMS[arm][1]
    if file is not None:
        merge_file(cfg, file)
    if cfg.grpo.advantage == "ema" and cfg.grpo.group_size == 1:  # REINFORCE: the rollout budget of the grouped arms
        cfg.grpo.prompts_per_step = base.grpo.prompts_per_step * base.grpo.group_size
    return cfg.validate()


def run_sft(demo: Demo, seed: int) -> Path:
    """Coconut curriculum SFT with this seed; test its final checkpoint. Returns the checkpoint."""
    cfg = copy.deepcopy(demo.base)
    cfg.seed = seed
    out = demo.out / "sft" / f"seed{seed}"
    t0 = time.time()
    torch.manual_seed(seed)
    lm = load_model(cfg.model, cfg.task, seed=seed)
    train_sft(
        lm, demo.train, cfg, out, valid=demo.valid, evaluate_fn=demo.count_correct, log=lambda m: None, resume="never"
    )
    lm = LatentLM.from_pretrained(out / "final")
    valid = _last_eval(out) if demo.base.sft.eval_each_stage else None
    valid = demo.count_correct(lm, demo.valid) / len(demo.valid) if valid is None else valid
    row = demo.test_model(lm, arm="sft", sft_seed=seed, rl_seed=None, checkpoint="sft", valid_accuracy=valid)
    demo.wall[f"sft/seed{seed}"] = round(time.time() - t0, 1)
    _say(f"SFT seed {seed}: valid {valid:.3f}, " + _accs(row) + f" ({demo.wall[f'sft/seed{seed}']:.0f} s)")
    return out / "final"


def _last_eval(run_dir: Path) -> float | None:
    """The validation accuracy of a run's last evaluation row (SFT: the end of its final stage)."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = [r["eval/valid/accuracy"] for r in rows if "eval/valid/accuracy" in r]
    return evals[-1] if evals else None


def run_arm(demo: Demo, arm: str, sft_seed: int, r: int, sft_ckpt: Path) -> None:
    """One RL run from an SFT checkpoint; test its final and its best-validation checkpoints."""
    seed = rl_seed(sft_seed, r)
    cfg = arm_config(demo.base, arm, seed)
    run_dir = demo.out / "arms" / arm / f"sft{sft_seed}_rl{r}"
    t0 = time.time()
    torch.manual_seed(seed)
    policy = LatentLM.from_pretrained(sft_ckpt)
    summary = train_grpo(
        policy,
        cfg,
        demo.train,
        run_dir,
        valid={"valid": demo.valid},
        evaluate_fn=demo.count_correct,
        progress=False,
        log=lambda m: None,
        resume="never",
    )
    t_train = time.time() - t0
    ident = {"arm": arm, "sft_seed": sft_seed, "rl_seed": r}
    final = demo.test_model(policy, **ident, checkpoint="final", step=cfg.grpo.steps)
    best_step = summary.get("best_step")
    if best_step is not None and best_step != cfg.grpo.steps and (run_dir / "best").is_dir():
        best = demo.test_model(LatentLM.from_pretrained(run_dir / "best"), **ident, checkpoint="best", step=best_step)
    else:  # the best checkpoint is the final model (or none was kept): the same weights, the same answers
        best = {**final, "checkpoint": "best", "step": cfg.grpo.steps if best_step is None else best_step}
        demo.models.append(best)
    demo.runs.append({**ident, "dir": str(run_dir), **run_diagnostics(run_dir), "best_step": best["step"]})
    demo.wall[f"{arm}/sft{sft_seed}_rl{r}"] = round(time.time() - t0, 1)
    _say(
        f"  {SHORT[arm]}, SFT seed {sft_seed}, RL seed {seed}: final {_accs(final)}; best (step {best['step']}) "
        f"{_accs(best)} (train {t_train:.0f} s, total {demo.wall[f'{arm}/sft{sft_seed}_rl{r}']:.0f} s)"
    )


def run_diagnostics(run_dir: Path) -> dict[str, Any]:
    """From a run's metrics: the within-group reward std, kept fraction and distinct answers (mean over the first and
    the last 10 steps; the std's maximum), and how many steps updated the model."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if "reward_mean" in r]

    def mean(key: str, part: list[dict]) -> float | None:
        vals = [r[key] for r in part if r.get(key) is not None]
        return statistics.fmean(vals) if vals else None

    std = [r["reward_std"] for r in steps if r.get("reward_std") is not None]
    out: dict[str, Any] = {"reward_std_max": max(std) if std else None, "updates": sum(1 - r["skipped"] for r in steps)}
    for key in ("reward_std", "frac_groups_kept", "distinct_answers", "reward_mean"):
        out[key] = [mean(key, steps[:10]), mean(key, steps[-10:])]
    return out


def _accs(row: Mapping[str, Any]) -> str:
    return ", ".join(f"{name.split(' ')[0]} {d['accuracy']:.3f}" for name, d in row["splits"].items())


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


# ------------------------------------------------------------------------------------------ analysis
def model_items(models: Sequence[Mapping[str, Any]], arm: str, checkpoint: str, split: str) -> dict[Any, list[bool]]:
    """Per-item correctness of an arm's models on a split: keyed by (SFT seed, RL seed), or by the SFT seed for SFT."""
    out: dict[Any, list[bool]] = {}
    for m in models:
        if m["arm"] != arm or (arm != "sft" and m["checkpoint"] != checkpoint):
            continue
        key = m["sft_seed"] if arm == "sft" else (m["sft_seed"], m["rl_seed"])
        out[key] = items_of(m["splits"][split]["items"])
    return out


def all_comparisons(models: Sequence[Mapping[str, Any]], splits: Iterable[str]) -> list[dict[str, Any]]:
    """Every comparison of ``COMPARISONS`` on every split, for both checkpoints."""
    out = []
    for split in splits:
        for ckpt in CHECKPOINTS:
            for a, b in COMPARISONS:
                c = compare(model_items(models, a, ckpt, split), model_items(models, b, ckpt, split))
                out.append({"a": a, "b": b, "checkpoint": ckpt, "split": split, **c})
    return out


def arm_accuracies(models: Sequence[Mapping[str, Any]], split: str) -> dict[str, dict[str, list[float]]]:
    """arm -> checkpoint -> accuracies (one per model) on a split."""
    out: dict[str, dict[str, list[float]]] = {}
    for m in models:
        for ckpt in CHECKPOINTS if m["arm"] == "sft" else (m["checkpoint"],):
            out.setdefault(m["arm"], {}).setdefault(ckpt, []).append(m["splits"][split]["accuracy"])
    return out


def analyse(demo: Demo) -> dict[str, Any]:
    """The comparisons, the claims' verdicts and the per-arm diagnostics, as results.json holds them."""
    comparisons = all_comparisons(demo.models, demo.tests)
    std_max: dict[str, float | None] = {}
    for run in demo.runs:
        v = run["reward_std_max"]
        std_max[run["arm"]] = v if std_max.get(run["arm"]) is None else max(std_max[run["arm"]] or 0.0, v or 0.0)
    return {
        "comparisons": comparisons,
        "claims": claim_verdicts(comparisons, std_max, next(iter(demo.tests))),
        "accuracy": {s: arm_accuracies(demo.models, s) for s in demo.tests},
        "reward_std_max": std_max,
    }


# ------------------------------------------------------------------------------------------ reports
def _pct(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def _ci_text(c: Mapping[str, Any]) -> str:
    if not c.get("n_pairs"):
        return "no pairs"
    interval = "no interval (1 pair)" if c["lo"] is None else f"[{c['lo']:+.2f}, {c['hi']:+.2f}]"
    return f"{c['mean']:+.2f} {interval}"


def accuracy_table(res: Mapping[str, Any]) -> list[str]:
    """Rows = arms; per split, the best-validation and the final checkpoint: mean ± std over models, in %."""
    splits = list(res["splits"])
    head = "| Model | models | " + " | ".join(f"{s}: {c}" for s in splits for c in ("best-valid ckpt", "final")) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(splits))]
    for arm, (label, _) in ARMS.items():
        acc = res["analysis"]["accuracy"]
        if arm not in acc[splits[0]]:
            continue
        cells = []
        for s in splits:
            for ckpt in CHECKPOINTS:
                xs = acc[s][arm][ckpt]
                sd = f" ± {100 * statistics.stdev(xs):.2f}" if len(xs) > 1 else ""
                cells.append(f"{100 * statistics.fmean(xs):.2f}%{sd}")
        lines.append(f"| {label} | {len(acc[splits[0]][arm]['final'])} | " + " | ".join(cells) + " |")
    return lines


def comparison_table(res: Mapping[str, Any], split: str) -> list[str]:
    """The paired comparisons on one split: mean difference in points, its 95% CI, pairs, items gained / lost."""
    lines = [
        "| A vs B | checkpoint | A - B, points (95% CI) | pairs | items gained / lost per pair (of n) |",
        "|---|---|---|---|---|",
    ]
    for c in res["analysis"]["comparisons"]:
        if c["split"] != split or not c["n_pairs"]:
            continue
        name = f"{SHORT.get(c['a'], 'SFT')} vs {SHORT.get(c['b'], 'SFT')}"
        ckpt = "best-valid" if c["checkpoint"] == "best" else "final"
        items = f"+{c['gained']:.1f} / -{c['lost']:.1f} (n={c['n_items']})"
        lines.append(f"| {name} | {ckpt} | {_ci_text(c)} | {c['n_pairs']} | {items} |")
    return lines


def claim_lines(res: Mapping[str, Any]) -> list[str]:
    """One line per claim: the verdict under the paper's protocol (best-validation checkpoint) and at the end."""
    lines = []
    for claim in CLAIMS:
        rows = {r["checkpoint"]: r for r in res["analysis"]["claims"] if r["id"] == claim.id}
        parts = []
        for ckpt, name in (("best", "best-valid checkpoint"), ("final", "final checkpoint")):
            r = rows[ckpt]
            num = "" if r["mean"] is None else f" ({_ci_text(r)} points, {r['n_pairs']} pairs)"
            if claim.kind == "exact" and r["n_pairs"]:
                num = f" ({r['gained']:.0f} items gained, {r['lost']:.0f} lost per pair; {r['n_pairs']} pairs)"
            parts.append(f"{name}: **{r['verdict']}**{num}")
        lines.append(f"{claim.id}. {claim.text}: " + "; ".join(parts))
    return lines


def diagnostics_table(res: Mapping[str, Any]) -> list[str]:
    """Per arm, mean over its runs: within-group reward std, kept fraction, distinct answers (first -> last 10
    steps), steps that updated the model, and the best-validation checkpoint's step."""
    lines = [
        "| arm | reward std | groups kept | distinct answers / group | updating steps | best-valid step |",
        "|---|---|---|---|---|---|",
    ]
    for arm in SHORT:
        runs = [r for r in res["runs"] if r["arm"] == arm]
        if not runs:
            continue
        cells = []
        for key in ("reward_std", "frac_groups_kept", "distinct_answers"):
            first = [r[key][0] for r in runs if r[key][0] is not None]
            last = [r[key][1] for r in runs if r[key][1] is not None]
            cells.append(f"{statistics.fmean(first):.3f} -> {statistics.fmean(last):.3f}" if first else "-")
        steps = ", ".join(str(r["best_step"]) for r in runs)
        cells += [f"{statistics.fmean(r['updates'] for r in runs):.0f} of {res['steps']}", steps]
        lines.append(f"| {SHORT[arm]} | " + " | ".join(cells) + " |")
    return lines


def sft_table(res: Mapping[str, Any]) -> list[str]:
    """Per SFT seed: its accuracies, and Dropout-GRPO minus it and minus token sampling per RL seed (test)."""
    splits = list(res["splits"])
    lines = [
        "| SFT seed | valid | " + " | ".join(splits) + " | Dropout-GRPO - SFT (best / final) | "
        "Dropout-GRPO - token sampling (best / final) |",
        "|" + "---|" * (4 + len(splits)),
    ]
    by = {(c["a"], c["b"], c["checkpoint"]): c for c in res["analysis"]["comparisons"] if c["split"] == res["headline"]}
    for m in (m for m in res["models"] if m["arm"] == "sft"):
        s = m["sft_seed"]
        cells = [f"{100 * m['valid_accuracy']:.1f}%"] + [f"{100 * m['splits'][x]['accuracy']:.2f}%" for x in splits]
        for b in ("sft", "grpo_sampling"):
            per = []
            for ckpt in CHECKPOINTS:
                ds = [p["diff"] for p in by.get(("dropout_grpo", b, ckpt), {}).get("pairs", []) if p["sft_seed"] == s]
                per.append(", ".join(f"{d:+.2f}" for d in ds) or "-")
            cells.append(" / ".join(per))
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines


def results_markdown(res: Mapping[str, Any]) -> str:
    """results.md: the claims, the paired comparisons, the accuracy table, per-SFT-seed numbers, diagnostics."""
    n_test = ", ".join(f"{s} n={n}" for s, n in res["splits"].items())
    out = [
        f"# dgrpo demo: {res['n_sft']} SFT seed(s) x {res['n_rl']} RL seed(s) per arm",
        "",
        f"Command: `{res['command']}`. Wall time {res['wall_s']['total']:.0f} s. Test splits: {n_test}; greedy pass@1,"
        " no dropout. `best-valid` = each run's best post-warmup validation checkpoint (the paper's protocol),"
        " `final` = its last checkpoint. A vs B pairs runs that share the SFT checkpoint and the RL seed; the interval"
        " is a 95% t-interval over the pair differences (points).",
        "",
        f"## Claims ({res['headline']} split)",
        "",
        *claim_lines(res),
        "",
        "Rule: A > B is resolved when the interval of A - B lies above 0 (contradicted when it lies below); "
        "A <= B is resolved when it lies at or below 0; claim 1 needs every item equal and a within-group reward "
        "std of exactly 0 at every step.",
    ]
    for split in res["splits"]:
        out += ["", f"## Paired comparisons: {split}", "", *comparison_table(res, split)]
    out += ["", "## Accuracy (mean ± std over models)", "", *accuracy_table(res)]
    out += ["", f"## Per SFT seed ({res['headline']}; differences in points, one per RL seed)", "", *sft_table(res)]
    out += ["", "## Training diagnostics (mean over runs; first 10 -> last 10 steps)", "", *diagnostics_table(res)]
    return "\n".join(out) + "\n"


def summary_paragraph(res: Mapping[str, Any]) -> str:
    """summary.txt: one paragraph, every claim's verdict with its numbers."""
    headline = res["headline"]
    acc = res["analysis"]["accuracy"][headline]
    sft = acc["sft"]["final"]
    head = (
        f"{res['n_sft']} Coconut SFT checkpoints score {_pct(statistics.fmean(sft))} on average on the built-in "
        f"{headline} split (n={res['splits'][headline]}; per seed "
        + ", ".join(_pct(x, 1) for x in sft)
        + f"); every RL arm ran {res['n_rl']} seed(s) from each. Paired over (SFT seed, RL seed), 95% t-intervals, "
        "points: "
    )
    parts = []
    for claim in CLAIMS:
        rows = {r["checkpoint"]: r for r in res["analysis"]["claims"] if r["id"] == claim.id}
        b, f = rows["best"], rows["final"]
        if claim.kind == "exact":
            items = f"{b['gained'] or 0:.0f} items gained and {b['lost'] or 0:.0f} lost per pair"
            parts.append(f"({claim.id}) {claim.text}: {b['verdict']} ({items}; reward std {_std_note(res)})")
        else:
            parts.append(
                f"({claim.id}) {claim.text}: best-valid checkpoint {_ci_text(b)} {b['verdict']}; final {_ci_text(f)} "
                f"{f['verdict']}"
            )
    return head + "; ".join(parts) + f". Total wall time {res['wall_s']['total']:.0f} s."


def _std_note(res: Mapping[str, Any]) -> str:
    v = res["analysis"]["reward_std_max"].get("grpo_deterministic")
    return "identically 0" if v == 0 else f"up to {v}"


def plot_figures(res: Mapping[str, Any], out: Path) -> list[str]:
    """eval_accuracy.png (validation accuracy over steps) and reward_std.png (within-group reward std and the kept
    fraction over steps), arms grouped, seeds as a band, drawn by :mod:`dgrpo.plotting`."""
    groups = {SHORT[arm]: [plotting.load_run(r["dir"]) for r in res["runs"] if r["arm"] == arm] for arm in SHORT}
    groups = {k: v for k, v in groups.items() if v}
    sft_valid = [m["valid_accuracy"] for m in res["models"] if m["arm"] == "sft"]
    seeds = "1 seed" if len(sft_valid) == 1 else f"mean of {len(sft_valid)} seeds"
    ref = {f"Coconut SFT ({seeds})": statistics.fmean(sft_valid)}
    descs = [
        plotting.plot_runs(groups, out / "eval_accuracy.png", panels=("eval",), reference=ref),
        plotting.plot_runs(groups, out / "reward_std.png", panels=("reward_std", "kept")),
    ]
    return [plotting.describe(d) for d in descs]


# ------------------------------------------------------------------------------------------ the command
def run_demo(args: Any) -> int:
    """``dgrpo demo``: SFT per seed, every arm from each, test once per model, statistics, files, figures."""
    t_start = time.time()
    base, n_sft, n_rl = demo_config(args)
    if base.threads:
        torch.set_num_threads(base.threads)
    demo = Demo(base, Path(args.out), generate_split(base.task, "train"), _valid(base), demo_splits(base.task))

    def partial(s: int) -> None:  # results so far, after each SFT seed: an interrupted demo still leaves its table
        if s + 1 < n_sft:
            demo.wall["total"] = round(time.time() - t_start, 1)
            write_results(demo, command_line(args) + f"  (partial: SFT seeds 0-{s} of {n_sft})", s + 1, n_rl)

    run_pipeline(demo, n_sft, n_rl, after_sft_seed=partial)
    demo.wall["total"] = round(time.time() - t_start, 1)
    res = write_results(demo, command_line(args), n_sft, n_rl)
    print(results_markdown(res))
    print(summary_paragraph(res))
    return 0


def run_pipeline(
    demo: Demo,
    n_sft: int,
    n_rl: int,
    arms: Sequence[str] | None = None,
    after_sft_seed: Callable[[int], None] | None = None,
) -> None:
    """SFT per seed, then every RL arm (or ``arms``) from each SFT checkpoint (the deterministic arm once per
    checkpoint: it cannot update, whatever its seed). ``after_sft_seed(s)`` runs when SFT seed ``s``'s arms are done
    (the demo writes its results so far)."""
    demo.out.mkdir(parents=True, exist_ok=True)
    _say(
        f"built-in task: {len(demo.train)} train, {len(demo.valid)} valid (per eval), "
        + ", ".join(f"{len(r)} {s}" for s, r in demo.tests.items())
        + f"; {n_sft} SFT seed(s) x {n_rl} RL seed(s); output in {demo.out}"
    )
    for s in range(n_sft):
        ckpt = run_sft(demo, s)
        for arm in (a for a in ARMS if ARMS[a][1] is not None and (arms is None or a in arms)):
            for r in range(1 if arm == "grpo_deterministic" else n_rl):
                run_arm(demo, arm, s, r, ckpt)
        if after_sft_seed is not None:
            after_sft_seed(s)


def _valid(base: Config) -> list[Record]:
    valid = generate_split(base.task, "valid")
    return valid[: base.data.eval_limit] if base.data.eval_limit else valid


def write_results(demo: Demo, command: str, n_sft: int, n_rl: int) -> dict[str, Any]:
    """results.json, results.md, summary.txt and the figures in the output folder; returns the results."""
    res: dict[str, Any] = {
        "command": command,
        "headline": next(iter(demo.tests)),
        "n_sft": n_sft,
        "n_rl": n_rl,
        "steps": demo.base.grpo.steps,
        "splits": {s: len(r) for s, r in demo.tests.items()},
        "n_valid": len(demo.valid),
        "labels": {a: v[0] for a, v in ARMS.items()},
        "config": to_dict(demo.base),
        "models": demo.models,
        "runs": demo.runs,
        "wall_s": demo.wall,
    }
    res["analysis"] = analyse(demo)
    (demo.out / "results.json").write_text(json.dumps(res, indent=1))
    (demo.out / "results.md").write_text(results_markdown(res))
    (demo.out / "summary.txt").write_text(summary_paragraph(res) + "\n")
    for line in plot_figures(res, demo.out):
        _say(line)
    return res


def command_line(args: Any) -> str:
    """The command that reproduces this run."""
    parts = ["dgrpo demo"]
    parts += ["--quick"] if args.quick else ["--full"] if getattr(args, "full", False) else []
    for flag, value in (("--sft-seeds", getattr(args, "sft_seeds", None)), ("--seeds", args.seeds)):
        parts += [f"{flag} {value}"] if value is not None else []
    parts += [f"--config {c}" for c in args.config] + [f"--set {o}" for o in args.overrides]
    return " ".join(parts + [f"--out {args.out}"])


__all__: list[str] = [
    "ARMS",
    "CLAIMS",
    "CI",
    "Claim",
    "claim_verdicts",
    "compare",
    "flips",
    "mean_ci",
    "run_demo",
    "t_quantile",
    "verdict",
]
