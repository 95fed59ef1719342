"""The LM head's statistics over the vocabulary, in fp32 from the (bf16) logits: the log-prob of a target token
(teacher-forced scoring: the update, theta_old, the reference) and the greedy choice's log-prob and entropy (the
rollouts' token choice).

Eager PyTorch's ``log_softmax(logits, dtype=float32)`` first writes an fp32 copy of the [rows, vocabulary] logits and
then reads it, and the entropy takes three more passes over fp32 tensors of that size: on the paper step (512 rows,
a vocabulary of 151,936) every answer token of the rollouts and every 3-position chunk of the update's and the
reference's scoring moves ~1-2.5 GB this way. Compiled (``model.compile_head``, on by default on CUDA;
:class:`HeadStats`) each statistic is one or two fused reductions that read the logits as they are, and the backward
of a target's log-prob is one pass that writes the logits' gradient. Both forms compute in fp32 from the same logits;
the compiled one sums in another order (float rounding: ``tests/test_head_stats.py``), and the greedy token is
eager's ``argmax`` in both.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
import torch._dynamo.exc as dynamo_exc
from torch import Tensor
from torch._dynamo.exc import TorchDynamoException


def eager_target_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """log softmax(logits)[targets] in fp32, [...] for logits [..., V] and targets [...]."""
    return logits.log_softmax(-1, dtype=torch.float32).gather(-1, targets[..., None]).squeeze(-1)


def fused_target_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """:func:`eager_target_logprobs` written as one reduction (x_t - logsumexp x): what the compiler fuses."""
    x = logits.float()
    return x.gather(-1, targets[..., None]).squeeze(-1) - torch.logsumexp(x, -1)


def eager_greedy(logits: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor, Tensor | None]:
    """Each row's greedy token of logits [B, V], its log-prob under softmax(logits) and (``with_entropy``) the
    entropy of that distribution, both fp32 [B]."""
    tokens = logits.argmax(-1)
    logp_all = logits.log_softmax(-1, dtype=torch.float32)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return tokens, logp_all.gather(-1, tokens[:, None]).squeeze(-1), entropy


def fused_greedy_stats(logits: Tensor) -> tuple[Tensor, Tensor]:
    """The log-prob of each row's largest logit and the entropy, [B] each, as two reductions over logits [B, V]:
    with z = x - max x and s = sum exp z, log p(argmax) = -log s and H = log s - sum(exp(z) z) / s."""
    x = logits.float()
    z = x - x.amax(-1, keepdim=True)
    e = z.exp()
    s = e.sum(-1)
    log_s = s.log()
    return -log_s, log_s - (e * z).sum(-1) / s


#: what a compiler that cannot run here raises (no C++ compiler, no Triton, an unsupported op: inductor's errors
#: included; with fullgraph, the recompile limit hit, a plain Exception: one shape, dtype or grad mode too many);
#: not what the compiled code's own run raises through it (out of memory; checkpoint's recomputation stopping early)
COMPILE_ERRORS: tuple[type[Exception], ...] = tuple(
    e for e in (TorchDynamoException, getattr(dynamo_exc, "FailOnRecompileLimitHit", None)) if e is not None
)


class HeadStats:
    """The head statistics of one model, eager or compiled (``torch.compile``, dynamic shapes: one graph for every
    row count and chunk). Should the compiler fail in a forward, a warning says so and the eager form serves from
    then on (a compiled backward is compiled at its first backward, past that net)."""

    def __init__(self, compiled: bool = False):
        self._target: Callable[[Tensor, Tensor], Tensor] | None = None
        self._greedy: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None
        if compiled:
            self._target = torch.compile(fused_target_logprobs, dynamic=True, fullgraph=True)
            self._greedy = torch.compile(fused_greedy_stats, dynamic=True, fullgraph=True)

    @property
    def compiled(self) -> bool:
        return self._target is not None

    def target_logprobs(self, logits: Tensor, targets: Tensor) -> Tensor:
        """log softmax(logits)[targets] in fp32 (differentiable)."""
        if self._target is not None:
            # as rows, [N, V] and contiguous [N]: one graph for every chunk of scoring (a chunk one position wide
            # and a chunk's strided slice of the targets each compiled one more, forward and backward; the logits are
            # a view of the head's [N, V] output there: a view of a tensor of another shape would guard on it)
            try:
                flat = self._target(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).contiguous())
                return flat.view(targets.shape)
            except COMPILE_ERRORS as err:  # a compiler that cannot run here: eager from now on
                self._fall_back(err)
        return eager_target_logprobs(logits, targets)

    def greedy(self, logits: Tensor, with_entropy: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        """:func:`eager_greedy`: the same tokens (eager's argmax); log-prob and entropy from the fused reductions."""
        if self._greedy is not None:
            try:
                logp, entropy = self._greedy(logits)
                return logits.argmax(-1), logp, (entropy if with_entropy else None)
            except COMPILE_ERRORS as err:
                self._fall_back(err)
        return eager_greedy(logits, with_entropy)

    def _fall_back(self, err: Exception) -> None:
        self._target = self._greedy = None
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        warnings.warn(
            f"model.compile_head: the compiled head statistics failed ({type(err).__name__}: {first}); the eager "
            "form runs from now on (the same values; set model.compile_head=false to skip the attempt)",
            RuntimeWarning,
            stacklevel=3,
        )
