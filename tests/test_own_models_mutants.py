"""Plug-in files, the hub probe, hub-id resolution, latent markers and the model factory: branches, error paths and
boundaries the first pass left unpinned (gaps found by a second pass of mutation testing)."""

from __future__ import annotations

import socket
import sys
from fnmatch import fnmatch

import pytest
import torch

from dgrpo import hub
from dgrpo.model import sources
from dgrpo.model.verified import CheckpointError
from dgrpo.plugins import PluginError, import_object


def test_a_plugin_file_that_exits_at_its_top_level_exits_again_when_named_again(tmp_path):
    """A file whose top level raises SystemExit (an argparse there) leaves no half-run module behind: named a
    second time (another option, the same file), it is the same one-line error, not the names it defined before
    exiting."""
    path = tmp_path / "script_like.py"
    path.write_text("def reward(text, gold):\n    return 1.0\n\nraise SystemExit(2)\n")
    for _ in range(2):
        with pytest.raises(PluginError, match=r"exited \(SystemExit: 2\)"):
            import_object(f"{path}:reward", "grpo.reward")
    assert not any(getattr(m, "__file__", None) == str(path.resolve()) for m in list(sys.modules.values()))


PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy")


@pytest.mark.parametrize(
    "error", [TimeoutError("timed out"), socket.gaierror(-3, "Temporary failure in name resolution")]
)
def test_a_probe_that_times_out_or_finds_no_address_is_unreachable(monkeypatch, error):
    """A machine without network fails the probe by a timeout (a firewall dropping packets) or a failed DNS lookup,
    not only by a refused connection: either is ``False`` (the cached model is read), never an exception."""
    for name in (*PROXIES, "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)

    def create_connection(address, timeout=None):
        raise error

    monkeypatch.setattr(socket, "create_connection", create_connection)
    assert hub.hub_reachable(timeout=0.1) is False


def test_without_an_endpoint_the_default_hub_is_probed_with_the_short_default_timeout(monkeypatch):
    """Without ``HF_ENDPOINT`` the probe opens huggingface.co:443; without a timeout given, it waits
    :data:`HUB_TIMEOUT_S`, a few seconds (not the libraries' ~50 s). (An empty one is an error: huggingface_hub
    takes it as written and fails on every request, ``test_hub_mutants``.)"""
    for name in (*PROXIES, "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    calls: list[tuple[str, int, float]] = []
    monkeypatch.setattr(hub, "_connects", lambda host, port, timeout: calls.append((host, port, timeout)) or True)
    assert hub.hub_reachable() is True
    assert calls == [("huggingface.co", 443, hub.HUB_TIMEOUT_S)]
    assert 0 < hub.HUB_TIMEOUT_S <= 5


def test_a_device_the_machine_lacks_is_one_line(monkeypatch):
    """``device: cuda`` without CUDA, and ``device: mps`` without Apple's GPU, are one CheckpointError line each
    before the model loads (torch failed later with a traceback)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CheckpointError, match=r"^device 'cuda' requested but CUDA is not available"):
        sources.resolve_device("cuda")
    with pytest.raises(CheckpointError, match=r"^device 'cuda:0' requested but CUDA is not available"):
        sources.resolve_device("cuda:0")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(CheckpointError, match=r"^device 'mps' requested but MPS \(Apple's GPU\) is not available"):
        sources.resolve_device("mps")
    assert sources.resolve_device("cpu") == torch.device("cpu")


def test_a_revision_of_a_repository_not_cached_at_all_is_said_to_be_missing_not_other_revisions(monkeypatch, tmp_path):
    """Offline, a hub id at a revision with nothing of the repository in the cache: 'not in the Hugging Face cache'
    (the 'other revisions are' wording is only for a repository whose other revisions are cached)."""
    import huggingface_hub
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda name, file, revision=None: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError) as caught:
        sources.resolve_hub_model("org/m", "v2")
    assert "is not in the Hugging Face cache" in str(caught.value)
    assert "other revisions" not in str(caught.value)


def test_a_checkpoint_dgrpo_wrote_whose_config_was_removed_says_it_is_damaged(tmp_path):
    """A model directory (not a run) with its manifest, config.json since removed: the manifest's line (damaged,
    the file missing, put it back), not only 'holds no model checkpoint'."""
    from dgrpo.model.verified import write_manifest

    folder = tmp_path / "ckpt"
    folder.mkdir()
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_text("{}")
    write_manifest(folder)
    (folder / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"ckpt is damaged: missing file config\.json \(removed since dgrpo"):
        sources.resolve_checkpoint(folder)


def test_a_run_directory_without_final_says_the_run_did_not_finish(tmp_path):
    """A run directory (its metrics.jsonl) with no final/: the line says the run did not finish and how to resume
    it or which of its checkpoints to name, not that the folder merely holds no model."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(CheckpointError, match=r"run directory without final/ \(the run did not finish: rerun"):
        sources.resolve_checkpoint(run)


@pytest.mark.parametrize("local_files_only", [True, False])
def test_a_hub_snapshot_reads_where_it_was_told_and_only_the_small_files(monkeypatch, tmp_path, local_files_only):
    """hub_snapshot hands ``local_files_only`` (the cache, when the hub cannot be reached or offline mode is on) and
    the revision to huggingface_hub, and fetches only :data:`SMALL_FILES` (no weights); its folder is returned."""
    import huggingface_hub

    seen: list[dict[str, object]] = []

    def snapshot_download(name, **kwargs):
        seen.append({"name": name, **kwargs})
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert sources.hub_snapshot("org/m", "v1", local_files_only) == tmp_path
    assert seen == [
        {
            "name": "org/m",
            "revision": "v1",
            "allow_patterns": list(sources.SMALL_FILES),
            "local_files_only": local_files_only,
        }
    ]
    weights = ("model.safetensors", "model-00001-of-00002.safetensors", "pytorch_model.bin")
    assert not any(fnmatch(w, p) for w in weights for p in sources.SMALL_FILES)


def test_the_latent_markers_are_added_as_special_tokens_that_decoding_drops(tokenizer):
    """The markers are special tokens: an answer's text decoded with special tokens dropped (as LatentLM.decode
    does before the reward reads it) holds none of them, and a text holding a marker encodes it as one token."""
    import copy

    from dgrpo.model.tiny import build_tiny_model
    from dgrpo.model.tokens import LATENT, LATENT_MARKERS, add_latent_tokens

    tok = copy.deepcopy(tokenizer)
    model = build_tiny_model("llama", len(tok), hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    assert add_latent_tokens(model, tok) == list(LATENT_MARKERS)
    ids = [tok.convert_tokens_to_ids(t) for t in LATENT_MARKERS]
    plain = tok("12", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids + plain, skip_special_tokens=True) == tok.decode(plain, skip_special_tokens=True)
    assert tok(f"1{LATENT}2", add_special_tokens=False)["input_ids"].count(ids[1]) == 1


def test_a_hub_snapshot_without_a_tokenizer_is_told_apart_by_where_it_was_read(tmp_path):
    """check_hub_tokenizer: a snapshot holding a vocabulary passes; one without, read from the cache, says to
    download the rest at its commit; fetched from the hub, says the repository has none and how to add one."""
    from dgrpo.model.tokens import check_hub_tokenizer

    snapshot = tmp_path / "abc123"
    snapshot.mkdir()
    with pytest.raises(CheckpointError, match=r"^model 'org/m' at commit abc123: no tokenizer .* in its files in the"):
        check_hub_tokenizer("org/m", snapshot, cached=True)
    with pytest.raises(CheckpointError, match=r"^model 'org/m' at commit abc123: no tokenizer .* in the repository"):
        check_hub_tokenizer("org/m", snapshot, cached=False)
    (snapshot / "tokenizer.json").write_text("{}")
    check_hub_tokenizer("org/m", snapshot, cached=True)
    check_hub_tokenizer("org/m", snapshot, cached=False)


def test_init_naming_the_built_in_model_is_refused_not_built(tmp_path, monkeypatch):
    """``--init builtin-tiny`` names no model to start from: load_model says so in one line instead of building a
    fresh untrained model in its place (a run 'initialised' from nothing, without a word)."""
    from dgrpo.config import Config, load_config
    from dgrpo.model import factory

    cfg = load_config(Config, "tiny.yaml", [])
    monkeypatch.chdir(tmp_path)  # (no folder of that name here)
    with pytest.raises(CheckpointError, match=r"^builtin-tiny is the untrained built-in model"):
        factory.load_model(cfg.model, cfg.task, init=sources.BUILTIN, training=False)


def test_compile_keeps_the_compiled_step_a_model_already_has():
    """model.compile on a model that already runs a compiled step (a trainer's second apply_speedups, the GRPO
    reference sharing it) keeps that step: a new one would compile the layers again."""
    from types import SimpleNamespace

    from dgrpo.config import ModelConfig
    from dgrpo.model import factory

    step = object()
    lm = SimpleNamespace(peft=None, compiled_layers=step)
    factory.compile_layers(lm, ModelConfig(compile=True))
    assert lm.compiled_layers is step


def test_the_built_in_model_starts_its_markers_as_the_config_says():
    """model.latent_token_init reaches the built-in model: ``coconut`` starts the three latent markers' rows as
    copies of ``<<``'s row, ``mean`` at the mean of the real tokens' rows (it was the mean whatever the option)."""
    from dgrpo.config import Config, load_config
    from dgrpo.model import factory
    from dgrpo.model.tokens import COCONUT_INIT_TOKEN, LATENT_MARKERS

    for init in ("coconut", "mean"):
        cfg = load_config(Config, "tiny.yaml", [f"model.latent_token_init={init}"])
        lm = factory.load_model(cfg.model, cfg.task, seed=0, training=False)
        w = lm.model.get_input_embeddings().weight.detach()
        src = lm.tokenizer.get_vocab()[COCONUT_INIT_TOKEN]
        markers = w[[lm.tokenizer.convert_tokens_to_ids(t) for t in LATENT_MARKERS]]
        assert torch.equal(markers, w[src].expand_as(markers)) == (init == "coconut")


def test_exactly_three_missing_shards_are_all_named_without_an_ellipsis(tmp_path, monkeypatch):
    """Three shards missing of five: all three named, no '...' (which says that more are missing than shown)."""
    import json

    shards = [f"model-0000{i}-of-00005.safetensors" for i in range(1, 6)]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict(zip("abcde", shards))}))
    for s in shards[3:]:
        (tmp_path / s).write_text("")
    monkeypatch.setattr(sources, "_cached_file", lambda name, file, revision: tmp_path / file)
    error = OSError(f"org/m does not appear to have a file named {shards[0]}.")
    assert sources.missing_weights(error, "org/m", None) == (
        f"3 of the 5 safetensors shards its model.safetensors.index.json names are missing ({', '.join(shards[:3])})"
    )


def test_a_model_named_by_its_unpadded_step_is_the_checkpoints_model(tmp_path):
    """``--init run/checkpoints/step-128`` (the step as a user writes it) resolves to the model the trainer wrote in
    ``step-00000128/model/``, read locally; it was 'checkpoint directory not found'."""
    model = tmp_path / "run" / "checkpoints" / "step-00000128" / "model"
    model.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (model / name).write_text("{}")
    (model.parent / "state.json").write_text("{}")
    assert sources.resolve_model_source(str(tmp_path / "run" / "checkpoints" / "step-128")) == (str(model), True)


def test_a_tokenizer_saved_as_tokenizersbackend_is_loaded_as_a_plain_tokenizer(tokenizer, tmp_path):
    """A folder whose tokenizer_config.json names TokenizersBackend (transformers 5's name for a plain
    ``tokenizers`` file) loads as PreTrainedTokenizerFast, not as the model type's tokenizer class."""
    import json

    from transformers import PreTrainedTokenizerFast

    from dgrpo.model.tokens import load_tokenizer

    tokenizer.save_pretrained(tmp_path)
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**settings, "tokenizer_class": "TokenizersBackend"}))
    loaded = load_tokenizer(str(tmp_path))
    assert type(loaded) is PreTrainedTokenizerFast
    assert loaded("12 + 34 = 46")["input_ids"] == tokenizer("12 + 34 = 46")["input_ids"]


def test_both_loading_options_for_the_built_in_model_are_warned_about_together():
    """model.revision and model.trust_remote_code both set for the built-in model: one warning naming both, in the
    plural ('apply', 'they are ignored')."""
    from dgrpo.config import ModelConfig
    from dgrpo.model import factory

    with pytest.warns(UserWarning) as caught:
        factory.warn_if_loading_options_are_set(ModelConfig(revision="v1", trust_remote_code=True))
    assert len(caught) == 1
    assert str(caught[0].message) == (
        "model.revision=v1 and model.trust_remote_code=true apply only to a model loaded from the hub or a directory: "
        "model.name_or_path is builtin-tiny, built here, and they are ignored"
    )


def test_an_adapter_targeting_modules_by_a_pattern_continues_without_a_mismatch_warning():
    """An adapter checkpoint whose target_modules is a pattern (peft's regex string, not a list) and whose rank,
    alpha and latent rows match model.lora is trained further without the 'differs from the checkpoint' warning,
    and model.lora keeps its own targets."""
    import warnings
    from types import SimpleNamespace

    from dgrpo.config import LoraConfig
    from dgrpo.model import factory, lora

    saved = SimpleNamespace(r=8, lora_alpha=16.0, target_modules=r".*\.(q_proj|v_proj)", trainable_token_indices=None)
    lm = SimpleNamespace(peft=SimpleNamespace(peft_config={lora.POLICY: saved}))
    cfg = LoraConfig(r=8, alpha=16.0, target_modules=["q_proj", "v_proj"], dropout=0.0, train_latent_tokens=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        factory.configure_lora(lm, cfg)
    assert (cfg.r, cfg.alpha, cfg.target_modules) == (8, 16.0, ["q_proj", "v_proj"])


def test_apply_speedups_applies_every_option_kernels_first(monkeypatch):
    """apply_speedups runs model.kernels first (the compiled step traces the layers it finds), then the compiled
    layers, the compiled head and the packed attention, each on the model and config given."""
    from types import SimpleNamespace

    from dgrpo.model import factory

    lm, cfg = SimpleNamespace(model="m"), SimpleNamespace(kernels="liger")
    calls: list[str] = []
    monkeypatch.setattr(factory, "apply_kernels", lambda model, kernels: calls.append(f"kernels {model}") or True)
    for name in ("compile_layers", "compile_head", "pack_gqa"):
        monkeypatch.setattr(
            factory, name, lambda lm_, cfg_, name=name: calls.append(name) if (lm_, cfg_) == (lm, cfg) else None
        )
    assert factory.apply_speedups(lm, cfg) == "liger"
    assert calls == ["kernels m", "compile_layers", "compile_head", "pack_gqa"]


def test_plugin_files_of_one_folder_put_it_on_sys_path_once(tmp_path, monkeypatch):
    """Two plug-in files of one folder, and an edited one imported again, add the folder to sys.path once (at its
    end), not once per import."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name, text in (("first.py", "A = 1\n"), ("second.py", "B = 2\n"), ("first.py", "A = 111\n")):
        (tmp_path / name).write_text(text)
        assert import_object(f"{tmp_path / name}:{text[0]}", "grpo.reward", kind="value") == int(text[4:-1])
    assert sys.path.count(str(tmp_path.resolve())) == 1
    assert sys.path[-1] == str(tmp_path.resolve())


def test_the_schemes_own_proxy_wins_over_all_proxy(monkeypatch):
    """https_proxy and ALL_PROXY both set: the hub libraries go through the scheme's own proxy, so that is probed."""
    for name in (*PROXIES, "HF_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALL_PROXY", "http://all.example:1111")
    monkeypatch.setenv("https_proxy", "http://own.example:2222")
    calls: list[tuple[str, int, float]] = []
    monkeypatch.setattr(hub, "_connects", lambda host, port, timeout: calls.append((host, port, timeout)) or True)
    assert hub.hub_reachable(timeout=1.0) is True
    assert calls == [("own.example", 2222, 1.0)]


def test_a_coconut_row_of_id_zero_is_copied(tokenizer):
    """``<<`` may be token 0: it is still Coconut's row (not 'no such token', which fell back to the mean), and
    init_new_embeddings copies row 0 into the new rows."""
    from types import SimpleNamespace

    from dgrpo.model.tiny import build_tiny_model
    from dgrpo.model.tokens import coconut_init_row, init_new_embeddings

    vocab = SimpleNamespace(get_vocab=lambda: {"<<": 0, "a": 1})
    assert coconut_init_row(vocab, 2) == 0
    model = build_tiny_model("llama", 6, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    init_new_embeddings(model, [4, 5], n_real=4, copy_of=0)
    w = model.get_input_embeddings().weight.detach()
    assert torch.equal(w[4], w[0]) and torch.equal(w[5], w[0])


def test_a_tokenizers_own_pad_token_is_kept_and_tokens_beyond_the_rows_are_named_by_id_range(tokenizer):
    """add_latent_tokens sets the pad token only when there is none (a tokenizer's own pad stays: padding with EOS
    changes what the model sees); tokens past the model's rows are warned about from the lowest id to the highest."""
    import copy

    from dgrpo.model.tiny import build_tiny_model
    from dgrpo.model.tokens import add_latent_tokens

    tok = copy.deepcopy(tokenizer)
    pad = tok.pad_token
    assert pad is not None and pad != tok.eos_token
    n = len(tok)
    model = build_tiny_model("llama", n - 4, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32)
    by_id = {i: t for t, i in tok.get_vocab().items()}
    with pytest.warns(UserWarning, match=r"beyond the model's") as caught:
        add_latent_tokens(model, tok)
    assert tok.pad_token == pad
    text = str(caught[0].message)
    assert (
        f"has 4 token(s) beyond the model's {n - 4} embedding rows (ids {n - 4} to {n - 1}, {by_id[n - 4]!r} first)"
        in text
    )


def test_the_tokens_beyond_the_rows_are_named_from_the_lowest_id_whatever_the_vocab_order():
    """A vocabulary not in id order (as get_vocab may return it): the warning counts the tokens past the rows (the
    latent markers aside) and names the lowest id, the highest and the lowest id's token."""
    from dgrpo.model.tokens import LATENT, _warn_tokens_beyond_rows

    vocab = {"z": 12, "ok": 1, "a": 10, LATENT: 13, "m": 11}
    with pytest.warns(UserWarning) as caught:
        _warn_tokens_beyond_rows(vocab, 10)
    assert "has 3 token(s) beyond the model's 10 embedding rows (ids 10 to 12, 'a' first)" in str(caught[0].message)
