"""dgrpo eval under torchrun: a SIGTERM before its first dataset (loading, joining the process group) stops a rank at
once, as a training command's before its first step does (tests/test_sigterm_before_training.py): nothing was
evaluated, nothing is lost. A job whose rank 0 refused at the start (torchrun then sends SIGTERM to the others) ended
when torchrun killed the others 30 s later."""

import os
import subprocess
import sys
import time
from datetime import datetime

import pytest
from test_sigterm_before_training import REPORTED

#: a worker whose rank 0 alone refuses its data (as one whose machine lacks a file the others have)
RANK_0_REFUSES = """
import os, sys

from dgrpo.cli import entry, evaluate
from dgrpo.data.records import DataError

if os.environ["RANK"] == "0":
    def refused(*a, **kw):
        raise DataError("data.jsonl: not found on this machine")

    evaluate._read_sets = refused
entry()
"""

#: a worker whose rank 1, loading its model while rank 0 waits in the agreement before the first dataset, sends
#: SIGTERM to every worker (as a scheduler's stop of the job's tasks), its own last
STOPPED_WHILE_LOADING = """
import os, signal, time
from pathlib import Path

from dgrpo.cli import entry, evaluate

if os.environ["RANK"] == "1":
    load = evaluate._load_eval_model

    def stopped(*a, **kw):
        time.sleep(4)  # (rank 0 reaches the agreement)
        pids = [int(p) for f in Path(f"/proc/{os.getppid()}/task").glob("*/children") for p in f.read_text().split()]
        for pid in sorted(pids, key=lambda p: p == os.getpid()):
            os.kill(pid, signal.SIGTERM)
        time.sleep(5)
        return load(*a, **kw)

    evaluate._load_eval_model = stopped
entry()
"""


def torchrun_eval(worker: str, model, tmp_path) -> subprocess.CompletedProcess:
    """``torchrun`` of 2 workers running ``worker`` as ``dgrpo eval --model model --data builtin:test --limit 2``."""
    (tmp_path / "worker.py").write_text(worker)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(tmp_path / "worker.py"), "eval", "--model", str(model), "--data", "builtin:test"]
    cmd += ["--limit", "2", "--out", str(tmp_path / "e")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_a_torchrun_job_of_dgrpo_eval_whose_rank_0_refuses_at_the_start_ends_without_a_sigkill(
    sft_checkpoint, tmp_path
):
    """Rank 0 refuses in one line and exits 2; torchrun sends SIGTERM to rank 1, which (its handler only asking, then
    blocked joining the process group) went on until torchrun's SIGKILL 30 s later."""
    t0 = time.monotonic()
    err = torchrun_eval(RANK_0_REFUSES, sft_checkpoint, tmp_path).stderr
    took = time.monotonic() - t0
    ended = {int(r): datetime.strptime(t, "%Y-%m-%d_%H:%M:%S") for t, r in REPORTED.findall(err)}
    gap = (ended[1] - ended[0]).total_seconds() if len(ended) == 2 else None
    said = [x for x in err.splitlines() if "dgrpo" in x]
    print(f"torchrun took {took:.1f} s; rank 1 ended {gap} s after rank 0", *said)
    assert "data.jsonl: not found on this machine" in err, err[-3000:]
    assert "SIGKILL" not in err and "Signal 9" not in err, err[-3000:]
    assert "exitcode  : 143" in err and gap is not None and gap < 10, err[-3000:]
    assert not (tmp_path / "e").exists()


@pytest.mark.slow
def test_a_sigterm_to_every_worker_while_dgrpo_eval_loads_stops_each_at_once_with_rank_0s_one_line(
    sft_checkpoint, tmp_path
):
    """Rank 1 stopped at once as it loaded, rank 0 waiting for it in the agreement before the first dataset: rank 0
    stops too (its handler runs as the collective fails), one line saying nothing was written, each rank exiting 143
    (not 'another rank ended mid-run', nor a signal's death)."""
    job = torchrun_eval(STOPPED_WHILE_LOADING, sft_checkpoint, tmp_path)
    err = job.stderr
    print(*(x for x in err.splitlines() if "dgrpo" in x or "exitcode" in x))
    assert err.count("dgrpo: terminated (SIGTERM) before the evaluation: nothing was written") == 1, err[-3000:]
    assert err.count("exitcode  : 143") == 2 and "another rank ended" not in err, err[-3000:]
    assert not (tmp_path / "e").exists()
