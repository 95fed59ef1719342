"""Behaviour of this session's new checks that the earlier tests left open (each test kills a mutant that survived
them): a checkpoint's state.json sections and non-finite tensors, the run directory's writability and lock file, the
tokenizer files a checkpoint needs, what config.json tells before the weights load, and the user's copies in
OUT/checkpoints."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
import torch
from safetensors.torch import load_file, save_file

from dgrpo.config import ConfigError
from dgrpo.model.verified import CheckpointError, write_manifest
from dgrpo.training.checkpoint import StateSection, read_checkpoint, save_checkpoint

from conftest import make_lm

# ---------------------------------------------------------------------------------------------- state.json sections


class _StubLM:
    """What save_checkpoint and read_checkpoint use of a LatentLM: ``model``'s weights in model/model.safetensors
    (no adapter, on the CPU)."""

    checkpoint_files = ("model.safetensors",)
    peft, revision, device = None, None, "cpu"

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def save_pretrained(self, path: Path, state_dict=None, weights: bool = True) -> None:
        path.mkdir()
        save_file({k: v.detach().clone() for k, v in self.model.state_dict().items()}, str(path / "model.safetensors"))

    def read_weights_dir(self, path: Path) -> dict:
        return load_file(str(path / "model.safetensors"))


def _remanifest(ckpt: Path) -> None:
    (ckpt / "manifest.json").unlink()
    write_manifest(ckpt)


def test_a_state_json_without_a_whole_section_is_said_to_lack_it(tmp_path):
    """A section the command reads missing from state.json altogether: the line names it ("lacks loop"), as a
    missing step does (not a KeyError's text)."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    lm = _StubLM(torch.nn.Linear(2, 2))
    ckpt = save_checkpoint(tmp_path, 1, lm=lm, optimizer=opt, state={"trainer": {}})
    sections = {"trainer": StateSection({}), "loop": StateSection({})}
    with pytest.raises(CheckpointError, match=r"^state.json lacks loop$"):
        read_checkpoint(ckpt, lm=lm, optimizer=opt, sections=sections)


def test_a_sections_line_names_every_missing_and_unknown_key_sorted_and_a_long_value_cut():
    """Every key missing is named, and every unknown one, in sorted order (not the file's); a long value is quoted
    to its first 40 characters; a str field refuses null; a field annotated ``Optional[int]`` takes null."""

    @dataclass
    class Record:
        a: int = 0
        b: str = ""
        c: Optional[int] = None  # noqa: UP045 - the typing.Union spelling, as an older record may use

    section = StateSection.of(Record, ("a", "b"))
    assert section.optional == {"c": (int, type(None))}
    with pytest.raises(CheckpointError, match=r"^state.json: its r lacks a, b$"):
        section.check("r", {})
    with pytest.raises(CheckpointError, match=r"^state.json: its r holds y, z, which this dgrpo does not read"):
        section.check("r", {"a": 1, "b": "x", "z": 1, "y": 2})
    with pytest.raises(CheckpointError, match=r"^state.json: its r's b is null, not str$"):
        section.check("r", {"a": 1, "b": None})
    long = "x" * 100
    said = json.dumps(long)[:40]
    with pytest.raises(CheckpointError, match=f"^state.json: its r's a is {said}, not int$"):
        section.check("r", {"a": long, "b": ""})
    section.check("r", {"a": 1, "b": "", "c": None})


def test_a_section_of_a_dataclass_with_a_list_or_dict_field_checks_it_as_a_list_or_dict():
    """A record's ``list[int]`` or ``dict[str, float] | None`` field: checked as a list (a dict, or null); the check
    was a TypeError (isinstance takes no ``list[int]``), and every checkpoint was skipped as damaged."""

    @dataclass
    class Record:
        order: list[int]
        seen: dict[str, float] | None = None

    section = StateSection.of(Record, ("order",))
    section.check("r", {"order": [3, 1], "seen": {"a": 0.5}})
    section.check("r", {"order": [], "seen": None})
    with pytest.raises(CheckpointError, match=r"^state.json: its r's order is 3, not list$"):
        section.check("r", {"order": 3})
    with pytest.raises(CheckpointError, match=r"^state.json: its r's seen is \[\], not dict or null$"):
        section.check("r", {"order": [], "seen": []})


# ---------------------------------------------------------------------------------------------- non-finite tensors


class _TiedWithMask(torch.nn.Module):
    """Two names for one weight (``b.weight`` tied to ``a.weight``) and a persistent buffer of -inf (a mask)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(2, 2, bias=False), torch.nn.Linear(2, 2, bias=False)
        self.b.weight = self.a.weight
        self.register_buffer("mask", torch.full((2,), float("-inf")))


def test_the_models_weights_are_checked_under_every_name_and_its_buffers_are_not(tmp_path):
    """model/'s tensors: a buffer of -inf (a mask) is no damage; a NaN under the second name of a tied weight (a
    file that kept that name) is refused, naming it."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    lm = _StubLM(_TiedWithMask())
    ckpt = save_checkpoint(tmp_path, 1, lm=lm, optimizer=opt, state={})
    read_checkpoint(ckpt, lm=lm, optimizer=opt)
    weights = load_file(str(ckpt / "model" / "model.safetensors"))
    weights["b.weight"][0, 0] = float("nan")
    save_file(weights, str(ckpt / "model" / "model.safetensors"))
    _remanifest(ckpt)
    with pytest.raises(CheckpointError, match=r"^model/: b.weight holds NaN or infinite values$"):
        read_checkpoint(ckpt, lm=lm, optimizer=opt)


class _Counting(torch.optim.SGD):
    """An optimizer whose per-parameter state keeps counters: a Python int and an integer tensor."""

    def step(self, closure=None):
        super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["calls"] = self.state[p].get("calls", 0) + 1
                self.state[p]["seen"] = torch.tensor(self.state[p]["calls"], dtype=torch.int64)


def test_an_optimizer_state_with_integer_counters_reads(tmp_path):
    """Per-parameter state that is not a floating tensor (a Python int, an integer tensor) is no moment to check for
    NaN: the checkpoint reads (it was a traceback's line about ints, the previous checkpoint tried)."""
    p = torch.nn.Parameter(torch.ones(2))
    opt = _Counting([p], lr=0.1, momentum=0.9)
    p.grad = torch.ones(2)
    opt.step()
    lm = _StubLM(torch.nn.Linear(2, 2))
    ckpt = save_checkpoint(tmp_path, 1, lm=lm, optimizer=opt, state={})
    read_checkpoint(ckpt, lm=lm, optimizer=opt)


def test_a_nan_in_a_lora_checkpoints_adapter_is_refused_when_read(lora_base_dirs, tmp_path):
    """Under LoRA, model/ holds the adapter (its names are not the wrapped model's parameter names): a NaN in it is
    refused when the checkpoint is read, naming the tensor."""
    pytest.importorskip("peft")
    from dgrpo.config import LoraConfig
    from dgrpo.model import lora
    from dgrpo.model.latent_lm import LatentLM

    lm = LatentLM.from_pretrained(lora_base_dirs / "llama")
    lora.apply_lora(lm, LoraConfig(r=2, alpha=4.0))
    opt = torch.optim.SGD([p for p in lm.model.parameters() if p.requires_grad], lr=0.1)
    ckpt = save_checkpoint(tmp_path, 1, lm=lm, optimizer=opt, state={})
    read_checkpoint(ckpt, lm=lm, optimizer=opt)
    file = next((ckpt / "model").glob("*.safetensors"))
    weights = load_file(str(file))
    name = next(k for k in sorted(weights) if "lora_B" in k)
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, str(file), metadata={"format": "pt"})
    _remanifest(ckpt)
    with pytest.raises(CheckpointError, match=f"^model/: {name} holds NaN or infinite values$"):
        read_checkpoint(ckpt, lm=lm, optimizer=opt)


# ---------------------------------------------------------------------------------------------- the run directory


def _refused(monkeypatch, path: Path, refused_mode: int) -> None:
    """The system says ``path`` lacks the permissions ``refused_mode`` (as root, modes refuse nothing)."""
    from dgrpo.training import out_dir

    access = out_dir.os.access
    monkeypatch.setattr(
        out_dir.os, "access", lambda p, mode, **k: not (Path(p) == path and mode & refused_mode) and access(p, mode)
    )


def test_a_folder_writable_but_not_searchable_is_refused(tmp_path, monkeypatch):
    """A folder the user may write but not enter (no x bit): checkpoints/ takes no checkpoint and a folder in it is
    not removed, so each is refused like an unwritable one."""
    from dgrpo.training.out_dir import check_removable, check_run_writes

    (tmp_path / "checkpoints" / "step-00000001").mkdir(parents=True)
    _refused(monkeypatch, tmp_path / "checkpoints", os.X_OK)
    with pytest.raises(ConfigError, match="checkpoints belongs to .* is not writable to you: the run writes"):
        check_run_writes(tmp_path, "grpo", "auto", 0)
    monkeypatch.undo()
    _refused(monkeypatch, tmp_path / "checkpoints" / "step-00000001", os.X_OK)
    with pytest.raises(ConfigError, match="step-00000001 belongs to .* is not writable to you"):
        check_removable(tmp_path / "checkpoints", "--resume never")


def test_an_sft_run_does_not_refuse_an_unwritable_rollouts_file(tmp_path, monkeypatch):
    """rollouts.jsonl is GRPO's: an SFT run (whatever grpo.log_rollouts says) never appends to it, and is not
    refused for it."""
    from dgrpo.training.out_dir import check_run_writes

    (tmp_path / "rollouts.jsonl").write_text("")
    _refused(monkeypatch, tmp_path / "rollouts.jsonl", os.W_OK)
    _refused(monkeypatch, tmp_path, os.W_OK)  # (else GRPO replaces it with a file of its own)
    check_run_writes(tmp_path, "sft", "auto", 4)
    with pytest.raises(ConfigError, match="rollouts.jsonl belongs to"):
        check_run_writes(tmp_path, "grpo", "auto", 4)


def test_check_removable_checks_the_folder_itself_and_not_through_links(tmp_path, monkeypatch):
    """The folder to empty must itself be writable (its entries are removed from it); a link in it to another
    user's folder is removed as a link (that folder is not entered), and is no reason to refuse."""
    from dgrpo.training.out_dir import check_removable

    folder, elsewhere = tmp_path / "eval", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    (folder / "linked").symlink_to(elsewhere, target_is_directory=True)
    _refused(monkeypatch, folder / "linked", os.W_OK)
    check_removable(folder, "--resume never")
    monkeypatch.undo()
    _refused(monkeypatch, folder, os.W_OK)
    with pytest.raises(ConfigError, match=f"--resume never would delete {folder}, and {folder} belongs to"):
        check_removable(folder, "--resume never")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts this process's open files in /proc")
def test_a_fifo_at_the_lock_files_path_is_refused_without_leaking_its_descriptor(tmp_path):
    """The lock file's path a FIFO: refused in one line, the FIFO opened to look at it closed again (a long-lived
    process that retries, a notebook, kept one descriptor per refusal)."""
    from dgrpo.training.out_dir import RunLock

    os.mkfifo(tmp_path / ".lock")
    fd = os.open(tmp_path / ".lock", os.O_RDWR)  # (a reader and writer: opening it does not block)
    try:
        before = _open_fds()
        for _ in range(3):
            with pytest.raises(ConfigError, match="is not a regular file, where a run keeps its lock file"):
                RunLock(tmp_path)
        assert _open_fds() == before
    finally:
        os.close(fd)


def test_a_lock_file_replaced_as_it_was_locked_is_not_the_locks_to_remove(tmp_path, monkeypatch):
    """The lock file this lock made, removed and made again by another process before it was locked: the lock opens
    the new one, which is not its own: a refused run's release(remove=True) leaves it."""
    from dgrpo.training import out_dir

    calls = []
    still_there = out_dir.RunLock._still_there

    def replaced_once(self, fd):
        if not calls:
            calls.append(fd)
            self.path.unlink()
            self.path.write_text("")  # (another process's lock file)
            return False
        return still_there(self, fd)

    monkeypatch.setattr(out_dir.RunLock, "_still_there", replaced_once)
    lock = out_dir.RunLock(tmp_path)
    assert calls and not lock.created
    lock.release(remove=True)
    assert (tmp_path / ".lock").is_file()


def test_a_socket_at_the_lock_files_path_is_one_line(tmp_path, monkeypatch):
    """OUT/.lock a socket (it cannot be opened: ENXIO): one line, not an OSError traceback."""
    from dgrpo.training.out_dir import RunLock

    monkeypatch.chdir(tmp_path)  # (a socket's path is short: bound relative to here)
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(".lock")
        with pytest.raises(ConfigError, match=r"\.lock, the run directory's lock file, cannot be opened \(.*\): use"):
            RunLock(tmp_path)
    finally:
        sock.close()


def test_releasing_a_lock_whose_file_is_gone_removes_nothing_and_raises_nothing(tmp_path):
    """release(remove=True) after the lock file was removed (by the user, as the run was refused): no error over the
    refusal it follows."""
    from dgrpo.training.out_dir import RunLock

    lock = RunLock(tmp_path)
    (tmp_path / ".lock").unlink()
    lock.release(remove=True)


def test_a_users_copies_are_listed_sorted(tmp_path):
    """checkpoint_copies names a user's entries in OUT/checkpoints sorted, whatever order the folder lists them in
    (the refusal's line names them in that order)."""
    from dgrpo.run_layout import checkpoint_copies

    root = tmp_path / "checkpoints"
    root.mkdir()
    names = ["zz", "step-00000004-copy", "mine", "b", "a-copy", "step-00000009"]
    for name in names:
        (root / name).mkdir()
    assert checkpoint_copies(tmp_path) == sorted(set(names) - {"step-00000009"})


# ---------------------------------------------------------------------------------------------- before the weights


def test_a_missing_vocabulary_file_in_a_subfolder_is_judged_by_that_folder(tmp_path):
    """A checkpoint whose tokenizer is in a subfolder (``model/``): a ``merges.txt`` missing there beside a whole
    ``tokenizer.json`` is droppable (said so), judged by the files of that subfolder, not of the checkpoint's top."""
    from dgrpo.model.verified import check_intact

    sub = tmp_path / "ckpt" / "model"
    sub.mkdir(parents=True)
    for name, text in (("tokenizer.json", "{}"), ("vocab.json", "{}"), ("merges.txt", "#version: 0.2\n")):
        (sub / name).write_text(text)
    write_manifest(tmp_path / "ckpt")
    (sub / "merges.txt").unlink()
    with pytest.raises(CheckpointError, match=r"missing file model/merges.txt \(changed since dgrpo wrote it"):
        check_intact(tmp_path / "ckpt")


def test_a_folder_without_a_vocabulary_says_a_vocab_json_needs_its_merges(tmp_path):
    """No vocabulary file at all: the line lists what would do, a ``vocab.json`` with the ``merges.txt`` it needs."""
    from dgrpo.model.tokens import load_tokenizer

    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(CheckpointError) as e:
        load_tokenizer(str(tmp_path))
    assert "(none of tokenizer.json, vocab.json with merges.txt, vocab.txt, *.model, *.tiktoken)" in str(e.value)


@pytest.mark.parametrize(
    ("config", "rows"),
    [
        ({"vocab_size": 319}, 319),
        ({"text_config": {"vocab_size": 77}}, 77),  # (a multimodal config's)
        ({"vocab_size": 319, "auto_map": {"AutoModel": "m.M"}}, None),  # (its own code may size it otherwise)
        ({"vocab_size": True}, None),
        ({"vocab_size": 0}, None),
        ({"vocab_size": "319"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_config_rows(config, rows):
    """The embedding rows config.json says: its vocab_size (a text_config's), a positive integer; None otherwise, or
    for a model that runs its own code."""
    from dgrpo.model.hf_loading import config_rows

    assert config_rows(config) == rows


def test_model_config_of_a_config_json_that_is_no_object_is_none(tmp_path):
    """A config.json holding a JSON list (or other non-object): None, as when it cannot be read (the load says
    why), never a list handed to the checks."""
    from dgrpo.model.hf_loading import model_config

    (tmp_path / "config.json").write_text("[1, 2]")
    assert model_config(str(tmp_path), None, True) is None
    (tmp_path / "config.json").write_text('{"vocab_size": 5}')
    assert model_config(str(tmp_path), None, True) == {"vocab_size": 5}


@pytest.mark.parametrize("dropout", ["high", [0.1]])
def test_a_config_attention_dropout_that_is_no_number_is_left_to_transformers(dropout):
    """config.json's attention_dropout not a number (a string, a list): the compile check refuses nothing (it is
    not its to say: transformers' load does), rather than a ValueError or TypeError traceback."""
    from dgrpo.model.compiled_layers import check_compilable_config

    check_compilable_config({"model_type": "llama", "attention_dropout": dropout})


def _plain_dir(tokenizer, folder: Path) -> Path:
    """A plain transformers model saved with its tokenizer (no latent markers: not a dgrpo checkpoint)."""
    from dgrpo.model.tiny import build_tiny_model

    model = build_tiny_model("llama", len(tokenizer), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("rows_said", [True, False])
def test_a_plain_models_tokenizer_is_not_held_to_dgrpos_markers(tokenizer, tmp_path, monkeypatch, rows_said):
    """A plain model (no latent_config.json) loads, its markers added: its tokenizer is not checked as dgrpo's,
    whether config.json says the rows or not (a model of its own code: the check would come after loading)."""
    from dgrpo.model import latent_lm

    if not rows_said:
        monkeypatch.setattr(latent_lm, "config_rows", lambda config: None)
    lm = latent_lm.LatentLM.from_pretrained(_plain_dir(tokenizer, tmp_path / "plain"))
    assert lm.new_latent_tokens


def test_a_tokenizer_past_the_rows_is_refused_once_loaded_when_config_json_does_not_say_them(
    tokenizer, tmp_path, monkeypatch
):
    """A dgrpo checkpoint whose tokenizer has tokens past the model's embedding rows (another tokenizer saved over
    its own), config.json not saying the rows (a model that runs its own code): refused against the model loaded,
    not loaded with random rows for those tokens."""
    from dgrpo.model import latent_lm

    monkeypatch.setattr(latent_lm, "config_rows", lambda config: None)
    lm = make_lm(tokenizer)
    rows = lm.model.get_input_embeddings().weight.shape[0]
    lm.save_pretrained(tmp_path / "ckpt")
    lm.tokenizer.add_tokens(["<extra-1>", "<extra-2>"])
    lm.tokenizer.save_pretrained(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=f"it has 2 tokens past the model's {rows} embedding rows"):
        latent_lm.LatentLM.from_pretrained(tmp_path / "ckpt")


def test_an_adapter_whose_tokenizer_has_no_eos_is_refused_before_its_base_loads(tokenizer, tmp_path, monkeypatch):
    """A LoRA adapter directory whose tokenizer has no EOS token: one CheckpointError line before its base's weights
    load (as a full checkpoint's), not once they have."""
    pytest.importorskip("peft")
    from dgrpo.config import LoraConfig
    from dgrpo.model import latent_lm, lora

    base = make_lm(tokenizer, "llama")
    base.save_pretrained(tmp_path / "base")
    base.name_or_path = str(tmp_path / "base")
    lora.apply_lora(base, LoraConfig(r=2, alpha=4.0))
    base.save_pretrained(tmp_path / "adapter")
    settings = json.loads((tmp_path / "adapter" / "tokenizer_config.json").read_text())
    (tmp_path / "adapter" / "tokenizer_config.json").write_text(json.dumps({**settings, "eos_token": None}))
    (tmp_path / "adapter" / "manifest.json").unlink(missing_ok=True)

    def load_hf_model(path, *args, **kwargs):
        raise AssertionError(f"the weights of {path} were loaded")

    monkeypatch.setattr(latent_lm, "load_hf_model", load_hf_model)
    with pytest.raises(CheckpointError, match=r"adapter: the tokenizer has no EOS token"):
        latent_lm.LatentLM.from_pretrained(tmp_path / "adapter")


def test_a_sections_float_field_refuses_nan_and_infinity_that_json_reads():
    """Python's json reads ``NaN`` and ``Infinity`` as floats: a checkpoint whose ``loop``/``trainer`` held one (an
    EMA baseline of NaN: every REINFORCE advantage NaN once the weights were applied) passed the type check. It is
    refused when read; a finite float, and a JSON integer for a float field, are not."""

    @dataclass
    class Record:
        baseline: float = 0.0

    section = StateSection.of(Record, ("baseline",))
    for text, said in (("NaN", "nan"), ("Infinity", "inf"), ("-Infinity", "-inf")):
        with pytest.raises(CheckpointError, match=f"^state.json: its r's baseline is {said}, not a finite number$"):
            section.check("r", json.loads(f'{{"baseline": {text}}}'))
    section.check("r", {"baseline": 0.25})
    section.check("r", {"baseline": 3})
