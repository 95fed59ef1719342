"""The command line: ``dgrpo sft | grpo | eval | demo | bench | data | config | plot``, and the checkpoint tools
``import-coconut | consolidate | export``.

Every training command takes ``--config FILE.yaml`` (repeatable; a path or a packaged name such as
``paper/grpo_dropout.yaml``) and any number of ``--set key=value`` overrides. A bad config, a bad data
file or a missing checkpoint exits with code 2 and one line on stderr (under torchrun one per machine: ``_error``).
Heavy imports (torch, transformers) happen inside the commands, so ``dgrpo --help`` answers at once.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import NoReturn

from ..progress import below_bar
from ..training.preemption import Terminated, is_rank0, sigterm_stops
from . import convert, evaluate, plot, tools, train
from .common import STOPPABLE_COMMANDS, TRAINING_COMMANDS, refuse_torchrun

DESCRIPTION = """Dropout-GRPO for latent-reasoning (Coconut-style) language models: train, evaluate, reproduce.

Every training command takes --config FILE.yaml (repeatable; a path or a packaged name such as
paper/grpo_dropout.yaml) and any number of --set key=value overrides (dgrpo config show lists them). A bad config,
a bad data file or a missing checkpoint exits with code 2 and one line on stderr."""

EPILOG = """examples:
  dgrpo demo                                                   # the CPU-scale reproduction, built-in task
  dgrpo sft  --config builtin/sft.yaml --out runs/sft          # Coconut curriculum SFT
  dgrpo grpo --init runs/sft --out runs/grpo                   # Dropout-GRPO from it
  dgrpo eval --model runs/grpo --data builtin:test --out runs/eval
  dgrpo plot runs/grpo runs/sampling --out runs/curves.png     # eval accuracy and reward std over steps
  dgrpo config show grpo                                       # every grpo.* option, default and meaning
"""


class _Parser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' too), whose usage error each machine's first worker alone prints under
    torchrun, as :func:`_error` an error every rank meets alike: every rank parses the same arguments, and the job
    printed the usage and the error once per rank."""

    def error(self, message: str) -> NoReturn:
        if _ranks()[1] and os.environ.get("LOCAL_RANK", "").strip() not in ("", "0"):
            self.exit(2)
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="dgrpo", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--version", action="version", version=f"dgrpo {version('dgrpo')}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for module in (train, evaluate, tools, plot, convert):
        module.register(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:  # the suite parses its own options (--out, --quick, --only)
        from ..bench import main as bench_main
        from ..bench.options import build_parser as bench_parser
        from ..config import ConfigError

        bench_parser().parse_args(argv[1:])  # (its --help at once: the torchrun check loads torch, 2-8 s)
        try:
            refuse_torchrun(
                "bench",
                "each rank would run the whole suite, timing it on shared devices, and write "
                "the same files at once; its parallel items start their own processes",
            )
        except ConfigError as e:
            _error(e, alike=True)
            return 2
        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    under_torchrun = _under_torchrun()
    if under_torchrun:
        exit_with_launcher()
    from ..config import ConfigError

    try:
        # the handler before torch and transformers load (seconds): a SIGTERM then ended the process without a word
        stoppable, stepped = args.cmd in STOPPABLE_COMMANDS, args.cmd in TRAINING_COMMANDS
        with _warnings_as_lines(), sigterm_stops(stoppable, distributed=under_torchrun, stepped=stepped):
            return _run(args)
    except ConfigError as e:  # (DGRPO_SIGTERM_GRACE_S, read as the handler goes on; the command's: _run)
        _error(e, alike=True)
        return 2
    except Terminated as e:
        if is_rank0():
            said = _stopped_in(e, args.cmd)
            print(f"dgrpo: terminated (SIGTERM){said}{_resume_hint(args, said)}", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt as e:
        if is_rank0():  # (Ctrl-C reaches every worker: torchrun sends it to each; to one alone: RANK_ENDED)
            said = _stopped_in(e, args.cmd)
            print(f"dgrpo: interrupted{said}{_resume_hint(args, said)}", file=sys.stderr)
        return 130
    except RuntimeError as e:
        if not _peer_gone(e):
            raise
        if is_rank0():  # (every rank that lost it says the same; one that ended said its own, or could not)
            print(f"dgrpo: error: {RANK_ENDED}{_resume_hint(args)}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into a reader that stopped (`| head`): quiet, as Unix tools are
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would raise again
        return 141  # 128 + SIGPIPE, what a shell reports for such a tool
    except OSError as e:  # (after BrokenPipeError, one of them)
        if e.errno == errno.ENOSPC:  # (a checkpoint's write says more: training.checkpoint.write_failed)
            _error(f"{e.filename or 'a file'}: no space left on the device{_resume_hint(args)}", alike=False)
            return 2
        if e.errno != errno.ENAMETOOLONG:
            raise
        _error(f"{e.filename or 'a path'}: a name longer than the file system allows", alike=False)
        return 2


def entry() -> NoReturn:
    """The ``dgrpo`` script and ``python -m dgrpo``: :func:`main`, its code the process's exit code. A torchrun worker
    that ends still in the process group (interrupted alone, its peer gone, a rank's own error: the ranks could not
    leave it together, as a finished or SIGTERM-stopped run does) exits at once, its output flushed, without the
    interpreter's teardown: there gloo's group was destroyed with a collective in flight or a peer gone, which could
    abort the process ("terminate called without an active exception", exit -6 instead of 130 or 1; measured: 2 of 10
    such jobs). What the run wrote (checkpoints, metrics, trackers) is closed before :func:`main` returns. Any other
    worker that failed ignores SIGTERM through the teardown: torchrun sends it to the others as soon as one worker
    has exited, and the ones still ending died of it (reported ``-15 (SIGTERM)``, 3 of 4 jobs whose config every
    rank refused, instead of exit 2; a usage error too)."""
    try:
        code = main()
    except SystemExit as e:  # (argparse: a usage error, which every rank makes, exits 2 as a refused config does)
        if e.code and _under_torchrun():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise
    if _joined():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if code and _under_torchrun():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(code)


def _under_torchrun() -> bool:
    """Whether this process is a torchrun worker."""
    return "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ


def _run(args: argparse.Namespace) -> int:
    """The command, dgrpo's errors each one line: exit 2 for what it was given (a config, data, a checkpoint, a
    scorer), 1 for a run stopped because it stopped learning."""
    from ..config import ConfigError
    from ..data.records import DataError
    from ..eval.scoring import RewardError, RewardSetupError
    from ..model.factory import CheckpointError
    from ..training.guards import TrainingStopped

    try:
        return int(args.func(args))
    except (ConfigError, DataError, CheckpointError) as e:  # (what every rank is given, and reads alike)
        _error(e, alike=True)
        return 2
    except RewardError as e:  # (a reward or a scorer: on a rank's own batch once the ranks have split the work)
        _error(e, alike=isinstance(e, RewardSetupError) or not _joined())
        return 2
    except TrainingStopped as e:
        if is_rank0():  # (every rank stops at the same step, for the same reason)
            print(f"dgrpo: error: {e}", file=sys.stderr)
        return 1


def _ranks() -> tuple[str, bool]:
    """This process's global rank under torchrun ("" otherwise), and whether the job has several."""
    return os.environ.get("RANK", "").strip(), os.environ.get("WORLD_SIZE", "").strip() not in ("", "0", "1")


def _error(e: object, alike: bool) -> None:
    """``dgrpo: error: E`` on stderr. Under torchrun an error that every rank meets ``alike`` (of the config, the data,
    a checkpoint: each rank reads the same; anything before the ranks join) is printed once per machine, by its first
    worker (torchrun's LOCAL_RANK 0; it printed once per rank), named but on rank 0: one line on one machine, and a
    machine whose files differ still says so. Any other (what befell one rank: a reward that failed on its batch,
    the others' "... in another process") by each rank that meets it, named."""
    rank, several = _ranks()
    if several and alike and os.environ.get("LOCAL_RANK", "").strip() not in ("", "0"):
        return  # (its machine's first worker says it)
    named = several and not (alike and rank in ("", "0"))
    print(f"dgrpo: error: {f'rank {rank}: ' if named else ''}{e}", file=sys.stderr)


#: what gloo says when a collective's peer is gone: its process ended (NCCL waits for its timeout instead)
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")
#: rank 0's line then, instead of gloo's traceback (a worker that got SIGINT alone says nothing, as at a Ctrl-C,
#: which torchrun sends to every worker and rank 0 says for all; one killed cannot)
RANK_ENDED = (
    "another rank ended mid-run (interrupted, killed or failed: torchrun's report names it, with its exit code): "
    "every rank stops without a checkpoint of the step under way"
)


def _peer_gone(e: RuntimeError) -> bool:
    """Whether ``e`` is a collective of torchrun's process group that failed because another rank's process ended."""
    return _joined() and any(words in str(e) for words in PEER_GONE)


def _joined() -> bool:
    """Whether this process is in torchrun's process group (joined by the command once its config, data and scorer
    are read: from then on each rank works on its own shard)."""
    tdist = sys.modules.get("torch.distributed")
    return bool(tdist is not None and tdist.is_available() and tdist.is_initialized())


PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _stopped_in(stop: KeyboardInterrupt, cmd: str) -> str:
    """What a stop interrupted and what that left on disk, after a space: what the command said (the stop's message:
    :func:`~dgrpo.training.preemption.stopping`), else, for dgrpo eval, that it had not begun (the stop came while
    dgrpo's modules loaded: its command says where it stands from its start); "" otherwise."""
    said = str(stop) if stop.args else evaluate.NOTHING_YET if cmd == "eval" else ""
    return f" {said}" if said else ""


def _resume_hint(args: argparse.Namespace, said: str = "") -> str:
    """What the same command does next: resume the newest checkpoint (a ``step-N`` folder, as the run lists them: not
    a file of that name nor a user's copy such as ``step-00000003.bak``, which the run does not resume), or (none
    written yet) start again. A run given
    ``--resume PATH`` or ``--resume never`` is told to drop it: given again, PATH would be resumed again (never: the
    checkpoint just written deleted and the run started over), not the newest checkpoint. Where the stop's line
    (``said``) already names the newest checkpoint, the hint says "it" (the line named it twice)."""
    if args.cmd == "demo":
        if getattr(args, "resume", "auto") == "never":
            return "; rerun it without --resume never to keep the runs that had finished (it starts every run over)"
        return "; the same command keeps the runs that had finished and starts the others over"
    if args.cmd not in TRAINING_COMMANDS:
        return ""
    from ..run_layout import CHECKPOINTS_DIR, checkpoint_dirs

    root = Path(args.out) / CHECKPOINTS_DIR  # (checkpoints as list_checkpoints reads them, without loading torch)
    written = checkpoint_dirs(args.out)
    if not written:
        return "; no checkpoint was written yet: the same command starts the run again"
    newest = "it" if said.endswith(f"checkpointed in {written[-1]}") else f"the newest checkpoint in {root}"
    resume = getattr(args, "resume", "auto")
    if resume == "auto":
        return f"; the same command resumes from {newest}"
    return f"; rerun it without --resume {resume} (--resume auto, the default) to resume from {newest}"


@contextmanager
def _warnings_as_lines() -> Iterator[None]:
    """dgrpo's own warnings as ``dgrpo: warning: ...`` lines on stderr (not Python's ``file:line: UserWarning:``
    and a line of dgrpo's source). Under torchrun the warnings about the config and the data (UserWarning) are
    printed by rank 0 alone (every rank printed the same: 8 copies of each on 8 GPUs), and what befell one rank
    (RuntimeWarning: a capture or a compiler that fell back to eager) by that rank, named. The libraries' warnings
    keep Python's form, which names where they come from, on every rank. (The format is replaced, not the display:
    recorded warnings, as pytest records them, stay recorded.)"""
    python_format, (rank, several) = warnings.formatwarning, _ranks()

    def formatted(
        message: Warning | str, category: type[Warning], filename: str, lineno: int, line: str | None = None
    ) -> str:
        if Path(filename).resolve().is_relative_to(PACKAGE_DIR):
            if several and issubclass(category, RuntimeWarning):
                return below_bar(f"dgrpo: warning: rank {rank}: {message}\n")
            return "" if several and rank not in ("", "0") else below_bar(f"dgrpo: warning: {message}\n")
        return below_bar(python_format(message, category, filename, lineno, line))

    warnings.formatwarning = formatted
    try:
        yield
    finally:
        warnings.formatwarning = python_format


def exit_with_launcher() -> None:
    """Under torchrun: this worker gets SIGTERM when its launcher dies (however it dies, SIGKILL included), so that
    killing ``torchrun`` never leaves workers running."""
    from ..training.distributed import exit_with_parent

    if not exit_with_parent():  # the launcher died before the call: nobody will signal us
        raise SystemExit("dgrpo: the torchrun launcher is gone; exiting")


__all__ = ["build_parser", "entry", "main"]
