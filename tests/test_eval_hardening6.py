"""dgrpo eval refusing to replace another model's (or dataset's) results in its --out unless --overwrite."""

import json
import shutil


def test_a_second_model_into_the_first_models_out_is_refused_unless_overwrite(run_cli, sft_checkpoint, tmp_path):
    """Two checkpoints compared into one --out: the second is refused in one line naming the file and the model
    that wrote it (the first's results kept, byte for byte); the same model again replaces its own; another dataset
    is refused too; --overwrite replaces them."""
    other = tmp_path / "other"
    shutil.copytree(sft_checkpoint, other)
    out = tmp_path / "eval"
    first = run_cli("eval", "--model", sft_checkpoint, "--data", "builtin:test", "--limit", 2, "--out", out)
    assert first.returncode == 0, first.stderr
    kept = (out / "results.json").read_bytes()
    assert json.loads(kept)["model"] == str(sft_checkpoint.resolve())

    second = run_cli("eval", "--model", other, "--data", "builtin:test", "--limit", 2, "--out", out)
    assert second.returncode != 0
    [line] = [x for x in second.stderr.splitlines() if str(out / "results.json") in x]
    assert str(sft_checkpoint.resolve()) in line and "--overwrite" in line
    assert (out / "results.json").read_bytes() == kept

    again = run_cli("eval", "--model", sft_checkpoint, "--data", "builtin:test", "--limit", 3, "--out", out)
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "results.json").read_text())["n"] == 3

    valid = run_cli("eval", "--model", sft_checkpoint, "--data", "builtin:valid", "--limit", 2, "--out", out)
    assert valid.returncode != 0 and "dataset builtin:test" in valid.stderr

    forced = run_cli("eval", "--model", other, "--data", "builtin:test", "--limit", 2, "--out", out, "--overwrite")
    assert forced.returncode == 0, forced.stderr
    assert json.loads((out / "results.json").read_text())["model"] == str(other.resolve())


def test_same_model_names_a_hub_id_at_any_commit_and_a_directory_alone():
    from dgrpo.cli.evaluate import _same_model

    assert _same_model("org/m@" + "a" * 40, "org/m@" + "b" * 40)
    assert _same_model("org/m", "org/m@" + "b" * 40)
    assert not _same_model("org/m@" + "a" * 40, "org/n@" + "a" * 40)
    assert _same_model("/runs/a/final", "/runs/a/final")
    assert not _same_model("/runs/a@1/final", "/runs/a@2/final")
    assert not _same_model("/runs/a/final", "org/m")
