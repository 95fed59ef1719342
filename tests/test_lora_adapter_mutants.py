"""A second mutation pass of ``dgrpo.model.lora``: what would silently change training and what
``test_lora_mutants.py`` does not pin (each test names the mutants it kills): the modules that get adapters per
architecture, the adapter's alpha / r scaling, the reference computed with the policy adapter off and the policy back
after (an exception too), the adapter saved alone (the policy's, without the base) and merged. Tiny models, width 32."""

from collections import Counter

import pytest
import torch

pytest.importorskip("peft")

from dgrpo.config import LoraConfig  # noqa: E402
from dgrpo.model import lora  # noqa: E402
from dgrpo.model.latent_lm import LatentLM  # noqa: E402

ATTN_MLP = {"q_proj": 2, "k_proj": 2, "v_proj": 2, "o_proj": 2, "gate_proj": 2, "up_proj": 2, "down_proj": 2}


@pytest.fixture
def bases(lora_base_dirs):
    return lora_base_dirs


def adapted(path, **kw) -> LatentLM:
    lm = LatentLM.from_pretrained(path)
    lora.apply_lora(lm, LoraConfig(**{"r": 4, "alpha": 8.0, **kw}))
    return lm


def adapted_leaves(lm: LatentLM, adapter: str = lora.POLICY) -> Counter:
    """How many modules of each leaf name hold ``adapter``."""
    return Counter(n.rsplit(".", 1)[-1] for n, m in lm.model.named_modules() if adapter in getattr(m, "lora_A", {}))


def nudge_policy(lm: LatentLM) -> None:
    """Move the policy adapter off its start (B = 0 makes a fresh adapter a no-op), deterministically."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if f".{lora.POLICY}." in name and ("lora_B" in name or "trainable_tokens_delta" in name):
                p.add_(0.2 * torch.randn(p.shape, generator=gen))


def logits(lm: LatentLM) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(torch.arange(3, 11)[None]).logits


@pytest.mark.parametrize(
    "arch, targets, leaves",
    [
        ("qwen2", ["all-linear"], ATTN_MLP),
        ("llama", ["all-linear"], ATTN_MLP),
        ("gpt2", ["all-linear"], {"c_attn": 2, "c_proj": 4, "c_fc": 2}),  # (the attention's and the MLP's c_proj)
        ("llama", ["q_proj", "v_proj"], {"q_proj": 2, "v_proj": 2}),
        ("gpt2", ["c_attn"], {"c_attn": 2}),
    ],
)
def test_adapters_land_on_the_named_linear_layers_of_each_architecture(bases, arch, targets, leaves):
    """all-linear: every linear layer of every block gets an adapter, the LM head none; a list: those layers only.
    Only the adapters and the markers' rows train (mutants: all-linear passed to PEFT as a module name, or refused
    by dgrpo's own check; the trainable rows dropped)."""
    lm = adapted(bases / arch, target_modules=targets)
    assert adapted_leaves(lm) == Counter(leaves)
    trainable = [n for n, p in lm.model.named_parameters() if p.requires_grad]
    assert {n.rsplit(".", 1)[-1] for n in trainable} == {"weight", lora.POLICY}
    assert all(".lora_A." in n or ".lora_B." in n or ".trainable_tokens_delta." in n for n in trainable)
    assert sum(".trainable_tokens_delta." in n for n in trainable) == (2 if arch == "llama" else 1)  # (untied head)


@pytest.mark.parametrize(
    "arch, layer", [("llama", "model.layers.1.self_attn.q_proj"), ("gpt2", "transformer.h.1.mlp.c_fc")]
)
def test_an_adapter_adds_alpha_over_r_times_b_a(bases, arch, layer):
    """The adapted layer computes base(x) + alpha / r * B A x (alpha 12, r 4: 3 B A x), a Conv1D as a Linear
    (mutants: alpha given as r, scaling 1; r and alpha swapped)."""
    lm = adapted(bases / arch, r=4, alpha=12.0, target_modules=["all-linear"])
    mod = lm.model.get_submodule(layer)
    a, b = mod.lora_A[lora.POLICY].weight, mod.lora_B[lora.POLICY].weight
    assert a.shape[0] == b.shape[1] == 4
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        a.copy_(torch.randn(a.shape, generator=gen))
        b.copy_(torch.randn(b.shape, generator=gen))
        x = torch.randn(2, a.shape[1], generator=gen)
        torch.testing.assert_close(mod(x) - mod.base_layer(x), 3.0 * x @ a.T @ b.T, atol=1e-5, rtol=1e-5)


def test_the_reference_runs_with_the_policy_adapter_off_and_the_policy_comes_back_even_after_an_error(bases):
    """Within ``reference_active`` the reference adapter alone computes (the initial policy); after it, and after an
    exception raised inside it, the policy adapter computes and it alone trains (mutants: the policy set active
    within; the policy not restored on an exception, or at all; add_reference leaving the reference active)."""
    lm = adapted(bases / "qwen2")
    start = logits(lm)
    lora.add_reference(lm)
    nudge_policy(lm)
    moved = logits(lm)
    assert not torch.allclose(moved, start)

    def policy_trains() -> None:
        assert lm.peft.active_adapters == [lora.POLICY] and torch.equal(logits(lm), moved)
        trainable = [n for n, p in lm.model.named_parameters() if p.requires_grad]
        assert trainable and all(n.endswith(f".{lora.POLICY}.weight") or n.endswith(lora.POLICY) for n in trainable)

    policy_trains()
    with lora.reference_active(lm) as ref:
        assert ref is lm and lm.peft.active_adapters == [lora.REFERENCE]
        assert torch.equal(logits(lm), start)
    policy_trains()
    with pytest.raises(RuntimeError, match="^inside$"):
        with lora.reference_active(lm):
            raise RuntimeError("inside")
    policy_trains()


def test_the_reference_checkpoint_state_is_the_reference_adapters(bases):
    """``ReferenceAdapterState`` saves and loads the reference adapter, not the policy: its state is the adapter of
    ``add_reference``'s moment after the policy moved, and loading one changes the reference alone (mutants: the
    state read from, or loaded into, the policy; ``adapter_state`` of the policy whatever adapter is asked)."""
    lm = adapted(bases / "llama")
    lora.add_reference(lm)
    initial = lora.adapter_state(lm)
    nudge_policy(lm)
    policy = lora.adapter_state(lm)
    state = lora.ReferenceAdapterState(lm)
    saved = state.state_dict()
    assert saved.keys() == initial.keys() and all(torch.equal(saved[k], initial[k]) for k in initial)
    assert any(not torch.equal(policy[k], initial[k]) for k in initial)
    state.load_state_dict({k: v + 1.0 for k, v in saved.items()})
    assert all(torch.equal(lora.adapter_state(lm, lora.REFERENCE)[k], saved[k] + 1.0) for k in saved)
    assert all(torch.equal(lora.adapter_state(lm)[k], policy[k]) for k in policy)


def test_the_saved_adapter_is_the_policy_alone_and_reloads_onto_its_base(bases, tmp_path):
    """An adapter checkpoint taken mid-run (the reference beside the moved policy) holds the policy adapter's tensors
    only, none of the base's, and reloads onto its base as the policy computes (mutants: the reference saved; the
    saved tensors not loaded back, a fresh adapter)."""
    from safetensors import safe_open

    lm = adapted(bases / "llama")
    lora.add_reference(lm)
    nudge_policy(lm)
    lm.save_pretrained(tmp_path / "adapter")
    assert not (tmp_path / "adapter" / "model.safetensors").exists()
    with safe_open(str(tmp_path / "adapter" / lora.ADAPTER_WEIGHTS), "pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys()}
    policy = lora.adapter_state(lm)
    assert saved.keys() == policy.keys() and all(torch.equal(saved[k], policy[k]) for k in policy)
    assert all("lora_" in k or "trainable_tokens" in k for k in saved)
    again = LatentLM.from_pretrained(tmp_path / "adapter")
    assert again.name_or_path == str((bases / "llama").resolve())
    assert torch.equal(logits(again), logits(lm))


def test_merging_folds_the_policy_in_and_saves_a_plain_model(bases, tmp_path):
    """``merge_into_base`` beside a reference adapter gives a plain model that computes as the policy (not the
    reference), every weight trainable, and saves as full weights that reload alike (mutants: adapters unloaded
    without merging; the backbone left frozen)."""
    lm = adapted(bases / "qwen2")
    lora.add_reference(lm)
    nudge_policy(lm)
    policy = logits(lm)
    lora.merge_into_base(lm)
    assert not adapted_leaves(lm) and not adapted_leaves(lm, lora.REFERENCE)
    assert all(p.requires_grad for p in lm.model.parameters())
    torch.testing.assert_close(logits(lm), policy, atol=1e-5, rtol=0)
    lm.save_pretrained(tmp_path / "merged")
    assert (tmp_path / "merged" / "model.safetensors").is_file()
    assert not (tmp_path / "merged" / lora.ADAPTER_CONFIG).exists()
    torch.testing.assert_close(logits(LatentLM.from_pretrained(tmp_path / "merged")), policy, atol=1e-5, rtol=0)


def test_the_adapter_records_the_bases_revision_and_task(bases, tmp_path):
    """The adapter config names the hub revision the base was loaded at (a hub base's adapter must load onto that
    commit, not the branch's newest weights) and PEFT's causal-LM task (PEFT's own loaders read it); a hub id names
    no local base directory (mutants: the revision not recorded, or not read back; the task type left out; a
    relative name taken for a directory)."""
    import json

    lm = LatentLM.from_pretrained(bases / "qwen2")
    lm.revision = "0123456789abcdef0123456789abcdef01234567"  # (as loading a hub id at that commit sets it)
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    (tmp_path / "adapter").mkdir()
    lora.save_adapter(lm, tmp_path / "adapter")
    assert lora.adapter_base_revision(tmp_path / "adapter") == lm.revision
    assert json.loads((tmp_path / "adapter" / lora.ADAPTER_CONFIG).read_text())["task_type"] == "CAUSAL_LM"
    assert lora.base_directory(lm) == (bases / "qwen2").resolve()
    lm.peft.peft_config[lora.POLICY].base_model_name_or_path = "org/name"  # a hub id: no local directory
    assert lora.base_directory(lm) is None


def test_a_relative_name_is_a_hub_id_and_gets_no_fingerprint(tmp_path, monkeypatch):
    """Only an absolute directory is a local base (``apply_lora`` names local bases so): a hub id such as ``org/name``
    gets no fingerprint even where a folder of that name, with a manifest, lies in the working directory (mutant:
    the absolute-path check dropped, the hub base fingerprinted by an unrelated local folder)."""
    import json

    (tmp_path / "org" / "name").mkdir(parents=True)
    (tmp_path / "org" / "name" / "manifest.json").write_text(json.dumps({"model.safetensors": "a1"}))
    monkeypatch.chdir(tmp_path)
    assert lora.base_fingerprint("org/name") is None
    assert lora.base_fingerprint(str(tmp_path / "org" / "name")) is not None
