"""The entry point of ``dgrpo bench``: where ``OMP_WAIT_POLICY`` is not set, re-run the suite in a child process
with ``OMP_WAIT_POLICY=PASSIVE`` (why: :mod:`dgrpo.bench.suite`); otherwise run it here.

The options' help and argparse's usage errors are answered here first, without torch (:mod:`dgrpo.bench.options`);
the decision comes next and needs only the environment: the process that starts the child loads neither torch nor
the items (seconds); the child checks the rest of the options and answers their errors (the same line and exit code).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from .options import build_parser

#: set in the child's environment: the suite runs there (with OMP_WAIT_POLICY set by the user, it runs in place)
CHILD_ENV = "DGRPO_BENCH_CHILD"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``dgrpo bench``; ``argv`` are the arguments after ``bench``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    build_parser().parse_args(argv)  # (--help, a missing --out: at once, before a child loads torch to say it)
    if needs_child():
        return relaunch(argv)
    from .suite import main as run_here

    return run_here(argv)


def needs_child() -> bool:
    """Whether the suite must re-run itself: OMP_WAIT_POLICY unset (or empty, which OpenMP reads as unset: its
    default policy) and this process not the child."""
    return not os.environ.get("OMP_WAIT_POLICY") and not os.environ.get(CHILD_ENV)


def relaunch(argv: list[str]) -> int:
    """``python -m dgrpo.bench ARGV`` in a child with ``OMP_WAIT_POLICY=PASSIVE``; its exit code."""
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **{CHILD_ENV: "1"})
    return run_child([sys.executable, "-m", "dgrpo.bench", *argv], env)


def run_child(cmd: list[str], env: dict[str, str]) -> int:
    """Run the suite in a child process and return its exit code (128 + N for a child ended by signal N). A Ctrl-C,
    which the terminal sends to both, is the child's to answer (one line, exit 130): this process lets it pass while
    it waits (it raised KeyboardInterrupt out of the wait, a traceback under the child's line). A SIGTERM, which
    ``timeout`` or ``kill`` sends to this process alone, is passed on to the child (this process ended and left the
    suite running, timing on shared devices and writing OUT). The handlers are set before the child starts (a
    handler, unlike an ignored signal, is not inherited: the child answers Ctrl-C itself)."""
    import signal

    children: list[subprocess.Popen] = []
    terms: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        if signum == signal.SIGTERM:
            terms.append(signum)
            for c in children:
                c.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with subprocess.Popen(cmd, env=env) as child:
            children.append(child)
            if terms:  # (a SIGTERM before the child was known)
                child.send_signal(signal.SIGTERM)
            code = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 - code if code < 0 else code
