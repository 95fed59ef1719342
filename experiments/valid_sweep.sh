#!/usr/bin/env bash
# The validation sweep of docs/demo/valid_sweep.md: 8 GRPO settings x 2 seeds from one SFT checkpoint.
# PYTHON: the interpreter (default python). A run that fails is named at the end (its traceback: runs/sweep/err.log);
# a run that refuses its command line (argparse's exit 2: a wrong checkpoint or override) stops the sweep at once, as
# every row would refuse it the same way.
set -u
S=${1:?usage: experiments/valid_sweep.sh SFT_CHECKPOINT}
mkdir -p runs/sweep
failed=()
for seed in 0 1; do
run() {
    name=$1
    shift
    "${PYTHON:-python}" experiments/valid_sweep.py "$S" "$name" "$seed" "$@" 2>>runs/sweep/err.log
    status=$?
    if ((status == 2)); then
        echo "experiments/valid_sweep.sh: stopped at $name/s$seed: $(tail -n 1 runs/sweep/err.log)" >&2
        exit 2
    elif ((status)); then
        failed+=("$name/s$seed")
    fi
}
run base
run K16 grpo.group_size=16
run steps200 grpo.steps=200
run lr2e-5 grpo.lr=2e-5
run lr5e-6 grpo.lr=5e-6
run nokl grpo.beta0=0
run p0.2 perturbation.p=0.2
run K16_200 grpo.group_size=16 grpo.steps=200
done
if ((${#failed[@]})); then
    echo "FAILED: ${failed[*]} (runs/sweep/err.log)"
    exit 1
fi
echo DONE
