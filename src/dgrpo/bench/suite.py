"""``dgrpo bench [--quick] [--only ITEMS] --out DIR``: the performance suite; writes DIR/bench.json and DIR/bench.md.

Items (see :mod:`dgrpo.bench.items` and :mod:`dgrpo.bench.long_items`): 1 rollouts, 2 Coconut SFT step,
3 GRPO step scaling, 4 cost of the perturbation, 5 memory, 6 distance to the machine's limit, 9 LoRA vs full
fine-tuning, 10 activation recomputation vs full backprop, 12 the fast rollout engine vs the eager one, 11 threads vs
processes for the demo's SFT step (CPU), 8 a 300-step memory soak of ``dgrpo grpo`` (CPU); where CUDA is present,
items 1-6, 9, 10 and 12 again on a ~0.5B Qwen2 in bf16 plus 7, AdamW vs 8-bit AdamW (bitsandbytes).
Every claim is a ratio of two ways of doing the same work, timed alternately.

OpenMP: with the default (active, spinning) wait policy, two torch threads on a 2-core machine that
another job is using spend most of their time spinning at barriers for a descheduled partner (a
batch-1 forward of the tiny model: ~400 ms instead of ~3 ms), which inflates every small-op path and
skews ratios. Unless ``OMP_WAIT_POLICY`` is already set, the suite therefore re-runs itself in a
child process with ``OMP_WAIT_POLICY=PASSIVE`` (it has to be set before the OpenMP runtime starts):
:func:`dgrpo.bench.main` does so before this module, torch and the items load (:mod:`dgrpo.bench.launch`).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

from ..config import ConfigError
from ..training.out_dir import check_output_path
from .items import ITEMS, P_DROP
from .options import GPU_ORDER, ITEM_KEYS, ORDER, SECTION_NOTE, build_parser
from .report import Row, markdown_table
from .workload import FLOP_FORMULA, FULL, GPU, QUICK, Ctx, Shapes


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict:
    import transformers

    info = {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "loadavg_start": os.getloadavg(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def item_order(row: Row) -> tuple[int, str]:
    """A row's place: by its item's number ("10. ..." after "4. ..."), then its text."""
    number = row.item.split(".", 1)[0]
    return (int(number) if number.isdigit() else 10**6, row.item)


def run_section(ctx: Ctx, keys: list[str], after_item=None) -> tuple[list[Row], dict]:
    """Run ``keys`` in order; ``after_item(rows, raw)`` is called after each (partial outputs survive a kill)."""
    rows: list[Row] = []
    raw: dict = {"shapes": ctx.shapes.to_json(), "device": str(ctx.device), "dtype": str(ctx.dtype)}
    for key in keys:
        t0 = time.perf_counter()
        load0 = os.getloadavg()
        try:
            r, d = ITEMS[key](ctx)
        except Exception as e:  # keep the other items; the error goes into the report and the exit code
            traceback.print_exc()
            raw[key] = {"error": f"{type(e).__name__}: {e}"}
            if after_item:  # (in item order, as after an item that ran: the rows were written unsorted)
                after_item(sorted(rows, key=item_order), raw)
            continue
        finally:
            gc.collect()
            if ctx.device.type == "cuda":
                torch.cuda.empty_cache()
        d["wall_s"] = round(time.perf_counter() - t0, 2)
        d["loadavg_before_after"] = [load0, os.getloadavg()]
        raw[key] = d
        rows += r
        log(f"{key} done in {d['wall_s']:.1f} s")
        if after_item:
            after_item(sorted(rows, key=item_order), raw)
    rows.sort(key=item_order)  # numbered items, in their order
    return rows, raw


def write_outputs(out: Path, result: dict, rows: list[Row]) -> None:
    result["table"] = [r.to_json() for r in rows]
    (out / "bench.json").write_text(json.dumps(result, indent=2, default=str))
    (out / "bench.md").write_text(render_md(result, rows))


def render_md(result: dict, rows: list[Row]) -> str:
    """bench.md: the run's header, each section's table (or why it has none), then the notes of the items run."""
    lines = _md_header(result["meta"])
    for section, title in (("cpu", "CPU"), ("gpu", "GPU (~0.5B Qwen2, bf16)")):
        lines += _md_section(result, rows, section, title)
    ran = {key for section in ("cpu", "gpu") for key in result.get(section, {}) if key in ITEM_KEYS}
    lines += _md_notes(ran)  # (ran or failed: its row or its error is in a table above)
    return "\n".join(lines)


def _md_header(m: dict) -> list[str]:
    """bench.md's title and the run's facts from ``result["meta"]``: date, command, machine, load, repetitions."""
    mach = m["machine"]
    quick = "quick smoke run: tiny shapes, the numbers are not the claims"
    kind = quick if m["quick"] else "full run"
    if m.get("only"):  # (a subset in full shapes is no "full run", which RESULTS.md calls the whole suite's)
        kind = f"{quick if m['quick'] else 'full shapes'}; --only {','.join(m['only'])}, not the whole suite"
    return [
        f"# dgrpo bench ({kind})",
        "",
        f"- date: {m['date']}",
        f"- command: `{m['command']}`",
        f"- machine: {mach['nproc']} cores, {mach['cpu_model']}{', GPU ' + mach['gpu'] if 'gpu' in mach else ''}; "
        f"torch {mach['torch']}, transformers {mach['transformers']}, {mach['torch_threads']} torch threads, "
        f"OMP_WAIT_POLICY={mach['omp_wait_policy']}",
        f"- load average (1, 5, 15 min) at start: {', '.join(f'{x:.2f}' for x in mach['loadavg_start'])}; at end: "
        f"{', '.join(f'{x:.2f}' for x in m.get('loadavg_end', []))}",
        "- every ratio: medians of the repetitions per candidate that its section states (or its row, where the row "
        "states its own), run alternately, the order reversed each round (A, B, B, A, ...), after warm-up rounds; "
        f"wall time of the whole run: {m.get('wall_s', 0):.0f} s",
        "",
    ]


def _md_section(result: dict, rows: list[Row], section: str, title: str) -> list[str]:
    """One section of bench.md: its rows' table and its failed items, or why it was not run."""
    lines = [f"## {title}", ""]
    if section not in result:
        return lines + ["not run (see --only and --section)", ""]
    sec = result[section]
    if "skipped" in sec:
        return lines + [f"skipped: {sec['skipped']}", ""]
    if "shapes" in sec:  # (the GPU section's shapes repeat fewer times than the CPU section's full ones)
        shapes = sec["shapes"]
        lines += [
            f"{shapes['name']} shapes; every ratio a median of {shapes['reps']} repetitions per candidate after "
            f"{shapes['warmup']} warm-up round(s), unless its row states its own",
            "",
        ]
    sec_rows = [r for r in rows if r.section == section]
    if sec_rows:
        lines += [markdown_table(sec_rows), ""]
    errors = {k: v["error"] for k, v in sec.items() if isinstance(v, dict) and "error" in v}
    for k, e in errors.items():
        lines.append(f"- **{k} failed**: {e}")
    if errors:
        lines.append("")
    return lines


def _md_notes(ran: set[str]) -> list[str]:
    """bench.md's closing notes: how each item that ran (``ran``: its keys) measures what it reports."""
    return ["## Notes", "", *(f"- {text}" for items, text in _notes() if items is None or ran & set(items)), ""]


def _notes() -> list[tuple[tuple[str, ...] | None, str]]:
    """Each note of bench.md, with the items it describes (None: every run's)."""
    return [
        (
            ("rollouts",),
            "Rollouts: all answers are forced to the same length (EOS logit set to -1e4 by a hook on the LM head), "
            f"greedy decoding; locked and native dropout with p={P_DROP}; the batch-1 recompute baseline "
            "(`dgrpo.model.reference.recompute_generate`) runs without dropout. The one-at-a-time baselines are timed "
            "on a subset of rollouts (stated in each row) and compared per rollout: their cost per rollout does not "
            "depend on K.",
        ),
        (
            ("sft",),
            "SFT: `naive` is `dgrpo.bench.baselines.naive_coconut_loss` (one full pass per latent + one, embeddings "
            "rebuilt from per-position Python lists, output_hidden_states=True, full-vocabulary logits everywhere); "
            "the two losses are asserted equal (1e-5 in fp32) before the ratio is reported.",
        ),
        (
            ("grpo_scaling", "perturbation"),
            "GRPO steps: `GRPOTrainer.step()` on fixed prompts, filter off, lr warm-up off, default beta0 "
            "(reference-model KL replay included); rollout/update split from the step's own `time_rollout_s` / "
            "`time_update_s`.",
        ),
        (
            ("memory", "lora", "recompute"),
            "Memory: each configuration in a fresh process (`python -m dgrpo.bench.memprobe`), measured on the step "
            "after a warm-up step; CPU: freed heap returned with malloc_trim, resident-set high-water mark reset "
            "through /proc/self/clear_refs, increment over the resident size just before the step; CUDA: "
            "max_memory_allocated over memory_allocated.",
        ),
        (
            ("lora",),
            "LoRA vs full fine-tuning (item 9): the same GRPO step (KL reference on: a frozen model copy for full "
            "fine-tuning, a frozen adapter under LoRA), rank 16, alpha 32, every linear layer plus the three latent "
            "rows; memory as above but the absolute peak of each arm; on CPU a wider model (6 layers x 768) than the "
            "other items, so that weights rather than the tiny model's activations set the memory.",
        ),
        (
            ("flops", "rollouts"),
            f"FLOPs: {FLOP_FORMULA}. Achieved = update FLOPs / the step's `time_update_s` (includes clip + AdamW).",
        ),
        (
            ("soak",),
            "Soak: `dgrpo grpo` as a child process (the real loop: metrics, eval, resumable checkpoints); its VmRSS is "
            "read from /proc each time the metrics file passes a multiple of 10 steps, and a least-squares line is "
            "fitted from step 20 on.",
        ),
        (
            ("optimizer",),
            "8-bit optimizer (GPU only): `bitsandbytes.optim.AdamW8bit` vs `torch.optim.AdamW` on the same bf16 "
            "weights; state bytes summed over the optimizer's state tensors after the timed steps.",
        ),
        (
            None,
            "OMP_WAIT_POLICY=PASSIVE is set by the suite unless already set: with the default spinning policy and a "
            "busy 2-core machine, small ops are slowed by up to ~100x and the ratios would be skewed.",
        ),
    ]


def run_suite(args: argparse.Namespace, argv: list[str]) -> int:
    torch.set_num_threads(2)
    t_start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    only = selected(args)
    shapes: Shapes = QUICK if args.quick else FULL
    result: dict = {
        "meta": {
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": "dgrpo bench " + " ".join(argv),
            "quick": bool(args.quick),
            "only": only if (args.only or "").strip(" ,") else None,  # (None: every item)
            "reps": shapes.reps,
            "warmup": shapes.warmup,
            "machine": machine_info(),
            "flop_formula": FLOP_FORMULA,
        }
    }
    rows: list[Row] = []
    cpu_keys = [k for k in ORDER if k in only] if args.section in ("all", "cpu") else []
    gpu_keys = [k for k in GPU_ORDER if k in only] if args.section in ("all", "gpu") else []

    def section(name: str, ctx: Ctx, keys: list[str]) -> None:
        nonlocal rows
        done = list(rows)

        def partial(sec_rows: list[Row], raw: dict) -> None:
            result[name] = raw
            write_outputs(out, result, done + sec_rows)

        r, result[name] = run_section(ctx, keys, partial)
        rows = done + r
        write_outputs(out, result, rows)

    if cpu_keys:
        log(f"CPU section ({shapes.name} shapes): {', '.join(cpu_keys)}")
        section("cpu", Ctx(torch.device("cpu"), torch.float32, shapes, log=log), cpu_keys)
    if gpu_keys:
        if torch.cuda.is_available():
            gshapes = QUICK if args.quick else GPU
            log(f"GPU section ({gshapes.name} shapes, bf16): {', '.join(gpu_keys)}")
            section("gpu", Ctx(torch.device("cuda"), torch.bfloat16, gshapes, log=log), gpu_keys)
        else:
            result["gpu"] = {"skipped": "no CUDA"}
            log("GPU section skipped: no CUDA")
    result["meta"]["loadavg_end"] = os.getloadavg()
    result["meta"]["wall_s"] = round(time.perf_counter() - t_start, 1)
    write_outputs(out, result, rows)
    log(f"wrote {out / 'bench.json'} and {out / 'bench.md'} ({result['meta']['wall_s']:.0f} s)")
    failed = [
        k for sec in ("cpu", "gpu") for k, v in result.get(sec, {}).items() if isinstance(v, dict) and "error" in v
    ]
    return 1 if failed else 0


def needs_cuda(section: str, only: list[str]) -> str:
    """What of a selection runs on CUDA alone, as an error names it: ``--section gpu``, or the ``--only`` items when
    none of them is a CPU section's item (``--only optimizer``); '' when the CPU section runs some."""
    if section == "gpu":
        return "--section gpu"
    if section == "all" and not any(k in ORDER for k in only):
        return f"--only {','.join(only)}"
    return ""


def selected(args: argparse.Namespace) -> list[str]:
    return [x.strip() for x in (args.only or "").split(",") if x.strip()] or ITEM_KEYS


def main(argv: list[str] | None = None) -> int:
    """The suite's checks of ``argv`` (the arguments after ``bench``), then its run, in this process: ``dgrpo bench``
    is :func:`dgrpo.bench.launch.main`, which calls this in a child with OMP_WAIT_POLICY=PASSIVE where it is unset."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    unknown = set(selected(args)) - set(ITEM_KEYS)
    if unknown:
        print(
            f"dgrpo: error: bench: unknown --only item(s) {', '.join(sorted(unknown))}; known: {', '.join(ITEM_KEYS)}",
            file=sys.stderr,
        )
        return 2
    only = selected(args)
    if args.only is not None and not args.only.strip(" ,"):  # ('' or ',' ran the whole suite)
        print("dgrpo: error: bench: --only names no item; leave it out to run them all", file=sys.stderr)
        return 2
    try:
        check_output_path(args.out)
    except ConfigError as e:
        print(f"dgrpo: error: bench: {e}", file=sys.stderr)
        return 2
    runnable = {"all": ITEM_KEYS, "cpu": ORDER, "gpu": GPU_ORDER}[args.section]
    if not any(k in runnable for k in only):  # (an empty report, exit 0, said only "not run")
        print(
            f"dgrpo: error: bench: --only {','.join(only)} runs nothing in --section {args.section}: {SECTION_NOTE}",
            file=sys.stderr,
        )
        return 2
    cuda_only = needs_cuda(args.section, only)
    if cuda_only and not torch.cuda.is_available():  # (an empty report, exit 0, said only "skipped: no CUDA")
        print(
            f"dgrpo: error: bench: {cuda_only} runs on CUDA only, and torch sees no CUDA device here: the CPU "
            "section runs without it (--section cpu)",
            file=sys.stderr,
        )
        return 2
    try:
        return run_suite(args, argv)
    except KeyboardInterrupt:  # (Ctrl-C: one line, as the other commands say it, not a traceback)
        written = Path(args.out) / "bench.json"
        kept = f"{written} holds the items finished before it" if written.is_file() else "nothing was written"
        print(f"dgrpo: interrupted (bench: {kept})", file=sys.stderr)
        return 130
