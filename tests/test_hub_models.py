"""Models named by a hub id, served here from a Hugging Face cache built in a temporary folder (offline): a dgrpo
checkpoint uploaded to the hub loads as its directory does, ``model.revision`` picks the revision, and a LoRA
adapter on a hub base records the commit it trained on and reloads its base there."""

import json
import shutil

import pytest
import torch

from dgrpo.config import Config, LoraConfig
from dgrpo.model.factory import load_model
from dgrpo.model.latent_lm import LatentLM, LatentSettings
from dgrpo.model.verified import CheckpointError

from conftest import make_lm

REPO = "tiny-org/latent-model"
#: two commits of REPO: "main" points to the newer, the tag "v1" to the older (other weights, other settings)
OLD, NEW = "1" * 40, "2" * 40


def snapshot(cache, commit):
    return cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit


@pytest.fixture
def hub_cache(tokenizer, tmp_path, monkeypatch):
    """The cache: OLD (seed 0, T = 2, its run config) and NEW (seed 1, T = 3), HF_HUB_OFFLINE set."""
    import huggingface_hub

    cache = tmp_path / "hub"
    for commit, seed, n_latent in ((OLD, 0, 2), (NEW, 1, 3)):
        lm = make_lm(tokenizer, seed=seed)
        lm.settings = LatentSettings(n_latent=n_latent)
        lm.run_config = {"seed": seed, "task": {"n_steps": 3 + seed}}
        lm.save_pretrained(snapshot(cache, commit))
    refs = snapshot(cache, OLD).parent.parent / "refs"
    refs.mkdir()
    (refs / "main").write_text(NEW)
    (refs / "v1").write_text(OLD)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def first_weight(lm):
    return next(lm.model.parameters()).detach().clone()


def test_a_dgrpo_checkpoint_on_the_hub_loads_its_latent_settings_and_run_config(hub_cache):
    """latent_config.json and run_config.json are read from the hub as from a directory (they were not: T = 0, no
    run config)."""
    lm = LatentLM.from_pretrained(REPO)
    local = LatentLM.from_pretrained(snapshot(hub_cache, NEW))
    assert lm.settings == local.settings and lm.settings.n_latent == 3
    assert lm.run_config == {"seed": 1, "task": {"n_steps": 4}}
    assert lm.name_or_path == REPO and lm.revision == NEW  # the commit "main" pointed to
    assert lm.hub_commit == NEW and local.hub_commit is None  # (results name the commit; a directory has none)
    assert torch.equal(first_weight(lm), first_weight(local))


def test_model_revision_picks_the_branch_tag_or_commit(hub_cache):
    cfg = Config()
    cfg.model.name_or_path = REPO
    at = {}
    for revision in ("", "main", "v1", OLD):
        cfg.model.revision = revision
        at[revision] = load_model(cfg.model, cfg.task, training=False)
    assert at[""].revision == at["main"].revision == NEW and at["v1"].revision == at[OLD].revision == OLD
    assert at["v1"].settings.n_latent == 2 and at["main"].settings.n_latent == 3
    assert torch.equal(first_weight(at["v1"]), first_weight(LatentLM.from_pretrained(snapshot(hub_cache, OLD))))
    assert not torch.equal(first_weight(at["v1"]), first_weight(at["main"]))
    cfg.model.revision = "v2"
    with pytest.raises(CheckpointError, match=r"at revision 'v2': .* is not at revision 'v2' \(other revisions are\)"):
        load_model(cfg.model, cfg.task, training=False)
    cfg.model.name_or_path = "tiny-org/base"  # a revision meant for the base, applied to --init: the line says why
    with pytest.raises(
        CheckpointError, match=rf"'v2'.* \(model.revision is the revision of the model loaded, {REPO}, "
    ):
        load_model(cfg.model, cfg.task, init=REPO, training=False)


def test_the_loading_options_set_for_the_built_in_model_are_warned_about(hub_cache):
    """model.revision and model.trust_remote_code with model.name_or_path=builtin-tiny (the default) were accepted
    and dropped without a word; with --init they name how to load it, and no warning is given."""
    import warnings

    cfg = Config()
    cfg.model.revision = "v1"
    with pytest.warns(UserWarning, match=r"^model.revision=v1 applies only to a model loaded from the hub or a dir"):
        load_model(cfg.model, cfg.task, training=False)
    cfg.model.trust_remote_code = True
    with pytest.warns(UserWarning, match=r"^model.revision=v1 and model.trust_remote_code=true apply only .*, and "):
        load_model(cfg.model, cfg.task, training=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_model(cfg.model, cfg.task, init=REPO, training=False).revision == OLD


def test_a_local_directory_ignores_the_revision(hub_cache):
    cfg = Config()
    cfg.model.revision = "v1"
    lm = load_model(cfg.model, cfg.task, init=str(snapshot(hub_cache, NEW)), training=False)
    assert lm.settings.n_latent == 3 and lm.revision is None


def test_an_adapter_on_a_hub_base_records_its_commit_and_reloads_the_base_there(hub_cache, tmp_path):
    """PEFT's ``revision`` field holds the commit the base was loaded at; the reload takes the base from that commit
    even after "main" moved on."""
    pytest.importorskip("peft")
    from dgrpo.model import lora

    lm = LatentLM.from_pretrained(REPO, revision="v1")
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    lm.save_pretrained(tmp_path / "adapter")
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == REPO and saved["revision"] == OLD
    again = LatentLM.from_pretrained(tmp_path / "adapter")
    assert again.revision == OLD and torch.equal(first_weight(again), first_weight(lm))
    shutil.rmtree(snapshot(hub_cache, OLD))  # the commit is gone from the cache: one line naming it
    with pytest.raises(CheckpointError, match=f"base model cannot be loaded .*at revision '{OLD}'"):
        LatentLM.from_pretrained(tmp_path / "adapter")


def test_a_lora_adapter_uploaded_to_the_hub_loads_with_its_base(hub_cache, tmp_path):
    """An adapter repository (adapter_config.json, adapter_model.safetensors) is an adapter when named by hub id."""
    pytest.importorskip("peft")
    from dgrpo.model import lora

    lm = LatentLM.from_pretrained(REPO)
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.1)
    adapter_repo = hub_cache / "models--tiny-org--adapter"
    lm.save_pretrained(adapter_repo / "snapshots" / ("3" * 40))
    (adapter_repo / "refs").mkdir()
    (adapter_repo / "refs" / "main").write_text("3" * 40)
    again = LatentLM.from_pretrained("tiny-org/adapter")
    assert again.peft is not None and again.name_or_path == REPO and again.revision == NEW
    assert again.hub_commit == "3" * 40  # the adapter repository's own commit (results name it), not its base's
    q, qm = again.encode_questions(["1 + 2 = ?"])
    t, tm = again.encode_targets(["3 #### 3"])
    with torch.no_grad():
        ours, theirs = (m.target_logprobs(q, qm, 3, t, tm)[0] for m in (again, lm))
    assert torch.equal(ours, theirs)
    # dgrpo export merges it by hub id too (it took a directory only)
    from dgrpo.cli import main

    assert main(["export", "tiny-org/adapter", "--merge", "--out", str(tmp_path / "merged")]) == 0
    merged = LatentLM.from_pretrained(tmp_path / "merged")
    assert merged.peft is None
    with torch.no_grad():
        assert torch.allclose(merged.target_logprobs(q, qm, 3, t, tm)[0], ours, atol=1e-5)


def test_a_lora_run_does_not_resume_onto_another_commit_of_its_hub_base(hub_cache, tmp_path):
    """The hub's "main" moved between the run's start and its resume: the adapter would have continued on other
    base weights without a word. A config error (not a damaged checkpoint: nothing is skipped or moved aside)."""
    pytest.importorskip("peft")
    from dgrpo.config import ConfigError
    from dgrpo.model import lora
    from dgrpo.training.checkpoint import read_checkpoint, save_checkpoint

    def adapted(revision):
        lm = LatentLM.from_pretrained(REPO, revision=revision)
        lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
        return lm, torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad])

    lm, opt = adapted("v1")
    ckpt = save_checkpoint(tmp_path, 1, lm=lm, optimizer=opt, state={"step": 1})
    read_checkpoint(ckpt, lm=lm, optimizer=opt)  # the same commit: loads
    moved, opt = adapted("main")
    with pytest.raises(ConfigError, match=f"at commit {OLD}, .* now at commit {NEW} .*model.revision = '{OLD}' and"):
        read_checkpoint(ckpt, lm=moved, optimizer=opt)


def test_dgrpo_eval_takes_a_hub_checkpoints_settings_at_its_revision(hub_cache):
    """The task and data settings eval takes from a checkpoint's run_config.json were read from local directories
    only."""
    from dgrpo.cli.evaluate import checkpoint_settings

    assert checkpoint_settings(REPO) == ({"model": {}, "task": {"n_steps": 4}, "data": {}, "eval": {}}, NEW)
    assert checkpoint_settings(REPO, "v1")[0]["task"] == {"n_steps": 3}
    with pytest.raises(CheckpointError, match="'tiny-org/not-there'"):  # (before the data are read without them)
        checkpoint_settings("tiny-org/not-there")


def test_dgrpo_eval_reads_settings_and_weights_at_one_commit(hub_cache, tmp_path, run_cli, monkeypatch):
    """eval resolved the branch once for the settings and again for the weights: ``main`` moving in between (here
    right after the first read) graded NEW's task with OLD's weights, and results.json named OLD."""
    import dgrpo.model.sources as sources

    read = sources.hub_snapshot

    def then_main_moves(*args, **kwargs):
        folder = read(*args, **kwargs)
        (snapshot(hub_cache, OLD).parent.parent / "refs" / "main").write_text(OLD)
        return folder

    monkeypatch.setattr(sources, "hub_snapshot", then_main_moves)
    r = run_cli("eval", "--model", REPO, "--data", "builtin:test", "--limit", 2, "--out", tmp_path / "ev")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "ev" / "results.json").read_text())["model"] == f"{REPO}@{NEW}"


@pytest.mark.slow
def test_dgrpo_eval_of_a_hub_model_under_a_runs_config_ignores_the_runs_base_commit(hub_cache, tmp_path, run_cli):
    """A run's config.json records the commit of its base model as model.revision: evaluating an upload of the run's
    model with it (``--config RUN/config.json``) asked the upload for the base's commit, which it does not have.
    The revision applies to --model when --set gives it or the config names that model."""
    config = tmp_path / "config.yaml"
    config.write_text(f"model:\n  name_or_path: base-org/base-model\n  revision: '{'3' * 40}'\n")
    args = ["eval", "--model", REPO, "--config", config, "--data", "builtin:test", "--limit", 2]
    with pytest.warns(UserWarning, match=r"model.revision=3{40} is the revision of the config's model.name_or_path"):
        r = run_cli(*args, "--out", tmp_path / "ev")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "ev" / "results.json").read_text())["model"] == f"{REPO}@{NEW}"
    r = run_cli(*args, "--set", "model.revision=v1", "--out", tmp_path / "ev1")  # given for it: applied
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "ev1" / "results.json").read_text())["model"] == f"{REPO}@{OLD}"
    r = run_cli(*args, "--set", "model={revision: v1}", "--out", tmp_path / "ev2")  # (the mapping form: the same)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "ev2" / "results.json").read_text())["model"] == f"{REPO}@{OLD}"
    from conftest import tiny_args

    sets = tiny_args(**{"grpo.steps": 1, "grpo.warmup_steps": 0, "data.test": "[]"})
    train = ["grpo", "--init", REPO, *sets, "--config", config]
    with pytest.warns(UserWarning, match=r"not applied to --init tiny-org/latent-model: --set model.revision=\.\.\."):
        r = run_cli(*train, "--out", tmp_path / "run")  # (--init: the same)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model"]["revision"] == NEW


def test_a_snapshot_without_its_weights_says_so(hub_cache):
    """An interrupted download (the configs cached, not the weights) said "Please do not set use_safetensors=True",
    an option the user never set."""
    (snapshot(hub_cache, NEW) / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no safetensors weights in its files in the Hugging Face cache \(an"):
        LatentLM.from_pretrained(REPO)
    # and how to complete it, at the commit whose files are there
    with pytest.raises(
        CheckpointError, match=rf": download it where there is network \(hf download {REPO} --revision {NEW}\)"
    ):
        LatentLM.from_pretrained(REPO)


def test_a_snapshot_missing_some_of_its_shards_names_them(hub_cache):
    """One shard of several gone from the cache said "no safetensors weights" (there were, in the other shards)."""
    folder = snapshot(hub_cache, NEW)
    lm = LatentLM.from_pretrained(folder)
    (folder / "model.safetensors").unlink()
    lm.model.save_pretrained(folder, max_shard_size="20KB")
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    assert len(shards) > 3
    for gone in (shards[1], shards[3]):
        gone.unlink()
    with pytest.raises(
        CheckpointError,
        match=rf"^cannot load the model {REPO}: 2 of the {len(shards)} safetensors shards its "
        rf"model.safetensors.index.json names are missing \({shards[1].name}, {shards[3].name}\) from its files in "
        rf"the Hugging Face cache \(an interrupted download\?\): download it .*\(hf download {REPO} --revision {NEW}\)",
    ):
        LatentLM.from_pretrained(REPO)


def test_a_snapshot_without_its_tokenizer_says_how_to_get_it(hub_cache):
    """A cached snapshot without tokenizer files was told to save the tokenizer beside the model (a local
    directory's advice, of a folder in the hub's cache)."""
    from dgrpo.model.tokens import check_hub_tokenizer

    for file in snapshot(hub_cache, NEW).glob("tokenizer*"):
        file.unlink()
    with pytest.raises(
        CheckpointError,
        match=rf"^model '{REPO}' at commit {NEW}: no tokenizer \(none of tokenizer.json, .*\) in its files in the "
        rf"Hugging Face cache .*: download it where there is network \(hf download {REPO} --revision {NEW}\) into",
    ):
        LatentLM.from_pretrained(REPO)
    # fetched from the hub (not cached): the repository has none at that commit
    with pytest.raises(
        CheckpointError, match=r"in the repository: download it \(hf download .* --local-dir DIR\), save"
    ):
        check_hub_tokenizer(REPO, snapshot(hub_cache, NEW), cached=False)


def test_import_coconut_refuses_a_hub_base_without_its_tokenizer(hub_cache):
    """import-coconut's --base read from a cached snapshot without tokenizer files got an empty tokenizer that
    transformers built from the model type (4 tokens: the latent markers and EOS; every question encoded as
    nothing), and the import failed later, asking whether --base was the run's base model."""
    from dgrpo.model.coconut_import import build_base

    assert len(build_base(REPO, False)[1]) > 100  # (its own tokenizer)
    for file in snapshot(hub_cache, NEW).glob("tokenizer*"):
        file.unlink()
    with pytest.raises(
        CheckpointError, match=rf"^model '{REPO}' at commit {NEW}: no tokenizer .*\(hf download {REPO} "
    ):
        build_base(REPO, False)


def test_a_model_missing_offline_says_how_to_get_it(hub_cache, monkeypatch):
    """Offline and not in the cache: the line said what was missing, not how to get it (the line without
    HF_HUB_OFFLINE did); and it named HF_HUB_OFFLINE when TRANSFORMERS_OFFLINE was the one set."""
    with pytest.raises(
        CheckpointError,
        match=r"HF_HUB_OFFLINE is set but .*: download it where there is network \(hf download tiny-org/absent\) "
        r"into this cache, or unset HF_HUB_OFFLINE$",
    ):
        LatentLM.from_pretrained("tiny-org/absent")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    with pytest.raises(
        CheckpointError, match=rf"TRANSFORMERS_OFFLINE is set .*\(hf download {REPO} --revision v2\) .*TRANSFORMERS_OFF"
    ):
        LatentLM.from_pretrained(REPO, revision="v2")


def test_the_snapshot_fetches_every_file_a_checkpoint_needs_but_its_weights(tokenizer, tmp_path):
    """What hub_snapshot fetches before the weights (its patterns, as huggingface_hub matches them) covers every file
    a dgrpo checkpoint and its tokenizer write: a chat template saved as chat_template.jinja was left out, and a
    checkpoint trained with data.chat_template lost it."""
    from fnmatch import fnmatch

    from dgrpo.model.sources import SMALL_FILES

    lm = make_lm(tokenizer)
    lm.tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    lm.save_pretrained(tmp_path / "ckpt")
    files = [str(p.relative_to(tmp_path / "ckpt")) for p in (tmp_path / "ckpt").rglob("*") if p.is_file()]
    assert "chat_template.jinja" in files
    weights = {"model.safetensors"}  # (from_pretrained fetches them, as transformers picks them)
    missed = [f for f in files if f not in weights and not any(fnmatch(f, pattern) for pattern in SMALL_FILES)]
    assert not missed, missed


def test_a_model_with_its_own_code_says_how_to_allow_it(tokenizer, tmp_path):
    """Without model.trust_remote_code, the line ended at transformers' "must be executed to correctly load the
    model" (its "pass trust_remote_code=True" is on a later line): it names the option. (Not loaded with it here:
    transformers would copy the code into the user's modules cache.)"""
    folder = tmp_path / "custom"
    make_lm(tokenizer).save_pretrained(folder)
    (folder / "configuration_custom.py").write_text(
        "from transformers import Qwen2Config\n\n\nclass CustomConfig(Qwen2Config):\n    model_type = 'custom_qwen'\n"
    )
    (folder / "modeling_custom.py").write_text(
        "from transformers import Qwen2ForCausalLM\n\nfrom .configuration_custom import CustomConfig\n\n\n"
        "class CustomForCausalLM(Qwen2ForCausalLM):\n    config_class = CustomConfig\n"
    )
    config = json.loads((folder / "config.json").read_text())
    config.update(
        model_type="custom_qwen",
        architectures=["CustomForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_custom.CustomConfig",
            "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM",
        },
    )
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "manifest.json").unlink()  # (a folder the user made: the manifest of what dgrpo wrote is not its)
    with pytest.raises(CheckpointError, match=r"custom code .*: allow it with --set model.trust_remote_code=true"):
        LatentLM.from_pretrained(folder)


@pytest.mark.slow
def test_a_run_on_a_hub_model_records_the_commit_it_loaded_and_resumes_unchanged(hub_cache, tmp_path, run_cli):
    """The commit was printed (and named in dgrpo eval's results.json) but the run's config.json recorded
    ``model.revision: ''``: the run could not be redone on the same weights from its config. The same command
    resumes it (the config compared is the recorded one); a run begun before the commit was recorded resumes too."""
    from conftest import tiny_args

    out = tmp_path / "run"
    sets = {"grpo.steps": 1, "grpo.warmup_steps": 0, "data.test": "[]"}
    args = ["grpo", "--init", REPO, "--out", out, *tiny_args(**sets)]
    r = run_cli(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    recorded = json.loads((out / "config.json").read_text())["model"]
    assert recorded["name_or_path"] == REPO and recorded["revision"] == NEW
    r = run_cli(*args)  # unchanged: the run is done, nothing to train, and no config change is reported
    assert r.returncode == 0 and "different config" not in r.stderr, r.stderr[-2000:]
    r = run_cli(*args, "--set", "model.revision=v1")  # other weights (as after "main" moved on): refused
    assert r.returncode == 2 and "a different config (model.revision)" in r.stderr, r.stderr[-2000:]
    assert f"(the run loaded its model at commit {NEW}: --set model.revision={NEW})" in r.stderr  # how to pin it
    config = json.loads((out / "config.json").read_text())
    config["model"]["revision"] = ""  # as a run written before dgrpo recorded the commit
    (out / "config.json").write_text(json.dumps(config))
    r = run_cli(*args)
    assert r.returncode == 0 and "different config" not in r.stderr, r.stderr[-2000:]


def test_dgrpo_eval_of_a_cached_hub_model_probes_the_hub_once(hub_cache, tmp_path, run_cli, monkeypatch):
    """Without HF_HUB_OFFLINE, eval probed the hub for the settings and again for the weights: on a network that
    drops packets it waited out the probe's timeout (3 s) twice. One probe now; its answer (unreachable: the cache)
    holds for both."""
    from dgrpo import hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    probes: list[tuple[str, int]] = []
    monkeypatch.setattr(hub, "_connects", lambda host, port, timeout: probes.append((host, port)) and False)
    r = run_cli("eval", "--model", REPO, "--data", "builtin:test", "--limit", 2, "--out", tmp_path / "ev")
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "ev" / "results.json").read_text())["model"] == f"{REPO}@{NEW}"  # (the cache's)
    assert len(probes) == 1, probes


@pytest.mark.slow
def test_the_commands_say_what_model_loads_and_from_where_before_its_weights_load(
    hub_cache, tmp_path, run_cli, monkeypatch
):
    """With transformers' progress bars off, dgrpo eval, sft and grpo printed nothing while a large hub model
    downloaded and loaded (minutes for a 1.5B model): the command looked hung. One line on rank 0 now says, before the
    weights load, which model loads from where: a directory, the hub cache, or a download (the cache lacks a weights
    file at the commit); none on torchrun's other ranks, none for the built-in model."""
    from dgrpo.model.hf_loading import hub_weights_cached, loading_line

    from conftest import tiny_args

    def said(*args):
        r = run_cli(*args)
        assert r.returncode == 0, r.stderr[-2000:]
        lines = r.stdout.splitlines()
        return [i for i, line in enumerate(lines) if line.startswith("dgrpo: loading")], lines

    at, lines = said("eval", "--model", REPO, "--data", "builtin:test", "--limit", 2, "--out", tmp_path / "e1")
    assert [lines[i] for i in at] == [f"dgrpo: loading {REPO} (from the hub cache) ..."]
    assert at[0] < min(i for i, line in enumerate(lines) if line.startswith("{"))  # (before the results)
    folder = snapshot(hub_cache, NEW)
    at, lines = said("eval", "--model", folder, "--data", "builtin:test", "--limit", 2, "--out", tmp_path / "e2")
    assert [lines[i] for i in at] == [f"dgrpo: loading {folder} (from {folder}) ..."]
    train = ["--out", tmp_path / "run", *tiny_args(**{"grpo.steps": 1, "grpo.warmup_steps": 0, "data.test": "[]"})]
    at, lines = said("grpo", "--init", REPO, *train)
    assert [lines[i] for i in at] == [f"dgrpo: loading {REPO} (from the hub cache) ..."]
    # (torchrun's other ranks say none: test_distributed's torchrun runs; a RANK without WORLD_SIZE is one process,
    # which says it: test_loading_edges)
    announced: list[str] = []
    cfg = Config()
    load_model(cfg.model, cfg.task, announce=announced.append)  # the built-in model: built, not loaded
    assert announced == []

    # the hub reachable (local_files_only False): a download unless the cache holds every weights file at the commit
    assert hub_weights_cached(REPO, NEW)
    assert loading_line(REPO, REPO, False, NEW) == f"dgrpo: loading {REPO} (from the hub cache) ..."
    lm = LatentLM.from_pretrained(folder)
    (folder / "model.safetensors").unlink()
    assert loading_line(REPO, REPO, False, NEW) == f"dgrpo: loading {REPO} (downloading from the hub) ..."
    assert loading_line(REPO, REPO, True, NEW) == f"dgrpo: loading {REPO} (from the hub cache) ..."  # (offline)
    lm.model.save_pretrained(folder, max_shard_size="20KB")
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and hub_weights_cached(REPO, NEW)
    shards[1].unlink()
    assert not hub_weights_cached(REPO, NEW)


def test_a_lora_adapters_loading_line_names_its_base_and_where_the_base_loads_from(hub_cache, tmp_path):
    """An adapter directory loads its base's weights (a hub id here): the line names both, and where the base's
    weights come from."""
    pytest.importorskip("peft")
    from dgrpo.model import lora

    lm = LatentLM.from_pretrained(REPO)
    lora.apply_lora(lm, LoraConfig(r=4, alpha=8.0))
    lm.save_pretrained(tmp_path / "adapter")
    announced: list[str] = []
    LatentLM.from_pretrained(tmp_path / "adapter", announce=announced.append)
    assert announced == [f"dgrpo: loading {tmp_path / 'adapter'} (a LoRA adapter on {REPO}, from the hub cache) ..."]
