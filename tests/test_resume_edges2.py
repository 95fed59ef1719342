"""Resume edges: a stuck (all-zero) Mersenne Twister state in a checkpoint, float32 masters left stale by a resume
under another dtype, the data and reward compared by GRPOTrainer.load_state called from Python, and the refusals
worded for the caller (the command line's options, or the Python call)."""

import json
import re

import pytest
import torch
from test_resume_state_checks import StubReadLM

from dgrpo.model.verified import CheckpointError, write_manifest
from dgrpo.training.checkpoint import read_checkpoint, save_checkpoint


def _rewritten(ckpt, change) -> None:
    """``ckpt``'s state.json changed by ``change`` (a function of the parsed state), its manifest written again."""
    state = json.loads((ckpt / "state.json").read_text())
    change(state)
    (ckpt / "state.json").write_text(json.dumps(state))
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)


def _stuck_python(state: dict) -> None:
    state["rng"]["python"][1][:624] = [0x7FFFFFFF] + [0] * 623  # (the first word's low 31 bits are never read)


def _stuck_numpy(state: dict) -> None:
    state["rng"]["numpy"][1] = [0] * 624


@pytest.mark.parametrize(("change", "name"), [(_stuck_python, "python"), (_stuck_numpy, "numpy")])
def test_an_all_zero_mersenne_twister_state_is_refused_as_a_damaged_checkpoint(tmp_path, change, name):
    """``rng.python`` / ``rng.numpy`` holding an all-zero state (no seeding makes one) passed every check: the
    resumed run's generator drew 0 forever (its shuffles and draws no longer random), without a word. It is now a
    damaged checkpoint's line when the checkpoint is read, as the other damaged random states are."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    ckpt = save_checkpoint(tmp_path, 1, lm=StubReadLM(), optimizer=opt, state={})
    read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt)
    _rewritten(ckpt, change)
    said = f"state.json: its rng's {name} holds an all-zero Mersenne Twister state (a generator that draws 0 forever"
    with pytest.raises(CheckpointError, match=re.escape(said)):
        read_checkpoint(ckpt, lm=StubReadLM(), optimizer=opt)


def test_a_generator_state_with_a_single_live_bit_is_no_stuck_state():
    """Only the first word's top bit and the other words count: one bit set there is a state a generator can hold."""
    from dgrpo.training.checkpoint import numpy_random_state, python_random_state, stuck_generator

    assert stuck_generator([0x7FFFFFFF] + [0] * 623) and stuck_generator([0] * 624)
    assert not stuck_generator([0x80000000] + [0] * 623) and not stuck_generator([0] * 623 + [1])
    python_random_state([3, [0x80000000] + [0] * 623 + [624], None])
    numpy_random_state(["MT19937", [0] * 623 + [1], 624, 0, 0.0])


def _adapter_checkpoint(tmp_path):
    """A checkpoint folder whose model/ is a LoRA adapter on the hub base ``org/base`` at commit ``aaa``."""
    (tmp_path / "model").mkdir()
    config = {"base_model_name_or_path": "org/base", "revision": "aaa"}
    (tmp_path / "model" / "adapter_config.json").write_text(json.dumps(config))
    return tmp_path


def _refusals(ckpt) -> list[str]:
    """The refusals of a LoRA checkpoint on another hub commit, another adapter, other base weights, and of a GRPO
    run shortened below its checkpoint, as the caller reads them now."""
    from types import SimpleNamespace

    from dgrpo.config import ConfigError
    from dgrpo.training.checkpoint import check_same_hub_base, other_adapter_error, other_base_error
    from dgrpo.training.resume_check import shortened_error

    with pytest.raises(ConfigError) as e:
        check_same_hub_base(ckpt, SimpleNamespace(peft=object(), revision="bbb", name_or_path="org/base"))
    errors = [other_adapter_error(ckpt, "model.lora.r=4"), other_base_error(ckpt, "/new/base"), shortened_error(3, 5)]
    return [str(e.value), *map(str, errors)]


def test_the_lora_and_shortened_run_refusals_name_the_python_call_to_a_python_caller(tmp_path):
    """A Python caller (train_grpo with out_dir=, read_checkpoint) resuming a LoRA run whose hub base moved, whose
    adapter its model.lora would not build or whose base holds other weights, or a GRPO run shortened below its
    checkpoint, was told the command line's options (--set, --allow-config-change, --init, --out, --resume), which
    it never types: it is told the Python call; the command line (command_line_words) still reads its options."""
    from dgrpo.training.wording import command_line_words

    ckpt = _adapter_checkpoint(tmp_path)
    hub, adapter, base, short = _refusals(ckpt)
    assert hub.endswith(
        "resume on the same weights with the config's model.revision = 'aaa' and allow_config_change=True"
    )
    assert adapter.endswith("and start a new run with LatentLM.from_pretrained('MERGED') as a new run's model)")
    assert base.endswith(
        "resume on the weights it was trained on (LatentLM.from_pretrained naming where they are now), or train an "
        "adapter on this base in a new run (another out_dir)"
    )
    assert short.endswith(
        "continue an earlier checkpoint in a new directory (resume='OUT/checkpoints/step-N' with a new out_dir)"
    )
    export = f"dgrpo export {ckpt} --merge --out MERGED"  # (a command, for the command line and Python alike)
    for said in (hub, adapter.replace(export, ""), base, short):
        assert not re.search(r"--(set|allow-config-change|init|out|resume)\b", said), said
    with command_line_words():
        hub, adapter, base, short = _refusals(ckpt)
    assert hub.endswith("resume on the same weights with --set model.revision=aaa --allow-config-change")
    assert adapter.endswith(
        f"merge it into its base, dgrpo export {ckpt} --merge --out MERGED, and start a new run with --init MERGED)"
    )
    assert base.endswith(
        "(--init naming where they are now), or train an adapter on this base in a new run (another --out)"
    )
    assert short.endswith("in a new directory (--resume OUT/checkpoints/step-N --out NEW)")


def _step(lm, optimizer) -> None:
    """One optimizer step (lr as the optimizer has it) on a loss that moves every weight."""
    optimizer.zero_grad()
    sum(p.float().pow(2).sum() for p in lm.model.parameters()).backward()
    optimizer.step()


def _masters(optimizer) -> list[torch.Tensor]:
    return [s["master"] for s in optimizer.state.values() if "master" in s]


def test_a_bf16_runs_masters_do_not_come_back_stale_after_a_float32_resume(tokenizer, tmp_path):
    """A bf16 run with model.master_weights resumed in float32 (allow_config_change) kept the masters in its
    optimizer state, unused (float32 weights step themselves) and saved with each checkpoint; resumed in bf16 again,
    it stepped from them: the weights went back to where the bf16 run had left them, the float32 run's updates
    lost. The masters of parameters not low-precision now are dropped when read, and those beside weights saved in
    float32 (a checkpoint written so before) replaced: a bf16 resume's masters are the saved float32 weights."""
    from dgrpo.training.master_weights import MasterWeightAdamW

    from conftest import make_lm

    lm = make_lm(tokenizer, seed=1).to(torch.bfloat16)
    opt = MasterWeightAdamW(lm.model.parameters(), lr=1e-2)
    _step(lm, opt)
    bf16 = save_checkpoint(tmp_path / "bf16", 1, lm=lm, optimizer=opt, state={})
    lm32 = make_lm(tokenizer, seed=2)
    opt32 = MasterWeightAdamW(lm32.model.parameters(), lr=1e-2)
    read_checkpoint(bf16, lm=lm32, optimizer=opt32).apply(lm32, opt32)
    assert opt32.state and not _masters(opt32)  # (the moments are kept)
    for _ in range(3):
        _step(lm32, opt32)
    stale = opt.state_dict()["state"]  # (the bf16 run's masters, which the float32 run kept and saved before)
    for i in opt32.state_dict()["state"]:
        opt32.state[opt32.param_groups[0]["params"][i]]["master"] = stale[i]["master"]
    f32 = save_checkpoint(tmp_path / "f32", 4, lm=lm32, optimizer=opt32, state={})
    saved = {n: p.detach().clone() for n, p in lm32.model.named_parameters()}
    back = make_lm(tokenizer, seed=3).to(torch.bfloat16)
    opt_back = MasterWeightAdamW(back.model.parameters(), lr=1e-6)
    read_checkpoint(f32, lm=back, optimizer=opt_back).apply(back, opt_back)
    params = dict(zip((p for g in opt_back.param_groups for p in g["params"]), saved.values()))  # (in model order)
    assert all(torch.equal(opt_back.state[p]["master"], w) for p, w in params.items())  # (the float32 weights)
    _step(back, opt_back)
    for name, p in back.model.named_parameters():  # (one step of lr 1e-6 from the float32 run's weights)
        assert torch.allclose(p.float(), saved[name], atol=1e-2, rtol=1e-2), name


def _full_marks(completions, records):
    return [1.0] * len(completions)


def _no_marks(completions, records):
    return [0.0] * len(completions)


def test_grpo_trainer_load_state_from_python_refuses_a_state_of_other_data_or_another_reward(tokenizer, task_records):
    """GRPOTrainer.load_state called from Python (a notebook taking a run up again) took the state of a run trained
    on other data, or with another reward, without a word, where the command line's resume (and train_grpo's)
    refused it: it now compares them as that resume does (resume_check.recorded_changes), the trainer left as it
    was, unless allow_config_change."""
    from dgrpo.config import ConfigError
    from dgrpo.training.grpo import GRPOTrainer

    from conftest import make_lm, tiny_config

    cfg = tiny_config(**{"grpo.prompts_per_step": 3, "grpo.beta0": 0})
    saved = json.loads(
        json.dumps(GRPOTrainer(make_lm(tokenizer), cfg, task_records[:8], reward_fn=_full_marks).state())
    )
    saved["step_idx"] = 5
    for train, reward, said in (
        (task_records[8:14], _full_marks, "trained on other training data than given now (8 records, now 6): "),
        (task_records[:8], _no_marks, f"trained with the reward {'; '.join(saved['reward'])}, now "),
    ):
        tr = GRPOTrainer(make_lm(tokenizer), cfg, train, reward_fn=reward)
        with pytest.raises(ConfigError) as e:
            tr.load_state(saved)
        assert str(e.value).startswith(f"GRPOTrainer.load_state: the state was {said}"), str(e.value)
        assert str(e.value).endswith(", or pass allow_config_change=True to go on")
        assert tr.step_idx == 0
        heard = []
        tr.load_state(saved, refuse=lambda what, keep, heard=heard: heard.append(what))  # (train_grpo's RunDir's)
        assert len(heard) == 1 and f"the state was {heard[0]}: " in str(e.value) and tr.step_idx == 5
        tr.load_state(saved, allow_config_change=True)
    GRPOTrainer(make_lm(tokenizer), cfg, task_records[:8], reward_fn=_full_marks).load_state(saved)  # (the same run)
