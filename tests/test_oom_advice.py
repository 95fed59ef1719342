"""Out of device memory in a training phase: the error names the phase, the setting that bounds its memory and a
value to try (``dgrpo.training.memory``), here in the command line's words (tests/test_wording3.py: a Python
caller's)."""

from unittest import mock

import pytest
import torch

from dgrpo.config import Config, load_config
from dgrpo.training.memory import MARK, oom_advice
from dgrpo.training.wording import command_line_words

from conftest import make_lm

OOM = "CUDA out of memory. Tried to allocate 9.00 GiB. GPU 0 has a total capacity of 79.19 GiB\nthe allocator's notes"


@pytest.fixture(autouse=True)
def command_line():
    """Each test as ``dgrpo sft`` / ``dgrpo grpo`` runs its trainer: the advice says ``--set``."""
    with command_line_words():
        yield


def raise_oom(*args, **kwargs):
    raise torch.OutOfMemoryError(OOM)


def test_the_advice_follows_the_first_line_and_keeps_the_error():
    with pytest.raises(torch.OutOfMemoryError) as info:
        with oom_advice("update", "grpo.micro_batch_size", 512, "rows per forward/backward"):
            raise_oom()
    lines = str(info.value).splitlines()
    assert lines[0] == OOM.splitlines()[0] and lines[2] == "the allocator's notes"
    advice = (
        "in the update at grpo.micro_batch_size=512: try --set grpo.micro_batch_size=256 (rows per forward/backward)"
    )
    assert lines[1] == f"{MARK} {advice}"
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)  # chained: the original traceback is kept


def test_an_inner_phase_advice_is_not_overwritten_and_nothing_smaller_says_only_why():
    with pytest.raises(torch.OutOfMemoryError) as info:
        with oom_advice("update", "grpo.micro_batch_size", 64, "outer"):
            with oom_advice("reference's scoring", "grpo.rollout_batch_size", 1, "a larger device"):
                raise_oom()
    message = str(info.value)
    assert message.count(MARK) == 1 and "outer" not in message
    assert f"{MARK} in the reference's scoring at grpo.rollout_batch_size=1: a larger device" in message
    assert "try" not in message


def make_trainer(tokenizer, task_records, beta0, *extra):
    from dgrpo.training.grpo import GRPOTrainer

    over = ["grpo.group_size=4", "grpo.filter=false", f"grpo.beta0={beta0}", "grpo.micro_batch_size=8"]
    over += ["grpo.rollout_batch_size=16", "grpo.recompute=true", "grpo.recompute_granularity=call", *extra]
    return GRPOTrainer(make_lm(tokenizer, "qwen2"), load_config(Config, "tiny.yaml", over), task_records)


ROLLOUTS = "in the rollouts at grpo.rollout_batch_size=16: try --set grpo.rollout_batch_size=8"
REFERENCE = "in the reference's scoring at grpo.rollout_batch_size=16: try --set grpo.rollout_batch_size=8"
UPDATE = "in the update at grpo.micro_batch_size=8: try --set grpo.micro_batch_size=4"


@pytest.mark.parametrize(
    ("target", "beta0", "expected"),
    [
        ("collect_rollouts", 0.01, ROLLOUTS),
        ("_replayed_logprobs", 0.01, REFERENCE),  # the reference scores first in the update
        ("replay_logprobs", 0.0, UPDATE),  # no reference: the policy's replay
    ],
)
@pytest.mark.slow
def test_a_grpo_step_names_the_phase_and_the_setting(tokenizer, task_records, target, beta0, expected):
    trainer = make_trainer(tokenizer, task_records, beta0)
    with mock.patch(f"dgrpo.training.grpo.{target}", raise_oom):
        with pytest.raises(torch.OutOfMemoryError, match="CUDA out of memory") as info:
            trainer.step()
    assert f"{MARK} {expected}" in str(info.value)
    if expected == UPDATE:  # per-call recomputation on: per layer keeps less
        assert "grpo.recompute_granularity=layer keeps less for backward" in str(info.value)


def test_kept_layers_are_the_first_thing_to_give_back(tokenizer, task_records):
    """With layers kept out of per-layer recomputation, the update's advice names them too."""
    over = ["grpo.recompute_granularity=layer", "grpo.recompute_kept_layers=1"]
    trainer = make_trainer(tokenizer, task_records, 0.0, *over)
    with mock.patch("dgrpo.training.grpo.replay_logprobs", raise_oom):
        with pytest.raises(torch.OutOfMemoryError) as info:
            trainer.step()
    assert f"{MARK} {UPDATE}" in str(info.value)
    assert "fewer grpo.recompute_kept_layers (now 1) keep less for backward" in str(info.value)


def test_memory_held_between_steps_is_the_first_thing_to_give_back(tokenizer, task_records):
    """With the latent chain's graphs and the kept decoders on, the update's advice tries them first (they hold
    memory between steps and leave the method as it is), then the micro-batch (README's order): it named the
    micro-batch first and the chain's graphs last."""
    over = ["grpo.engine=fast", "grpo.update_latent_graphs=true", "grpo.recompute_latent_steps=false"]
    trainer = make_trainer(tokenizer, task_records, 0.0, *over)
    with pytest.raises(torch.OutOfMemoryError) as info:
        with trainer._update_oom_advice():
            raise_oom()
    advice = str(info.value).splitlines()[1]
    assert advice.startswith(
        f"{MARK} in the update at grpo.micro_batch_size=8: try --set grpo.update_latent_graphs=false "
        "grpo.keep_graphs=false (memory held between steps; the same method, a slower step) first; then try --set "
        "grpo.micro_batch_size=4 (rows per forward/backward"
    ), advice


def test_the_rollouts_too_are_advised_to_give_back_the_memory_held_between_steps_first(tokenizer, task_records):
    """The latent chain's graphs and the kept decoders stay held while the next step's rollouts run: the rollouts'
    advice named their batch alone."""
    over = ["grpo.engine=fast", "grpo.update_latent_graphs=true", "grpo.recompute_latent_steps=false"]
    trainer = make_trainer(tokenizer, task_records, 0.0, *over)
    with mock.patch("dgrpo.training.grpo.collect_rollouts", raise_oom):
        with pytest.raises(torch.OutOfMemoryError) as info:
            trainer.step()
    assert f"{MARK} in the rollouts at grpo.rollout_batch_size=" in str(info.value)
    assert "try --set grpo.update_latent_graphs=false grpo.keep_graphs=false (memory held between steps" in str(
        info.value
    )


def test_a_cheaper_lever_comes_before_the_setting_even_at_its_floor():
    with pytest.raises(torch.OutOfMemoryError) as info:
        with oom_advice("update", "grpo.micro_batch_size", 1, "one row already", first="--set a=b (why)"):
            raise_oom()
    assert f"{MARK} in the update at grpo.micro_batch_size=1: try --set a=b (why) first; then one row already" in (
        str(info.value)
    )


def test_rollouts_one_at_a_time_are_advised_as_such(tokenizer, task_records):
    """Native dropout replays one rollout at a time whatever grpo.rollout_batch_size says: no smaller value to try."""
    trainer = make_trainer(tokenizer, task_records, 0.0, "perturbation.kind=native")
    with mock.patch("dgrpo.training.grpo.collect_rollouts", raise_oom):
        with pytest.raises(torch.OutOfMemoryError) as info:
            trainer.step()
    assert f"{MARK} in the rollouts at grpo.rollout_batch_size=1: rows generated at a time" in str(info.value)


def test_an_sft_step_names_the_next_grad_accum_that_divides_the_batch(tmp_path, run_cli):
    from conftest import tiny_args

    small = {"model.hidden_size": 32, "model.intermediate_size": 64, "task.n_train": 48, "task.n_valid": 8}
    small |= {"task.n_test": 8, "sft.batch_size": 12, "sft.grad_accum": 4, "data.test": "[]"}
    with mock.patch("dgrpo.training.sft.sft_step", raise_oom):
        with pytest.raises(torch.OutOfMemoryError) as info:
            run_cli("sft", "--out", tmp_path / "sft", *tiny_args(**small))
    assert f"{MARK} in the SFT step at sft.grad_accum=4: try --set sft.grad_accum=6" in str(info.value)
    assert "sft.recompute=true keeps less for backward" in str(info.value)
    small |= {"sft.recompute": "true", "sft.recompute_kept_layers": 1}  # (layers kept out of recomputation)
    with mock.patch("dgrpo.training.sft.sft_step", raise_oom):
        with pytest.raises(torch.OutOfMemoryError) as info:
            run_cli("sft", "--out", tmp_path / "sft2", *tiny_args(**small))
    assert "fewer sft.recompute_kept_layers (now 1) keep less for backward" in str(info.value)


def test_a_one_line_error_gets_its_advice_as_the_last_line_and_other_errors_pass_unchanged():
    """An out-of-memory message of one line ends at the advice (no empty line after it); an error that is not out of
    memory raised in the block is not touched (neither retyped nor given advice)."""
    with pytest.raises(torch.OutOfMemoryError) as info:
        with oom_advice("update", "grpo.micro_batch_size", 8, "rows"):
            raise torch.OutOfMemoryError("CUDA out of memory.")
    assert str(info.value) == f"CUDA out of memory.\n{MARK} in the update at grpo.micro_batch_size=8: try --set " + (
        "grpo.micro_batch_size=4 (rows)"
    )
    error = ValueError("not memory")
    with pytest.raises(ValueError) as other:
        with oom_advice("update", "grpo.micro_batch_size", 8, "rows"):
            raise error
    assert other.value is error and MARK not in str(other.value)
