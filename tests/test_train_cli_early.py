"""What the training commands say before the model loads, of what the ``--init`` checkpoint's run recorded: a file
of the columns that run mapped (``data.question_key=prompt`` in its run_config.json), read here without the mapping,
is refused with the mapping named."""

from __future__ import annotations

import json

import pytest

from conftest import make_lm, tiny_args


@pytest.fixture
def no_model(monkeypatch):
    """The model never loads: a refusal that came after it fails the test."""
    from dgrpo.model import factory

    monkeypatch.setattr(factory, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))


def _mapped_init(tokenizer, folder, **data) -> str:
    """A tiny checkpoint whose run_config.json says its run read its data with ``data`` (the column mapping)."""
    make_lm(tokenizer).save_pretrained(folder)
    (folder / "manifest.json").unlink(missing_ok=True)  # (changed by hand below)
    (folder / "run_config.json").write_text(json.dumps({"data": data}))
    return str(folder)


def _prompt_target_file(path):
    rows = [{"prompt": f"What is {i} + {i}?", "target": str(2 * i)} for i in range(4)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("cmd", ["grpo", "sft"])
def test_a_file_of_the_init_runs_mapped_columns_is_refused_naming_the_mapping(
    tokenizer, tmp_path, run_cli, no_model, cmd
):
    """The --init run read prompt/target columns (data.question_key=prompt data.answer_key=target); the same kind
    of file given without the mapping: one line that names the mapping the checkpoint's run used."""
    init = _mapped_init(tokenizer, tmp_path / "sft", question_key="prompt", answer_key="target")
    data = _prompt_target_file(tmp_path / "train.jsonl")
    over = {"data.train": data, "data.valid": "''", "data.test": "[]"}
    r = run_cli(cmd, "--init", init, "--out", tmp_path / "out", *tiny_args(**over))
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert "unrecognised record keys" in r.stderr
    assert (
        "the --init checkpoint's run read its data with data.question_key=prompt data.answer_key=target "
        "(its run_config.json)" in r.stderr
    ), r.stderr
    assert "--set data.question_key=prompt data.answer_key=target reads this file so" in r.stderr


def test_a_held_out_file_of_the_mapped_columns_names_the_mapping_too(tokenizer, tmp_path, run_cli, no_model):
    """data.test of the --init run's columns (the training data built in): the same line, for data.test."""
    init = _mapped_init(tokenizer, tmp_path / "sft", question_key="prompt", answer_key="target")
    test = _prompt_target_file(tmp_path / "test.jsonl")
    r = run_cli("grpo", "--init", init, "--out", tmp_path / "out", *tiny_args(**{"data.test": f"[{test}]"}))
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert "data.test: " in r.stderr and "data.question_key=prompt data.answer_key=target" in r.stderr, r.stderr


def test_an_init_run_that_mapped_no_columns_adds_nothing(tokenizer, tmp_path, run_cli, no_model):
    """A checkpoint whose run read a known format: the line is the reader's, no mapping named."""
    init = _mapped_init(tokenizer, tmp_path / "sft")
    data = _prompt_target_file(tmp_path / "train.jsonl")
    over = {"data.train": data, "data.valid": "''", "data.test": "[]"}
    r = run_cli("grpo", "--init", init, "--out", tmp_path / "out", *tiny_args(**over))
    assert "unrecognised record keys" in r.stderr and "--init checkpoint's run" not in r.stderr, r.stderr


def _denied(monkeypatch, path):
    """The system says this user may not write in ``path`` (another user's folder; as root too)."""
    from pathlib import Path

    from dgrpo.training import out_dir

    access = out_dir.os.access
    monkeypatch.setattr(out_dir.os, "access", lambda p, mode, **k: Path(p) != path and access(p, mode, **k))


def _run_with_eval_best(out):
    """A finished-looking run's OUT whose eval_best/ (best/'s test results) is there."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text("")
    (out / "eval_best").mkdir()
    return out / "eval_best"


@pytest.mark.parametrize(
    ("command", "over", "refused"),
    [
        ("sft", {}, False),  # (no sft.eval_every_epoch: no best/, nothing tested into eval_best/)
        ("sft", {"sft.eval_every_epoch": "true"}, True),
        ("grpo", {}, True),
        ("grpo", {"grpo.save_best": "false"}, False),
        ("grpo", {"data.valid": "''"}, False),  # (no validation: no best/)
    ],
)
def test_an_unwritable_eval_best_is_refused_only_where_the_run_tests_best(
    tmp_path, monkeypatch, command, over, refused
):
    """OUT/eval_best not writable to the user: refused at the start where the run tests best/ into it (it keeps a
    best/, chosen on validation); a run that keeps none (SFT without sft.eval_every_epoch, grpo.save_best=false, no
    data.valid) was refused for a folder it never writes."""
    from dgrpo.config import ConfigError, to_dict
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    from conftest import tiny_config

    cfg = tiny_config(**over)
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(to_dict(cfg)))
    folder = _run_with_eval_best(out)
    _denied(monkeypatch, folder)
    run = lambda: RunDir(out, cfg, Dist.single(), command, log=lambda m: None)  # noqa: E731
    if refused:
        with pytest.raises(ConfigError, match=f"^{folder} belongs to user .* not writable to you: the run writes"):
            run()
    else:
        run().close()


def test_the_command_line_lets_an_sft_run_without_best_through_an_unwritable_eval_best(tmp_path, monkeypatch, run_cli):
    """``dgrpo sft`` without sft.eval_every_epoch, OUT/eval_best not writable: on to the model (which here fails in
    one line), not refused for eval_best/."""
    from dgrpo.config import ConfigError
    from dgrpo.model import factory

    def load(*a, **k):
        raise ConfigError("the model loads")

    monkeypatch.setattr(factory, "load_model", load)
    out = tmp_path / "run"
    folder = _run_with_eval_best(out)
    _denied(monkeypatch, folder)
    r = run_cli("sft", "--out", out, *tiny_args())
    assert r.stderr == "dgrpo: error: the model loads\n", r.stderr
    r = run_cli("sft", "--out", out, *tiny_args(**{"sft.eval_every_epoch": "true"}))
    assert r.stderr.startswith(f"dgrpo: error: {folder} belongs to user "), r.stderr


@pytest.mark.parametrize(
    ("name", "why", "has_config"),
    [
        ("config.json", "the run writes its config to it", False),
        ("applied.json", "the run records the settings it applied in it", True),
        ("summary.json", "the run writes its summary to it at its end", True),
    ],
)
def test_a_folder_named_as_a_file_the_run_writes_is_refused_at_its_start(tmp_path, name, why, has_config):
    """A folder named config.json, applied.json or (GRPO) summary.json in a run's OUT: the run went on, and failed
    where it wrote there (config.json's and applied.json's once the model loaded; summary.json's at the run's end,
    hours in). Refused in one line at the start, the folder left as it was."""
    from dgrpo.config import ConfigError, to_dict

    from conftest import grpo_run_dir, tiny_config

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("")
    if has_config:
        (out / "config.json").write_text(json.dumps(to_dict(tiny_config())))
    (out / name).mkdir()
    (out / name / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError) as e:
        grpo_run_dir(out)
    assert (
        str(e.value)
        == f"{out / name} is a folder, not a file: {why}; move it out of {out}, or use another --out (out_dir)"
    )
    assert (out / name / "notes.txt").read_text() == "mine"


def test_a_folder_named_config_json_is_refused_before_the_model_loads(tmp_path, run_cli, no_model):
    """``dgrpo sft --out OUT`` (--resume never too), OUT/config.json a folder: its write failed once the data and
    the model were read; now one line first."""
    out = tmp_path / "run"
    (out / "config.json").mkdir(parents=True)
    for resume in ("auto", "never"):
        r = run_cli("sft", "--out", out, "--resume", resume, *tiny_args())
        assert r.returncode == 2, r.stderr
        assert r.stderr == (
            f"dgrpo: error: {out / 'config.json'} is a folder, not a file: the run writes its config to it; move it "
            f"out of {out}, or use another --out\n"
        )


def _grpo_out(out, **over):
    """A GRPO run's OUT (its config.json under tiny_config(**over)) with one checkpoint."""
    from dgrpo.config import to_dict

    from conftest import state_only_checkpoint, tiny_config

    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(to_dict(tiny_config(**over))))
    state_only_checkpoint(out / "checkpoints" / "step-00000004")


def test_a_python_callers_refusals_name_the_model_to_start_from_in_its_words(tmp_path):
    """From Python (train_grpo(out_dir=, resume=)), the advice to start a new run from a model named the command
    line's --init, which a Python caller never types: it names LatentLM.from_pretrained; the command line's words
    are unchanged."""
    from dgrpo.config import ConfigError
    from dgrpo.training.wording import command_line_words

    from conftest import grpo_run_dir, tiny_config

    sft = tmp_path / "sft" / "checkpoints" / "step-00000002"
    sft.mkdir(parents=True)
    (sft / "state.json").write_text('{"progress": {}}')
    with pytest.raises(ConfigError) as e:
        grpo_run_dir(tmp_path / "new", resume=str(sft))
    assert str(e.value).endswith(
        f"to start from its model: LatentLM.from_pretrained({str(sft)!r}) as a new run's model"
    )
    with pytest.raises(ConfigError) as e, command_line_words():
        grpo_run_dir(tmp_path / "new", resume=str(sft))
    assert str(e.value).endswith(f"to start from its model: --init {sft}")

    for over, now in (
        ({"model.lora.r": 4}, {}),
        ({"model.dtype": "bfloat16", "model.master_weights": "true"}, {"model.dtype": "bfloat16"}),
    ):
        out = tmp_path / f"run{len(over)}"
        _grpo_out(out, **over)
        with pytest.raises(ConfigError) as e:
            grpo_run_dir(out, tiny_config(**now))
        assert "start a new run with LatentLM.from_pretrained on its final/ or a checkpoint)" in str(e.value)
        assert "--init" not in str(e.value)
        with pytest.raises(ConfigError) as e, command_line_words():
            grpo_run_dir(out, tiny_config(**now))
        assert "start a new run with --init on its final/ or a checkpoint)" in str(e.value)


def test_a_python_callers_start_over_line_names_its_argument(tmp_path):
    """resume='never' from Python: the line saying what it removed named --resume never alone."""
    from dgrpo.training.distributed import Dist
    from dgrpo.training.run import RunDir

    from conftest import tiny_config

    out = tmp_path / "run"
    _grpo_out(out)
    said: list[str] = []
    RunDir(out, tiny_config(), Dist.single(), "grpo", log=said.append, resume="never").close()
    assert any(line.startswith("dgrpo: --resume never (resume='never'): removed the earlier run's ") for line in said)
