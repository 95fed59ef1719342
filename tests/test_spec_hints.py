"""Refusals that name what was meant: a plug-in file given without the function (or class) in it, a run's folder
given as --config, TRL's SFT logging and evaluation step options."""

from pathlib import Path

import pytest

from dgrpo.config import Config, ConfigError, load_config
from dgrpo.eval.scoring import RewardError, build_rewards, build_scorer
from dgrpo.perturbation import kind_class

PLUGIN = """import math


def correct(completions, **kwargs):
    return [1.0] * len(completions)


async def judged(completions, **kwargs):
    return [0.0] * len(completions)


def _helper():
    pass


class Noisy:
    pass
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rewards.py").write_text(PLUGIN)
    return tmp_path / "my_rewards.py"


@pytest.mark.parametrize("spec", ["my_rewards.py", "my_rewards.py:"])
def test_a_reward_file_without_its_function_is_told_to_name_one_of_those_it_defines(plugin: Path, spec: str) -> None:
    with pytest.raises(RewardError) as e:
        build_rewards(spec, [], "numeric")
    assert str(e.value).endswith("; name the function in it: 'my_rewards.py:FUNCTION' (it defines correct, judged)")


def test_a_scorer_file_without_its_function_names_them_too(plugin: Path) -> None:
    with pytest.raises(RewardError, match=r"'my_rewards.py:FUNCTION' \(it defines correct, judged\)$"):
        build_scorer("my_rewards.py")


def test_a_perturbation_file_without_its_class_names_the_classes(plugin: Path) -> None:
    with pytest.raises(ConfigError, match=r"; name the class in it: 'my_rewards.py:CLASS' \(it defines Noisy\)$"):
        kind_class("my_rewards.py")


def test_a_missing_file_without_a_function_says_it_is_not_found(plugin: Path) -> None:
    with pytest.raises(RewardError, match=r"'other.py:FUNCTION' \(file other.py not found\)$"):
        build_rewards("other.py", [], "numeric")


def test_a_module_name_without_a_function_keeps_the_plain_line(plugin: Path) -> None:
    with pytest.raises(RewardError) as e:
        build_rewards("my_rewards", [], "numeric")
    assert "name the function" not in str(e.value)


def test_a_run_folder_given_as_config_names_its_config_json(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    with pytest.raises(ConfigError) as e:
        load_config(Config, [str(tmp_path / "run")], [])
    assert str(e.value) == (
        f"config file not found: {tmp_path / 'run'} is a folder; the config a run there ran with is "
        f"{tmp_path / 'run' / 'config.json'}"
    )
    assert load_config(Config, [str(tmp_path / "run" / "config.json")], []).seed == Config().seed


@pytest.mark.parametrize("name, said", [("logging_steps", "every 10th optimizer step"), ("eval_steps", "stage's end")])
def test_trls_sft_logging_and_eval_steps_say_what_sft_does(name: str, said: str) -> None:
    with pytest.raises(ConfigError, match=f"TRL's {name} has no counterpart in SFT: SFT .*{said}"):
        load_config(Config, [], [f"sft.{name}=10"])
