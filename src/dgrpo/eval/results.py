"""An evaluation's files and its shards: ``results.json`` and ``predictions.jsonl`` written whole into a folder
(:func:`write_results`, under a lock on the folder), and the results of contiguous shards merged into one
(:func:`merge_results`, the mean score bit for bit as one process sums it)."""

from __future__ import annotations

import errno
import fcntl
import json
import numbers
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import MISSING, fields, replace
from pathlib import Path

from .evaluate import EvalResult, ordered_mean, pass_at_k_of

#: the EvalResult fields that count what a shard evaluated (summed or joined by merge_results); the others say
#: what was evaluated and how, and must agree between shards
_COUNTED = frozenset({"accuracy", "n", "correct", "unparseable", "wall_s", "predictions", "mean_score", "pass_at_k"})


def merge_results(parts: list[EvalResult]) -> EvalResult:
    """One result from the results of contiguous shards of a dataset (e.g. one per process), in order. ValueError
    for no shard, one result given twice, or shards that differ in what was evaluated or how (dataset, seed, mode,
    decoding, scorer, ...). Shards of equal contents are distinct shards (a dataset may repeat its questions)."""
    if not parts:
        raise ValueError("merge_results: no results to merge (an empty list); give one result per shard")
    seen: dict[int, int] = {}
    for i, p in enumerate(parts):
        if (j := seen.setdefault(id(p), i)) != i:  # (its rows and counts would be taken twice)
            raise ValueError(f"merge_results: shards {j} and {i} are one result object; give each shard once")
    first = parts[0]
    differ = [
        f"{f.name} ({', '.join(dict.fromkeys(repr(getattr(p, f.name)) for p in parts))})"
        for f in fields(EvalResult)
        if f.name not in _COUNTED and any(getattr(p, f.name) != getattr(first, f.name) for p in parts)
    ]
    if differ:
        raise ValueError(f"merge_results: the shards differ in {'; '.join(differ)}; merge shards of one evaluation")
    n = sum(p.n for p in parts)
    correct = sum(p.correct for p in parts)
    return replace(
        first,
        accuracy=correct / n if n else 0.0,
        n=n,
        correct=correct,
        unparseable=sum(p.unparseable for p in parts),
        mean_score=_merged_mean_score(parts, n),
        pass_at_k=_merged_pass_at_k(parts, n),
        wall_s=max(p.wall_s for p in parts),
        predictions=[x for p in parts for x in p.predictions],
    )


def _merged_mean_score(parts: list[EvalResult], n: int) -> float | None:
    """The shards' ``mean_score`` over all their records (None when a shard has none): from their predictions'
    scores, summed in order as one process sums them (the shards' means, weighted, differed in the last bits: 0.2
    for one process, 0.19999999999999998 from shards of 1 and 2); from the means for shards without them."""
    if any(p.mean_score is None for p in parts):
        return None
    if not n:
        return 0.0
    scored = [result_scores(p) for p in parts]
    if all(s is not None for s in scored):
        return ordered_mean([x for s in scored for x in s or ()])
    return sum(float(p.mean_score or 0.0) * p.n for p in parts) / n


def _merged_pass_at_k(parts: list[EvalResult], n: int) -> dict[str, float] | None:
    """The shards' ``pass_at_k`` (:func:`~.evaluate.evaluate_mc_vote`'s) over all their records (None when a shard
    has none): from their rows' ``correct_masks`` as one process averages them where each shard's rows give its own
    ``pass_at_k``, else the shards' values weighted by their ``n``. ValueError for shards of other k."""
    if any(p.pass_at_k is None for p in parts):
        return None
    keys = [sorted(p.pass_at_k or {}) for p in parts]
    if any(k != keys[0] for k in keys):
        raise ValueError(f"merge_results: the shards' pass_at_k differ in their k ({keys}); merge one vote's shards")
    answered = [p for p in parts if p.n]  # (a rank's empty shard adds no row)
    counted = [c for p in answered if (c := _mask_counts(p)) is not None]
    if answered and len(counted) == len(answered) and len({masks for _, masks in counted}) == 1:
        return pass_at_k_of([x for counts, _ in counted for x in counts], counted[0][1])
    return {k: sum((p.pass_at_k or {})[k] * p.n for p in parts) / n if n else 0.0 for k in keys[0]}


def _mask_counts(result: EvalResult) -> tuple[list[int], int] | None:
    """(each row's ``correct_masks``, the masks per row) where a vote's rows hold them and give its ``pass_at_k``;
    None otherwise."""
    rows = result.predictions
    if not isinstance(rows, list) or len(rows) != result.n or not rows:
        return None
    if not all(isinstance(r, dict) and isinstance(r.get("correct_masks"), int) for r in rows):
        return None
    masks = {len(r.get("votes") or ()) for r in rows}
    if len(masks) != 1 or (n_masks := masks.pop()) < 1:
        return None
    counts = [r["correct_masks"] for r in rows]
    if any(not 0 <= c <= n_masks for c in counts) or pass_at_k_of(counts, n_masks) != result.pass_at_k:
        return None
    return counts, n_masks


def result_scores(result: EvalResult) -> list[float] | None:
    """Each of a result's prediction rows' ``score`` as a float (a scorer's 1 beside its 0.5 too) where they are its
    ``n`` records' and their mean, summed in order, is its ``mean_score`` (:func:`evaluate`'s are): the scores one
    process sums, from which shards' means are merged bit for bit. None otherwise: no mean score, rows missing or
    other than numbers, or a 'score' of one's own that is another thing (87.0 for a mean_score of 0.87)."""
    rows = result.predictions
    if result.mean_score is None or not isinstance(rows, list) or len(rows) != result.n:
        return None
    values = [row.get("score") if isinstance(row, dict) else None for row in rows]
    if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in values):
        return None
    scores = [float(v) for v in values]  # type: ignore[arg-type]
    return scores if ordered_mean(scores) == result.mean_score else None


def write_results(result: EvalResult, out_dir: str | Path) -> None:
    """``results.json`` (the summary) and ``predictions.jsonl`` (one row per question) in ``out_dir``, each whole:
    each is written under a temporary name first; then an earlier ``results.json`` is removed, and
    ``predictions.jsonl`` and ``results.json``, last, take their places. A results.json describes the predictions
    beside it, whenever the process is stopped (SIGTERM, Ctrl-C, SIGKILL); the temporary files a killed write left
    are removed by the next write into that folder (those of a process still running, which may be writing them now,
    are left alone). Two processes writing into one folder take their turns at the swap (a lock on the folder): the
    pair left is one process's."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results, predictions = out_dir / "results.json", out_dir / "predictions.jsonl"
    for leftover in (p for name in (predictions.name, results.name) for p in out_dir.glob(f".tmp-{name}-*")):
        if not _writer_alive(leftover):
            leftover.unlink(missing_ok=True)
    temporary = [out_dir / f".tmp-{path.name}-{os.getpid()}" for path in (predictions, results)]
    try:
        with open(temporary[0], "w") as f:
            for p in result.predictions:
                f.write(json.dumps(p) + "\n")
        temporary[1].write_text(json.dumps(result.summary(), indent=2))
        with _folder_locked(out_dir):
            results.unlink(missing_ok=True)
            os.replace(temporary[0], predictions)
            os.replace(temporary[1], results)
    finally:
        for path in temporary:
            path.unlink(missing_ok=True)


#: the keys of every ``results.json`` :func:`write_results` writes (EvalResult's fields without a default)
_SUMMARY_KEYS = frozenset(f.name for f in fields(EvalResult) if f.default is MISSING and f.default_factory is MISSING)


def is_results_file(path: Path, folder_name: str | None = None) -> bool:
    """Whether ``path`` is a ``results.json`` as :func:`write_results` writes it: a JSON object with every key of an
    :class:`EvalResult`'s summary; with ``folder_name``, one whose dataset is named so in paths (the folder ``dgrpo
    eval`` writes a dataset of several into: :func:`~dgrpo.run_layout.results_name`)."""
    from ..run_layout import results_name

    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    if not isinstance(summary, dict) or not _SUMMARY_KEYS <= summary.keys():
        return False
    return folder_name is None or (
        isinstance(summary["dataset"], str) and results_name(summary["dataset"]) == folder_name
    )


def stale_results(out: str | Path, written: Iterable[str | Path]) -> list[Path]:
    """The ``results.json`` an earlier ``dgrpo eval --out OUT`` wrote that one writing its results into the folders
    ``written`` (OUT itself for one dataset, OUT/<name> for each of several) does not rewrite: OUT's own beside
    folders of several, and that of a folder OUT/<name> this one does not write, where it names a dataset so named.
    Only an evaluation's: one that is not (a demo's, a user's) is none of them."""
    out, written = Path(out), {Path(w) for w in written}
    folders = [out] if out not in written else []
    if out.is_dir():
        folders += sorted(d for d in out.iterdir() if d.is_dir() and not d.is_symlink() and d not in written)
    return [f / "results.json" for f in folders if is_results_file(f / "results.json", None if f == out else f.name)]


@contextmanager
def _folder_locked(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder`` while the block runs; without one where its file system has none (NFS
    takes no lock on a directory, Lustre none without its flock option): the block runs as it did before locks."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # (released as the folder is closed)
        except OSError as e:
            if e.errno not in (errno.EBADF, errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        yield
    finally:
        os.close(fd)


def _writer_alive(temporary: Path) -> bool:
    """Whether the process named by a ``.tmp-NAME-PID`` file's PID is another process still running on this machine."""
    pid = temporary.name.rpartition("-")[2]
    if not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's process)
        return True
    return True
