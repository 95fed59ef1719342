"""A resume's refusals made from the run directory alone, before the model loads: a fork (``--resume`` of another
run's checkpoint) into an OUT that holds a finished run."""

import json
from pathlib import Path

import pytest

from dgrpo.config import ConfigError, to_dict
from dgrpo.model.verified import write_manifest
from dgrpo.training.resume_check import check_resume_config

from conftest import tiny_config


def _finished_run(out: Path, command: str) -> Path:
    """An OUT holding a finished run of ``command`` whose checkpoints were deleted: its final/ (with its manifest),
    config.json, and GRPO's summary.json or SFT's stage-K/."""
    for folder in ("final", "stage-1") if command == "sft" else ("final",):
        (out / folder).mkdir(parents=True)
        (out / folder / "model.safetensors").write_text("weights")
        write_manifest(out / folder)
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    if command == "grpo":
        (out / "summary.json").write_text("{}")
    return out


def _checkpoint(path: Path, command: str) -> Path:
    """A folder that reads as a resumable checkpoint of ``command`` (its state.json), without weights."""
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"trainer": {}} if command == "grpo" else {"progress": {}}))
    return path


def _run_dir(out: Path, command: str, **kw):
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    return RunDir(out, tiny_config(), Dist.single(), command, log=lambda m: None, **kw)


def _files(out: Path) -> list[tuple[str, bytes]]:
    return sorted(
        (str(p.relative_to(out)), p.read_bytes()) for p in out.rglob("*") if p.is_file() and p.name != ".lock"
    )


@pytest.mark.parametrize("command", ["grpo", "sft"])
def test_a_fork_into_an_out_holding_a_finished_run_is_refused_as_a_resume_there_is(tmp_path, command):
    """--resume PATH (another run's checkpoint) into an OUT that holds a finished run without checkpoints was
    accepted: it removed and rewrote that run's final/ and summary, kept its stage-K/ beside them, where a resume
    without --resume refuses such an OUT. It is refused in one line naming a new --out, by the command line's check
    before anything is read and by the run directory, nothing in OUT changed; a fork into a new OUT, or into an
    unfinished run's (the same fork stopped before its first checkpoint, given again), goes on."""
    parent = _checkpoint(tmp_path / "parent" / "checkpoints" / "step-00000004", command)
    out = _finished_run(tmp_path / "done", command)
    before = _files(out)
    said = (
        f"--resume {parent} is another run's checkpoint, and {out} holds a finished run (final/, its model) and no "
        f"checkpoint: name a new --out to start from {parent} (the fork would write over that run's results)"
    )
    with pytest.raises(ConfigError) as e:
        check_resume_config(out, tiny_config(), command, resume=str(parent))
    assert str(e.value) == said
    with pytest.raises(ConfigError) as e:
        _run_dir(out, command, resume=str(parent))
    assert str(e.value) == said
    assert _files(out) == before
    with pytest.raises(ConfigError, match=r"holds a finished run \(final/\) and no checkpoint to resume"):
        _run_dir(out, command)  # (the refusal the fork now matches)
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    (unfinished / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    for fork in (tmp_path / "new", unfinished):
        check_resume_config(fork, tiny_config(), command, resume=str(parent))
        with _run_dir(fork, command, resume=str(parent)) as run:
            assert run.candidates == [parent]
