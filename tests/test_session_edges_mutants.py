"""Tests for the survivors of mutation testing of the session's edges: counts in words (the demo's first line too),
bench.md's notes of each item run (the GPU section's too), the resume advice for each folder of a LoRA run on a moved
base, a manifest's mode fix under a group-writable umask, a missing tiktoken vocabulary, and each command's own
description in its --help."""

import argparse

import pytest
from test_bench_mutants import _fake_suite
from test_bench_report_title import _item

from dgrpo.bench import suite
from dgrpo.text import counted


def test_a_count_of_none_is_plural():
    """``0 seeds``, as ``3 seeds``; ``1 seed`` alone is singular (mutant: ``n <= 1`` wrote ``0 seed``)."""
    assert [counted(n, "seed") for n in (0, 1, 2)] == ["0 seeds", "1 seed", "2 seeds"]


@pytest.mark.parametrize(
    ("n_sft", "n_rl", "workers", "said"),
    [(1, 1, 1, "1 SFT seed x 1 RL seed; 1 worker;"), (2, 3, 2, "2 SFT seeds x 3 RL seeds; 2 workers;")],
)
def test_the_demos_first_line_counts_seeds_and_workers_in_words(
    tmp_path, monkeypatch, capsys, n_sft, n_rl, workers, said
):
    """The demo's first line said "1 SFT seed(s) x 1 RL seed(s); 1 worker(s)" (mutant: a count of them as before)."""
    from dgrpo.config import Config
    from dgrpo.demo import pipeline

    monkeypatch.setattr(pipeline, "available_cpus", lambda: 2)
    monkeypatch.setattr(pipeline, "run_sft", lambda demo, s: None)
    monkeypatch.setattr(pipeline, "run_arm", lambda demo, arm, s, r, ckpt: None)
    monkeypatch.setattr(pipeline, "_run_pool", lambda *a: None)  # (no processes)
    demo = pipeline.Demo(Config(), tmp_path, [], [], {})
    pipeline.run_pipeline(demo, n_sft, n_rl, arms=["grpo_null"], workers=workers)
    first = capsys.readouterr().out.splitlines()[0]
    assert f"; {said} output in {tmp_path}" in first, first


def _notes(tmp_path, monkeypatch, only: str, section: str) -> str:
    """bench.md's notes after a run of stand-in items (``only``: the items; ``section``: cpu or gpu)."""
    _fake_suite(monkeypatch, dict.fromkeys(suite.ITEM_KEYS, _item), cuda=True)
    monkeypatch.setattr(suite.torch.cuda, "get_device_name", lambda *a: "a GPU", raising=False)
    args = argparse.Namespace(out=str(tmp_path), quick=True, only=only, section=section)
    suite.run_suite(args, [])
    return (tmp_path / "bench.md").read_text().split("## Notes")[1]


@pytest.mark.parametrize(
    ("only", "section", "heads"),
    [
        ("optimizer", "gpu", ("- 8-bit optimizer",)),  # (mutant: the GPU section's items not read as run)
        ("rollouts", "cpu", ("- Rollouts:", "- FLOPs:")),  # (mutant: FLOPs' note for flops alone)
        ("recompute", "cpu", ("- Memory:",)),  # (mutant: Memory's note not for recompute's memory probes)
        ("perturbation", "cpu", ("- GRPO steps:",)),  # (mutant: GRPO steps' note for grpo_scaling alone)
        ("lora", "cpu", ("- LoRA", "- Memory:")),
    ],
)
def test_each_item_run_has_the_notes_that_describe_it(tmp_path, monkeypatch, only, section, heads):
    """bench.md notes how each item that ran measures: a GPU-only run of the 8-bit optimizer had no note of it, and
    an item that shares a note (rollouts' FLOPs, recompute's memory probes, perturbation's GRPO steps) keeps it when
    run alone."""
    notes = _notes(tmp_path, monkeypatch, only, section)
    for head in heads:
        assert head in notes, (only, head, notes)
    assert notes.count("\n- ") == len(heads) + 1  # (and the OMP_WAIT_POLICY note of every run)


@pytest.mark.parametrize(
    ("where", "resumed"),
    [
        ("run/final", True),  # (mutant: final/ not a run's folder)
        ("run/best", True),
        ("run/stage-2", True),  # (mutant: stage-K/ not a run's folder)
        ("run/checkpoints/step-00000003/model", True),
        ("run/old/step-00000003/model", False),  # (mutant: any step-N's model/, not only under checkpoints/)
        ("run/checkpoints/mine/model", False),  # (mutant: any folder of checkpoints/)
        ("run/checkpoints/step-00000003/other", False),
        ("copies/final", False),  # (mutant: a folder named final/ outside any run, no config.json beside it)
        ("run/stage-2-copy", False),
    ],
)
def test_only_a_runs_own_adapter_folders_are_told_to_resume_the_run(tmp_path, where, resumed):
    """The advice for an adapter folder whose base moved names the resume of the run holding it (its config.json)
    only for the run's own final/, best/, stage-K/ and checkpoints/step-N/model; a folder anywhere else, a copy, is
    told the hand-made route alone (a resume would not point it to the new place)."""
    from dgrpo.model.lora import repoint_hint

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    folder = tmp_path / where
    folder.mkdir(parents=True)
    hint = repoint_hint(folder)
    assert hint.startswith("resume the run ") == resumed, hint
    assert not resumed or hint.startswith(f"resume the run {tmp_path / 'run'} with --init"), hint
    assert f"point base_model_name_or_path in {folder / 'adapter_config.json'}" in hint


def test_owner_only_files_get_the_group_writable_mode_and_others_keep_theirs(tmp_path, set_umask):
    """Under umask 002 a checkpoint's owner-only file gets 0664, as a new file does (mutant: a probe created 0644
    gave 0644), and a file its writer gave another mode (a script 0755, a private 0640) keeps it (mutant: every
    file given the umask's mode)."""
    from dgrpo.model.verified import write_manifest

    set_umask(0o002)  # (group-writable: new files 0664, as on a shared project folder)
    modes = {"model.safetensors": 0o600, "run.sh": 0o755, "notes.txt": 0o640}
    for name, mode in modes.items():
        (tmp_path / name).write_text(name)
        (tmp_path / name).chmod(mode)
    write_manifest(tmp_path)
    got = {name: (tmp_path / name).stat().st_mode & 0o777 for name in modes}
    assert got == {"model.safetensors": 0o664, "run.sh": 0o755, "notes.txt": 0o640}


def test_a_missing_tiktoken_vocabulary_is_needed(tmp_path):
    """A tokenizer whose only vocabulary is a ``*.tiktoken`` file does not load without it: not 'delete
    manifest.json to load it' (mutant: ``*.tiktoken`` not one of the vocabulary formats)."""
    from dgrpo.model.verified import CheckpointError, check_intact

    from conftest import written_with_manifest

    folder = written_with_manifest(tmp_path, {"tokenizer_config.json": "{}", "cl100k.tiktoken": "x"})
    (folder / "cl100k.tiktoken").unlink()
    with pytest.raises(CheckpointError, match="missing file cl100k.tiktoken ") as e:
        check_intact(folder)
    assert "the model does not load without it" in str(e.value), str(e.value)


@pytest.mark.parametrize(
    ("words", "says"),
    [
        (("grpo",), "K = 8 rollouts per prompt, 16 prompts a step"),  # (mutant: GRPO_ABOUT not passed)
        (("config", "show"), "the resolved config as JSON: what dgrpo sft and grpo given the same --config"),
        (("data", "inspect"), 'The last line is JSON: {"n": N, "example":'),
    ],
)
def test_a_commands_help_starts_with_its_own_description(capsys, words, says):
    """`dgrpo grpo --help`, `dgrpo config show --help` and `dgrpo data inspect --help` print their description, not
    the one line of the command list (mutants: the description not passed, or subcommand() ignoring it)."""
    from dgrpo.cli import build_parser

    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*words, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and says in out, out
