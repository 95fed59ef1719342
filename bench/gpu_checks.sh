#!/usr/bin/env bash
# The GPU measurements of the paper-scale step and the CUDA tests, in priority order, inside one time budget; for a
# GPU node you hold for a short while, possibly one without network access. Each item's output goes to its own log
# in OUT_DIR; an item that would not end inside the budget is cut at the deadline (its log keeps what it printed),
# and the items after it are skipped. bench/RESULTS.md says what each figure means.
#
#   bash bench/gpu_checks.sh [OUT_DIR] [BUDGET_S]      # default: runs/gpu_checks, 540 s
#   ONLY="capture_smoke recipe_profile" bash bench/gpu_checks.sh ...   # just the items named (unknown names: refused;
#                                      # a smoke item left out gates nothing: the chain's items need chain_smoke named
#                                      # to run only when its tests pass, the rest capture_smoke)
#
# OUT_DIR gets about a dozen files (a log per item, summary.txt, environment.txt, gpu_clocks.csv, the profiled
# step's trace). Where only a few files come back from the node, bundle them after the run, the trace apart (it may
# be ~10 MB):
#
#   bash bench/gpu_checks.sh /tmp/gc 515; mv /tmp/gc/*.json.gz "$OUT"/; tar czf "$OUT"/gpu_checks.tgz -C /tmp gc
#
# The node's Python needs torch with CUDA, transformers, liger-kernel, bitsandbytes, pytest and hypothesis (pip install
# -e ".[gpu,test]").
# On a node without network, download the three wheels on a machine with it, copy the folder beside the checkout and
# point WHEELS at it; they are installed into a temporary folder on PYTHONPATH (the node's torch, triton, numpy,
# tokenizers, huggingface_hub are used as they are):
#
#   bash bench/gpu_checks.sh --download-wheels .whl    # here: ~58 MB, for CPython 3.12 on x86-64 Linux
#   WHEELS=.whl bash bench/gpu_checks.sh               # there
#
# Items (name: what it shows), most wanted first:
#   capture_smoke      : the CUDA tests of the fast engine's graph capture and of the mask prefetch's pinning beside
#                        captures (seconds); the script stops if they fail (or if torch sees no CUDA device)
#   recipe_profile     : the recipe as shipped (per-layer recomputation, all 512 rows in one micro-batch, the latent
#                        steps not recomputed, the update's latent steps captured: grpo.update_latent_graphs=auto),
#                        alone in its process (its peak memory), three timed steps, then its
#                        profile: busy share overall and per phase, kernels, FLOP/s, host syncs by call site, the
#                        costliest host calls and kernels, by_range (host, idle and kernel time per path of labelled
#                        calls), and the step's Chrome trace in recipe_trace.json.gz
#   extra_profile      : only with EXTRA_PROFILE=path/to/script.py: that script, run from the checkout's root with
#                        src/ on PYTHONPATH (e.g. a profile tool kept with an issue, carried to the node), with the
#                        arguments in EXTRA_PROFILE_ARGS (e.g. "28 grpo.optimizer=adamw8bit")
#   recipe_vs_earlier  : the recipe alternated with the earlier GPU path (eager engine, HF layers, 64-row
#                        micro-batches, no recomputation, eager head statistics, SDPA's own grouped-query attention):
#                        the issue's fast / eager ratio; three timed steps each
#   fast_vs_eager      : the recipe against grpo.engine=eager on the same weights and prompts (the engine key alone)
#   lever_smoke        : the CUDA tests of the compiled head and of packed grouped-query attention (seconds)
#   kernel_levers      : bench/kernel_levers.py: the compiled head, the packed attention and a matmul decode
#                        attention, each alone against what it replaces at the paper step's shapes (seconds)
#   head_pack_vs_none  : the recipe against model.compile_head=false and model.pack_gqa=false, alternated: what
#                        the compiled head statistics and the packed grouped-query attention save together
#   chain_smoke        : the CUDA tests of grpo.update_latent_graphs (the update's latent steps as one captured
#                        forward and backward) and of the latent steps' keys and values kept once; the chain's step
#                        items after it run only if they pass
#   recipe_vs_no_chain : the recipe against grpo.update_latent_graphs=false, alternated
#   varied_chain       : recipe_vs_no_chain over steps as a real run's vary (VARIED: prompts 76-136 tokens wide, the
#                        longest of 16 GSM-Hard / SVAMP questions at ~4 characters a token; 6-16 groups kept by the
#                        filter), eight timed steps: what the chain gives when its shapes change (each row: captures)
#   chain_no_recompute : the recipe (the chain on) with no recomputation and 128-row micro-batches (four per step),
#                        alone in its process, three timed steps: against recipe_profile's steps, what
#                        the recomputation's second forward (~0.9 of a pass of the update's ~4.9) costs once the latent
#                        steps are captured, and the peak memory without it (bench/kept_layer_bytes.py counts 9.52 MiB
#                        a layer and row with Hugging Face's layers: <= ~33 GiB of activations at 128 rows)
#   kept_vs_capture    : the recipe (grpo.keep_graphs: each decoder's graphs captured once, replayed every later step)
#                        against grpo.keep_graphs=false (captured again for every batch), alternated
#   varied_kept        : kept_vs_capture over the VARIED steps: what keeping one decoder per purpose saves when the
#                        prompt's columns and the update's rows change from step to step
#   kept_layers        : the recipe with its last KEPT_LAYERS (default 6) layers kept out of recomputation against the
#                        recipe (what a kept layer saves in time; bench/kept_layer_bytes.py counts what it costs in
#                        memory); KEPT_LAYERS=1 for a try-out on a 2-layer shape
#   reference_share    : the recipe against grpo.beta0=0 (no reference model: what its forward pass costs a step)
#   head_vs_eager_head : the recipe against model.compile_head=false (the compiled head statistics alone)
#   packed_vs_sdpa     : the recipe against model.pack_gqa=false (the packed grouped-query attention alone)
#   cuda_tests         : pytest tests/test_cuda.py, and the CUDA tests kept beside their CPU ones (Dist's reduction
#                        through the backend's device, sampling CUDA logits with a CPU generator, a resume's read of
#                        a truncated CUDA random state)
#   call256_vs_recipe  : per-call recomputation of every call at 256-row micro-batches (the recipe until 2026-11-25)
#   hf_vs_liger        : the recipe against model.kernels=none (what Liger's layers save)
#   compiled_vs_liger  : model.compile=true with Hugging Face's layers (profiled) against the recipe's Liger layers
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEEL_SPECS=(liger-kernel==0.8.5 bitsandbytes==0.50.2 transformers==5.24.0)
# the items, in the order they run: ONLY's names are checked against these before anything runs (a mistyped name
# would otherwise skip its item without a word), and run_item refuses a name not here
ITEMS=(capture_smoke recipe_profile extra_profile recipe_vs_earlier fast_vs_eager lever_smoke kernel_levers
    head_pack_vs_none chain_smoke recipe_vs_no_chain varied_chain chain_no_recompute kept_vs_capture varied_kept
    kept_layers reference_share head_vs_eager_head packed_vs_sdpa cuda_tests call256_vs_recipe hf_vs_liger
    compiled_vs_liger)
is_item() { [[ " ${ITEMS[*]} " == *" $1 "* ]]; }

if [[ "${1:-}" == "--download-wheels" ]]; then
    dest=${2:?--download-wheels DIR}
    platforms=()
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
        manylinux2014_x86_64 manylinux1_x86_64; do platforms+=(--platform "$p"); done
    exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${platforms[@]}" -d "$dest" "${WHEEL_SPECS[@]}"
fi

read -r -a only <<<"${ONLY:-}"
unknown=()
for name in "${only[@]}"; do is_item "$name" || unknown+=("$name"); done
if ((${#unknown[@]})); then
    echo "ONLY: unknown item(s) ${unknown[*]}; the items: ${ITEMS[*]}" >&2
    exit 2
fi
if [[ " ${only[*]} " == *" extra_profile "* && -z "${EXTRA_PROFILE:-}" ]]; then
    echo "ONLY names extra_profile, which runs the script EXTRA_PROFILE names: set EXTRA_PROFILE" >&2
    exit 2
fi

OUT_DIR=${1:-runs/gpu_checks}
BUDGET_S=${2:-540}
mkdir -p "$OUT_DIR"
deadline=$(($(date +%s) + BUDGET_S))
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if [[ -n "${WHEELS:-}" ]]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/dgrpo_site \
        "$WHEELS"/*.whl || exit 1
    export PYTHONPATH="$PYTHONPATH:/tmp/dgrpo_site"
fi
"$PY" - <<'EOF' | tee "$OUT_DIR/environment.txt"
import importlib, importlib.metadata, torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for name, dist in (("transformers",) * 2, ("liger_kernel", "liger-kernel"), ("bitsandbytes",) * 2, ("triton",) * 2):
    try:
        importlib.import_module(name)
        print(name, importlib.metadata.version(dist))
    except Exception as e:  # noqa: BLE001
        print(name, "missing:", type(e).__name__)
EOF

# no CUDA device seen: every item would skip its tests or fail on its own (unless trying the script on a CPU)
if [[ " ${GPU_CHECKS_STEP_ARGS:-} " != *" --device cpu "* ]] && ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "stopped: torch sees no CUDA device (environment.txt)" | tee -a "$OUT_DIR/summary.txt"
    exit 1
fi

# the GPU's SM clock (and its maximum), power and temperature every second, in gpu_clocks.csv: a clock under load
# below its maximum is the card throttling, which moves the step times of the items run while it does
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,utilization.gpu \
        --format=csv --loop=1 >"$OUT_DIR/gpu_clocks.csv" 2>&1 &
    clock_pid=$!
    trap 'kill "$clock_pid" 2>/dev/null' EXIT
fi

# GPU_CHECKS_STEP_ARGS: extra paper_step.py arguments (e.g. "--device cpu --shape host --set grpo.prompts_per_step=2
# --set grpo.group_size=4 --set grpo.max_new_tokens=6" to try this script on a CPU: 28 layers, ~3.5 min)
read -r -a EXTRA <<<"${GPU_CHECKS_STEP_ARGS:-}"
STEP=(bench/paper_step.py --steps 2 "${EXTRA[@]}")
run_item() {  # name, command...
    local name=$1 left
    shift
    if ! is_item "$name"; then
        echo "run_item $name: not in ITEMS (bench/gpu_checks.sh)" | tee -a "$OUT_DIR/summary.txt" >&2
        exit 2
    fi
    if ((${#only[@]})) && [[ " ${only[*]} " != *" $name "* ]]; then return 0; fi
    left=$((deadline - $(date +%s)))
    if ((left < 30)); then
        echo "== $name: skipped, ${left}s left of the budget" | tee -a "$OUT_DIR/summary.txt"
        return
    fi
    echo "== $name ($(date +%T), ${left}s left): $*" | tee -a "$OUT_DIR/summary.txt"
    timeout --signal=INT --kill-after=15 "$left" "$@" >"$OUT_DIR/$name.log" 2>&1
    local rc=$?
    echo "   rc $rc; last line: $(tail -n 1 "$OUT_DIR/$name.log" | cut -c1-400)" | tee -a "$OUT_DIR/summary.txt"
    return $rc
}

# the earlier GPU path: every lever of the GPU path whose key defaults on for CUDA switched off (the latent chain
# follows the engine; the keys and values kept once have no key: the same bits, less memory)
EARLIER=(grpo.engine=eager model.kernels=none grpo.micro_batch_size=64 grpo.recompute=false model.compile_head=false
    model.pack_gqa=false)
CALL256=(grpo.recompute_granularity=call grpo.micro_batch_size=256 grpo.recompute_latent_steps=true)
VARIED=(--steps 8 --prompt-widths 80,100,136,92,120,76,104,128 --kept-groups 16,9,12,6,14,10,8,13)
PYTEST=("$PY" -m pytest -q -p no:cacheprovider -o addopts="")  # (addopts: xdist, which the node may not have)
# every later item runs the fast engine's captured rollouts: if they fail here (seconds), stop and keep the budget
# (not the latent chain's tests: chain_smoke runs those, and their failing does not stop the rest; nor the head and
# attention levers': lever_smoke runs those, whose bf16 agreement on a random-weight model may miss by a near-tie)
SMOKE="(captured or write_offset or kept or prefetched) and not latent_chain and not compiled_head and not packed_gqa"
if ! run_item capture_smoke "${PYTEST[@]}" tests/test_cuda.py -k "$SMOKE"; then
    echo "stopped: the captured rollouts fail (capture_smoke.log)" | tee -a "$OUT_DIR/summary.txt"
    exit 1
fi
run_item recipe_profile "$PY" "${STEP[@]}" --steps 3 --profile --trace "$OUT_DIR/recipe_trace.json.gz"
# the judged figures first, so that a budget cut short loses the optional items: an issue's own profile script,
# the recipe against the earlier path (three rounds: a median less moved by one slow step) and against eager
if [[ -n "${EXTRA_PROFILE:-}" ]]; then  # a profile script of one's own (e.g. one kept with an issue), run from here
    read -r -a EXTRA_ARGS <<<"${EXTRA_PROFILE_ARGS:-}"
    run_item extra_profile "$PY" "$EXTRA_PROFILE" "${EXTRA_ARGS[@]}"
fi
run_item recipe_vs_earlier "$PY" "${STEP[@]}" --steps 3 "${EARLIER[@]/#/--versus=}"
run_item fast_vs_eager "$PY" "${STEP[@]}" --versus grpo.engine=eager
run_item lever_smoke "${PYTEST[@]}" tests/test_cuda.py -k "compiled_head or packed_gqa"
run_item kernel_levers "$PY" bench/kernel_levers.py
run_item head_pack_vs_none "$PY" "${STEP[@]}" --versus model.compile_head=false --versus model.pack_gqa=false
CHAIN=grpo.update_latent_graphs
run_item chain_smoke "${PYTEST[@]}" tests/test_cuda.py -k "latent_chain or keys_and_values"
chain_ok=$?  # (the chain's step items run only if its tests pass)
((chain_ok == 0)) && run_item recipe_vs_no_chain "$PY" "${STEP[@]}" --versus "$CHAIN=false"
if ((chain_ok == 0)); then
    run_item varied_chain "$PY" "${STEP[@]}" "${VARIED[@]}" --versus "$CHAIN=false"
    run_item chain_no_recompute "$PY" "${STEP[@]}" --steps 3 --set "$CHAIN=true" --set grpo.recompute=false \
        --set grpo.micro_batch_size=128
fi
run_item kept_vs_capture "$PY" "${STEP[@]}" --versus grpo.keep_graphs=false
run_item varied_kept "$PY" "${STEP[@]}" "${VARIED[@]}" --versus grpo.keep_graphs=false
run_item kept_layers "$PY" "${STEP[@]}" --set "grpo.recompute_kept_layers=${KEPT_LAYERS:-6}" --versus grpo.recompute_kept_layers=0
run_item reference_share "$PY" "${STEP[@]}" --versus grpo.beta0=0
run_item head_vs_eager_head "$PY" "${STEP[@]}" --versus model.compile_head=false
run_item packed_vs_sdpa "$PY" "${STEP[@]}" --versus model.pack_gqa=false
run_item cuda_tests "${PYTEST[@]}" tests/test_cuda.py \
    tests/test_distributed_mutants.py::test_a_reduction_through_the_backends_device_comes_back_into_the_callers_tensor \
    tests/test_latent_lm_mutants.py::test_a_cpu_generator_samples_cuda_logits_from_its_own_draws \
    tests/test_resume_contents.py::test_a_truncated_cuda_random_state_is_refused_when_read
run_item call256_vs_recipe "$PY" "${STEP[@]}" "${CALL256[@]/#/--versus=}"
run_item hf_vs_liger "$PY" "${STEP[@]}" --versus model.kernels=none
run_item compiled_vs_liger "$PY" "${STEP[@]}" --profile --set model.kernels=none --set model.compile=true \
    --versus model.kernels=liger --versus model.compile=false
echo "done at $(date +%T); logs in $OUT_DIR" | tee -a "$OUT_DIR/summary.txt"
