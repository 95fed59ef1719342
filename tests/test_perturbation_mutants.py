"""Perturbations: what mutation testing of dgrpo.perturbation found unpinned (seed ranges, the row memo's keys and
recency, the thread split, the context helpers)."""

from __future__ import annotations

import pytest
import torch

from dgrpo.perturbation import as_seeds, base, seeds_for
from dgrpo.perturbation.locked import RowMemo, draw_threads, keep_rows


def test_seeds_drawn_again_for_a_shared_generator_seed_stay_in_range_and_distinct(monkeypatch):
    """A seed whose generator-read bits an earlier seed has is drawn again, and the new one is in [0, 2^62) like
    the others (here 8 generator bits, so most of 200 seeds are drawn again: all distinct there, all in range)."""
    monkeypatch.setattr(base, "GENERATOR_SEED_BITS", 0xFF)
    seeds = seeds_for(7, 3, 0, 200)
    assert len(set((seeds & 0xFF).tolist())) == 200
    assert 0 <= int(seeds.min()) and int(seeds.max()) < 2**62


def test_text_seeds_are_int63_hashes():
    """text_seed spans 63 bits (not the 32 of a short digest): a key's seed is fixed, other keys' differ."""
    drawn = [base.text_seed(f"k/{i}") for i in range(64)]
    assert all(0 <= s < 2**63 for s in drawn) and max(drawn) >= 2**62 and len(set(drawn)) == 64
    assert base.text_seed("k/0") == drawn[0]


def test_a_scalar_seed_is_refused_one_per_row():
    """A 0-d seed tensor is not a batch of one: refused like a 2-d one."""
    with pytest.raises(ValueError, match=r"must be 1-d \(one seed per row\), got shape \(\)"):
        as_seeds(torch.tensor(5))
    assert as_seeds([5]).shape == (1,)


def test_the_row_memo_is_keyed_by_width_too():
    """Rows memoised for one width are not handed to a draw of another width with the same seeds, sites and p."""
    memo, seeds = RowMemo(), torch.tensor([3, 9])
    assert keep_rows(seeds, 2, 16, 0.3, memo).shape == (2, 2, 16)
    wide = keep_rows(seeds, 2, 32, 0.3, memo)
    assert torch.equal(wide, keep_rows(seeds, 2, 32, 0.3))


def test_the_row_memo_forgets_the_least_recently_used_rows():
    """Past its capacity the memo drops the rows least recently put or looked up, and keeps the newest."""
    memo = RowMemo(capacity=2)
    a, b, c = (torch.full((1,), float(i)) for i in range(3))
    memo.put_many({"a": a, "b": b})
    assert memo.lookup(["a"]) == {"a": a}  # a is now the most recent
    memo.put_many({"c": c})
    assert list(memo.rows) == ["a", "c"]
    memo.put_many({"b": b})
    assert list(memo.rows) == ["c", "b"]


def test_a_draw_takes_at_most_eight_threads_and_one_per_row():
    """The threads a draw is split over: the budget given (or torch's), at most 8, at most one per row, at least 1."""
    assert draw_threads(3, 16) == 3
    assert draw_threads(100, 16) == 8
    assert draw_threads(100, 4) == 4
    assert draw_threads(0, 4) == 1


def test_unperturbed_binds_no_tensors_and_swapped_puts_values_back():
    """``none`` reads no tensors (a kept CUDA graph serves every batch) and pads rows as a no-op; ``swapped`` puts the
    attribute's own value back on leaving, also when the block raises."""
    from types import SimpleNamespace

    from dgrpo.perturbation import NoPerturbation

    bound = NoPerturbation().bind(None, torch.tensor([1, 2]))
    assert bound.graph_inputs() == [] and bound.rows is None
    with bound.row_padding(4):
        pass
    owner = SimpleNamespace(x=1)
    with pytest.raises(RuntimeError), base.swapped(owner, "x", 2):
        assert owner.x == 2
        raise RuntimeError
    assert owner.x == 1


def test_a_memoised_draw_draws_only_the_rows_it_lacks(monkeypatch):
    """keep_rows with a memo draws the rows not drawn before, each once (a repeated seed too), and no others."""
    from dgrpo.perturbation import locked

    memo = RowMemo()
    first = keep_rows(torch.tensor([1, 2]), 2, 8, 0.3, memo)
    drawn: list[list[int]] = []
    real = locked.draw_keep_rows
    monkeypatch.setattr(locked, "draw_keep_rows", lambda s, *a, **kw: drawn.append(list(s)) or real(s, *a, **kw))
    both = keep_rows(torch.tensor([2, 5, 1, 5]), 2, 8, 0.3, memo)
    assert drawn == [[5]]
    assert torch.equal(both[[2, 0]], first) and torch.equal(both[1], both[3])


@pytest.mark.parametrize("p", [-0.1, 1.0, float("nan")])
def test_a_locked_rate_outside_0_1_is_refused(p):
    """p is a drop probability in [0, 1): a negative p (which kept every unit and scaled it by 1/(1-p) < 1) or 1 (a
    division by zero) is one ValueError."""
    from dgrpo.perturbation import LockedDropout

    with pytest.raises(ValueError, match="dropout p must be in"):
        LockedDropout(p=p)


def test_a_bind_of_exactly_the_prefetched_seeds_takes_the_prefetched_batch(tokenizer, monkeypatch):
    """The bind of the seeds a prefetch drew takes the batch that thread stacked (and, on CUDA, pinned) as it is: it
    neither draws nor stacks the rows again."""
    from dgrpo.perturbation import LockedDropout, locked

    from conftest import make_lm

    lm, seeds = make_lm(tokenizer, "qwen2"), torch.arange(100, 104)
    want = LockedDropout(p=0.3, sites=["attn", "mlp"]).bind(lm, seeds).masks
    pert = LockedDropout(p=0.3, sites=["attn", "mlp"])
    pert.prefetch(lm, seeds)
    assert pert._prefetch is not None
    prefetched = pert._prefetch[1].result()
    moved = []
    monkeypatch.setattr(locked, "keep_rows", lambda *a, **kw: pytest.fail("drawn again"))
    monkeypatch.setattr(locked, "to_device", lambda t, device: moved.append(t) or t)
    bound = pert.bind(lm, seeds)
    assert len(moved) == 1 and moved[0] is prefetched
    assert torch.equal(bound.masks, want)


def test_gaussian_activation_noise_is_each_rows_own_seeds_normals(tokenizer):
    """Row b's activation noise at site k is row k of the normals of the generator seeded with seeds[b] (the same
    row's noise in any batch), and the factor applied is 1 + sigma * that noise."""
    from dgrpo.perturbation import GaussianNoise
    from dgrpo.perturbation.base import row_normals

    from conftest import make_lm

    lm, seeds = make_lm(tokenizer, "qwen2"), [12, 34567]
    bound = GaussianNoise(sigma=0.2, sites=["attn", "mlp"]).bind(lm, torch.tensor(seeds))
    n_sites, width = len(bound.modules), lm.model.config.hidden_size
    assert bound.noises.shape == (n_sites, 2, width)
    for b, s in enumerate(seeds):
        assert torch.equal(bound.noises[:, b], row_normals(s, n_sites, width))


@pytest.mark.parametrize("target", ["locked", "activations", "weights"])
def test_row_padding_appends_copies_of_the_first_rows_noise_and_puts_the_rows_back(tokenizer, target):
    """Within ``row_padding(n)`` a bound perturbation holds n rows: its own, then copies of row 0's noise (for a graph
    kept for larger batches); on leaving, its own rows again."""
    from dgrpo.perturbation import GaussianNoise, LockedDropout

    from conftest import make_lm

    lm = make_lm(tokenizer, "qwen2")
    pert = LockedDropout(p=0.3) if target == "locked" else GaussianNoise(sigma=0.2, target=target)
    bound = pert.bind(lm, torch.tensor([5, 6]))
    before = [t.clone() for t in bound.graph_inputs()]
    assert bound.rows == 2
    with bound.row_padding(5):
        assert bound.rows == 5
        dim = 1 if target == "activations" else 0
        for t, own in zip(bound.graph_inputs(), before, strict=True):
            assert torch.equal(t.narrow(dim, 0, 2), own)
            for r in range(2, 5):
                assert torch.equal(t.narrow(dim, r, 1), own.narrow(dim, 0, 1))
    assert bound.rows == 2
    assert all(torch.equal(t, own) for t, own in zip(bound.graph_inputs(), before, strict=True))
