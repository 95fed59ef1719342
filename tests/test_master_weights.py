"""model.master_weights: bf16 weights stepped through float32 masters, as float32 weights would be, and resumed."""

import copy

import pytest
import torch

from dgrpo.config import ConfigError
from dgrpo.training.master_weights import MasterWeightAdamW, adamw, carry_masters, rounded_away_share

from conftest import run_script, tiny_config


def _params(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    # values a bf16 tensor holds exactly, so that every dtype starts from the same weights
    return [torch.nn.Parameter((torch.randn(*s, generator=g) * 0.02).bfloat16().to(dtype)) for s in ((64, 32), (32,))]


def _grads(step, params):
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g).bfloat16().to(p.dtype) for p in params]


def _steps(opt, params, steps, first=0):
    for t in range(first, first + steps):
        for p, g in zip(params, _grads(t, params)):
            p.grad = g
        opt.step()


KW = {"lr": 1e-4, "weight_decay": 0.1, "betas": (0.9, 0.95)}


def test_float32_weights_step_exactly_as_torch_adamw():
    a, b = _params(torch.float32), _params(torch.float32)
    _steps(torch.optim.AdamW(a, **KW), a, 5)
    opt = MasterWeightAdamW(b, **KW)
    _steps(opt, b, 5)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all("master" not in opt.state[p] for p in b)


def test_bf16_weights_follow_the_float32_run_through_their_masters():
    """The masters are the float32 run bit for bit; the weights are the masters rounded to nearest; without
    masters most of the updates (lr 1e-4, weights near 0.02) are lost."""
    ref = _params(torch.float32)
    _steps(torch.optim.AdamW(ref, **KW), ref, 8)
    bf16 = _params(torch.bfloat16)
    opt = MasterWeightAdamW(bf16, **KW)
    _steps(opt, bf16, 8)
    for r, p in zip(ref, bf16):
        state = opt.state[p]
        assert {k: v.dtype for k, v in state.items() if k != "step"} == dict.fromkeys(
            ("master", "exp_avg", "exp_avg_sq"), torch.float32
        )
        assert torch.equal(state["master"], r.detach())
        assert p.dtype == torch.bfloat16 and torch.equal(p.detach(), r.detach().bfloat16())
    plain = _params(torch.bfloat16)
    _steps(torch.optim.AdamW(plain, **KW), plain, 8)
    start = _params(torch.float32)

    def error(ps):
        return sum((p.float() - r).norm() for p, r in zip(ps, ref)) / sum((r - s).norm() for r, s in zip(ref, start))

    assert error([p.detach() for p in bf16]) < 0.5 * error([p.detach() for p in plain])


def test_step_hooks_run_once_a_step():
    """Once any torch AdamW exists torch wraps AdamW.step with the step hooks; called from this class's own wrapped
    step, a user's hook ran twice a step."""
    torch.optim.AdamW(_params(torch.float32), **KW)
    ps = _params(torch.bfloat16)
    opt = MasterWeightAdamW(ps, **KW)
    calls = []
    opt.register_step_pre_hook(lambda *a: calls.append("pre"))
    opt.register_step_post_hook(lambda *a: calls.append("post"))
    _steps(opt, ps, 2)
    assert calls == ["pre", "post"] * 2


def test_a_parameter_without_a_gradient_is_left_as_it_is():
    ps = _params(torch.bfloat16)
    opt = MasterWeightAdamW(ps, **KW)
    before = ps[1].detach().clone()
    ps[0].grad = torch.ones_like(ps[0])
    opt.step()
    assert torch.equal(ps[1], before) and ps[1] not in opt.state
    assert set(opt.state[ps[0]]) == {"master", "step", "exp_avg", "exp_avg_sq"}
    assert len(opt.state) == 1  # (no masters left behind as keys of their own)


def test_a_saved_state_loads_back_in_float32_and_the_run_goes_on_bit_for_bit():
    """torch's load_state_dict casts a parameter's state to its dtype: the masters and moments would be rounded to
    bf16 and a resumed run would differ from the uninterrupted one."""
    a = _params(torch.bfloat16)
    opt_a = MasterWeightAdamW(a, **KW)
    _steps(opt_a, a, 3)
    saved = copy.deepcopy(opt_a.state_dict())  # (as written to a file: not the tensors opt_a steps on)
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    opt_b = MasterWeightAdamW(b, **KW)
    opt_b.load_state_dict(saved)
    assert all(opt_b.state[p]["master"].dtype == torch.float32 for p in b)
    _steps(opt_a, a, 4, first=3)
    _steps(opt_b, b, 4, first=3)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(torch.equal(opt_a.state[x]["master"], opt_b.state[y]["master"]) for x, y in zip(a, b))


def test_a_new_optimizer_starts_from_the_old_ones_masters():
    """SFT's reset makes a new AdamW at each stage: the weights' float32 values go on, the moments start afresh."""
    ps = _params(torch.bfloat16)
    old = MasterWeightAdamW(ps, **KW)
    _steps(old, ps, 3)
    masters = [old.state[p]["master"].clone() for p in ps]
    new = MasterWeightAdamW(ps, **KW)
    carry_masters(old, new)
    assert all(set(new.state[p]) == {"master"} for p in ps)
    _steps(new, ps, 1, first=3)
    fresh = [torch.nn.Parameter(m.clone()) for m in masters]
    _steps(torch.optim.AdamW(fresh, **KW), fresh, 1, first=3)
    assert all(torch.equal(new.state[p]["master"], f.detach()) for p, f in zip(ps, fresh))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lr", [1e-6, 1e-5, 1e-4])
def test_the_rounded_away_share_is_what_an_adamw_step_leaves_unchanged(dtype, lr):
    """rounded_away_share counts the weights whose half spacing exceeds lr: torch's AdamW (no masters) steps each
    entry of N(0, 0.02) weights by lr (its first step, gradients +-1) and leaves just those unchanged (bf16 at lr
    1e-5, the paper's peak: 84% of them; at 1e-6: 98%)."""
    g = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter((torch.randn(100_000, generator=g) * 0.02).to(dtype))
    start, predicted = w.detach().clone(), rounded_away_share([w], lr)
    assert rounded_away_share([{"params": [w]}], lr) == predicted  # (param groups too)
    opt = torch.optim.AdamW([w], lr=lr, weight_decay=0.0)
    w.grad = torch.randn(w.shape, generator=g).sign().to(dtype)
    opt.step()
    assert predicted == pytest.approx((w.detach() == start).double().mean().item(), abs=2e-3)
    assert rounded_away_share([w.detach().float().requires_grad_()], lr) == 0.0  # float32: none


def test_adamw_on_low_precision_weights_without_masters_warns_when_the_lr_step_rounds_away(recwarn):
    """The paper's recipe (bf16 weights, no masters) at its peak lr 1e-5 leaves 84% of N(0, 0.02) weights unchanged
    at every step (98% at 1e-6, the cosine's tail), silently; the optimizer factory (SFT's and GRPO's) says so. With
    masters, float32 weights, or an lr whose step moves them, nothing is said."""
    ws = _params(torch.bfloat16)
    with pytest.warns(UserWarning, match=r"a step of lr 1e-06 is under half the spacing of 9\d\.\d% of the trained"):
        adamw(ws, False, lr=1e-6)
    for params, masters, lr in ((ws, True, 1e-6), (_params(torch.float32), False, 1e-6), (ws, False, 1e-2)):
        adamw(params, masters, lr=lr)
    assert not [w for w in recwarn if "master_weights" in str(w.message)]


def test_the_warned_share_is_printed_above_the_threshold_it_passed(monkeypatch):
    """A share just over the 10% threshold reads as such ("10.4%"; it printed "10%", the threshold itself)."""
    from dgrpo.training import master_weights

    monkeypatch.setattr(master_weights, "rounded_away_share", lambda params, lr: 0.104)
    with pytest.warns(UserWarning, match=r"under half the spacing of 10\.4% of the trained weights"):
        master_weights.warn_if_updates_round_away([], 1e-5)


def test_grpo_optimizer_warns_of_a_rounded_away_step_also_for_the_8bit_fallback(tokenizer):
    """grpo.optimizer=adamw8bit off CUDA is torch's AdamW on the bf16 weights (no masters: refused with it): both
    the fallback and the rounding are said."""
    from dgrpo.training.grpo import build_optimizer

    from conftest import make_lm

    params = list(make_lm(tokenizer).to(torch.bfloat16).model.parameters())
    cfg = tiny_config(**{"model.dtype": "bfloat16", "grpo.optimizer": "adamw8bit", "grpo.lr": 1e-6})
    with pytest.warns(UserWarning) as caught:
        opt = build_optimizer(params, cfg, torch.device("cpu"))
    said = " ".join(str(w.message) for w in caught)
    assert "adamw8bit runs on CUDA only" in said and "without model.master_weights: a step of lr 1e-06" in said
    assert "set model.master_weights=true (with grpo.optimizer=adamw) to step" in said  # (masters refuse adamw8bit)
    assert type(opt) is torch.optim.AdamW


def test_master_weights_with_the_8bit_optimizer_are_refused():
    with pytest.raises(ConfigError, match=r"model.master_weights: .*set grpo.optimizer=adamw"):
        tiny_config(**{"model.master_weights": "true", "grpo.optimizer": "adamw8bit"})


@pytest.mark.slow
def test_a_bf16_grpo_run_with_master_weights_resumes_from_its_checkpoint_bit_for_bit(sft_checkpoint, tmp_path):
    """Two steps, a resumable checkpoint, a fresh trainer loaded from it: the same next steps as the run never
    stopped (the masters are in the checkpoint's optimizer state, in float32)."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.checkpoint import list_checkpoints, read_checkpoint, save_checkpoint
    from dgrpo.training.grpo import GRPOTrainer

    over = {"model.dtype": "bfloat16", "model.master_weights": "true", "grpo.prompts_per_step": 4, "grpo.steps": 4}
    cfg = tiny_config(**over, **{"grpo.lr": 1e-3, "grpo.filter": "false", "perturbation.p": 0.3})
    train = generate_split(cfg.task, "train")

    def trainer():
        return GRPOTrainer(LatentLM.from_pretrained(sft_checkpoint).to(torch.bfloat16), cfg, train)

    a = trainer()
    a.step()
    a.step()
    save_checkpoint(tmp_path, 2, lm=a.lm, optimizer=a.opt, state={"trainer": a.state()})
    b = trainer()
    saved = read_checkpoint(list_checkpoints(tmp_path)[-1], lm=b.lm, optimizer=b.opt)
    b.load_state(saved.apply(b.lm, b.opt)["trainer"])
    masters = [s["master"] for s in b.opt.state.values() if "master" in s]
    assert masters and all(m.dtype == torch.float32 for m in masters)
    rng = torch.random.get_rng_state()
    for _ in range(2):
        torch.random.set_rng_state(rng)
        a.step()
        torch.random.set_rng_state(rng)
        b.step()
    wa, wb = a.lm.model.state_dict(), b.lm.model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    moved = [
        k
        for k, v in LatentLM.from_pretrained(sft_checkpoint).model.state_dict().items()
        if not torch.equal(v.bfloat16(), wa[k])
    ]
    assert moved


@pytest.mark.slow
def test_bf16_sft_with_master_weights_checkpoints_the_masters_whose_rounding_is_the_weights(tmp_path, monkeypatch):
    """Across the tiny curriculum's stage boundary (a new AdamW, which starts from the old one's masters): each
    resumable checkpoint holds a float32 master for every trained weight, and the saved bf16 weight is that master
    rounded to nearest."""
    from safetensors.torch import load_file

    import dgrpo.training.sft as sft
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.checkpoint import list_checkpoints
    from dgrpo.training.sft import train_sft

    carried = []

    def carry(old, new):
        carry_masters(old, new)
        if old is not None:
            olds = [old.state[p]["master"] for g in old.param_groups for p in g["params"]]
            news = [new.state[p]["master"] for g in new.param_groups for p in g["params"]]
            carried.append(all(a is b for a, b in zip(olds, news, strict=True)))

    monkeypatch.setattr(sft, "carry_masters", carry)

    over = {"model.dtype": "bfloat16", "model.master_weights": "true", "task.n_train": 64, "sft.batch_size": 32}
    cfg = tiny_config(
        **over, **{"sft.save_every": 1, "sft.eval_each_stage": "false", "data.test": "[]", "sft.warmup_steps": 1}
    )
    torch.manual_seed(0)
    lm = load_model(cfg.model, cfg.task, seed=0)
    assert lm.new_latent_tokens  # (the built-in model's markers are new; SFT trains them: GRPO need not warn after)
    train_sft(lm, generate_split(cfg.task, "train"), cfg, tmp_path, log=lambda *a: None, progress=False)
    assert lm.new_latent_tokens == []
    ckpt = list_checkpoints(tmp_path)[-1]
    weights = load_file(str(ckpt / "model" / "model.safetensors"))
    optimizer = torch.load(ckpt / "optimizer.pt", weights_only=True)
    names = [n for n, p in lm.model.named_parameters() if p.requires_grad]
    ids = [i for g in optimizer["param_groups"] for i in g["params"]]
    assert len(ids) == len(names)
    checked = 0
    for i, name in zip(ids, names):
        master = optimizer["state"][i]["master"]
        assert master.dtype == torch.float32 and torch.equal(master.bfloat16(), weights[name]), name
        checked += 1
    assert checked == len(names)
    assert carried == [True]  # (one stage boundary)


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, argv, code, said",
    [
        ("bf16_grpo_updates", ["--help"], 0, "usage: bf16_grpo_updates.py [-h] [--threads N] [STEPS]"),
        ("bf16_grpo_updates", ["--help"], 0, "torch threads (default 2, as the published figures were taken"),
        ("bf16_grpo_updates", ["--threads", "0"], 2, "argument --threads: expected a positive integer, got 0"),
        ("bf16_grpo_updates", ["x"], 2, "argument STEPS: expected a positive integer, got 'x'"),
        ("bf16_grpo_updates", ["0"], 2, "argument STEPS: expected a positive integer, got 0"),
        ("bf16_updates", ["--help"], 0, "usage: bf16_updates.py [-h]"),
    ],
)
def test_the_bf16_experiments_answer_help_and_a_bad_step_count_at_once(monkeypatch, capsys, script, argv, code, said):
    """experiments/bf16_*.py: ``--help`` ended in int()'s traceback (bf16_grpo_updates) or ran the whole experiment
    (bf16_updates); STEPS 0 ran SFT and then divided the update errors by 0. Now argparse's help or error."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "experiments" / f"{script}.py"
    got, out, err = run_script(path, argv, monkeypatch, capsys)
    assert got == code and said in out + err, err[-2000:]
    assert "Traceback" not in err and "update error" not in out


def test_grpo_8bit_optimizer_on_cuda_warns_of_a_rounded_away_step_too(tokenizer, monkeypatch):
    """bitsandbytes' AdamW8bit (the recipe on CUDA) rounds its update into the bf16 weight to nearest, as torch's
    AdamW does: the same warning (a stand-in module here: no CUDA, no bitsandbytes needed)."""
    import sys
    import types

    from dgrpo.training.grpo import build_optimizer

    from conftest import make_lm

    fake = types.SimpleNamespace(optim=types.SimpleNamespace(AdamW8bit=torch.optim.AdamW))
    monkeypatch.setitem(sys.modules, "bitsandbytes", fake)
    params = list(make_lm(tokenizer).to(torch.bfloat16).model.parameters())
    cfg = tiny_config(**{"model.dtype": "bfloat16", "grpo.optimizer": "adamw8bit", "grpo.lr": 1e-6})
    with pytest.warns(UserWarning, match=r"without model.master_weights: a step of lr 1e-06 is under half"):
        build_optimizer(params, cfg, torch.device("cuda"))


def test_a_bf16_sft_run_warns_of_its_rounded_away_steps_once(tmp_path):
    """SFT makes an optimizer for a checkpoint to load into and a new one at its first stage (and at each reset): a
    bf16 run without masters said the rounded-away step's warning twice, two identical lines at its start; it asks
    for masters without GRPO's optimizer key, which is not SFT's (it said '(with grpo.optimizer=adamw)')."""
    import warnings

    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    over = {"model.dtype": "bfloat16", "sft.num_epochs": 2, "sft.batch_size": 4, "sft.warmup_steps": 0}
    cfg = tiny_config(**over, **{"sft.lr": 1e-6, "sft.eval_each_stage": False})
    torch.manual_seed(0)
    lm = load_model(cfg.model, cfg.task, seed=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train_sft(lm, generate_split(cfg.task, "train")[:4], cfg, tmp_path, progress=False, log=lambda *a: None)
    said = [str(w.message) for w in caught if "without model.master_weights" in str(w.message)]
    assert len(said) == 1 and "a step of lr 1e-06 is under half the spacing of" in said[0], said
    assert "set model.master_weights=true to step" in said[0], said  # (grpo.optimizer is not SFT's option)
