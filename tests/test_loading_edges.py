"""Loading a model, its edges: the line a command says before the weights load (on rank 0 alone, rank 0 decided
alike by dgrpo eval, sft and grpo), the advice about a checkpoint's missing tokenizer files, and the checks that
refuse a model before its weights load (minutes for a large one), not after."""

from conftest import make_lm


def test_a_stray_rank_variable_in_one_process_silences_no_line_of_eval(tokenizer, tmp_path, run_cli, monkeypatch):
    """A ``RANK`` left set in a shell (no torchrun: no ``WORLD_SIZE`` over 1) silenced dgrpo eval's loading line, its
    note of the checkpoint's settings and its summary of several datasets, while sft and grpo (``dist.is_main``: one
    process is rank 0) said theirs: the three decide rank 0 alike now."""
    lm = make_lm(tokenizer)
    lm.run_config = {"model": {"dtype": "float32"}}
    lm.save_pretrained(tmp_path / "ckpt")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "3")
    data = ["--data", "builtin:test", "builtin:valid", "--limit", 1, "--set", "threads=1"]
    r = run_cli("eval", "--model", tmp_path / "ckpt", *data, "--out", tmp_path / "ev")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert f"dgrpo: loading {tmp_path / 'ckpt'} (from {tmp_path / 'ckpt'}) ..." in lines, r.stdout
    assert any(line.startswith("dgrpo eval: task, data, dtype and scorer settings from") for line in lines), r.stdout
    assert any(line.startswith("dgrpo eval: builtin:test ") for line in lines), r.stdout
