"""Probe: can the update's decoder layers run as one ``torch.compile``d step shared by every layer?

    python bench/compile_probe.py                    # tiny Qwen2, 4 layers, CPU: graphs, recompiles, error vs eager
    python bench/compile_probe.py --rows 8 8 8 6     # rows per replay (a different count: the last micro-batch)
    python bench/compile_probe.py --layers 28 --device cuda                  # depth and compile time on a GPU

Not part of the library (nothing here is used by training): it measures what a compiled path would need. Compiling
Hugging Face's decoder layers as they are recompiles past dynamo's limit inside one replay (the guards read the
whole ``DynamicCache``, the perturbation hooks' closures and the layer index). Here each layer's forward is replaced
by a call of one compiled ``step``: ``torch.func.functional_call`` of a template layer with layer i's weights, its
past keys / values, the 4-d mask, the rotary tables and its locked-dropout site masks all as tensor arguments (the
template's hooks read the masks from a slot the step fills), rows marked dynamic. Each replay is scored under locked
dropout through the latent chain with backward, once eager and once compiled; the summary gives the graphs compiled,
the first compile's time, and the largest log-prob and gradient differences from the library's own (eager) path (the
gradient's also relative to its largest entry). The results and what they mean: bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from typing import Any

import torch
from torch._dynamo.utils import counters

from dgrpo.config import PerturbationConfig, TaskConfig
from dgrpo.data.synthetic import generate_split, tokenizer_corpus
from dgrpo.data.tokenizer import train_task_tokenizer
from dgrpo.model.latent_lm import LatentLM
from dgrpo.model.recompute import OneLayerCache, _cache_layer
from dgrpo.model.tiny import build_tiny_model
from dgrpo.perturbation import make_perturbation

SLOT: dict[str, Any] = {}  # the site masks of the layer the compiled step is running


def site_hook(module: torch.nn.Module, args: Any, out: Any) -> Any:
    m = SLOT.get(module._site_name)  # type: ignore[arg-type]
    if m is None:
        return None
    return (out[0] * m, *out[1:]) if isinstance(out, tuple) else out * m


def shared_step(layers: list[torch.nn.Module]) -> Any:
    """The compiled step over a template copy of layer 0, its site hooks installed once."""
    template = copy.deepcopy(layers[0])
    template.self_attn.layer_idx = 0
    for p in template.parameters():
        p.requires_grad_(False)
    for name, mod in (("attn", template.self_attn), ("mlp", template.mlp)):
        mod._site_name = name
        mod.register_forward_hook(site_hook)

    def step(params, hidden, past_k, past_v, mask, cos, sin, m_attn, m_mlp):
        SLOT["attn"], SLOT["mlp"] = m_attn, m_mlp
        cache = OneLayerCache(0, past_k, past_v)
        kw = dict(attention_mask=mask, position_embeddings=(cos, sin), cache=cache, use_cache=True)
        out = torch.func.functional_call(template, params, (hidden,), kw)
        return out, cache.keys, cache.values

    return torch.compile(step, dynamic=True)


def install(lm: LatentLM, step: Any, state: dict) -> None:
    """Every decoder layer's forward becomes a call of ``step`` with its own weights, past and site masks."""
    for i, layer in enumerate(lm.model.model.layers):
        params = dict(layer.named_parameters())

        def forward(
            hidden_states, attention_mask=None, cache=None, position_embeddings=None, _i=i, _l=layer, _p=params, **kw
        ):
            stored = _cache_layer(cache, _i)  # a DynamicCache's full-attention layer, or a clear error
            pk, pv = (stored.keys.contiguous(), stored.values.contiguous()) if stored.is_initialized else (None, None)
            pb = state["bound"]
            masks = [pb.site_masks[state["site"][id(m)]].clone() if pb.active else None for m in (_l.self_attn, _l.mlp)]
            tensors = [hidden_states, pk, pv, attention_mask, *position_embeddings, *masks]
            for t in tensors:
                if t is not None:
                    torch._dynamo.mark_dynamic(t, 0)  # rows: the last micro-batch has fewer
            out, k, v = step(_p, *tensors)
            if not stored.is_initialized:
                stored.lazy_initialization(k, v)
            stored.keys, stored.values = k, v
            return out

        layer.forward = forward


def replay(lm: LatentLM, records: list, pert: Any, seeds: torch.Tensor, state: dict, n_latent: int) -> tuple:
    """Log-probs of a batch's targets through the latent chain under locked dropout, and the gradients of their sum."""
    qs = [r.question for r in records]
    targets = ["\n".join(r.steps) + "\n#### " + r.answer for r in records]
    ids, mask = lm.encode_questions(qs)
    tg, tm = lm.encode_targets(targets)
    lm.zero_grad()
    with pert.bind(lm, seeds) as pb:
        state["bound"], state["site"] = pb, {id(m): k for k, m in enumerate(pb.modules)}
        if state.get("compiled"):
            pb._uninstall()  # the template's hooks act, not the layers' own
        lp, _ = lm.target_logprobs(ids, mask, n_latent, tg, tm, perturbation=pb, end_with_targets=True)
        if state.get("compiled"):
            pb._install()
        (-(lp * tm).sum()).backward()
    return lp.detach(), [p.grad.clone() for p in lm.parameters() if p.grad is not None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rows", type=int, nargs="+", default=[8, 8, 8, 8], help="rows of each replay (one bind each)")
    ap.add_argument("--latent", type=int, default=6, help="latent steps (T)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (fp32 either way)")
    args = ap.parse_args()
    torch.manual_seed(0)
    tok = train_task_tokenizer(tokenizer_corpus(TaskConfig()))
    records = generate_split(TaskConfig(n_test=256), "test")
    lm = LatentLM(
        build_tiny_model("qwen2", len(tok), hidden_size=32, num_layers=args.layers, num_heads=4, intermediate_size=64),
        tok,
    )
    lm.model.to(args.device)
    pert = make_perturbation(PerturbationConfig(kind="locked", p=0.1, sites=["attn", "mlp"]))
    batches = [(records[10 * j : 10 * j + n], torch.arange(n) + 100 * j) for j, n in enumerate(args.rows)]
    state: dict = {}
    reference = [replay(lm, recs, pert, seeds, state, args.latent) for recs, seeds in batches]  # the library's path
    install(lm, shared_step(list(lm.model.model.layers)), state)
    state["compiled"] = True
    rows = []
    for (recs, seeds), (ref_lp, ref_g) in zip(batches, reference):
        t = time.perf_counter()
        lp, g = replay(lm, recs, pert, seeds, state, args.latent)
        rows.append(
            {
                "rows": len(recs),
                "wall_s": round(time.perf_counter() - t, 2),
                "graphs_so_far": counters["stats"]["unique_graphs"],
                "logp_max_diff": (lp - ref_lp).abs().max().item(),
                "grad_max_diff": max((a - b).abs().max().item() for a, b in zip(g, ref_g)),
                "grad_max_rel_diff": max((a - b).abs().max().item() / b.abs().max().item() for a, b in zip(g, ref_g)),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"layers": args.layers, "replays": len(rows), "graphs": counters["stats"]["unique_graphs"]}))


if __name__ == "__main__":
    main()
