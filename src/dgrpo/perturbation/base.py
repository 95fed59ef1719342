"""The perturbation interface, per-row seeded noise, and the registry of perturbation kinds."""

from __future__ import annotations

import functools
import hashlib
import re
import typing
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, TypeVar

import torch
from torch import Tensor, nn

from ..config import REGISTERED_CHOICES, PerturbationKind
from ..model.anatomy import SITES
from ..model.latent_lm import OPEN_PERTURBATIONS

if TYPE_CHECKING:
    from ..config import PerturbationConfig
    from ..model.latent_lm import LatentLM


class BoundPerturbation:
    """Active perturbation for one batch (a context manager); LatentLM calls ``before_forward``.

    Entering is re-entrant: only the outermost ``with`` installs it (``_install``) and removes it (``_uninstall``),
    so a recomputation in backward (dgrpo.model.recompute) may enter it again whether or not it is still active.
    With :attr:`model` set, the outermost ``with`` also opens it over that model: a LatentLM forward there given no
    ``perturbation=`` runs under it as one given it (``dgrpo.model.latent_lm.open_perturbation``)."""

    perturb_prompt: bool = True
    perturb_answer: bool = True
    #: the model (``lm.model``) over which the ``with`` block opens it (set on what a kind's ``bind`` returns:
    #: :func:`opening_over`); None: a forward there calls ``before_forward`` only when given ``perturbation=``
    model: nn.Module | None = None

    def __init__(self) -> None:
        self.phase = "prompt"
        self.depth = 0  # nesting of ``with`` blocks

    def before_forward(self, phase: str) -> None:
        """A forward call of ``phase`` begins (each call of the recurrence restarts what a phase needs)."""
        self.phase = phase

    def resume(self, phase: str) -> None:
        """Part of a ``phase`` call runs again (a recomputed layer): take up its phase, restart nothing."""
        self.phase = phase

    def acts_in(self, phase: str) -> bool:
        """Whether the noise acts on a forward of ``phase``: a latent step's always, the prompt's with
        ``perturb_prompt``, the answer's (the ``<|end-latent|>`` marker and the answer tokens) with
        ``perturb_answer``."""
        if phase == "prompt":
            return self.perturb_prompt
        return self.perturb_answer or phase != "answer"

    @property
    def active(self) -> bool:
        """Whether the noise acts on the forward under way (:meth:`acts_in` its phase)."""
        return self.acts_in(self.phase)

    @property
    def rows(self) -> int | None:
        """The batch rows this perturbation holds tensors for (one per seed; None: it fits any batch)."""
        return None

    @property
    def needs_stepwise(self) -> bool:
        """Whether teacher-forced scoring must feed the answer one token per forward, as decoding does
        (``LatentLM.target_logprobs(..., stepwise=True)``), to replay this noise: a noise drawn per forward call
        (native dropout's restored RNG stream) depends on how the answer's tokens are split into calls. False here:
        a row's noise depends on its seed alone."""
        return False

    def _install(self) -> None:
        return None

    def _uninstall(self) -> None:
        return None

    def __enter__(self) -> BoundPerturbation:
        self.depth += 1
        if self.depth == 1:
            self._install()
            if self.model is not None:
                OPEN_PERTURBATIONS.setdefault(self.model, []).append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.depth -= 1
        if self.depth == 0:
            self._close()
            self._uninstall()

    def _close(self) -> None:
        """No longer open over :attr:`model` (the innermost block need not be the last opened: any order)."""
        model = self.model
        opened = OPEN_PERTURBATIONS.get(model) if model is not None else None
        if model is None or opened is None:
            return
        opened[:] = [p for p in opened if p is not self]
        if not opened:
            del OPEN_PERTURBATIONS[model]

    def within(self, root: nn.Module) -> AbstractContextManager[object]:
        """Entered for what runs inside ``root`` (one recomputed decoder layer): here, all of it."""
        return self

    def graph_inputs(self) -> list[Tensor] | None:
        """Every tensor the perturbation's forwards read, for a CUDA graph kept from one batch to the next
        (dgrpo.model.fixed_shape): a replay reads the tensors it was captured with, so a later batch's perturbation
        copies its own into them; their number and shapes depend only on the batch's shape. None (the default, for
        a kind that does not say): unknown, and the graphs are captured again for every batch."""
        return None

    def row_padding(self, rows: int) -> AbstractContextManager[object] | None:
        """A block within which the perturbation acts on ``rows`` rows: the batch's, then copies of its first row
        (for a graph kept for larger batches, run over this one padded to its rows: dgrpo.model.latent_chain). None
        (the default) for a kind that does not say how."""
        return None


class HookedPerturbation(BoundPerturbation):
    """A bound perturbation applied by forward hooks on ``modules``: :meth:`hook` ``(k)`` builds module k's forward
    hook (``hook(module, args, output) -> output``, the output perturbed for each row by its seed's noise, left as it
    is while not :attr:`active`: the prompt, unless ``perturb_prompt``; the answer, unless ``perturb_answer``); the
    hooks are installed on entering and removed on leaving. A kind of one's own draws its noise from the seeds in its
    ``bind`` and returns a subclass that defines ``hook``."""

    def __init__(self, modules: list[nn.Module], perturb_prompt: bool, perturb_answer: bool = True):
        super().__init__()
        self.modules, self.perturb_prompt, self.perturb_answer = modules, perturb_prompt, perturb_answer
        self.handles: list = []

    def hook(self, k: int) -> Callable:
        """Module k's forward hook (a subclass defines it)."""
        raise NotImplementedError(f"{type(self).__name__} must define hook(self, k): module k's forward hook")

    def _install(self) -> None:
        self.handles = [m.register_forward_hook(self.hook(k)) for k, m in enumerate(self.modules)]

    def _uninstall(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    @contextmanager
    def within(self, root: nn.Module) -> Iterator[object]:
        """Only the hooks of the modules inside ``root`` (none when the perturbation is entered already): a
        recomputed layer needs its own sites, not every layer's."""
        if self.depth > 0:
            yield self
            return
        inside = {id(m) for m in root.modules()}
        handles = [m.register_forward_hook(self.hook(k)) for k, m in enumerate(self.modules) if id(m) in inside]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()


class Perturbation:
    """A stochasticity source; ``bind(lm, seeds)`` gives the context for one batch of rollouts."""

    batched = True  # False: rows must be run one at a time (native dropout)
    #: whether the noise acts on the answer (``perturbation.perturb_answer``): a kind that can leave the answer to the
    #: unperturbed network sets it from the config in ``from_config`` and hands it to what ``bind`` returns
    #: (:class:`BoundPerturbation`'s ``perturb_answer``); one that leaves it true is refused under
    #: ``perturb_answer=false`` (:func:`dgrpo.perturbation.make_perturbation`)
    perturb_answer: bool = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        """A kind's own ``bind`` is wrapped (:func:`opening_over`): what it returns opens over ``lm.model``."""
        super().__init_subclass__(**kwargs)
        if "bind" in cls.__dict__:
            cls.bind = opening_over(cls.__dict__["bind"])  # type: ignore[method-assign]

    @classmethod
    def from_config(cls, cfg: PerturbationConfig) -> Perturbation:
        """The perturbation the ``perturbation.*`` options describe (a new kind defines it)."""
        raise NotImplementedError(
            f"{cls.__name__} must define from_config(cls, cfg) -> {cls.__name__}, a classmethod that builds it from "
            "the perturbation.* options"
        )

    def bind(self, lm: LatentLM, seeds: Tensor) -> BoundPerturbation:
        """The perturbation of one batch, row i drawn from ``seeds[i]`` alone (a new kind defines it)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define bind(self, lm, seeds) -> BoundPerturbation: the context of one batch, "
            "row i perturbed by the noise of seeds[i] alone"
        )

    def prefetch(self, lm: LatentLM, seeds: Tensor) -> None:
        """Prepare, on the host and in the background, what a later :meth:`bind` of ``seeds`` will need (nothing by
        default; locked dropout draws its masks); the caller goes on at once."""

    def check(self, lm: LatentLM) -> None:
        """Raise ConfigError (one line) when this perturbation cannot be applied to ``lm`` (e.g. no such layer)."""
        self.bind(lm, torch.zeros(1, dtype=torch.long))


def opening_over(bind: Callable[..., BoundPerturbation]) -> Callable[..., BoundPerturbation]:
    """A kind's ``bind``, whose bound perturbation gets the model bound (``lm.model``) as its
    :attr:`BoundPerturbation.model` when it names none: a forward in its ``with`` block given no ``perturbation=``
    then runs under it, a kind of one's own's as the built-in ones'."""

    @functools.wraps(bind)
    def bound_over(self: Perturbation, lm: LatentLM, seeds: Tensor) -> BoundPerturbation:
        bound = bind(self, lm, seeds)
        if isinstance(bound, BoundPerturbation) and bound.model is None:
            bound.model = getattr(lm, "model", None)
        return bound

    return bound_over


def site_names(sites: list[str] | None) -> list[str]:
    """The ``sites`` a perturbation is built with: None is the default ``["mlp"]``, else a non-empty list of distinct
    names of :data:`~dgrpo.model.anatomy.SITES` (a string is refused: ``"mlp"`` would be read letter by letter; an
    empty list would perturb nothing; a name twice would put two masks on one site)."""
    if sites is None:
        return ["mlp"]
    if isinstance(sites, str) or not isinstance(sites, (list, tuple)) or not sites or len(set(sites)) < len(sites):
        raise ValueError(
            f"sites must be a non-empty list of distinct site names (['mlp'], ['attn', 'mlp']), got {sites!r}"
        )
    if unknown := [s for s in sites if s not in SITES]:  # (it was said at the first bind, as a config key's error)
        named = ", ".join(map(repr, unknown))
        raise ValueError(f"sites: unknown site name(s) {named}; the sites are {', '.join(SITES)}")
    return list(sites)


#: ``perturbation.kind`` -> class; filled by :func:`register` (the kinds' modules register themselves)
PERTURBATIONS: dict[str, type[Perturbation]] = {}
P = TypeVar("P", bound=type[Perturbation])


PERTURBATIONS_BUILTIN = typing.get_args(PerturbationKind)


def register(kind: str) -> Callable[[P], P]:
    """Class decorator: make a :class:`Perturbation` available as ``perturbation.kind: <kind>`` (in configs loaded or
    validated after it runs: the decorated module is imported first; from the command line, name the class instead:
    ``perturbation.kind=path/to/file.py:Class``). A built-in kind's name is refused (it replaced that kind for the
    whole process); registering a kind again (a module run again in a notebook) replaces it."""
    if not isinstance(kind, str) or not re.fullmatch(r"[A-Za-z][\w.-]*", kind):
        raise ValueError(f"register: a kind is a name (a letter, then letters, digits, _ . -), got {kind!r}")
    if kind in PERTURBATIONS_BUILTIN and kind in PERTURBATIONS:  # (dgrpo's own modules register them first)
        raise ValueError(f"register({kind!r}): {kind} is a built-in kind; register yours under a name of its own")

    def add(cls: P) -> P:
        if not (isinstance(cls, type) and issubclass(cls, Perturbation)):
            raise TypeError(f"register({kind!r}): {cls!r} is not a subclass of dgrpo.perturbation.Perturbation")
        PERTURBATIONS[kind] = cls
        extra = REGISTERED_CHOICES["perturbation.kind"]
        if kind not in (*PERTURBATIONS_BUILTIN, *extra):
            extra.append(kind)
        return cls

    return add


@register("none")
class NoPerturbation(Perturbation):
    """Deterministic rollouts: nothing is perturbed."""

    @classmethod
    def from_config(cls, cfg: PerturbationConfig) -> NoPerturbation:
        none = cls()
        none.perturb_answer = cfg.perturb_answer  # (nothing is perturbed anywhere: either value holds)
        return none

    def bind(self, lm: LatentLM, seeds: Tensor) -> BoundPerturbation:
        as_seeds(seeds)
        return Unperturbed()


class Unperturbed(BoundPerturbation):
    """What ``none`` binds: no hooks, no tensors."""

    def graph_inputs(self) -> list[Tensor]:
        return []

    def row_padding(self, rows: int) -> AbstractContextManager[object]:
        return nullcontext()


@contextmanager
def swapped(owner: object, name: str, value: object) -> Iterator[None]:
    """``owner.name`` is ``value`` within the block (its own value back on leaving)."""
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


def text_seed(key: str) -> int:
    """An int63 seed, a pure function of ``key`` (its blake2b digest)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") & (2**63 - 1)


def site_seed(seed: int, site: int, stream: str) -> int:
    """The seed of row ``seed``'s noise at site ``site`` of ``stream`` (a kind's own draws): a hash of all three, so
    that no other row's seed at another site gives the same noise (``seed + c * site`` would for seeds c apart)."""
    return text_seed(f"{stream}/{seed}/{site}")


def as_seeds(seeds: object) -> Tensor:
    """``seeds`` as what :meth:`Perturbation.bind` takes: a 1-d int64 tensor, one seed per row. A tensor, NumPy array
    or list of integers is accepted; floats are refused (an int63 seed does not survive a float: other masks)."""
    t = seeds if isinstance(seeds, Tensor) else torch.as_tensor(seeds)
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise TypeError(f"perturbation seeds must be integers (int64), got {t.dtype}: a float loses the seed's bits")
    if t.dim() != 1:
        raise ValueError(f"perturbation seeds must be 1-d (one seed per row), got shape {tuple(t.shape)}")
    return t.to(torch.int64)


#: the bits of a seed a generator reads: PyTorch's CPU generator (Mersenne Twister) is seeded by the low 32 alone
GENERATOR_SEED_BITS = 0xFFFFFFFF


def seeds_for(run_seed: int, step: int, rank: int, n: int, stream: str = "rollout") -> Tensor:
    """``n`` seeds in [0, 2^62), a pure function of (run seed, step, rank, stream): reproducible, and different across
    ranks and steps. Distinct in what a row's generator reads (:data:`GENERATOR_SEED_BITS`): a seed whose low 32 bits
    an earlier one has (two rows with one mask: a 3000-step run of 512 rows a step would have such a pair with
    probability 0.09) is drawn again from its index, so seed i depends on the seeds before it alone (a rank's share of
    the first rows is the same on all)."""
    key = f"{run_seed}/{step}/{rank}/{stream}"
    g = torch.Generator().manual_seed(text_seed(key))
    seeds = torch.randint(0, 2**62, (n,), generator=g, dtype=torch.int64).tolist()
    seen: set[int] = set()
    for i, s in enumerate(seeds):
        while s & GENERATOR_SEED_BITS in seen:
            s = text_seed(f"{key}/{i}/{s}") >> 1  # (into [0, 2^62))
        seeds[i] = s
        seen.add(s & GENERATOR_SEED_BITS)
    return torch.tensor(seeds, dtype=torch.int64)


def row_uniforms(seed: int, n_sites: int, width: int) -> Tensor:
    """U(0,1) noise of one row, [n_sites, width], from its own generator: independent of the batch."""
    g = torch.Generator().manual_seed(int(seed))
    return torch.rand(n_sites, width, generator=g)


#: mixed into a row's seed for its sampling draws, so that they are not the draws a perturbation makes from that seed
SAMPLING_SALT = 0x5DEECE66D


def row_sampling_uniforms(seeds: Tensor, n_tokens: int) -> Tensor:
    """[rows, n_tokens] U(0, 1) draws for sampling answer tokens (``LatentLM.generate``'s ``uniforms``), row i's
    from its own generator seeded by ``seeds[i]`` (host tensor): a row samples the same tokens whatever batch, device
    or rank decodes it."""
    rows = [row_uniforms(int(s) ^ SAMPLING_SALT, 1, n_tokens)[0] for s in seeds.tolist()]
    return torch.stack(rows) if rows else torch.zeros(0, n_tokens)


def row_normals(seed: int, n_sites: int, width: int) -> Tensor:
    """N(0,1) noise of one row, [n_sites, width], from its own generator."""
    g = torch.Generator().manual_seed(int(seed))
    return torch.randn(n_sites, width, generator=g)


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """A host tensor moved to ``device``: on CUDA through pinned memory, without waiting (a copy from pageable
    memory synchronises the stream first)."""
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
