"""``dgrpo import-coconut``: a tiny GPT-2 checkpoint laid out like the official Coconut code's (github.com/
facebookresearch/coconut, run.py + coconut.py) converts to a dgrpo checkpoint that computes what Coconut computes;
unsafe or malformed files are refused with one line and exit code 2."""

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import GPT2LMHeadModel

from dgrpo.data.records import Record
from dgrpo.model.coconut_import import coconut_settings, import_coconut
from dgrpo.model.factory import CheckpointError
from dgrpo.model.latent_lm import LATENT_CONFIG_FILE, LatentLM, LatentSettings
from dgrpo.model.reference import uncached_target_logprobs
from dgrpo.model.tiny import build_tiny_model, tiny_config

from conftest import COCONUT_BASE_SHAPE

TINY = COCONUT_BASE_SHAPE
#: run.py's order: tokenizer.add_tokens one at a time, start, end, latent
OFFICIAL_ORDER = ["<|start-latent|>", "<|end-latent|>", "<|latent|>"]


class CoconutLike(nn.Module):
    """What coconut.py's ``Coconut`` registers: the base LM as ``base_causallm`` and its input embedding again."""

    def __init__(self, base: GPT2LMHeadModel):
        super().__init__()
        self.base_causallm = base
        self.embedding = base.transformer.get_input_embeddings()


def _touch(path: str) -> None:
    Path(path).write_text("executed")


class Payload:
    """Unpickling this runs code: it creates the marker file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (_touch, (self.marker,))


@pytest.fixture(scope="module")
def official(tmp_path_factory, tokenizer):
    """(base dir, the official checkpoint file, its unprefixed state dict, the official tokenizer, base vocab)."""
    root = tmp_path_factory.mktemp("coconut")
    base_tok = copy.deepcopy(tokenizer)
    n_base = len(base_tok)
    base = root / "base"
    base_tok.save_pretrained(base)
    tiny_config("gpt2", n_base, **TINY).save_pretrained(base)
    model = build_tiny_model("gpt2", n_base, seed=3, **TINY)
    tok = copy.deepcopy(tokenizer)
    for t in OFFICIAL_ORDER:
        tok.add_tokens(t)  # as run.py does (not special)
    model.resize_token_embeddings(len(tok))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # "trained" latent rows, distinct from every other row
        emb = model.get_input_embeddings().weight
        emb[n_base:] = torch.randn(3, emb.shape[1], generator=gen)
        for p in model.parameters():  # and weights far from GPT-2's tiny init, so the comparison has teeth
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    wrapped = CoconutLike(model).state_dict()
    assert "embedding.weight" in wrapped and all(
        k.startswith("base_causallm.") for k in wrapped if k != "embedding.weight"
    )
    ckpt = root / "checkpoint_15"
    torch.save(wrapped, ckpt)
    plain = {k: v.clone() for k, v in model.state_dict().items()}
    return base, ckpt, plain, tok, n_base


def saved(tmp_path, name, sd) -> Path:
    path = tmp_path / name
    torch.save(sd, path)
    return path


def coconut_reference(weights, n_vocab, q_ids, n_latent, end_id, target_ids):
    """log p(target) the Coconut way, from the original weights in a plain GPT-2: embed the question (ending in
    <|start-latent|>), then each latent position gets the last hidden state of a full forward over everything
    before it, then <|end-latent|> and the teacher-forced answer."""
    model = GPT2LMHeadModel(tiny_config("gpt2", n_vocab, **TINY)).eval()
    model.load_state_dict(weights, strict=True)
    emb = model.get_input_embeddings()
    seq = list(emb(torch.tensor(q_ids)))
    for _ in range(n_latent):
        out = model(inputs_embeds=torch.stack(seq)[None], output_hidden_states=True)
        seq.append(out.hidden_states[-1][0, -1])
    seq += list(emb(torch.tensor([end_id] + target_ids[:-1])))
    logits = model(inputs_embeds=torch.stack(seq)[None]).logits[0, len(q_ids) + n_latent :]
    return logits.log_softmax(-1).gather(-1, torch.tensor(target_ids)[:, None]).squeeze(-1)


def pause_reference(weights, n_vocab, q_ids, n_latent, latent_id, end_id, target_ids):
    """log p(target) as run.py computes it for a pause-as-thought run (coconut: False): the plain model over token
    ids, the question (ending in <|start-latent|>), n_latent <|latent|> tokens, <|end-latent|>, the answer."""
    model = GPT2LMHeadModel(tiny_config("gpt2", n_vocab, **TINY)).eval()
    model.load_state_dict(weights, strict=True)
    ids = q_ids + [latent_id] * n_latent + [end_id] + target_ids[:-1]
    logits = model(torch.tensor([ids])).logits[0, len(q_ids) + n_latent :]
    return logits.log_softmax(-1).gather(-1, torch.tensor(target_ids)[:, None]).squeeze(-1)


def assert_same_weights(lm: LatentLM, plain: dict) -> None:
    got = lm.model.state_dict()
    for k, v in plain.items():
        assert torch.equal(got[k], v), k


def test_official_checkpoint_converts_and_computes_what_coconut_computes(official, tmp_path, task_records):
    base, ckpt, plain, tok, n_base = official
    out = import_coconut(ckpt, str(base), tmp_path / "out", c_thought=2, max_latent_stage=3)
    assert json.loads((out / LATENT_CONFIG_FILE).read_text()) == {
        "mode": "coconut",
        "c_thought": 2,
        "stage": 4,
        "n_latent": 6,
        "chat_template": False,
        "markers": True,
    }
    lm = LatentLM.from_pretrained(out).eval()
    assert len(lm.tokenizer) == n_base + 3 and lm.model.get_input_embeddings().weight.shape[0] == n_base + 3
    assert (lm.start_id, lm.end_id, lm.latent_id) == tuple(tok.convert_tokens_to_ids(OFFICIAL_ORDER))
    assert (lm.pad_id, lm.eos_id) == (tok.pad_token_id, tok.eos_token_id)
    assert_same_weights(lm, plain)  # the latent rows included: nothing re-initialised
    assert lm.settings == LatentSettings(mode="coconut", c_thought=2, stage=4, n_latent=6)

    recs = task_records[:3]
    questions = [r.question if i else r.question[:30] for i, r in enumerate(recs)]  # ragged: left padding
    targets = ["\n".join(r.steps) + "\n#### " + r.answer for r in recs]
    ids, mask = lm.encode_questions(questions)
    tg, tm = lm.encode_targets(targets)
    n_lat = lm.settings.n_latent
    with torch.no_grad():
        cached, _ = lm.target_logprobs(ids, mask, n_lat, tg, tm)
        uncached, _ = uncached_target_logprobs(lm, ids, mask, n_lat, tg, tm)
        assert torch.allclose(cached, uncached, atol=1e-5), (cached - uncached).abs().max()
        for i, (q, t) in enumerate(zip(questions, targets)):
            q_ids = tok(q + "\n", add_special_tokens=False)["input_ids"] + [
                tok.convert_tokens_to_ids(OFFICIAL_ORDER[0])
            ]
            t_ids = tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            assert ids[i, mask[i].bool()].tolist() == q_ids and tg[i, tm[i].bool()].tolist() == t_ids
            ref = coconut_reference(plain, len(tok), q_ids, n_lat, tok.convert_tokens_to_ids(OFFICIAL_ORDER[1]), t_ids)
            got = cached[i, : len(t_ids)]
            assert torch.allclose(got, ref, atol=1e-5), (got - ref).abs().max()


def test_cli_imports_the_official_layout(official, tmp_path, run_cli):
    base, ckpt, plain, _, _ = official
    out = tmp_path / "gsm"
    r = run_cli("import-coconut", ckpt, "--base", base, "--c-thought", 2, "--max-latent-stage", 3, "--out", out)
    assert r.returncode == 0, r.stderr
    assert str(out) in r.stdout and '"n_latent": 6' in r.stdout and '"stage": 4' in r.stdout
    lm = LatentLM.from_pretrained(out)
    assert_same_weights(lm, plain)
    r = run_cli("import-coconut", ckpt, "--base", base, "--c-thought", 2, "--n-latent", 4, "--out", tmp_path / "t4")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "t4" / LATENT_CONFIG_FILE).read_text())["n_latent"] == 4


@pytest.mark.parametrize("variant", ["plain", "plain_legacy_buffers_untied_key_dropped"])
def test_plain_state_dict_imports(official, tmp_path, variant):
    """Read as continuous thought unless told otherwise, with a warning: run.py saves this layout (no wrapper, the
    latent rows) for its pause-as-thought runs."""
    base, _, plain, _, _ = official
    sd = dict(plain)
    if variant != "plain":  # an older transformers: constant attention buffers saved; lm_head.weight left out (tied)
        del sd["lm_head.weight"]
        for layer in range(TINY["num_layers"]):
            sd[f"transformer.h.{layer}.attn.bias"] = torch.tril(torch.ones(8, 8, dtype=torch.bool))[None, None]
            sd[f"transformer.h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    with pytest.warns(UserWarning, match=r"ckpt: a plain state dict with the latent-token rows, imported as contin"):
        out = import_coconut(saved(tmp_path, "ckpt", sd), str(base), tmp_path / "out", c_thought=1, n_latent=3)
    lm = LatentLM.from_pretrained(out)
    assert_same_weights(lm, plain)
    assert lm.settings == LatentSettings(mode="coconut", c_thought=1, stage=4, n_latent=3)


def test_a_pause_as_thought_checkpoint_imported_with_mode_pause_computes_what_run_py_computes(
    official, tmp_path, task_records, recwarn
):
    """run.py's pause-as-thought run (coconut: False) saves the plain model with the latent rows and feeds the
    <|latent|> token's embedding at each latent position: with mode pause the import's log-probs and greedy answers
    are those of the plain model over the token ids; read as coconut (the default) they were not."""
    base, _, plain, tok, _ = official
    ckpt = saved(tmp_path, "checkpoint_15", plain)
    out = import_coconut(ckpt, str(base), tmp_path / "pause", c_thought=2, max_latent_stage=3, mode="pause")
    assert not [w for w in recwarn if "plain state dict" in str(w.message)]  # (asked for: no warning)
    lm = LatentLM.from_pretrained(out).eval()
    assert lm.settings == LatentSettings(mode="pause", c_thought=2, stage=4, n_latent=6)
    assert_same_weights(lm, plain)
    recs = task_records[:2]
    ids, mask = lm.encode_questions([r.question for r in recs])
    tg, tm = lm.encode_targets(["\n".join(r.steps) + "\n#### " + r.answer for r in recs])
    start, end, latent = tok.convert_tokens_to_ids(OFFICIAL_ORDER)
    hf = GPT2LMHeadModel(tiny_config("gpt2", len(tok), **TINY)).eval()
    hf.load_state_dict(plain, strict=True)
    with torch.no_grad():
        got, _ = lm.target_logprobs(ids, mask, 6, tg, tm)
        answers = lm.generate(ids, mask, max_new_tokens=5)
        for i in range(len(recs)):
            q_ids, t_ids = ids[i, mask[i].bool()].tolist(), tg[i, tm[i].bool()].tolist()
            ref = pause_reference(plain, len(tok), q_ids, 6, latent, end, t_ids)
            assert torch.allclose(got[i, : len(t_ids)], ref, atol=1e-5), (got[i, : len(t_ids)] - ref).abs().max()
            hidden = coconut_reference(plain, len(tok), q_ids, 6, end, t_ids)  # what the coconut reading computes
            assert not torch.allclose(ref, hidden, atol=1e-3)
            # run.py's eval: generate() of the plain model on the question, the markers and the pause tokens
            prompt = torch.tensor([q_ids + [latent] * 6 + [end]])
            want = hf.generate(prompt, max_new_tokens=5, do_sample=False, pad_token_id=tok.eos_token_id)
            n = int(answers.mask[i].sum())
            assert answers.tokens[i, :n].tolist() == want[0, prompt.shape[1] :].tolist()[:n]


def test_mode_pause_is_refused_where_the_file_is_no_pause_runs(official, tmp_path, run_cli):
    """The Coconut wrapper's layout is saved only by coconut: True runs, a CoT-stage checkpoint has no latent rows:
    --mode pause is a one-line error for both; --mode coconut on the plain layout is taken without a warning."""
    base, ckpt, plain, _, n_base = official
    cot = build_tiny_model("gpt2", n_base, seed=5, **TINY).state_dict()
    settings = ["--base", base, "--c-thought", 2, "--max-latent-stage", 3]
    for given, expect in (
        (ckpt, "is in the Coconut wrapper's layout (base_causallm.* keys), which run.py saves only for coconut: True"),
        (saved(tmp_path, "cot", cot), "has no latent-token rows: a CoT-stage checkpoint, not a pause-as-thought"),
    ):
        r = run_cli("import-coconut", given, *settings, "--mode", "pause", "--out", tmp_path / "o")
        assert r.returncode == 2 and expect in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
        assert not (tmp_path / "o").exists()
    r = run_cli("import-coconut", ckpt, *settings, "--mode", "thought", "--out", tmp_path / "o")
    assert r.returncode == 2 and "invalid choice: 'thought'" in r.stderr
    flat = saved(tmp_path, "flat", plain)
    r = run_cli("import-coconut", flat, *settings, "--mode", "pause", "--out", tmp_path / "p")
    assert r.returncode == 0 and '"mode": "pause"' in r.stdout and '"n_latent": 6' in r.stdout, r.stderr
    r = run_cli("import-coconut", flat, *settings, "--mode", "coconut", "--out", tmp_path / "c")
    assert r.returncode == 0 and '"mode": "coconut"' in r.stdout and "warning" not in r.stderr, r.stderr
    with pytest.warns(UserWarning, match="give --mode pause if it is one of them, --mode coconut if it is not"):
        r = run_cli("import-coconut", flat, *settings, "--out", tmp_path / "d")
    assert r.returncode == 0 and '"mode": "coconut"' in r.stdout
    with pytest.raises(CheckpointError, match=r"^mode \(--mode\) must be one of coconut, pause, got 'cot'$"):
        import_coconut(flat, str(base), tmp_path / "e", c_thought=2, max_latent_stage=3, mode="cot")


def test_cot_stage_checkpoint_gets_the_latent_rows_run_py_would_make(official, tmp_path, tokenizer, task_records):
    base, _, _, tok, n_base = official
    cot = build_tiny_model("gpt2", n_base, seed=5, **TINY)  # run.py's CoT stage: the plain model, never resized
    sd = {k: v.clone() for k, v in cot.state_dict().items()}
    out = import_coconut(saved(tmp_path, "cot", sd), str(base), tmp_path / "out", c_thought=2)
    lm = LatentLM.from_pretrained(out)
    # prompted as run.py trained and evaluated its CoT stage: the question alone, no latent markers
    assert lm.settings == LatentSettings(mode="cot", c_thought=2, stage=0, n_latent=0, markers=False)
    emb = lm.model.get_input_embeddings().weight
    assert emb.shape[0] == n_base + 3 and torch.equal(emb[:n_base], sd["transformer.wte.weight"])
    src = tokenizer.get_vocab()["<<"]
    for t in OFFICIAL_ORDER:
        assert torch.equal(emb[tok.convert_tokens_to_ids(t)], emb[src])
    from dgrpo.eval.evaluate import evaluate, plain_prompt

    recs = task_records[:3]
    got = [p["completion"] for p in evaluate(lm.eval(), recs, max_new_tokens=4, progress=False).predictions]
    ids, mask = lm.encode_questions([r.question for r in recs], markers=False)
    assert int(ids[0, -1]) != lm.start_id
    plain = lm.generate(ids, mask, 0, max_new_tokens=4, markers=False)
    assert got == lm.decode(plain.tokens, plain.mask)  # the question alone, as run.py evaluated it
    # a plain LM's k-shot prompt writes out a GSM8K example's own solution (its calculator annotations dropped)
    gsm = Record("Tom has 16 eggs.", ["<<16-3-4=9>>"], "9", {"solution": "He has 16 - 3 - 4 = <<16-3-4=9>>9.\n#### 9"})
    assert plain_prompt("Q?", [gsm, Record("Ann has 2.", [], "2", {})]) == (
        "Question: Tom has 16 eggs.\nAnswer: He has 16 - 3 - 4 = 9. The answer is 9.\n\n"
        "Question: Ann has 2.\nAnswer: The answer is 2.\n\nQuestion: Q?\nAnswer:"
    )


def test_pickled_code_is_refused_and_never_run(official, tmp_path, run_cli):
    base = official[0]
    marker = tmp_path / "executed"
    bad = saved(tmp_path, "evil.pt", {"x": torch.zeros(1), "payload": Payload(marker)})
    r = run_cli(
        "import-coconut", bad, "--base", base, "--c-thought", 2, "--max-latent-stage", 3, "--out", tmp_path / "o"
    )
    assert r.returncode == 2
    assert r.stderr.startswith("dgrpo: error:") and r.stderr.strip().count("\n") == 0, r.stderr
    assert "refused" in r.stderr and "_touch" in r.stderr
    assert not marker.exists() and not (tmp_path / "o").exists()
    # the payload is live: an unsafe load would have run it
    live = tmp_path / "live"
    torch.load(saved(tmp_path, "live.pt", {"payload": Payload(live)}), weights_only=False)
    assert live.exists()


def _missing(sd):
    del sd["base_causallm.transformer.h.1.mlp.c_fc.weight"]
    return sd, "missing transformer.h.1.mlp.c_fc.weight: a file saved or copied in part, or is --base the model the"


def _wrong_shape(sd):
    sd["base_causallm.transformer.h.0.attn.c_proj.weight"] = torch.zeros(32, 16)
    return sd, "transformer.h.0.attn.c_proj.weight (32, 16) vs (32, 32)"


def _extra(sd):
    sd["base_causallm.transformer.h.2.ln_1.weight"] = torch.ones(32)
    return sd, "unexpected transformer.h.2.ln_1.weight: is --base the model the run started from"


def _integer_weight(sd):  # load_state_dict would cast it into the float weight
    sd["base_causallm.transformer.h.0.attn.c_proj.weight"] = torch.zeros(32, 32, dtype=torch.int64)
    return sd, "tensors of another kind (not float) transformer.h.0.attn.c_proj.weight torch.int64"


def _training_state(sd):
    return {"model": sd, "epoch": 3}, "a dict holding one under 'model' (entries 'model': OrderedDict, 'epoch': int)"


def _mixed(sd):
    sd["transformer.wte.weight"] = sd["embedding.weight"]
    return sd, "found both base_causallm.* keys and transformer.wte.weight"


def _not_a_dict(sd):
    return [sd["embedding.weight"]], "found list"


@pytest.mark.parametrize(
    "broken", [_missing, _wrong_shape, _integer_weight, _extra, _training_state, _mixed, _not_a_dict]
)
def test_malformed_checkpoints_are_one_line_errors(official, tmp_path, run_cli, broken):
    base, ckpt = official[:2]
    sd, expect = broken(torch.load(ckpt, weights_only=True))
    bad = saved(tmp_path, "bad.pt", sd)
    out = tmp_path / "o"
    r = run_cli("import-coconut", bad, "--base", base, "--c-thought", 2, "--max-latent-stage", 3, "--out", out)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert expect in r.stderr, r.stderr
    assert not out.exists()


def test_damaged_files_are_said_to_be_unreadable_in_one_line(official, tmp_path, run_cli):
    """Random bytes, or a checkpoint cut short: 'not a readable torch checkpoint' with torch's reason, one line (not
    the refusal of pickled code, which is for files that name a global). A file cut short says so, and what to do
    (torch's reason was '[Errno 22] Invalid argument', or a sentence cut at 160 characters)."""
    base, ckpt = official[:2]
    whole = Path(ckpt).read_bytes()
    legacy = tmp_path / "legacy.pt"  # (torch's format before its zip archives: cut short, 'unexpected EOF')
    torch.save(torch.load(ckpt, weights_only=True), legacy, _use_new_zipfile_serialization=False)
    cut = "not a readable torch checkpoint: cut short ({:,} bytes, its end missing: an interrupted save, copy or "
    for name, data, says in (
        ("noise.pt", bytes(range(256)) * 4, "not a readable torch checkpoint, damaged or of another format ("),
        ("cut.pt", whole[: len(whole) // 2], cut.format(len(whole) // 2)),
        ("cut-end.pt", whole[:-10], cut.format(len(whole) - 10)),
        ("cut-legacy.pt", legacy.read_bytes()[:-10], cut.format(legacy.stat().st_size - 10)),
    ):
        bad = tmp_path / name
        bad.write_bytes(data)
        r = run_cli("import-coconut", bad, "--base", base, "--c-thought", 2, "--out", tmp_path / "o")
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
        assert says in r.stderr, r.stderr
        assert not name.startswith("cut") or r.stderr.endswith("download); copy it again from the run's save_dir\n")


def test_argument_errors(official, tmp_path, run_cli):
    base, ckpt = official[:2]
    cases = [
        (["--c-thought", 2], "give max_latent_stage"),
        (["--c-thought", 2, "--n-latent", 5], "n_latent 5 is not a multiple of c_thought 2"),
        (["--c-thought", 0, "--max-latent-stage", 3], "c_thought (--c-thought) must be >= 1"),
        (["--c-thought", 2, "--epochs-per-stage", 3, "--stage", 1], "--stage and --epochs-per-stage: give one"),
    ]
    for extra, expect in cases:
        r = run_cli("import-coconut", ckpt, "--base", base, "--out", tmp_path / "o", *extra)
        assert r.returncode == 2 and expect in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    r = run_cli("import-coconut", tmp_path / "nope", "--base", base, "--c-thought", 2, "--out", tmp_path / "o")
    assert r.returncode == 2 and "not found" in r.stderr
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    r = run_cli(
        "import-coconut", ckpt, "--base", base, "--c-thought", 2, "--max-latent-stage", 3, "--out", tmp_path / "full"
    )
    assert r.returncode == 2 and "not empty" in r.stderr
    r = run_cli(
        "import-coconut", ckpt, "--base", base, "--c-thought", 2, "--max-latent-stage", 3, "--out", tmp_path / "full/x"
    )
    assert r.returncode == 2 and "exists and is not a directory" in r.stderr
    r = run_cli(  # under a file: one line (was a FileExistsError traceback)
        "import-coconut",
        ckpt,
        "--base",
        base,
        "--c-thought",
        2,
        "--max-latent-stage",
        3,
        "--out",
        tmp_path / "full/x/o",
    )
    assert r.returncode == 2 and "full/x is not a directory" in r.stderr
    notok = tmp_path / "notok"  # a base directory without its tokenizer (model.save_pretrained alone)
    notok.mkdir()
    shutil.copy(Path(base) / "config.json", notok)
    wrong_base = [
        (base, ckpt, "is a directory: a model directory (a transformers or TRL output, or a dgrpo checkpoint)"),
        (ckpt, tmp_path / "nodir", "checkpoint directory not found"),  # (was the hub's retries, then its error)
        (ckpt, notok, "no tokenizer in"),  # (was an empty tokenizer: latent ids on ordinary rows)
    ]
    for given, base_dir, expect in wrong_base:
        r = run_cli(
            "import-coconut",
            given,
            "--base",
            base_dir,
            "--c-thought",
            2,
            "--max-latent-stage",
            3,
            "--out",
            tmp_path / "o",
        )
        assert r.returncode == 2 and expect in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "given, stage, n_latent",
    [
        ({"max_latent_stage": 3}, 4, 6),  # the official run: every step latent
        ({"n_latent": 4}, 3, 4),
        ({"n_latent": 4, "max_latent_stage": 3}, 2, 4),  # a mid-curriculum checkpoint (was stage 4, with 4 thoughts)
        ({"n_latent": 6, "max_latent_stage": 3}, 4, 6),
        ({"stage": 2, "max_latent_stage": 3}, 2, 4),  # (was n_latent 6 at stage 2)
        ({"stage": 5, "max_latent_stage": 3}, 5, 6),
        ({"stage": 2, "n_latent": 4}, 2, 4),
        ({"stage": 5, "n_latent": 4}, 5, 4),  # past max_latent_stage 2
        ({"stage": 2, "n_latent": 4, "max_latent_stage": 3}, 2, 4),
    ],
)
def test_consistent_coconut_settings_are_inferred(given, stage, n_latent):
    assert coconut_settings(2, **{"n_latent": None, "stage": None, "max_latent_stage": None, **given}) == (
        LatentSettings(mode="coconut", c_thought=2, stage=stage, n_latent=n_latent)
    )


def test_inconsistent_coconut_settings_are_refused(official, tmp_path):
    """n_latent=2, stage=1, c_thought=1 was saved as given, though Coconut's stage 1 has 1 thought."""
    base, ckpt = official[:2]
    with pytest.raises(CheckpointError, match=r"^n_latent 2 does not fit c_thought 1, stage 1: Coconut's stage k has"):
        import_coconut(ckpt, str(base), tmp_path / "o", c_thought=1, n_latent=2, stage=1)
    assert not (tmp_path / "o").exists()
    for kw, msg in (
        ({"n_latent": 6, "stage": 2, "max_latent_stage": 3}, "n_latent 6 does not fit c_thought 2, stage 2, max_"),
        ({"n_latent": 8, "max_latent_stage": 3}, r"n_latent 8 is more than c_thought \* max_latent_stage = 6"),
        ({"n_latent": 3, "stage": 4}, "n_latent 3 is not a multiple of c_thought 2"),
        ({"stage": -1, "max_latent_stage": 3}, r"stage \(--stage\) must be >= 0"),
    ):
        with pytest.raises(CheckpointError, match=msg):
            coconut_settings(2, **{"n_latent": None, "stage": None, "max_latent_stage": None, **kw})


def test_what_the_probe_of_a_real_run_found_is_refused_or_read(official, tmp_path, run_cli):
    """A --base whose tokenizer is not the run's (the checkpoint's rows not len(tokenizer): the trained latent rows
    went unused, 31% for 100%), NaN weights (imported, then 0% with every answer unparseable), a DDP ``module.``
    prefix (an error that did not say why), an empty file or state dict (an empty reason), a run directory as
    --base ('Should have a model_type key'): each one line; the prefix is read through."""
    base, ckpt, plain = official[:3]
    sd = torch.load(ckpt, weights_only=True)
    more = dict(sd)  # (a row more than the tokenizer's: another tokenizer's embedding)
    for key in ("embedding.weight", "base_causallm.transformer.wte.weight", "base_causallm.lm_head.weight"):
        more[key] = torch.cat([sd[key], sd[key][:1]])
    nan = dict(sd)
    nan["base_causallm.transformer.h.0.mlp.c_fc.weight"] = torch.full_like(
        sd["base_causallm.transformer.h.0.mlp.c_fc.weight"], float("nan")
    )
    (tmp_path / "empty.pt").write_bytes(b"")
    cases = [
        (saved(tmp_path, "more.pt", more), "embedding rows, but the tokenizer of"),
        (
            saved(tmp_path, "nan.pt", nan),
            "NaN or infinite weights, a diverged run's: transformer.h.0.mlp.c_fc.weight",
        ),
        (tmp_path / "empty.pt", "damaged or of another format (an empty file) ("),
        (saved(tmp_path, "nothing.pt", {}), "an empty state dict (no tensors)"),
    ]
    for bad, expect in cases:
        r = run_cli(
            "import-coconut", bad, "--base", base, "--c-thought", 2, "--max-latent-stage", 3, "--out", tmp_path / "o"
        )
        assert r.returncode == 2 and expect in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
        assert str(bad) in r.stderr, r.stderr  # (the NaN refusal named no file: "the checkpoint holds NaN ...")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"sft": {}, "grpo": {}}))
    for given, expect in (
        (run_dir, "its config.json is no model config (a dgrpo run's config)"),
        (tmp_path, "no config.json"),
    ):
        r = run_cli(
            "import-coconut", ckpt, "--base", given, "--c-thought", 2, "--max-latent-stage", 3, "--out", tmp_path / "o"
        )
        assert r.returncode == 2 and expect in r.stderr, r.stderr
    ddp = saved(tmp_path, "ddp.pt", {f"module.{k}": v for k, v in sd.items()})
    assert_same_weights(
        LatentLM.from_pretrained(import_coconut(ddp, str(base), tmp_path / "ddp", c_thought=2, max_latent_stage=3)),
        plain,
    )


def test_a_diverged_runs_nan_embedding_is_said_to_be_nan_not_two_tensors(official, tmp_path, run_cli):
    """NaN in the input embedding, which the wrapper's ``embedding``, ``wte`` and the tied ``lm_head`` share (a
    diverged run's, wrapped and plain): said to be NaN weights (it was 'embedding.weight differs from ...' and
    'lm_head.weight differs ..., is --base the model the run started from', NaN being unequal to itself)."""
    base, ckpt = official[:2]
    sd = torch.load(ckpt, weights_only=True)
    emb = sd["embedding.weight"].clone()
    emb[-1] = float("nan")
    shared = ("embedding.weight", "base_causallm.transformer.wte.weight", "base_causallm.lm_head.weight")
    wrapped = {**sd, **dict.fromkeys(shared, emb)}
    plain = {k.removeprefix("base_causallm."): v for k, v in wrapped.items() if k != "embedding.weight"}
    for name, sd_ in (("wrapped.pt", wrapped), ("plain.pt", plain)):
        r = run_cli(
            "import-coconut", saved(tmp_path, name, sd_), "--base", base, "--c-thought", 2, "--max-latent-stage", 3,
            "--mode", "coconut", "--out", tmp_path / "o",
        )  # fmt: skip
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
        assert "NaN or infinite weights, a diverged run's: transformer.wte.weight" in r.stderr, r.stderr


def test_the_stage_of_checkpoint_n_is_read_from_its_name(official, tmp_path, run_cli):
    """run.py saves checkpoint_N after epoch N, of stage (N - 1) // epochs_per_stage: its checkpoint_5 of
    args/gsm_coconut.yaml (epochs_per_stage 3) has 2 thoughts, but every checkpoint was imported with 6."""
    base, ckpt = official[:2]
    early, odd = tmp_path / "checkpoint_5", tmp_path / "final.pt"
    shutil.copy(ckpt, early)
    shutil.copy(ckpt, odd)
    settings = ["--base", base, "--c-thought", 2, "--max-latent-stage", 3, "--epochs-per-stage", 3]
    for given, stage, n_latent in ((early, 1, 2), (ckpt, 4, 6)):  # (ckpt: checkpoint_15)
        out = tmp_path / f"o{stage}"
        r = run_cli("import-coconut", given, *settings, "--out", out)
        assert r.returncode == 0, r.stderr
        written = json.loads((out / LATENT_CONFIG_FILE).read_text())
        assert (written["stage"], written["n_latent"]) == (stage, n_latent)
    r = run_cli("import-coconut", odd, *settings, "--out", tmp_path / "x")
    assert r.returncode == 2 and "'final.pt' is not one (give --stage)" in r.stderr


def test_a_cot_stage_checkpoint_takes_the_cot_runs_own_settings(official, tmp_path):
    """args/gsm_cot.yaml has c_thought 0 and max_latent_stage 0: 'c_thought must be >= 1', then 'leave out ...'."""
    base, _, _, _, n_base = official
    cot = build_tiny_model("gpt2", n_base, seed=5, **TINY)
    out = import_coconut(
        saved(tmp_path, "cot", cot.state_dict()), str(base), tmp_path / "o", c_thought=0, max_latent_stage=0
    )
    assert LatentLM.from_pretrained(out).settings == LatentSettings(
        mode="cot", c_thought=1, stage=0, n_latent=0, markers=False
    )


def test_a_revision_given_with_a_local_directory_is_warned_about(official, tmp_path, run_cli):
    """import-coconut's and export's --revision (a hub id's branch, tag or commit) with a local directory was
    dropped without a word."""
    base, ckpt, _, _, _ = official
    with pytest.warns(UserWarning, match=rf"^--revision v1 applies only to a hub id: --base {base} is a local dir"):
        r = run_cli(
            "import-coconut",
            ckpt,
            "--base",
            base,
            "--c-thought",
            2,
            "--n-latent",
            2,
            "--revision",
            "v1",
            "--out",
            tmp_path / "o",
        )
    assert r.returncode == 0, r.stderr
    with pytest.warns(UserWarning, match=rf"^--revision v1 applies only to a hub id: SRC {tmp_path / 'o'} is a local"):
        r = run_cli("export", tmp_path / "o", "--revision", "v1", "--merge", "--out", tmp_path / "m")
    assert r.returncode == 2 and "already a full checkpoint" in r.stderr, r.stderr


def test_a_base_that_is_not_the_runs_is_one_line_asking_for_it(official, tmp_path, tokenizer, run_cli):
    """A checkpoint over a --base of another architecture, size or tokenizer was refused naming what did not fit,
    but not what to check (the missing embedding key, missing or wrong-shape tensors, too few rows for the latent
    tokens, a head the base ties): each line now asks whether --base is the run's model_id."""
    base, ckpt, _, tok, n_base = official
    others = {"llama": ("llama", {}), "qwen2": ("qwen2", {}), "wide": ("gpt2", {"hidden_size": 64})}
    others["deep"] = ("gpt2", {"num_layers": 3})  # (one layer more than the run's)
    for name, (arch, over) in others.items():
        other = tmp_path / f"base-{name}"
        copy.deepcopy(tokenizer).save_pretrained(other)
        tiny_config(arch, n_base, **{**TINY, **over}).save_pretrained(other)
    llama = build_tiny_model("llama", n_base, seed=3, **TINY)
    llama.resize_token_embeddings(len(tok), mean_resizing=False)
    llama_ckpt = saved(tmp_path, "llama.pt", {f"base_causallm.{k}": v for k, v in llama.state_dict().items()})
    bigger = tmp_path / "base-bigger"  # (the run's architecture, a tokenizer of more tokens: another model's)
    big_tok = copy.deepcopy(tokenizer)
    big_tok.add_tokens([f"extra{i}" for i in range(5)])
    big_tok.save_pretrained(bigger)
    tiny_config("gpt2", len(big_tok), **TINY).save_pretrained(bigger)
    for given, over, says in (
        (ckpt, "base-llama", "no input embedding 'model.embed_tokens.weight' for the base model of"),
        (llama_ckpt, "base-qwen2", "lm_head.weight differs from model.embed_tokens.weight, but the base model ties"),
        (ckpt, "base-wide", "does not fit the base model: wrong shapes (checkpoint vs base) transformer.wte.weight"),
        # (a base one layer deeper: the missing keys are a whole layer, which the key list alone did not say)
        (ckpt, "base-deep", "the checkpoint has 2 decoder layers (transformer.h.N), the base model 3; missing "),
        (ckpt, "base-bigger", f"its {len(tok)} embedding rows stop short of the latent tokens (ids ["),
    ):
        r = run_cli(
            "import-coconut", given, "--base", tmp_path / over, "--c-thought", 1, "--max-latent-stage", 3,
            "--out", tmp_path / "o",
        )  # fmt: skip
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and says in r.stderr, r.stderr
        assert r.stderr.endswith(": is --base the model the run started from (its model_id)?\n"), r.stderr
        assert str(given) in r.stderr, r.stderr  # (a wrong shape's or depth's refusal named no file)
        assert not (tmp_path / "o").exists()


def test_a_base_whose_tokenizer_holds_the_markers_in_dgrpos_order_is_refused(official, tmp_path, tokenizer, run_cli):
    """A dgrpo checkpoint as --base (its tokenizer has the markers as start, latent, end; run.py adds start, end,
    latent) imported without a word, the checkpoint's <|end-latent|> row read as <|latent|>'s and the reverse. A
    base whose tokenizer holds them in run.py's order is read as before."""
    base, ckpt, plain, tok, n_base = official
    dgrpo_base = tmp_path / "dgrpo-base"
    LatentLM(build_tiny_model("gpt2", n_base, **TINY), copy.deepcopy(tokenizer)).save_pretrained(dgrpo_base)
    settings = ["--c-thought", 2, "--max-latent-stage", 3]
    r = run_cli("import-coconut", ckpt, "--base", dgrpo_base, *settings, "--out", tmp_path / "o")
    n = n_base
    says = f"its tokenizer already holds the latent tokens (<|start-latent|> {n}, <|latent|> {n + 1}, <|end-latent|> "
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert (
        r.stderr.endswith("is --base the model the run started from (its model_id)?\n")
        and not (tmp_path / "o").exists()
    )
    in_order = tmp_path / "in-order"  # (the run's tokenizer, saved beside its base's config)
    shutil.copytree(base, in_order)
    tok.save_pretrained(in_order)
    r = run_cli("import-coconut", ckpt, "--base", in_order, *settings, "--out", tmp_path / "o")
    assert r.returncode == 0, r.stderr
    assert_same_weights(LatentLM.from_pretrained(tmp_path / "o"), plain)
    from dgrpo.model.coconut_import import check_marker_order

    partial = copy.deepcopy(tokenizer)  # a base with <|latent|> only: run.py adds the others after it, as the import
    for token in ("<|latent|>", "<|start-latent|>", "<|end-latent|>"):
        partial.add_tokens([token])
    check_marker_order("base", partial, ["<|start-latent|>", "<|end-latent|>"])
