"""Time and memory of one Dropout-GRPO step at the paper's full scale, on the GPU (CPU: --device cpu or a small shape).

    python bench/paper_step.py --steps 3 [--device cuda] [--out runs/paper-step.json]
    python bench/paper_step.py --steps 3 --versus grpo.engine=eager --versus model.kernels=none \\
        --versus grpo.micro_batch_size=64 --versus grpo.recompute=false \\
        --versus model.compile_head=false --versus model.pack_gqa=false       # against the eager path, alternated
    python bench/paper_step.py --steps 2 --profile                             # kernels, busy share, FLOP/s, syncs
    python bench/paper_step.py --steps 8 --prompt-widths 80,100,136 --kept-groups 16,9,12 \
        --versus grpo.keep_graphs=false                                       # steps that vary as a real run's
    python bench/paper_step.py --steps 2 --profile --trace step.json.gz        # ... and the step's Chrome trace
    python bench/paper_step.py --tiny --device cpu --steps 1 --profile         # (CPU: the ops that would wait)
    python bench/paper_step.py --shape full --device cpu --set model.kernels=none --versus model.compile=true
    python bench/paper_step.py --shape host --device cpu --set model.kernels=none --set grpo.micro_batch_size=16 \
        --set grpo.prompts_per_step=4 --set grpo.group_size=8 --set threads=1   # the update's ops at little arithmetic

Builds a model of Qwen2.5-1.5B's shape (``--shape``: or one of the CPU bench suite's) with random weights (no hub
access needed) in the recipe's dtype, loads the packaged paper/grpo_dropout.yaml unchanged except: T = 6 is given
explicitly (there is no SFT checkpoint to read it from), the group filter is off and EOS is suppressed, so that
every step runs the full update on 16 x 32 rollouts of exactly ``max_new_tokens`` answer tokens (the worst case a
real step can reach). Prints one JSON line per step and a summary: step time (rollout / update split), peak
memory, the optimizer actually used. ``--set threads=N`` sets torch's CPU threads (the host proxy at one thread: with
two, every tiny op also pays for handing work to an OpenMP thread, which a GPU's host does not). An override of a key
the script does not read (the model's name or size, ``task``, ``data``, ``fsdp``, ...: :data:`UNUSED_KEYS`) is
refused.

``--prompt-widths`` and ``--kept-groups`` make the steps differ as a real run's do, the same for every arm: step i's
prompts are that many tokens wide (a filler prefix on the built-in problems; a real run's longest question changes
the prompt's columns, so the fast engine's kept decoders meet new shapes) and its group filter keeps that many groups
(a reward that gives those groups half their rollouts right and the others none: the update's rows change); each
step's row counts the CUDA graphs captured in it.

``--versus KEY=VALUE`` (repeatable) adds a second arm: a trainer on a copy of the same initial weights (cast to its
``model.dtype``) with those overrides on top, stepping alternately with the recipe on the same prompts; the summary
gives each arm's medians and the recipe / versus ratio of the step. ``--profile`` (CUDA) adds, after the timed steps,
one step of the recipe under the profiler (device kernels, host launch calls, kernel-busy share of the wall, FLOP/s by
the counting rule of bench/RESULTS.md against the bf16 matmul peak measured in the same process; per phase and per path
of the calls :func:`step_labels` names, host time, the device idle time it caused and its kernels' time; the costliest
kernels; ``--trace``: the step's Chrome trace, for Perfetto) and one under sync-debug mode (the calls that made the host
wait for the device, by call site). On a CPU ``--profile`` gives, for one more step, the ops that would make the host
wait were they on a GPU, by call site (the step's host-side bookkeeping counts there too), for another the ops that
reach a kernel in the rollout and in the update (about the launches the eager layers would make on a GPU), and for a
third the host time per path of labelled calls (``--shape host``: a GPU step's host work). """

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch._dynamo.utils import counters

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from dgrpo.bench import step_profile, timeline  # noqa: E402
from dgrpo.bench.workload import FULL, QUICK, Shapes, build_lm, task_records  # noqa: E402
from dgrpo.cli.common import positive_int  # noqa: E402
from dgrpo.config import Config, ConfigError, load_config  # noqa: E402
from dgrpo.data.records import Record  # noqa: E402
from dgrpo.eval.scoring import Rewards  # noqa: E402
from dgrpo.model import latent_lm  # noqa: E402
from dgrpo.model.decoding import AnswerBook  # noqa: E402
from dgrpo.model.fixed_shape import FixedShapeDecoder  # noqa: E402
from dgrpo.model.latent_chain import LatentChain  # noqa: E402
from dgrpo.model.latent_lm import LatentLM  # noqa: E402
from dgrpo.training import grpo  # noqa: E402
from dgrpo.training.grpo import GRPOTrainer  # noqa: E402

#: Qwen2.5-1.5B: 28 layers, hidden 1536, 12 query / 2 KV heads, FFN 8960, vocabulary 151,936.
QWEN25_15B = Shapes(name="qwen2.5-1.5b", hidden=1536, layers=28, heads=12, kv_heads=2, ffn=8960, vocab=151936)
#: T (given explicitly: there is no SFT checkpoint to read it from), and what else the measurement fixes on top of
#: the packaged recipe
T = 6
#: Qwen2.5-1.5B's depth at the quick shape's width: a CPU proxy for a GPU step's host time (every op of the 28-layer
#: step is dispatched, by Python and the autograd engine, at little arithmetic per op)
HOST = dataclasses.replace(QUICK, name="host", layers=QWEN25_15B.layers)
#: --shape: the paper's model, the bench suite's CPU sizes (dgrpo.bench.workload) and the host-time proxy
SHAPES = {s.name: s for s in (QWEN25_15B, FULL, QUICK, HOST)}
MEASURED = [f"grpo.n_latent={T}", "grpo.filter=false", "grpo.warmup_steps=0"]
#: config keys (or sections, ending in '.') this script does not read: its model is built from ``--shape`` with
#: random weights, its prompts are built-in problems, it runs one process and no SFT, evaluation or tracking
UNUSED_KEYS = (
    *(f"model.{k}" for k in ("name_or_path", "revision", "arch", "hidden_size", "num_layers", "num_heads")),
    *(f"model.{k}" for k in ("intermediate_size", "trust_remote_code", "latent_token_init")),
    *("task.", "data.", "sft.", "eval.", "logging.", "fsdp", "device"),
)
#: the keys of those sections that the GRPO trainer reads all the same: the reward's default (``eval.scorer``) and how
#: prompts are cut and written
READ_KEYS = ("eval.scorer", "data.max_question_tokens", "data.chat_template")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=positive_int, default=3, help="timed steps per arm (after one warm-up step each)")
    ap.add_argument(
        "--device",
        default=None,
        help="cpu or cuda (default: cuda where there is one; without, cpu for the CPU shapes, and Qwen2.5-1.5B's is "
        "refused unless --device cpu asks for it: hours a step)",
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra config overrides")
    ap.add_argument(
        "--versus",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a second arm with these overrides on top, alternated with the recipe",
    )
    ap.add_argument(
        "--profile", action="store_true", help="one profiled and one sync-counted step (CUDA; CPU: waiting ops)"
    )
    ap.add_argument(
        "--trace",
        default=None,
        metavar="PATH",
        help="with --profile: write the profiled step's Chrome trace here (.json, or .json.gz compressed) for "
        "Perfetto or chrome://tracing",
    )
    ap.add_argument("--out", default="", help="write the summary JSON here too")
    ap.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        help=f"the model's shape: Qwen2.5-1.5B's ({QWEN25_15B.name}, the default), the CPU bench suite's 128-wide "
        "model (full), a tiny one (quick), or the tiny one 28 layers deep (host: a CPU proxy for the host's share of a "
        "GPU step)",
    )
    ap.add_argument("--tiny", action="store_true", help="= --shape quick (a smoke test of this script)")
    ap.add_argument(
        "--prompt-widths",
        type=int_list,
        default=[],
        metavar="W,W,...",
        help="step i's prompts are W tokens wide (the longest of them; a filler prefix on the built-in problems), the "
        "list cycled over the steps, the warm-up first: prompt widths that change from step to step as a real run's do",
    )
    ap.add_argument(
        "--kept-groups",
        type=int_list,
        default=[],
        metavar="N,N,...",
        help="step i's group filter keeps N of its groups (cycled like --prompt-widths; turns grpo.filter on): a "
        "reward gives N groups half their rollouts right and the others none, so the update's rows change from step "
        "to step as a real run's do",
    )
    args = ap.parse_args()
    if args.tiny and args.shape not in (None, QUICK.name):  # (None: --shape not given)
        ap.error(f"--tiny is --shape {QUICK.name}: give --shape {args.shape} or --tiny, not both")
    args.shape = QUICK.name if args.tiny else args.shape or QWEN25_15B.name
    if args.trace is not None and not args.profile:
        ap.error("--trace writes the profiled step's trace: add --profile")
    if args.trace is not None and not args.trace.strip():
        ap.error("--trace: an empty path; give the trace file's (or leave --trace out)")
    args.trace = args.trace or ""
    for flag, path in (("--out", args.out), ("--trace", args.trace)):  # (written after the steps: checked before)
        problem = unwritable(Path(path)) if path else ""
        if problem:
            ap.error(f"{flag} {path}: {problem}")
    if any(w < 1 for w in args.prompt_widths) or any(n < 0 for n in args.kept_groups):
        ap.error("--prompt-widths are positive and --kept-groups non-negative")
    return args


def unwritable(path: Path) -> str:
    """Why the file ``path`` could not be written once the steps have run ('' if it can; its folder is made now, as
    a fresh clone has no runs/): a missing folder ended the run in a traceback after its measurements."""
    if path.is_dir():
        return "is a directory; give a file's path"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"its folder cannot be made ({e.strerror})"
    return ""


def check_read(overrides: list[str], flag: str) -> None:
    """Refuse an override of a key this script does not read (:data:`UNUSED_KEYS`): it was accepted and changed
    nothing, so a measurement said to be of another model or task was of the recipe's."""
    for kv in overrides:
        key = kv.partition("=")[0].strip()
        if key not in READ_KEYS and any(key == k or (k.endswith(".") and key.startswith(k)) for k in UNUSED_KEYS):
            fail(
                f"{flag} {kv}: this script does not read {key} (it builds a random model of --shape's size in the "
                "recipe's model.dtype, on the built-in problems, in one process, on --device)"
            )


def fail(message: str) -> NoReturn:
    """An argument found wrong after parsing (a device, an override, a size): one line and exit 2, as argparse's."""
    print(f"paper_step.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def int_list(text: str) -> list[int]:
    """``"3,5,8"`` -> [3, 5, 8]."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


#: what lengthens a prompt for --prompt-widths: one token of the built-in tokenizer per copy
FILLER = "0"


def widened(lm: LatentLM, records: list[Record], width: int) -> list[Record]:
    """``records`` with the same filler prefix each, as many copies as keep the longest prompt within ``width``
    tokens (so it takes ``width`` where the filler is one token)."""
    questions = [r.question for r in records]

    def longest(n: int) -> int:
        return lm.encode_questions([FILLER * n + q for q in questions])[0].shape[1]

    if longest(0) > width:
        raise ValueError(f"--prompt-widths {width}: the problems alone take {longest(0)} tokens; give at least that")
    lo, hi = 0, width  # the most copies that fit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if longest(mid) <= width else (lo, mid - 1)
    return [dataclasses.replace(r, question=FILLER * lo + r.question) for r in records]


class GroupsKept:
    """A reward for --kept-groups: of the step's problems (:meth:`start`), the first ``kept`` get every other rollout
    right (accuracy 1/2, inside the filter's window), the rest none (outside it): the filter keeps ``kept`` groups."""

    def __init__(self) -> None:
        self.kept = 0
        self.order: dict[str, int] = {}  # the step's problems, by question
        self.seen: dict[str, int] = {}  # rollouts scored so far, by question

    def start(self, prompts: list[Record], kept: int) -> None:
        self.kept, self.order = kept, {r.question: i for i, r in enumerate(prompts)}

    def __call__(self, completions: list[str], records: list[Record]) -> list[float]:
        out = []
        for r in records:
            j = self.seen[r.question] = self.seen.get(r.question, -1) + 1
            out.append(float(self.order.get(r.question, self.kept) < self.kept and j % 2 == 0))
        return out


class Schedule:
    """What changes from one step to the next (--prompt-widths, --kept-groups), each list cycled over the steps."""

    def __init__(self, lm: LatentLM, prompts: list[Record], widths: list[int], kept: list[int]):
        """Every width's prompts are made here (a width too narrow for the problems: ValueError, before any step)."""
        self.lm, self.prompts, self.widths, self.kept = lm, prompts, widths, kept
        self.reward = GroupsKept()  # (the trainers' reward, for kept)
        self._by_width = {width: widened(lm, prompts, width) for width in dict.fromkeys(widths)}

    def begin(self, i: int) -> tuple[list[Record], dict]:
        """Step ``i``'s prompts (the reward told which groups to keep), and what its row says of them."""
        prompts, row = self.prompts, {}
        if self.widths:
            width = row["prompt_width"] = self.widths[i % len(self.widths)]
            prompts = self._by_width[width]
        if self.kept:
            row["kept_groups"] = self.kept[i % len(self.kept)]
            self.reward.start(prompts, row["kept_groups"])
        return prompts, row


@contextlib.contextmanager
def graph_captures() -> Iterator[list[int]]:
    """``[n]``: the CUDA graphs captured inside the block so far (each capture begins with
    ``CUDAGraph.capture_begin``; none on a CPU)."""
    count = [0]

    def counted(begin: Any) -> Any:
        def call(self: torch.cuda.CUDAGraph, *args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            return begin(self, *args, **kwargs)

        return call

    with timeline.wrapped_calls([(torch.cuda.CUDAGraph, "capture_begin", counted)]):
        yield count


def timed_step(tr: GRPOTrainer, prompts: list[Record], device: torch.device, i: int) -> dict:
    """One step of ``tr``: wall time, the trainer's rollout / update split, peak memory on CUDA."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    with graph_captures() as captures:
        m = tr.step(prompts=prompts)
    if device.type == "cuda":
        torch.cuda.synchronize()
    row = {
        "step": i,
        "warmup": i == 0,
        "wall_s": round(time.perf_counter() - t, 3),
        "rollout_s": m["time_rollout_s"],
        "update_s": m["time_update_s"],
        "n_rollouts_kept": m["n_rollouts_kept"],
        "captures": captures[0],
    }
    if device.type == "cuda":  # (reserved: what the allocator holds, dead graph pools included, after the step)
        row["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        row["reserved_gib"] = round(torch.cuda.memory_reserved() / 2**30, 2)
    return row


def make_trainers(
    arms: dict[str, tuple[LatentLM, Config]], prompts: list[Record], reward: GroupsKept | None
) -> tuple[dict[str, GRPOTrainer], dict[str, str]]:
    """A trainer per arm, and the fused layers each got: its ``model.kernels`` where the trainer applied them
    (``GRPOTrainer.kernels``), else ``none`` and where they were not (Liger's only warn off CUDA)."""
    trainers, kernels = {}, {}
    with warnings.catch_warnings():  # a scheduled reward grades no answer: its 0 for the gold answers is by design
        warnings.filterwarnings("ignore", message="the reward gives 0 to the gold answer")
        for name, (lm, cfg) in arms.items():
            tr = trainers[name] = GRPOTrainer(lm, cfg, prompts, reward_fn=reward)
            kind = cfg.model.kernels
            kernels[name] = kind if tr.kernels == kind else f"none ({kind} not applied on {lm.device})"
    return trainers, kernels


def summarize(tr: GRPOTrainer, rows: list[dict], device: torch.device, kernels: str) -> dict:
    """The medians of ``tr``'s timed ``rows`` and the settings it ran with, as resolved (``kernels``: as applied,
    :func:`make_trainers`)."""
    timed = [r for r in rows if not r["warmup"]]
    g, applied = tr.cfg.grpo, tr.applied()  # (what a run's applied.json records)
    out = {
        "micro_batch_size": g.micro_batch_size,
        "engine": applied["engine"],
        "kernels": kernels,
        "compile": tr.cfg.model.compile,
        # (as resolved: auto is on on CUDA; the head is false again should its compiler have failed)
        "compile_head": applied["compile_head"],
        "pack_gqa": applied["pack_gqa"],
        "recompute": g.recompute_granularity if g.recompute else False,
        "recompute_latent_steps": g.recompute_latent_steps,
        "recompute_kept_layers": g.recompute_kept_layers,
        "optimizer": type(tr.opt).__name__,
        "dtype": str(next(tr.lm.model.parameters()).dtype),
        "update_latent_graphs": applied["update_latent_graphs"],  # (as resolved: auto is on where the chain can run)
        "median_step_s": statistics.median(r["wall_s"] for r in timed),
        "median_rollout_s": statistics.median(r["rollout_s"] for r in timed),
        "median_update_s": statistics.median(r["update_s"] for r in timed),
        "hours_for_3000_steps": round(3000 * statistics.median(r["wall_s"] for r in timed) / 3600, 2),
        "captures_in_timed_steps": sum(r["captures"] for r in timed),
    }
    if device.type == "cuda":
        out["peak_allocated_gib"] = max(r["peak_allocated_gib"] for r in timed)
    out["kept_decoders_gib"] = round(tr.kept_decoder_bytes() / 2**30, 3)  # (grpo.keep_graphs: held through the update)
    if tr.chain_latents:
        out["latent_chain"] = latent_chain_state(tr)
    return out


def latent_chain_state(tr: GRPOTrainer) -> dict:
    """Whether the update's latent chain is kept, and whether its graphs were captured or the capture failed (a
    failure only warns, and the chain then runs the steps one by one)."""
    kept = tr.lm.kept_decoders.get("update")
    if kept is None:
        return {"kept": False}
    chain = kept[1]
    out = {"kept": True, "captured": chain.forward_graph is not None, "failed": chain.failed}
    if chain.forward_graph is not None:  # (its static tensors are in kept_decoders_gib)
        out["pool_gib"] = pool_gib(chain.pool)
    return out


def pool_gib(pool: tuple[int, int]) -> float | None:
    """The device memory a CUDA graph pool holds reserved (the allocator's segments that pool owns): for the chain,
    the forward's saved activations and the backward's scratch. None where the snapshot does not say."""
    try:
        segments = torch.cuda.memory_snapshot()
        held = sum(s["total_size"] for s in segments if tuple(s["segment_pool_id"]) == tuple(pool))
    except (KeyError, TypeError, RuntimeError):
        return None
    return round(held / 2**30, 3)


def profile_recipe(
    tr: GRPOTrainer, prompts: list[Record], device: torch.device, dtype: torch.dtype, trace: str = ""
) -> dict:
    """Device activity, FLOP/s by the counting rule and host syncs of one more step of the recipe (``trace``: where
    to write the profiled step's Chrome trace)."""
    peak = step_profile.matmul_peak(device, dtype)
    prompt_len = tr.lm.encode_questions([r.question for r in prompts])[0].shape[1]
    rows, tokens = len(prompts) * tr.cfg.grpo.group_size, prompt_len + T + tr.cfg.grpo.max_new_tokens
    flops = step_profile.grpo_step_flops(tr.lm, rows, tokens)
    act = labelled_activity(tr, prompts, device, trace)
    achieved = flops / act["profiled_wall_s"]
    out = {
        **act,
        "tokens_per_row": tokens,
        "step_tflop": round(flops / 1e12, 1),
        "achieved_tflops": round(achieved / 1e12, 1),
        "matmul_peak_tflops": round(peak / 1e12, 1),
        "share_of_peak": round(achieved / peak, 4),
    }
    return {**out, **step_profile.host_syncs(lambda: tr.step(prompts=prompts))}


#: the step's phases in a profile, each a trainer method (the reference and the optimizer run inside the update)
PHASES = {
    "rollout": "_collect",
    "update": "_update",
    "reference": "_reference_logprobs",
    "optimizer": "_optimizer_step",
}


def labelled_activity(tr: GRPOTrainer, prompts: list[Record], device: torch.device, trace: str = "") -> dict:
    """One more step of ``tr`` under the profiler (``step_profile.device_activity``), each method named in PHASES
    inside a profiler range of its phase's name and the calls of :func:`step_labels` inside theirs: the phases'
    busy shares and costliest kernels, and per label path its host time, the device idle time it caused and its
    kernels' time (``trace``: also write the step's Chrome trace there)."""
    with timeline.labelled_calls(step_labels(tr)) as labels:
        return step_profile.device_activity(lambda: tr.step(prompts=prompts), device, tuple(PHASES), labels, trace)


def step_labels(tr: GRPOTrainer) -> list[tuple[Any, str, timeline.Label]]:
    """What a profiled step's time is told by (``timeline.labelled_calls``): the phases, and inside them the model's
    forward calls (by phase, with or without grad), the rollout's fixed-shape steps (warm-up, capture, replay or
    eager), its token choices, the head's log-probs, the perturbation's binding, the backward, the optimizer's parts
    and the host-side text work."""

    def forward(lm: LatentLM, cache: Any, phase: str, *args: Any, **kwargs: Any) -> str:
        return f"{phase} forward" + (" with grad" if torch.is_grad_enabled() else "")

    def decoder_step(dec: FixedShapeDecoder, phase: str) -> str:
        return f"{phase} step: {dec.next_step(phase)}"

    def chain(kind: str) -> timeline.Label:
        def label(c: LatentChain, *args: Any) -> str:
            how = "eager" if not c.capture else ("replay" if c.forward_graph is not None else "capture")
            return f"latent chain {kind}: {how}"

        return label

    return [
        *((tr, method, phase) for phase, method in PHASES.items()),
        (LatentLM, "_call_base", forward),
        (FixedShapeDecoder, "step", decoder_step),
        (LatentChain, "forward", chain("forward")),
        (LatentChain, "backward", chain("backward")),
        (AnswerBook, "choose", "token choice"),
        (LatentLM, "logits", "LM head logits"),
        (latent_lm, "head_logprobs", "head log-probs"),  # (the name LatentLM._scored calls, imported from decoding)
        (LatentLM, "encode_questions", "tokenize"),
        (LatentLM, "decode", "detokenize"),
        (Rewards, "__call__", "reward"),
        (tr.perturbation, "bind", "perturbation bind"),
        (grpo, "replay_logprobs", "replay"),
        (grpo, "grpo_objective", "objective"),
        (torch.autograd, "backward", "backward"),
        (torch.nn.utils, "clip_grad_norm_", "clip grad norm"),
        (tr.opt, "step", "optimizer step"),
        (grpo, "weights_finite", "finite-weights check"),
    ]


def phase_ops(tr: GRPOTrainer, prompts: list[Record]) -> dict:
    """The ops that reach a kernel in one more step of ``tr``: in its rollout, in its update and in all."""
    counts: dict[str, int] = {}

    def counting(name: str) -> Any:
        def wrap(method: Any) -> Any:
            def run(*args: Any, **kwargs: Any) -> Any:
                out, counts[name] = step_profile.counted_ops(lambda: method(*args, **kwargs))
                return out

            return run

        return wrap

    with timeline.wrapped_calls([(tr, PHASES[name], counting(name)) for name in ("rollout", "update")]):
        _, total = step_profile.counted_ops(lambda: tr.step(prompts=prompts))
    return {"ops_rollout": counts["rollout"], "ops_update": counts["update"], "ops_step": total}


def alternate(
    trainers: dict[str, GRPOTrainer],
    prompts: list[Record],
    device: torch.device,
    steps: int,
    schedule: Schedule | None = None,
) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """A warm-up step and ``steps`` timed steps of each arm in turn (``schedule``: each step's prompts and kept groups,
    the same for every arm), each row printed as it ends: (rows by arm, why an arm stopped). The arms' order turns
    round every step: what the process keeps for a shape met once (the allocator's segments, Triton's and cuBLAS'
    kernels for it) is paid by whichever arm meets a new shape first, so with a schedule each arm goes first in every
    other step. An arm that runs out of device memory is dropped (its trainer and memory freed) and the others go on,
    so that one configuration too large for the card does not lose the measurements of the rest."""
    rows: dict[str, list[dict]] = {name: [] for name in trainers}
    failed: dict[str, str] = {}
    for i in range(steps + 1):
        step_prompts, said = schedule.begin(i) if schedule else (prompts, {})
        for name in list(trainers)[:: 1 if i % 2 == 0 else -1]:
            try:
                rows[name].append({"arm": name, **said, **timed_step(trainers[name], step_prompts, device, i)})
            except torch.OutOfMemoryError as e:
                failed[name] = f"out of memory in step {i}: {str(e).splitlines()[0][:300]}"
            if name in failed:  # outside the handler: its traceback no longer holds the step's tensors
                del trainers[name], rows[name]
                gc.collect()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                print(json.dumps({"arm": name, "step": i, "error": failed[name]}), flush=True)
                continue
            print(json.dumps(rows[name][-1]), flush=True)
    return rows, failed


def default_device(shape: str) -> str:
    """cuda where there is one; else cpu, but for Qwen2.5-1.5B's shape, which is refused: a step of its 512 rollouts
    takes hours on a CPU (the README's GPU commands, run where there is no GPU, started it and never ended)."""
    if torch.cuda.is_available():
        return "cuda"
    if shape == QWEN25_15B.name:
        fail(
            f"no CUDA device, and --shape {shape} (the default) on a CPU takes hours a step: give --device cpu to run "
            "it all the same, or --tiny / --shape full|host|quick for a CPU's sizes"
        )
    return "cpu"


def main() -> int:
    args = parse_args()
    args.device = args.device or default_device(args.shape)
    try:
        device = torch.device(args.device)
    except RuntimeError as e:
        fail(f"--device {args.device!r}: {e}")
    if device.type not in ("cpu", "cuda"):
        fail(f"--device {args.device!r}: cpu or cuda (this script measures no other)")
    if device.type == "cuda" and not torch.cuda.is_available():
        fail("--device cuda, but this machine has no CUDA device (use --device cpu)")
    check_read(args.set, "--set")
    check_read(args.versus, "--versus")
    measured = [*MEASURED, "grpo.filter=true"] if args.kept_groups else MEASURED  # (--kept-groups: the filter acts)
    try:
        configs = [load_config(Config, "paper/grpo_dropout.yaml", [*measured, *args.set])]
        if args.versus:
            configs.append(load_config(Config, "paper/grpo_dropout.yaml", [*measured, *args.set, *args.versus]))
    except ConfigError as e:
        fail(str(e))
    if any(c.model.lora.r for c in configs):  # (train_grpo's adapters need a model saved on disk; this one is not)
        fail(
            "model.lora: LoRA needs a model saved on disk and this step's is built in memory, so every weight "
            "trains here (it was ignored); LoRA's step: dgrpo bench --only lora"
        )
    cfg = configs[0]
    if any(n > cfg.grpo.prompts_per_step for n in args.kept_groups):
        fail(f"--kept-groups: a step has {cfg.grpo.prompts_per_step} groups; got {args.kept_groups}")
    dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
    if cfg.threads:  # (--set threads=1: the host proxy without OpenMP's wake-ups in every tiny op)
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    shape = SHAPES[args.shape]
    lm = build_lm(shape, device, dtype, keep=False)  # no spare copy on the device
    prompts = task_records(cfg.grpo.prompts_per_step)
    varied = args.prompt_widths or args.kept_groups
    try:
        schedule = Schedule(lm, prompts, args.prompt_widths, args.kept_groups) if varied else None
    except ValueError as e:  # (a width under the problems' own: one line, before the trainers are built)
        fail(str(e))
    reward = schedule.reward if schedule and args.kept_groups else None
    arms = {"recipe": (lm, cfg)}
    if args.versus:  # a copy of the weights before the recipe's trainer swaps in its kernels
        versus = configs[1]
        arms["versus"] = (copy.deepcopy(lm).to(getattr(torch, versus.model.dtype)), versus)  # (its model.dtype)
    trainers, kernels = make_trainers(arms, prompts, reward)
    head = {"built_s": round(time.perf_counter() - t0, 1), "params": sum(p.numel() for p in lm.model.parameters())}
    print(json.dumps({**head, "device": str(device), "dtype": str(dtype), "versus": args.versus}), flush=True)
    if device.type == "cuda":
        retries0 = step_profile.allocator_retries()
    rows, failed = alternate(trainers, prompts, device, args.steps, schedule)
    summary: dict = {
        "shape": shape.name,
        "prompts": cfg.grpo.prompts_per_step,
        "K": cfg.grpo.group_size,
        "T": T,
        "max_new_tokens": cfg.grpo.max_new_tokens,
        **({"schedule": {"prompt_widths": args.prompt_widths, "kept_groups": args.kept_groups}} if varied else {}),
        **({"failed": failed} if failed else {}),
        **(summarize(trainers["recipe"], rows["recipe"], device, kernels["recipe"]) if "recipe" in trainers else {}),
    }
    if device.type == "cuda":
        summary.update(gpu=torch.cuda.get_device_name(0), allocator_retries=step_profile.allocator_retries() - retries0)
    if any(tr.cfg.model.compile for tr in trainers.values()):  # graphs dynamo built (model.compile: 3 per grad mode)
        summary["compiled_graphs"] = counters["stats"]["unique_graphs"]
    if "versus" in trainers:
        theirs = summarize(trainers["versus"], rows["versus"], device, kernels["versus"])
        summary["versus"] = {"overrides": args.versus, **theirs}
    if "recipe" in trainers and "versus" in trainers:
        pairs = [a["wall_s"] / b["wall_s"] for a, b in zip(rows["recipe"], rows["versus"]) if not a["warmup"]]
        summary["step_ratio"] = round(summary["median_step_s"] / summary["versus"]["median_step_s"], 4)
        summary["step_ratio_per_round"] = [round(r, 4) for r in pairs]
    if args.profile and "recipe" in trainers:
        recipe = trainers["recipe"]
        if schedule:  # (profiled: steps like the warm-up)
            prompts = schedule.begin(0)[0]
        if device.type == "cuda":
            prof = summary["profile"] = profile_recipe(recipe, prompts, device, dtype, args.trace)
            # the rule: the profiled step's kernel time (and FLOPs) over a timed step's wall, which the
            # profiler's host overhead does not stretch
            median = summary["median_step_s"]
            prof["gpu_busy_of_median_step"] = round(prof["gpu_busy_s"] / median, 3)
            prof["share_of_peak_at_median_step"] = round(prof["step_tflop"] / median / prof["matmul_peak_tflops"], 4)
        else:  # no kernels to count on a CPU: the ops that would make a GPU's host wait, and the ops per phase
            waits = step_profile.waiting_ops(lambda: recipe.step(prompts=prompts), top=24)
            # the phases' and labelled calls' host times, costliest calls
            act = labelled_activity(recipe, prompts, device, args.trace)
            summary["profile"] = {
                **waits,
                **phase_ops(recipe, prompts),
                "phases": act["phases"],
                "by_range": act["by_range"],
                "host_top": act["host_top"],
            }
    print(json.dumps(summary), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "steps": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
