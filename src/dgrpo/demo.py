"""``dgrpo demo``: the paper's Table 1 and Figures 2-3 at CPU scale, on the built-in task, out of the box.

Coconut SFT once, then from that same checkpoint every arm of the paper (deterministic GRPO,
REINFORCE + dropout with an EMA baseline, GRPO with answer-token sampling and no dropout, and
Dropout-GRPO) for ``--seeds`` seeds; greedy evaluation without dropout on every test split, plus
Dropout-GRPO as a Monte-Carlo-dropout majority vote. Writes results.json, results.md and two figures.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from .config import Config, ConfigError, load_config, merge_file, to_dict
from .data.synthetic import generate_split
from .eval.evaluate import evaluate, evaluate_mc_vote
from .model.factory import load_model
from .model.latent_lm import LatentLM
from .perturbation import make_perturbation
from .training.grpo import train_grpo
from .training.sft import train_sft

TEST_SPLITS = ("test", "ood_steps", "ood_numbers")

#: The arms of Table 1: label, and the packaged config merged over the demo's base config (None = no RL).
ARMS: dict[str, tuple[str, str | None]] = {
    "sft": ("Coconut SFT (baseline)", None),
    "grpo_deterministic": ("Coconut + GRPO (deterministic rollout)", "builtin/grpo_deterministic.yaml"),
    "reinforce_ema": ("Coconut + REINFORCE + dropout (EMA)", "builtin/reinforce_ema.yaml"),
    "grpo_sampling": ("Coconut + GRPO (token sampling, no dropout)", "builtin/grpo_sampling.yaml"),
    "dropout_grpo": ("Coconut + Dropout-GRPO (ours)", "builtin/dropout_grpo.yaml"),
}
QUICK_CONFIG = "tiny.yaml"  # --quick: the tiny model and task the tests use (a smoke test; numbers mean nothing)
QUICK_MC_MASKS = 3


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


def flips(base: list[bool], new: list[bool]) -> list[int]:
    """[gained, lost]: items the new model gets right that the baseline got wrong, and the reverse."""
    if len(base) != len(new):
        raise ValueError(f"paired comparison needs the same items ({len(base)} vs {len(new)})")
    return [sum(n and not b for b, n in zip(base, new)), sum(b and not n for b, n in zip(base, new))]


def paired_diff(gained: int, lost: int, n: int) -> tuple[float, float]:
    """Accuracy difference (new - base) on the same n items and its standard error: the mean of the per-item
    differences d_i in {-1, 0, 1} and sqrt(var(d) / n) (with one seed; no correction)."""
    d = (gained - lost) / n
    var = (gained + lost) / n - d * d
    return d, math.sqrt(max(var, 0.0) / n)


def paired_summary(flips_per_seed: list[list[int]], n: int) -> dict:
    """Mean over seeds of the net change, items gained and lost, and one seed's paired standard error."""
    diffs = [paired_diff(g, lo, n) for g, lo in flips_per_seed]
    return {
        "net": statistics.fmean(d for d, _ in diffs),
        "gained": statistics.fmean(g for g, _ in flips_per_seed),
        "lost": statistics.fmean(lo for _, lo in flips_per_seed),
        "se": statistics.fmean(e for _, e in diffs),
    }


def mean_std(xs: list[float]) -> tuple[float, float]:
    return (statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0)


def run_demo(args) -> int:
    base = load_config(Config, [*args.config, *([QUICK_CONFIG] if args.quick else [])], args.overrides)
    mc_masks = QUICK_MC_MASKS if args.quick else 8
    if args.seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {args.seeds}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    if base.threads:
        torch.set_num_threads(base.threads)
    splits = {s: generate_split(base.task, s) for s in ("train", "valid", *TEST_SPLITS)}
    print(
        f"[demo] built-in task: {len(splits['train'])} train, {len(splits['valid'])} valid, "
        + ", ".join(f"{len(splits[s])} {s}" for s in TEST_SPLITS)
        + f"; {args.seeds} seed(s); output in {out}"
    )

    # ---- 1. Coconut SFT, once
    sft_dir = out / "sft"
    t0 = time.time()
    torch.manual_seed(base.seed)
    lm = load_model(base.model, base.task, seed=base.seed)
    ev_kw = dict(batch_size=base.eval.batch_size, max_new_tokens=base.eval.max_new_tokens, progress=False)

    valid = splits["valid"][: base.data.eval_limit] if base.data.eval_limit else splits["valid"]

    def count_correct(lm_, recs, settings=None):
        n_lat = settings.n_latent if settings is not None else None
        return evaluate(lm_, recs, n_latent=n_lat, seed=base.seed, **ev_kw).correct

    print("[demo] 1/3 Coconut curriculum SFT")
    train_sft(lm, splits["train"], base, sft_dir, valid=valid, evaluate_fn=count_correct)
    wall: dict[str, Any] = {"sft_s": round(time.time() - t0, 1)}
    sft_ckpt = sft_dir / "final"

    results: dict = {
        "arms": {},
        "labels": {k: v[0] for k, v in ARMS.items()},
        "splits": list(TEST_SPLITS),
        "n": {s: len(splits[s]) for s in TEST_SPLITS},
        "config": to_dict(base),
        "seeds": args.seeds,
    }

    def test_all(model: LatentLM, seed: int) -> tuple[dict, dict]:
        """Accuracy per split, and the per-item correctness (for the paired comparison with SFT)."""
        res = {s: evaluate(model, splits[s], dataset=f"builtin:{s}", seed=seed, **ev_kw) for s in TEST_SPLITS}
        return {s: r.accuracy for s, r in res.items()}, {
            s: [p["correct"] for p in r.predictions] for s, r in res.items()
        }

    sft_lm = LatentLM.from_pretrained(sft_ckpt)
    sft_acc, sft_items = test_all(sft_lm, base.seed)
    sft_valid = count_correct(sft_lm, valid) / len(valid)
    results["arms"]["sft"] = {s: {"per_seed": [sft_acc[s]]} for s in TEST_SPLITS}
    results["sft_valid_accuracy"] = sft_valid
    print(
        f"[demo] SFT: valid {sft_valid:.3f}, "
        + ", ".join(f"{s} {a:.3f}" for s, a in sft_acc.items())
        + f" ({wall['sft_s']:.0f} s)"
    )

    # ---- 2. RL arms from the same checkpoint
    print("[demo] 2/3 RL arms from the SFT checkpoint")
    traces: dict[str, list[list[dict]]] = {}
    wall["arms_s"] = {}
    mc_results: list[dict] = []
    for arm in [a for a in ARMS if ARMS[a][1] is not None]:
        traces[arm] = []
        results["arms"][arm] = {s: {"per_seed": []} for s in TEST_SPLITS}
        wall["arms_s"][arm] = []
        for seed in range(args.seeds):
            cfg = arm_config(base, arm, seed)
            run_dir = out / "arms" / arm / f"seed{seed}"
            if (run_dir / "metrics.jsonl").exists():
                (run_dir / "metrics.jsonl").unlink()
            t0 = time.time()
            torch.manual_seed(seed)
            policy = LatentLM.from_pretrained(sft_ckpt)
            print(f"[demo]   {ARMS[arm][0]}, seed {seed}")
            train_grpo(policy, cfg, splits["train"], run_dir, valid={"valid": valid}, evaluate_fn=count_correct)
            wall["arms_s"][arm].append(round(time.time() - t0, 1))
            acc, items = test_all(policy, seed)
            for s in TEST_SPLITS:
                results["arms"][arm][s]["per_seed"].append(acc[s])
                results["arms"][arm][s].setdefault("flips_vs_sft", []).append(flips(sft_items[s], items[s]))
            traces[arm].append([json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()])
            print(
                "[demo]     "
                + ", ".join(f"{s} {a:.3f}" for s, a in acc.items())
                + f" ({wall['arms_s'][arm][-1]:.0f} s)"
            )
            if arm == "dropout_grpo":
                pert = make_perturbation(cfg.perturbation)
                mc = {
                    s: evaluate_mc_vote(
                        policy,
                        splits[s],
                        pert,
                        n_masks=mc_masks,
                        seed=seed,
                        batch_size=base.eval.batch_size,
                        max_new_tokens=base.eval.max_new_tokens,
                        progress=False,
                    )
                    for s in TEST_SPLITS
                }
                mc_results.append(mc)
    results["arms"]["dropout_grpo_mc_vote"] = {
        s: {
            "per_seed": [m[s].accuracy for m in mc_results],
            "flips_vs_sft": [flips(sft_items[s], [p["correct"] for p in m[s].predictions]) for m in mc_results],
        }
        for s in TEST_SPLITS
    }
    results["labels"]["dropout_grpo_mc_vote"] = f"Dropout-GRPO, MC-dropout majority vote ({mc_masks} masks)"

    # ---- 3. tables and figures
    print("[demo] 3/3 tables and figures")
    for per in results["arms"].values():
        for s, d in per.items():
            d["mean"], d["std"] = mean_std(d["per_seed"])
            d["n"] = len(splits[s])
    results["wall_s"] = {**wall, "total_s": round(time.time() - t_start, 1)}
    results["reward_std_trace"] = {
        arm: [[(r["step"], r.get("reward_std")) for r in tr if "reward_mean" in r] for tr in runs]
        for arm, runs in traces.items()
    }
    results["eval_trace"] = {
        arm: [[(r["step"], r["eval/valid/accuracy"]) for r in tr if "eval/valid/accuracy" in r] for tr in runs]
        for arm, runs in traces.items()
    }
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(results_table(results))
    plot_traces(results, out)
    print(results_table(results))
    print(summary_paragraph(results))
    return 0


def results_table(res: dict) -> str:
    """Markdown shaped like the paper's Table 1: rows = arms, columns = splits, mean ± std over seeds (in %)."""
    head = "| Model | " + " | ".join(f"{s} (n={res['n'][s]})" for s in res["splits"]) + " |"
    lines = [head, "|" + "---|" * (len(res["splits"]) + 1)]
    for arm, per in res["arms"].items():
        cells = []
        for s in res["splits"]:
            d = per[s]
            cells.append(
                f"{100 * d['mean']:.2f}%"
                if len(d["per_seed"]) == 1
                else f"{100 * d['mean']:.2f}% ± {100 * d['std']:.2f}%"
            )
        lines.append(f"| {res['labels'][arm]} | " + " | ".join(cells) + " |")
    seeds = res["seeds"]
    paired = [(arm, per) for arm, per in res["arms"].items() if "flips_vs_sft" in per[res["splits"][0]]]
    if paired:
        lines += [
            "",
            "Paired with the SFT checkpoint on the same items: net change in points, mean over seeds (items gained / "
            "lost "
            "per seed; standard error of one seed's paired difference):",
            "",
            "| Model | " + " | ".join(res["splits"]) + " |",
            "|" + "---|" * (len(res["splits"]) + 1),
        ]
        for arm, per in paired:
            cells = []
            for s in res["splits"]:
                p = paired_summary(per[s]["flips_vs_sft"], res["n"][s])
                cells.append(f"{100 * p['net']:+.2f} (+{p['gained']:.0f} / -{p['lost']:.0f}; SE {100 * p['se']:.2f})")
            lines.append(f"| {res['labels'][arm]} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Greedy pass@1 without dropout (the MC row votes over dropout masks). SFT: one checkpoint; RL arms: "
        f"{seeds} seed(s){', mean ± std' if seeds > 1 else ''}. Wall time: {res['wall_s']['total_s']:.0f} s."
    )
    return "\n".join(lines) + "\n"


def summary_paragraph(res: dict) -> str:
    s = res["splits"][0]
    sft = res["arms"]["sft"][s]["mean"]
    det = res["arms"]["grpo_deterministic"][s]
    ours = res["arms"]["dropout_grpo"][s]
    rein = res["arms"]["reinforce_ema"][s]
    samp = res["arms"]["grpo_sampling"][s]
    det_std = [v for run in res["reward_std_trace"]["grpo_deterministic"] for _, v in run]
    ours_std = [v for run in res["reward_std_trace"]["dropout_grpo"] for _, v in run if v is not None]
    gain = ours["mean"] - sft
    if len(ours["per_seed"]) < 2:
        verdict = "with one seed there is no seed-to-seed std to compare with (run --seeds 3)"
    else:
        verdict = ("larger than" if gain > ours["std"] and gain > 0 else "not larger than") + " the seed-to-seed std"
    best_ctrl = max(("reinforce_ema", "grpo_sampling"), key=lambda a: res["arms"][a][s]["mean"])
    ctrl = res["arms"][best_ctrl][s]
    se = 100 * math.sqrt(max(sft * (1 - sft), 1e-12) / res["n"][s])  # binomial standard error of one accuracy
    valid_end = {
        a: statistics.fmean(run[-1][1] for run in runs) for a, runs in res["eval_trace"].items() if runs and runs[0]
    }
    paired = ""
    if "flips_vs_sft" in ours:
        p = paired_summary(ours["flips_vs_sft"], res["n"][s])
        paired = (
            f" Paired on the same items, Dropout-GRPO gained {p['gained']:.0f} and lost {p['lost']:.0f} of them per "
            "seed "
            f"(paired standard error of one seed {100 * p['se']:.2f} points)."
        )
    valid = ""
    if "dropout_grpo" in valid_end and "sft_valid_accuracy" in res:
        valid = (
            f" On the validation split used during training, Dropout-GRPO went {100 * res['sft_valid_accuracy']:.1f}% "
            "-> "
            f"{100 * valid_end['dropout_grpo']:.1f}% (mean over seeds; {res['config']['data']['eval_limit'] or 'all'} "
            "items)."
        )
    return (
        f"On the built-in {s} split (n={res['n'][s]}), Coconut SFT scores {100 * sft:.2f}%. Deterministic GRPO ends at "
        f"{100 * det['mean']:.2f}% with within-group reward std "
        f"{'identically 0' if all(v == 0 for v in det_std) else 'NOT always 0'} "
        f"(max {max(det_std) if det_std else 0:.3g}). REINFORCE + dropout (EMA) ends at {100 * rein['mean']:.2f}% ± "
        f"{100 * rein['std']:.2f}%, token sampling without dropout at {100 * samp['mean']:.2f}% ± "
        f"{100 * samp['std']:.2f}%. "
        f"Dropout-GRPO ends at {100 * ours['mean']:.2f}% ± {100 * ours['std']:.2f}% (mean reward std "
        f"{statistics.fmean(ours_std) if ours_std else 0:.3f}): a change of {100 * gain:+.2f} points, {verdict}; "
        f"{100 * (ours['mean'] - ctrl['mean']):+.2f} points against the strongest control "
        f"({res['labels'][best_ctrl]}). "
        f"One accuracy on {res['n'][s]} items has a binomial standard error of about {se:.2f} points (and the SFT "
        f"checkpoint is a single run): the change is {'within' if abs(100 * gain) < 2 * se else 'outside'} two "
        f"standard errors.{paired}{valid} "
        f"Total wall time {res['wall_s']['total_s']:.0f} s."
    )


def plot_traces(res: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "grpo_deterministic": "#7f7f7f",
        "reinforce_ema": "#d62728",
        "grpo_sampling": "#ff7f0e",
        "dropout_grpo": "#1f77b4",
    }
    for key, fname, ylabel, title in (
        (
            "eval_trace",
            "eval_accuracy.png",
            "validation accuracy (greedy, no dropout)",
            "Eval accuracy over training (paper Fig. 2)",
        ),
        (
            "reward_std_trace",
            "reward_std.png",
            "within-group reward std",
            "Rollout diversity within groups (paper Fig. 3)",
        ),
    ):
        fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
        for arm, runs in res[key].items():
            pts = [[(s, v) for s, v in run if v is not None] for run in runs]
            pts = [p for p in pts if p]
            if not pts:
                continue
            steps = sorted({s for p in pts for s, _ in p})
            by_step = {s: [v for p in pts for s2, v in p if s2 == s] for s in steps}
            mean = [statistics.fmean(by_step[s]) for s in steps]
            ax.plot(steps, mean, color=colors.get(arm), lw=2)
            if len(pts) > 1:
                sd = [statistics.pstdev(by_step[s]) for s in steps]
                ax.fill_between(
                    steps,
                    [m - d for m, d in zip(mean, sd)],
                    [m + d for m, d in zip(mean, sd)],
                    color=colors.get(arm),
                    alpha=0.15,
                )
            ax.annotate(
                res["labels"][arm].replace("Coconut + ", ""),
                (steps[-1], mean[-1]),
                xytext=(6, 0),
                textcoords="offset points",
                color=colors.get(arm),
                va="center",
                fontsize=9,
            )
        if key == "eval_trace":
            ax.axhline(res["sft_valid_accuracy"], color="black", ls="--", lw=1)
            ax.annotate(
                "Coconut SFT", (0, res["sft_valid_accuracy"]), xytext=(2, 4), textcoords="offset points", fontsize=9
            )
        else:
            ax.annotate(
                "REINFORCE (K = 1): undefined",
                (0.01, 0.97),
                xycoords="axes fraction",
                va="top",
                fontsize=8,
                color=colors["reinforce_ema"],
            )
        ax.set_xlabel("GRPO step")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.margins(x=0.02)
        right = ax.get_xlim()[1]
        ax.set_xlim(right=right * 1.32)  # room for the line labels
        fig.tight_layout()
        fig.savefig(out / fname)
        plt.close(fig)
