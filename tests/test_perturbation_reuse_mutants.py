"""Perturbations, a second mutation pass (dgrpo.perturbation): what it found unpinned, on toy modules where it can
(no model: the whole file runs in well under a second)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from dgrpo.perturbation import BoundPerturbation, HookedPerturbation, Perturbation


class _Doubled(HookedPerturbation):
    """Doubles each module's output while active."""

    def hook(self, k: int) -> Callable:
        return lambda module, args, output: output * 2 if self.active else None


def test_within_a_root_installs_only_the_hooks_of_the_modules_inside_it():
    """``within(root)`` (a recomputed layer, the perturbation not entered) hooks the modules inside ``root`` alone,
    and removes those hooks on leaving."""
    inner, outer = nn.Linear(2, 2), nn.Linear(2, 2)
    root = nn.Sequential(inner)
    pert = _Doubled([inner, outer], perturb_prompt=True)
    with pert.within(root):
        assert len(inner._forward_hooks) == 1 and len(outer._forward_hooks) == 0
    assert len(inner._forward_hooks) == 0


def test_a_bound_perturbation_that_names_its_model_keeps_it():
    """A kind's ``bind`` whose bound perturbation names a model of its own keeps it (the model bound is set only on
    one that names none)."""
    own = nn.Linear(1, 1)

    class Named(Perturbation):
        def bind(self, lm, seeds) -> BoundPerturbation:
            bound = BoundPerturbation()
            bound.model = own if int(seeds[0]) else None
            return bound

    lm = type("LM", (), {"model": nn.Linear(1, 1)})()
    assert Named().bind(lm, torch.tensor([1])).model is own
    assert Named().bind(lm, torch.tensor([0])).model is lm.model


def test_boolean_seeds_are_refused():
    """A boolean tensor is no seed list (True would bind seed 1): refused like floats, one TypeError."""
    from dgrpo.perturbation import as_seeds

    with pytest.raises(TypeError, match="perturbation seeds must be integers"):
        as_seeds(torch.tensor([True, False]))


def test_sampling_draws_of_no_rows_are_an_empty_batch():
    """No rows (an empty shard) gives [0, n_tokens] sampling draws, not an error."""
    from dgrpo.perturbation.base import row_sampling_uniforms

    assert row_sampling_uniforms(torch.zeros(0, dtype=torch.int64), 5).shape == (0, 5)


def test_a_kind_registered_again_is_listed_once(monkeypatch):
    """Registering a kind again (a module run again in a notebook) replaces its class and lists its name once among
    the config's choices."""
    from dgrpo.config import REGISTERED_CHOICES
    from dgrpo.perturbation import PERTURBATIONS, register

    monkeypatch.setitem(PERTURBATIONS, "again", PERTURBATIONS["locked"])
    monkeypatch.setitem(REGISTERED_CHOICES, "perturbation.kind", list(REGISTERED_CHOICES["perturbation.kind"]))
    first = register("again")(type("First", (Perturbation,), {}))
    second = register("again")(type("Second", (Perturbation,), {}))
    assert PERTURBATIONS["again"] is second is not first
    assert REGISTERED_CHOICES["perturbation.kind"].count("again") == 1


def test_check_binds_one_zero_seed_and_raises_what_bind_raises():
    """``check`` tries a bind of one row (seed 0) on the model, so a kind that cannot apply raises there."""
    from dgrpo.config import ConfigError

    bound: list[list[int]] = []

    class Picky(Perturbation):
        def bind(self, lm, seeds) -> BoundPerturbation:
            bound.append(seeds.tolist())
            raise ConfigError("no such site")

    with pytest.raises(ConfigError, match="no such site"):
        Picky().check(None)
    assert bound == [[0]]


def test_a_draw_on_one_thread_makes_no_pool(monkeypatch):
    """A draw given one thread runs on the calling thread (no pool is made for it), however large."""
    from dgrpo.perturbation import locked

    monkeypatch.setattr(locked, "PARALLEL_DRAW_MIN", 0)
    monkeypatch.setattr(locked, "_pools", {})
    rows = locked.draw_keep_rows([1, 2, 3], 1, 4, 0.5, threads=1)
    assert locked._pools == {} and len(rows) == 3


def test_site_masks_are_each_their_own_contiguous_tensor():
    """Each site's [B, 1, H] mask is its own contiguous copy (offset 0), not a strided view into the batch's masks (a
    compiled layer step would be specialised on the view's offset)."""
    from dgrpo.perturbation.locked import site_masks

    masks = torch.arange(2 * 3 * 4.0).view(2, 3, 4)
    per_site = site_masks(masks)
    for k, m in enumerate(per_site):
        assert m.shape == (2, 1, 4) and m.is_contiguous() and m.storage_offset() == 0
        assert torch.equal(m[:, 0], masks[:, k])


def test_the_same_seeds_bound_again_in_another_order_get_their_own_rows(tokenizer):
    """A bind reuses the last bind's masks only for the seeds in the same order: the same seeds reordered (another
    micro-batch order) give each row its own seed's mask, as a new object would."""
    from dgrpo.perturbation import LockedDropout

    from conftest import make_lm

    lm, pert = make_lm(tokenizer, "qwen2"), LockedDropout(p=0.5)
    first = pert.bind(lm, torch.tensor([1, 2, 3])).masks
    again = pert.bind(lm, torch.tensor([3, 1, 2])).masks
    assert torch.equal(again, first[:, [2, 0, 1]]) and not torch.equal(again, first)


def test_a_prefetch_is_not_taken_by_a_bind_of_its_seeds_in_another_order(tokenizer):
    """A prefetch's stacked batch is in its seeds' order: a bind of the same seeds reordered gets each row its own
    seed's mask (from the memo), not the prefetched rows in their order."""
    from dgrpo.perturbation import LockedDropout

    from conftest import make_lm

    lm, pert = make_lm(tokenizer, "qwen2"), LockedDropout(p=0.5)
    want = LockedDropout(p=0.5).bind(lm, torch.tensor([3, 1, 2])).masks
    pert.prefetch(lm, torch.tensor([1, 2, 3]))
    assert torch.equal(pert.bind(lm, torch.tensor([3, 1, 2])).masks, want)


def test_the_same_seeds_bound_over_a_wider_model_get_masks_of_its_width(tokenizer):
    """The last bind's masks are reused only at the same width: a model of another hidden size (same layers) gets
    masks of its own width, the ones a new object would bind."""
    from dgrpo.perturbation import LockedDropout

    from conftest import make_lm

    lm, wide, seeds = make_lm(tokenizer, "qwen2"), make_lm(tokenizer, "qwen2", hidden_size=48), torch.tensor([4, 2])
    pert = LockedDropout(p=0.3)
    pert.bind(lm, seeds)
    assert torch.equal(pert.bind(wide, seeds).masks, LockedDropout(p=0.3).bind(wide, seeds).masks)


def test_a_prefetch_waits_for_the_draw_under_way_and_raises_what_it_raised(tokenizer, monkeypatch):
    """One draw under way at a time: a prefetch first waits for the one before, and a failure of that draw is raised
    there (not lost when a second prefetch replaces it)."""
    from dgrpo.perturbation import LockedDropout, locked

    from conftest import make_lm

    def failing(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("draw failed")

    lm, pert = make_lm(tokenizer, "qwen2"), LockedDropout(p=0.5)
    monkeypatch.setattr(locked, "keep_rows", failing)
    pert.prefetch(lm, torch.tensor([1, 2]))
    with pytest.raises(RuntimeError, match="draw failed"):
        pert.prefetch(lm, torch.tensor([5, 6]))
    assert pert._prefetch is None


def test_gaussian_weight_noise_of_one_row_refuses_a_module_input_of_three(tokenizer):
    """The weight-noise hook itself refuses an input of another batch size than the rows bound (one row's noise is
    not spread over three by broadcasting)."""
    from dgrpo.perturbation import GaussianNoise

    from conftest import make_lm

    bound = GaussianNoise(sigma=0.1, target="weights").bind(make_lm(tokenizer, "qwen2"), torch.tensor([7]))
    hook, (out_f, in_f) = bound.hook(0), bound.noises[0].shape[1:]
    bound.phase = "latent"
    with pytest.raises(ValueError):
        hook(bound.modules[0], (torch.ones(3, 2, in_f),), torch.zeros(3, 2, out_f))


def test_native_dropout_resumed_switches_its_dropout_by_phase_and_keeps_the_rng_state(tokenizer):
    """A recomputed layer's ``resume(phase)`` turns the attention dropout on or off as the phase says (off in the
    answer under ``perturb_answer=false``) and leaves the RNG where the checkpoint put it (reseeding would draw the
    first forward's masks again, not the layer's own)."""
    from dgrpo.model.anatomy import attention_modules
    from dgrpo.perturbation import NativeDropout

    from conftest import make_lm

    lm = make_lm(tokenizer, "qwen2")
    attn = attention_modules(lm.model)
    with NativeDropout(p=0.3, perturb_answer=False).bind(lm, torch.tensor([11])) as bound:
        bound.before_forward("latent")
        torch.rand(5)  # (the stream moves on within the forward)
        state = torch.random.get_rng_state()
        bound.resume("answer")
        assert not any(m.training for m in attn)
        assert torch.equal(torch.random.get_rng_state(), state)
        bound.resume("latent")
        assert all(m.training for m in attn)
        assert torch.equal(torch.random.get_rng_state(), state)
