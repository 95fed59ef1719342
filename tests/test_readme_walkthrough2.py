"""README's "Your own task" and docs/from_trl.md's GRPO command run as written, end to end, in a scratch folder with
the files they name: the only changes are the tiny model (``builtin-tiny`` for the hub id, ``--config tiny.yaml`` and
a few steps), so a flag, a default or an output the text promises cannot drift from the code unseen. test_docs.py
only parses these commands; here they train, and what the text says of their outputs is checked."""

import json
import re
import shlex
from pathlib import Path

import pytest

from conftest import TINY

ROOT = Path(__file__).resolve().parents[1]

#: what turns a documented command into a seconds-long one: the tiny model and few steps (nothing the text sets)
SHORT = {
    "sft": ["--config", TINY, "--set", "sft.num_epochs=2", "sft.epochs_per_stage=1", "sft.warmup_steps=0"],
    "grpo": ["--config", TINY, "--set", "grpo.steps=2", "grpo.eval_every=1", "grpo.warmup_steps=0"],
}
#: the hub ids of the texts' commands, and the nearest local model (no hub in the tests)
LOCAL = {"Qwen/Qwen2.5-0.5B": "builtin-tiny"}


def local(word: str) -> str:
    """``word`` with a hub id of :data:`LOCAL` (alone or as a ``--set`` value) replaced by its local model."""
    key, eq, value = word.rpartition("=")
    return f"{key}{eq}{LOCAL[value]}" if value in LOCAL else word


def block_commands(path: Path, heading: str) -> list[list[str]]:
    """The ``dgrpo`` commands (arguments after the command name) of the first bash block after ``heading``, as a
    reader copies them (continuation lines joined, comments dropped), hub ids replaced (:func:`local`)."""
    text = path.read_text()
    block = re.search(r"```bash\n(.*?)```", text[text.index(heading) :], flags=re.DOTALL)
    assert block, f"{path.name}: no bash block after {heading.strip()!r}"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    return [[local(w) for w in shlex.split(line, comments=True)][1:] for line in lines if line.startswith("dgrpo ")]


def shortened(args: list[str]) -> list[str]:
    """``args`` with the tiny config first (so the text's own --set win over it) and few steps."""
    return [args[0], *SHORT.get(args[0], []), *args[1:]]


def task_rows(split: str, n: int) -> list[dict]:
    """``n`` built-in-task problems of ``split`` as GSM8K-style rows (``question``, ``answer`` ending ``#### x``)."""
    from dgrpo.config import TaskConfig
    from dgrpo.data.synthetic import generate_split

    recs = generate_split(TaskConfig(n_steps=2, n_train=n, n_valid=n, n_test=n), split)[:n]
    return [{"question": r.question, "answer": " ".join(r.steps) + f"\n#### {r.answer}"} for r in recs]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_readme_own_task_commands_run_as_written(run_cli, tmp_path, monkeypatch):
    """The three commands of README's "Your own task" (a plain TRL user's first run): SFT, GRPO with a reward file and
    rollouts logged, eval with the run's own scorer; and what the paragraph under them says of the run's records."""
    commands = block_commands(ROOT / "README.md", "\n## Your own task\n")
    assert [c[0] for c in commands] == ["sft", "grpo", "eval"], commands
    monkeypatch.chdir(tmp_path)
    for name, split in (("my_train", "train"), ("my_valid", "valid"), ("my_test", "test")):
        write_jsonl(tmp_path / f"{name}.jsonl", task_rows(split, 64 if split == "train" else 16))
    (tmp_path / "my_rewards.py").write_text(
        "def reward(completions, records):\n"
        "    return [float(c.split('####')[-1].strip() == r.answer) for c, r in zip(completions, records)]\n"
    )
    for args in commands:
        r = run_cli(*shortened(args))
        assert r.returncode == 0, (args, r.stderr[-2000:])
    grpo = tmp_path / "runs" / "mine" / "grpo"
    rollouts = [json.loads(line) for line in (grpo / "rollouts.jsonl").read_text().splitlines()]
    assert rollouts and {"completion", "reward", "answer"} <= set(rollouts[0])
    config = json.loads((grpo / "config.json").read_text())
    assert config["data"]["train"] == str(tmp_path / "my_train.jsonl")  # "by absolute path (as it does the reward's)"
    assert config["grpo"]["reward"] == f"{tmp_path / 'my_rewards.py'}:reward"
    assert config["data"]["test"] == ["my_test.jsonl"]  # "data.test stays as typed"
    (applied,) = json.loads((grpo / "applied.json").read_text())  # (a list: one entry per start)
    assert str(tmp_path / "my_rewards.py") in applied["plugin_files"]  # "by their contents' hash"
    assert applied["started_in"] == str(tmp_path)
    results = json.loads((tmp_path / "runs" / "mine" / "eval" / "results.json").read_text())
    assert results["scorer"] == "exact"  # "# the run's own scorer"
    for field in ("model", "temperature", "top_p", "max_new_tokens", "limit", "shots"):  # what results.json names
        assert field in results, field


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_docs_from_trl_grpo_command_runs_with_its_reward_unchanged(run_cli, sft_checkpoint, tmp_path, monkeypatch):
    """docs/from_trl.md's command with its reward file as written (a TRL reward taking ``solution``) and a data file
    with a ``solution`` column, from an SFT run at runs/sft: the run trains, and its rollouts hold the reward."""
    path = ROOT / "docs" / "from_trl.md"
    reward = re.search(r"```python\n(# my_rewards\.py.*?)```", path.read_text(), flags=re.DOTALL)
    assert reward, "docs/from_trl.md no longer opens a Python block with '# my_rewards.py'"
    commands = block_commands(path, "## Your reward functions and data")
    assert [c[0] for c in commands] == ["grpo"], commands
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rewards.py").write_text(reward.group(1))
    for name, split in (("my_data", "train"), ("my_valid", "valid"), ("my_test", "test")):
        n = 64 if split == "train" else 16
        rows = [{"question": r["question"], "solution": r["answer"]} for r in task_rows(split, n)]
        write_jsonl(tmp_path / f"{name}.jsonl", rows)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "sft").symlink_to(sft_checkpoint.parent)
    r = run_cli(*shortened(commands[0]))
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "runs" / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert any("reward_mean" in row for row in rows)
