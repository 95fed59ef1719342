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

from dgrpo.cli import evaluate, main
from dgrpo.data.records import DataError

if os.environ["RANK"] == "0":
    def refused(*a, **kw):
        raise DataError("data.jsonl: not found on this machine")

    evaluate._read_sets = refused
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_torchrun_job_of_dgrpo_eval_whose_rank_0_refuses_at_the_start_ends_without_a_sigkill(
    sft_checkpoint, tmp_path
):
    """Rank 0 refuses in one line and exits 2; torchrun sends SIGTERM to rank 1, which (its handler only asking, then
    blocked joining the process group) went on until torchrun's SIGKILL 30 s later."""
    (tmp_path / "worker.py").write_text(RANK_0_REFUSES)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(tmp_path / "worker.py"), "eval", "--model", str(sft_checkpoint), "--data", "builtin:test"]
    cmd += ["--limit", "2", "--out", str(tmp_path / "e")]
    t0 = time.monotonic()
    job = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    took, err = time.monotonic() - t0, job.stderr
    ended = {int(r): datetime.strptime(t, "%Y-%m-%d_%H:%M:%S") for t, r in REPORTED.findall(err)}
    gap = (ended[1] - ended[0]).total_seconds() if len(ended) == 2 else None
    said = [x for x in err.splitlines() if "dgrpo" in x]
    print(f"torchrun took {took:.1f} s; rank 1 ended {gap} s after rank 0", *said)
    assert "data.jsonl: not found on this machine" in err, err[-3000:]
    assert "SIGKILL" not in err and "Signal 9" not in err, err[-3000:]
    assert "exitcode  : 143" in err and gap is not None and gap < 10, err[-3000:]
    assert not (tmp_path / "e").exists()
