"""Fused decoder kernels (``model.kernels``): Liger Kernel's Triton RMSNorm, SwiGLU MLP and rotary embedding.

The update's backprop through the latent recurrence runs the decoder's small element-wise operations (RMSNorm's
fp32 upcast and rescale, the MLP's SiLU and product, the rotary rotation) as a dozen separate kernels per layer, each
keeping its output for backward. Liger Kernel (https://github.com/linkedin/Liger-Kernel) fuses each into one Triton
kernel that keeps only its inputs: fewer launches per forward call and less activation memory per token, so larger
micro-batches fit. The SFT and GRPO trainers apply it to the loaded model instance (its RMSNorm and MLP modules get
Liger's forwards); as Liger does, its rotary function replaces the architecture's module-level one for the whole
process (the same rotation, fused). The latent recurrence, the perturbation hooks (on the attention and MLP modules)
and the LM head are untouched.
"""

from __future__ import annotations

import sys
import warnings

from torch import nn

#: the keyword arguments of Liger's ``apply_liger_kernel_to_<arch>``: the fused layers only; the loss patches
#: (cross-entropy, fused linear cross-entropy) would replace the causal LM's ``forward``, which this library never
#: calls for its logits (it scores answer positions itself, in chunks: ``LatentLM.score_targets``)
LIGER_LAYERS = {
    "rope": True,
    "rms_norm": True,
    "swiglu": True,
    "cross_entropy": False,
    "fused_linear_cross_entropy": False,
}


def apply_kernels(model: nn.Module, kind: str) -> bool:
    """Swap in the fused layers ``kind`` names (``none`` or ``liger``) on ``model`` (a Hugging Face causal LM, or a
    PEFT model around one); returns whether anything was applied. ``liger`` needs the model on a CUDA device and the
    ``liger-kernel`` package; elsewhere the model keeps its modules and a warning says so."""
    if kind == "none":
        return False
    if kind != "liger":
        raise ValueError(f"model.kernels: expected none or liger, got {kind!r}")
    device = next(model.parameters()).device
    if device.type != "cuda":
        warnings.warn(
            f"model.kernels=liger: Liger's Triton kernels need CUDA, the model is on {device}; kept as is",
            stacklevel=2,
        )
        return False
    try:
        from liger_kernel.transformers import _apply_liger_kernel_to_instance
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as e:
        raise ImportError("model.kernels=liger needs Liger Kernel: pip install liger-kernel") from e
    base = getattr(model, "get_base_model", lambda: model)()  # PEFT wraps the causal LM
    model_type = getattr(base.config, "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        raise ValueError(
            f"model.kernels=liger: Liger has no kernels for model type {model_type!r} (it has: "
            f"{', '.join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))}); set model.kernels=none"
        )
    # Liger also swaps the architecture's module classes (new models would be built with its layers): undone here,
    # so that only this instance changes; its rotary function stays swapped (the attention looks it up as a global)
    modeling = sys.modules[type(base).__module__]
    before = dict(vars(modeling))
    _apply_liger_kernel_to_instance(model=base, **LIGER_LAYERS)
    for name, value in before.items():
        if isinstance(value, type) and vars(modeling).get(name) is not value:
            setattr(modeling, name, value)
    return True
