"""What mutation testing of ``dgrpo.model.coconut_import`` found untested: each test kills a mutant that the other
tests let live (the mutant named in its docstring). Tiny and in-process: a GPT-2 base of 2 layers, width 32."""

import copy
import warnings
from pathlib import Path

import pytest
import torch

from dgrpo.model.coconut_import import import_coconut, unwrap
from dgrpo.model.factory import CheckpointError
from dgrpo.model.tiny import build_tiny_model, tiny_config

from conftest import COCONUT_BASE_SHAPE

TINY = COCONUT_BASE_SHAPE
#: run.py's order: start, end, latent
OFFICIAL_ORDER = ["<|start-latent|>", "<|end-latent|>", "<|latent|>"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, tokenizer):
    """(base dir, the model's plain state dict with the latent rows, as run.py's Coconut stages save it unwrapped)."""
    root = tmp_path_factory.mktemp("coconut-mutants")
    base = root / "base"
    copy.deepcopy(tokenizer).save_pretrained(base)
    tiny_config("gpt2", len(tokenizer), **TINY).save_pretrained(base)
    model = build_tiny_model("gpt2", len(tokenizer), seed=3, **TINY)
    model.resize_token_embeddings(len(tokenizer) + 3)
    return base, {k: v.clone() for k, v in model.state_dict().items()}


def wrapped(plain: dict) -> dict:
    """The official layout: ``base_causallm.`` keys and the input embedding again as ``embedding.weight``."""
    return {"embedding.weight": plain["transformer.wte.weight"], **{f"base_causallm.{k}": v for k, v in plain.items()}}


def save(tmp_path: Path, sd: dict) -> Path:
    torch.save(sd, tmp_path / "checkpoint_15")
    return tmp_path / "checkpoint_15"


def test_a_wrapper_embedding_other_than_the_base_models_is_refused(run, tmp_path):
    """Coconut's ``embedding`` is the base model's input embedding registered twice: two different tensors are no
    file of run.py's (mutant: ``unwrap`` returned no wrapper embedding, so nothing compared them)."""
    base, plain = run
    sd = wrapped(plain)
    sd["embedding.weight"] = sd["embedding.weight"] + 1.0
    says = "embedding.weight differs from base_causallm.transformer.wte.weight (they are one tensor in Coconut)"
    ckpt = save(tmp_path, sd)
    with pytest.raises(CheckpointError, match=f"^{ckpt}: {says}$".replace("(", r"\(").replace(")", r"\)")):
        import_coconut(ckpt, str(base), tmp_path / "o", c_thought=2, max_latent_stage=3)
    assert not (tmp_path / "o").exists()


def test_the_wrappers_embedding_without_its_base_keys_is_named(run, tmp_path):
    """A plain state dict with the wrapper's own ``embedding.weight`` is refused saying so (mutant: the check dropped,
    it was refused later as an unexpected key of the base model, asking whether --base is the run's)."""
    _, plain = run
    ckpt = tmp_path / "half.pt"
    with pytest.raises(CheckpointError, match=r"half.pt: has 'embedding.weight' but no base_causallm.\* keys \(keys: "):
        unwrap({**plain, "embedding.weight": plain["transformer.wte.weight"]}, ckpt)


def test_the_prefixes_of_torchs_wrappers_are_read_through(run):
    """FSDP's ``_fsdp_wrapped_module.`` (anywhere in a key), DDP's ``module.`` and torch.compile's ``_orig_mod.``
    (leading, stacked) are dropped (mutants: FSDP's prefix kept; DDP's and compile's kept)."""
    _, plain = run
    sd = wrapped(plain)
    saved = {
        **{f"_fsdp_wrapped_module.{k}": v for k, v in list(sd.items())[:3]},
        **{f"module._orig_mod.{k}": v for k, v in list(sd.items())[3:]},
    }
    inner, is_wrapped, emb = unwrap(saved, Path("ckpt"))
    assert is_wrapped and emb is plain["transformer.wte.weight"]
    assert inner.keys() == plain.keys() and all(inner[k] is plain[k] for k in plain)


def test_a_wrapped_checkpoint_without_the_latent_rows_is_refused(run, tmp_path):
    """Only run.py's CoT stage saves the model without the latent rows, and it saves the plain model: the Coconut
    wrapper's layout with the base's rows alone is refused, not imported as a CoT stage (mutant: ``cot`` no longer
    required a plain state dict)."""
    base, plain = run
    sd = wrapped(plain)
    n = sd["embedding.weight"].shape[0] - 3
    sd = {k: v[:n] if k.endswith(("wte.weight", "lm_head.weight", "embedding.weight")) else v for k, v in sd.items()}
    with pytest.raises(CheckpointError, match=rf"its {n} embedding rows stop short of the latent tokens \(ids \[{n}, "):
        import_coconut(save(tmp_path, sd), str(base), tmp_path / "o", c_thought=2, max_latent_stage=3)
    assert not (tmp_path / "o").exists()


def test_rows_one_short_of_the_latent_tokens_are_named_so(run, tmp_path):
    """A checkpoint with two rows past the base's, where the tokenizer's latent tokens need three: the line says the
    rows stop short of the latent tokens (mutant: ``max(latent_ids) > rows``, which let the last id, equal to the
    row count, through to a line about the tokenizer's size; the line said the rows "lack" them, which two do not)."""
    base, plain = run
    n = plain["transformer.wte.weight"].shape[0] - 1
    sd = {k: v[:n] if k in ("transformer.wte.weight", "lm_head.weight") else v for k, v in plain.items()}
    with pytest.raises(
        CheckpointError, match=rf"its {n} embedding rows stop short of the latent tokens \(ids \[{n - 2}, "
    ):
        import_coconut(save(tmp_path, wrapped(sd)), str(base), tmp_path / "o", c_thought=2, max_latent_stage=3)


def test_the_official_layout_converts_in_the_runs_dtype_without_a_warning(run, tmp_path):
    """A bfloat16 run's checkpoint is written in bfloat16, every tensor as the file held it (mutant: the model was
    left in float32, and load_state_dict widened the weights into it: a file twice the size, another dtype). The
    wrapper's layout is only a continuous-thought run's: no warning about pause-as-thought runs (mutant: the warning
    for a plain state dict given for the wrapper's layout too)."""
    from safetensors import safe_open

    base, plain = run
    half = {k: v.to(torch.bfloat16) for k, v in plain.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = import_coconut(save(tmp_path, wrapped(half)), str(base), tmp_path / "o", c_thought=2, max_latent_stage=3)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        got = {k: f.get_tensor(k) for k in f.keys()}
    assert {v.dtype for v in got.values()} == {torch.bfloat16}
    assert torch.equal(got["transformer.wte.weight"], half["transformer.wte.weight"])


def test_a_cot_stage_checkpoint_refuses_latent_settings_and_a_negative_c_thought():
    """A CoT-stage checkpoint (no latent rows) is mode cot at stage 0: n_latent, stage or max_latent_stage other than
    0 are refused, and so is c_thought < 0 (0, gsm_cot.yaml's, is read as 1) (mutants: either refusal dropped)."""
    from dgrpo.model.coconut_import import choose_settings
    from dgrpo.model.latent_lm import LatentSettings

    ckpt = Path("checkpoint_3")
    cot = LatentSettings(mode="cot", c_thought=1, stage=0, n_latent=0, markers=False)
    assert choose_settings(ckpt, True, 0, 0, 0, 0) == cot
    for n_latent, stage, max_latent_stage in ((2, None, None), (None, 1, None), (None, None, 3)):
        with pytest.raises(CheckpointError, match=r"^checkpoint_3 has no latent-token rows: a CoT-stage checkpoint"):
            choose_settings(ckpt, True, 1, n_latent, stage, max_latent_stage)
    with pytest.raises(CheckpointError, match=r"^c_thought \(--c-thought\) must be >= 0 for a CoT-stage checkpoint"):
        choose_settings(ckpt, True, -1, None, None, None)


def test_a_coconut_stage_is_never_read_as_cot_on_a_base_that_holds_the_markers(run, tmp_path, tokenizer):
    """A base whose tokenizer already holds the markers in run.py's order and whose embedding has their rows (run.py's
    resized model, saved as a model directory): a plain state dict of that size is a Coconut stage, its trained
    marker rows kept under the tokenizer's ids (mutant: ``cot`` without ``bool(added)``, the rows counted as the base's
    own, the file read as a CoT stage and refused, or its trained rows overwritten with ``<<``'s)."""
    from dgrpo.model.latent_lm import LatentLM

    _, plain = run
    base = tmp_path / "resized-base"
    tok = copy.deepcopy(tokenizer)
    for t in OFFICIAL_ORDER:
        tok.add_tokens([t], special_tokens=True)
    tok.save_pretrained(base)
    tiny_config("gpt2", len(tok), **TINY).save_pretrained(base)
    with pytest.warns(UserWarning, match="imported as continuous thought"):
        out = import_coconut(save(tmp_path, plain), str(base), tmp_path / "o", c_thought=2, max_latent_stage=3)
    lm = LatentLM.from_pretrained(out)
    assert (lm.settings.mode, lm.settings.stage, lm.settings.n_latent) == ("coconut", 4, 6)
    n = len(tokenizer)
    assert [lm.start_id, lm.end_id, lm.latent_id] == [n, n + 1, n + 2]  # run.py's ids, read from the base's tokenizer
    assert torch.equal(lm.model.get_input_embeddings().weight, plain["transformer.wte.weight"])


def test_a_cot_stage_over_a_vocabulary_padded_by_fewer_rows_than_markers_grows_to_the_tokenizer(tmp_path, tokenizer):
    """A CoT-stage checkpoint of a base whose embedding has 2 spare rows (a padded vocabulary) beyond its tokenizer:
    the 3 markers need one more row, so the embedding grows to the tokenizer's size, the checkpoint's rows kept and
    the markers' rows copies of one row, as run.py makes them (mutant: ``len(tokenizer) > n_old + 1``, no resize: the
    last marker's id past the rows)."""
    from dgrpo.model.latent_lm import LatentLM

    n = len(tokenizer)
    base = tmp_path / "padded-base"
    copy.deepcopy(tokenizer).save_pretrained(base)
    tiny_config("gpt2", n + 2, **TINY).save_pretrained(base)
    sd = build_tiny_model("gpt2", n + 2, seed=5, **TINY).state_dict()
    out = import_coconut(save(tmp_path, sd), str(base), tmp_path / "o", c_thought=1)
    lm = LatentLM.from_pretrained(out)
    emb = lm.model.get_input_embeddings().weight
    assert lm.settings.mode == "cot" and emb.shape[0] == n + 3 == len(lm.tokenizer)
    assert torch.equal(emb[:n], sd["transformer.wte.weight"][:n])
    ids = [lm.start_id, lm.latent_id, lm.end_id]
    assert sorted(ids) == [n, n + 1, n + 2] and all(torch.equal(emb[i], emb[ids[0]]) for i in ids)


def test_a_coconut_runs_stage_zero_has_no_thoughts_and_is_accepted():
    """run.py's ``coconut: True`` runs save the wrapper's layout from their first epochs on, at stage 0 (no thought
    yet): stage 0, n_latent 0, max_latent_stage 0 are valid settings (mutant: ``value <= 0`` refused them)."""
    from dgrpo.model.coconut_import import coconut_settings
    from dgrpo.model.latent_lm import LatentSettings

    zero = LatentSettings(mode="coconut", c_thought=2, stage=0, n_latent=0)
    assert coconut_settings(2, None, 0, 3) == zero
    assert coconut_settings(2, 0, 0, 3) == zero
    assert coconut_settings(2, None, None, 0) == LatentSettings(mode="coconut", c_thought=2, stage=1, n_latent=0)


def test_an_output_path_that_is_a_file_is_refused_in_one_line(run, tmp_path):
    """``out`` naming a file is refused saying so, and the file is left as it was (mutant: the check dropped: the
    emptiness check then listed the file as a directory, a NotADirectoryError traceback)."""
    import re

    base, plain = run
    out = tmp_path / "o"
    out.write_text("kept")
    with pytest.raises(CheckpointError, match=f"^output directory {re.escape(str(out))} exists and is a file$"):
        import_coconut(save(tmp_path, wrapped(plain)), str(base), out, c_thought=2, max_latent_stage=3)
    assert out.read_text() == "kept"


def test_a_buffer_the_model_does_not_save_is_dropped_whatever_its_name():
    """A checkpoint holding a buffer the base model registers but does not save (Llama's rotary
    ``original_inv_freq``, a constant no name pattern lists) has it dropped, not refused as an unexpected key; the
    weights pass through as they are (mutant: only the listed legacy buffer names dropped)."""
    from dgrpo.model.coconut_import import fit_state_dict

    model = build_tiny_model("llama", 40, seed=1, **TINY)
    buffers = dict(model.named_buffers())
    sd = {**model.state_dict(), "model.rotary_emb.original_inv_freq": buffers["model.rotary_emb.original_inv_freq"]}
    fitted = fit_state_dict(model, sd, None)
    assert fitted.keys() == model.state_dict().keys() and all(fitted[k] is sd[k] for k in fitted)


def test_markers_of_a_cot_stage_in_a_padded_vocabulary_start_at_the_mean_of_the_real_tokens_rows():
    """A CoT-stage checkpoint of a base whose embedding has spare rows beyond its tokenizer (a padded vocabulary, as
    Qwen2.5's 151,936 rows for 151,665 tokens): the markers' ids fall among the spare rows, and without a ``<<``
    token their rows are the mean of the real tokens' rows, as dgrpo's rule says, not of every row (the spare rows
    were averaged in)."""
    from dgrpo.model.coconut_import import init_latent_rows

    class Vocab:  # (a tokenizer of 20 tokens, the three markers appended: no '<<')
        def __init__(self) -> None:
            self.ids = {f"t{i}": i for i in range(17)} | {m: 17 + k for k, m in enumerate(OFFICIAL_ORDER)}

        def __len__(self) -> int:
            return len(self.ids)

        def get_vocab(self) -> dict[str, int]:
            return dict(self.ids)

    model = build_tiny_model("gpt2", 25, seed=5, **TINY)  # (25 rows: 5 spare)
    weight = model.get_input_embeddings().weight
    with torch.no_grad():
        weight[17:] += 10.0  # (spare rows far from the real ones: averaging them in shows)
    real = weight[:17].detach().clone()
    init_latent_rows(model, Vocab(), OFFICIAL_ORDER)
    assert weight.shape[0] == 25 and torch.equal(weight[:17], real)
    for i in (17, 18, 19):
        assert torch.allclose(weight[i], real.mean(0), atol=1e-6)
