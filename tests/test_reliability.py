"""What the README's reliability section promises: every bad input is exit code 2 and one line naming what is wrong
(no traceback); a run that stops learning stops with a clear line (exit 1); one run per directory; damaged or
incomplete checkpoints are detected (strict loading, manifests, atomic writes) and never loaded; nothing from a
checkpoint is ever unpickled."""

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dgrpo.model.latent_lm import LatentLM

from conftest import dgrpo, files_state, make_lm, tiny_args, tiny_config, wait_until

READ_ONLY = Path("/sys/dgrpo-read-only-out")  # unwritable even for root


@pytest.fixture(scope="module")
def damaged(sft_checkpoint, tmp_path_factory):
    """Copies of the SFT checkpoint, each damaged one way (manifest kept or rewritten to match the damage)."""
    from dgrpo.model.verified import write_manifest

    root = tmp_path_factory.mktemp("damaged")

    def copy(name: str, rewrite_manifest: bool, damage) -> Path:
        d = root / name
        shutil.copytree(sft_checkpoint, d)
        damage(d)
        if rewrite_manifest:
            write_manifest(d)  # as if the damage had been written through dgrpo itself: the manifest cannot tell
        return d

    def truncate(d):
        data = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(data[: len(data) // 2])

    def drop_tensor(d):
        from safetensors.torch import load_file, save_file

        state = load_file(str(d / "model.safetensors"))
        state.pop(sorted(k for k in state if "layers.1.mlp" in k)[0])
        save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})

    def wrong_shape(d):
        from safetensors.torch import load_file, save_file

        state = load_file(str(d / "model.safetensors"))
        k = sorted(k for k in state if "layers.0.mlp.down_proj" in k)[0]
        state[k] = torch.zeros(3, 3)
        save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})

    def pickle_weights(d):
        from safetensors.torch import load_file

        torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")
        (d / "model.safetensors").unlink()

    def flip_byte(d):
        data = bytearray((d / "model.safetensors").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (d / "model.safetensors").write_bytes(bytes(data))

    return {
        "truncated": copy("truncated", True, truncate),
        "empty": copy("empty", True, lambda d: (d / "model.safetensors").write_bytes(b"")),
        "bad-json": copy("bad-json", True, lambda d: (d / "config.json").write_text("{not json")),
        "no-tokenizer": copy("no-tokenizer", True, lambda d: [(d / f).unlink() for f in ("tokenizer.json",)]),
        "dropped-tensor": copy("dropped-tensor", True, drop_tensor),
        "wrong-shape": copy("wrong-shape", True, wrong_shape),
        "pickle-weights": copy("pickle-weights", True, pickle_weights),
        "flipped-byte": copy("flipped-byte", False, flip_byte),
        "manifest-empty": copy(
            "manifest-empty", False, lambda d: (drop_tensor(d), (d / "manifest.json").write_text("{}"))
        ),
    }


DAMAGED = (
    "truncated",
    "empty",
    "bad-json",
    "no-tokenizer",
    "dropped-tensor",
    "wrong-shape",
    "pickle-weights",
    "flipped-byte",
    "manifest-empty",
)


def bad_inputs(tmp: Path, ckpt: Path, damaged: dict) -> dict[str, tuple[list, str]]:
    """case -> (argv, what the one line must name); the files the cases name are written by the test."""
    out = ["--out", tmp / "o"]
    grpo = ["grpo", "--init", ckpt, *tiny_args()]
    sft = ["sft", *tiny_args()]
    ev = ["eval", "--model", ckpt, "--data", "builtin:test", "--set", "task.n_test=16"]
    rows = {
        "yaml-not-utf8": ([*sft, "--config", tmp / "latin1.yaml", *out], "not UTF-8"),
        "weight-decay-negative": ([*sft, "--set", "sft.weight_decay=-1", *out], "sft.weight_decay"),
        "weight-decay-nan": ([*grpo, "--set", "grpo.weight_decay=nan", *out], "grpo.weight_decay"),
        "lr-inf": ([*grpo, "--set", "grpo.lr=inf", *out], "grpo.lr"),
        "layers-99": ([*grpo, "--set", "perturbation.layers=99", *out], "perturbation.layers"),
        "layers-abc": ([*grpo, "--set", "perturbation.layers=abc", *out], "perturbation.layers"),
        "layers-1:2:3": ([*grpo, "--set", "perturbation.layers=1:2:3", *out], "perturbation.layers"),
        "gaussian-weights-residual": (
            [*grpo, "--set", "perturbation.kind=gaussian", "--set", "perturbation.gaussian_target=weights"]
            + ["--set", "perturbation.sites=[residual]", *out],
            "perturbation.sites",
        ),
        "seed-1e30": ([*sft, "--set", "seed=1e30", *out], "seed"),
        "device-tpu": ([*sft, "--set", "device=tpu", *out], "device"),
        "grpo-out-is-a-file": ([*grpo, "--out", tmp / "a-file"], "not a directory"),
        "sft-out-is-a-file": ([*sft, "--out", tmp / "a-file"], "not a directory"),
        "eval-out-is-a-file": ([*ev, "--out", tmp / "a-file"], "not a directory"),
        "sft-out-read-only": ([*sft, "--out", READ_ONLY], "cannot write"),
        "eval-out-read-only": ([*ev, "--out", READ_ONLY], "cannot write"),
        "model-path-missing": ([*sft, "--set", f"model.name_or_path={tmp / 'nope'}", *out], "not found"),
        "n-train-0": ([*sft, "--set", "data.train=builtin:train?n_train=0", *out], "n_train"),
        "n-train-negative": ([*sft, "--set", "data.train=builtin:train?n_train=-3", *out], "n_train"),
        "shots-negative": ([*ev, "--plain", "--shots", "-1", *out], "eval.shots"),
        "max-grad-norm-nan": ([*sft, "--set", "sft.max_grad_norm=nan", *out], "sft.max_grad_norm"),
        "eval-n-latent-huge": ([*ev, "--set", "eval.n_latent=100000", *out], "eval.n_latent"),
        "grpo-n-latent-huge": ([*grpo, "--set", "grpo.n_latent=100000", *out], "grpo.n_latent"),
        "eval-no-records": ([*ev, "--plain", "--shots", "16", *out], "nothing to evaluate"),
        "shots-without-plain": ([*ev, "--shots", "2", *out], "--shots"),
        "split-of-a-file": (
            ["eval", "--model", ckpt, "--data", tmp / "latin1.yaml", "--split", "train", *out],
            "--split",
        ),
        "hub-id-unreachable": (
            ["eval", "--model", "some-org/no-such-model", "--data", "builtin:test", *out],
            "some-org/no-such-model",
        ),
    }
    for name in DAMAGED:
        rows[f"eval-{name}"] = (["eval", "--model", damaged[name], "--data", "builtin:test", *out], name)
        rows[f"init-{name}"] = (["grpo", "--init", damaged[name], *tiny_args(), *out], name)
    return rows


CASES = list(bad_inputs(Path("/unused"), Path("/unused"), {n: Path("/unused") / n for n in DAMAGED}))


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_exit_2_and_one_line_naming_it(case, tmp_path, sft_checkpoint, damaged, run_cli, monkeypatch):
    (tmp_path / "latin1.yaml").write_bytes("grpo: {lr: 1e-5}  # caf\xe9\n".encode("latin-1"))
    (tmp_path / "a-file").write_text("")
    argv, needle = bad_inputs(tmp_path, sft_checkpoint, damaged)[case]
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # (the hub, unreachable: nothing listens there)
    tried = connections_tried(monkeypatch)
    r = run_cli(*argv)
    assert r.returncode == 2, (case, r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], (case, r.stderr)
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "o" / "final").exists()
    # an unreachable hub fails at once: its probe's one connection, not the hub libraries' retries (a wall-clock
    # bound failed on a busy machine); no other case tries the network
    probe = [(what, "127.0.0.1", 9, "dgrpo/hub.py") for what in ("lookup", "connect")]
    assert tried == (probe if case == "hub-id-unreachable" else []), tried


def connections_tried(monkeypatch) -> list[tuple[str, str, int, str]]:
    """What this process tries on the network from now on (the test's end restores the socket module): (lookup or
    connect, host, port, the file that asked) for each name looked up (``getaddrinfo``: every connection by name, the
    hub libraries' too, makes one first, which fails at once without DNS) and each address connected to."""
    import socket
    import traceback

    tried: list[tuple[str, str, int, str]] = []
    lookup, connect = socket.getaddrinfo, socket.socket.connect

    def asked(what: str, host: str, port: int) -> None:
        frame = next(f for f in reversed(traceback.extract_stack()[:-2]) if Path(f.filename).name != "socket.py")
        tried.append((what, host, port, "/".join(Path(frame.filename).parts[-2:])))  # (dgrpo/hub.py: the probe)

    def logged_lookup(host, port, *a, **kw):
        asked("lookup", host, port)
        return lookup(host, port, *a, **kw)

    def logged_connect(self, address):
        if isinstance(address, tuple):  # (an IP address and port, not a Unix socket's path)
            asked("connect", *address[:2])
        return connect(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", logged_lookup)
    monkeypatch.setattr(socket.socket, "connect", logged_connect)
    return tried


def test_layers_slice_forms_are_accepted_through_set(sft_checkpoint, tmp_path, run_cli):
    """`1:2` was read as the base-60 number 62; `-2:` was rejected. Both are slices now."""
    from dgrpo.model.anatomy import select_layers

    assert select_layers(tiny_config(**{"perturbation.layers": "1:2"}).perturbation.layers, 2) == [1]
    assert select_layers(tiny_config(**{"perturbation.layers": "-1:"}).perturbation.layers, 2) == [1]
    r = run_cli(
        "grpo",
        "--init",
        sft_checkpoint,
        *tiny_args(**{"grpo.steps": 1, "perturbation.layers": "-1:"}),
        "--out",
        tmp_path / "o",
    )
    assert r.returncode == 0, r.stderr[-2000:]


# ----------------------------------------------------------------------------------- a run that stops learning
def test_lr_inf_is_refused_and_nan_weights_stop_the_run(sft_checkpoint, monkeypatch):
    """lr=inf used to pass validation, make every weight NaN at step 1 and end with exit 0 after all steps were
    silently skipped. The value is refused now; and weights that become non-finite in a step stop the run."""
    from dgrpo.config import ConfigError
    from dgrpo.data.synthetic import generate_split
    from dgrpo.training import grpo
    from dgrpo.training.guards import NonFiniteError

    with pytest.raises(ConfigError, match="grpo.lr"):
        tiny_config(**{"grpo.lr": "inf"})
    cfg = tiny_config(**{"grpo.filter": "false", "perturbation.p": "0.3", "grpo.prompts_per_step": "4"})
    tr = grpo.GRPOTrainer(LatentLM.from_pretrained(sft_checkpoint), cfg, generate_split(cfg.task, "train"))
    real_step = tr.opt.step

    def poisoned_step(*a, **kw):
        out = real_step(*a, **kw)
        with torch.no_grad():
            next(tr.lm.model.parameters()).fill_(float("nan"))
        return out

    monkeypatch.setattr(tr.opt, "step", poisoned_step)
    with pytest.raises(NonFiniteError, match="weights became non-finite"):
        tr.step()


@pytest.mark.slow
def test_every_group_filtered_warns_then_stops_with_exit_1(sft_checkpoint, tmp_path):
    """Deterministic rollouts: every group is filtered out at every step. The log warns, the metrics carry the
    streak, and past grpo.max_skip_streak the run stops (state saved) with one line and exit code 1."""
    over = {"perturbation.kind": "none", "grpo.steps": 30, "grpo.max_skip_streak": 12, "grpo.eval_every": 0}
    r = dgrpo("grpo", "--init", sft_checkpoint, *tiny_args(**over), "--out", tmp_path / "o")
    assert r.returncode == 1, r.stderr[-2000:]
    assert "filtered out for 10 steps in a row" in r.stdout + r.stderr  # the warning, naming the window
    assert "filter window [0.2, 0.95])" in r.stdout + r.stderr  # (it said 'None', a metric nothing set)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("dgrpo: error:") and "12 steps in a row" in last and "max_skip_streak" in last
    rows = [json.loads(x) for x in (tmp_path / "o" / "metrics.jsonl").read_text().splitlines() if '"reward_mean"' in x]
    assert [row["skip_streak"] for row in rows] == list(range(1, 13))
    assert (tmp_path / "o" / "checkpoints").is_dir() and not (tmp_path / "o" / "final").exists()
    saved = sorted((tmp_path / "o" / "checkpoints").iterdir())[-1]
    assert saved.name == "step-00000012" and f"state saved in {saved};" in last  # (the checkpoint, named: 1-based)


# ----------------------------------------------------------------------------------- one run per directory
@pytest.mark.slow
def test_a_second_command_on_the_same_out_is_refused_naming_the_pid(sft_checkpoint, tmp_path, run_cli):
    out = tmp_path / "run"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dgrpo",
            "grpo",
            "--init",
            str(sft_checkpoint),
            "--out",
            str(out),
            *tiny_args(**{"grpo.steps": 500, "grpo.eval_every": 0}),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(  # (its metrics.jsonl: it holds the lock, in its steps)
            lambda: (out / "metrics.jsonl").exists(), first, "the first run did not start", lambda: files_state(out)
        )
        r = run_cli("grpo", "--init", sft_checkpoint, *tiny_args(**{"seed": 1}), "--out", out)
        assert r.returncode == 2 and f"PID {first.pid}" in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert json.loads((out / "config.json").read_text())["seed"] == 0  # the first run's files are untouched
    finally:
        first.kill()
        first.wait()
    # the OS released the lock with the process: the directory can be used again (here: resumed)
    r = run_cli(
        "grpo",
        "--init",
        sft_checkpoint,
        *tiny_args(**{"grpo.steps": 500, "grpo.eval_every": 0}),
        "--out",
        out,
        "--set",
        "grpo.steps=1",
        "--resume",
        "never",
    )
    assert r.returncode == 0, r.stderr[-2000:]


# ----------------------------------------------------------------------------------- checkpoints
def test_damaged_checkpoints_are_never_loaded(damaged):
    from dgrpo.model.verified import CheckpointError

    for name, d in damaged.items():
        with pytest.raises(CheckpointError) as e:
            LatentLM.from_pretrained(d)
        assert "\n" not in str(e.value), name
        if name == "flipped-byte":  # a file changed after dgrpo wrote it (HF tools re-saving it, say): how to accept it
            assert "changed since dgrpo wrote it; if the change is yours, delete manifest.json" in str(e.value)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("n_latent", "3", "n_latent must be a non-negative integer, not '3'"),
        ("markers", "false", "markers must be true or false, not 'false'"),  # the text "false" read as true
        ("c_thought", 1.5, "c_thought must be a positive integer, not 1.5"),
        ("mode", "coconutt", "mode 'coconutt' is not one of coconut, pause, cot, no_cot, plain"),
        (None, [1], "it holds a JSON list, not an object"),
    ],
)
def test_a_hand_edited_latent_config_is_checked_when_read(sft_checkpoint, tmp_path, key, value, message):
    from dgrpo.model.verified import CheckpointError

    d = tmp_path / "edited"
    shutil.copytree(sft_checkpoint, d)
    (d / "manifest.json").unlink()  # what the checksum message tells a user who edited a file to do
    settings = json.loads((d / "latent_config.json").read_text())
    (d / "latent_config.json").write_text(json.dumps(value if key is None else {**settings, key: value}))
    with pytest.raises(CheckpointError, match=f"{d / 'latent_config.json'} is not valid: .*{message}"):
        LatentLM.from_pretrained(d)


@pytest.mark.parametrize(
    "swap, says",
    [
        ("base", "(316 tokens, 319 embedding rows) is not the one dgrpo saved with it: it lacks the latent markers <|"),
        ("more", "(329 tokens, 319 embedding rows) is not the one dgrpo saved with it: it has 10 tokens past the"),
    ],
)
def test_a_checkpoint_whose_tokenizer_was_replaced_is_one_line(tokenizer, tmp_path, swap, says):
    """A checkpoint's tokenizer replaced (the base model's copied over it, manifest.json deleted as the checksum line
    says) loaded: the markers were added anew at the ids of their trained rows, which were overwritten with the
    mean (dgrpo eval then called the model 'a plain LM'); tokens past the rows got random ones."""
    import copy

    from dgrpo.model.verified import CheckpointError

    lm = make_lm(tokenizer, "llama")
    lm.save_pretrained(tmp_path / "ckpt")
    (tmp_path / "ckpt" / "manifest.json").unlink()
    other = copy.deepcopy(tokenizer if swap == "base" else lm.tokenizer)  # (the task tokenizer has no markers)
    other.add_tokens([f"extra{i}" for i in range(10 if swap == "more" else 0)])
    other.save_pretrained(tmp_path / "ckpt")
    with pytest.raises(CheckpointError) as e:
        LatentLM.from_pretrained(tmp_path / "ckpt")
    message = str(e.value)
    assert message.startswith(f"cannot load the model {tmp_path / 'ckpt'}: its tokenizer ") and says in message
    assert message.endswith("copy back the tokenizer files saved with the checkpoint") and "\n" not in message
    lm.tokenizer.save_pretrained(tmp_path / "ckpt")  # its own tokenizer back: it loads, the markers' rows its own
    again = LatentLM.from_pretrained(tmp_path / "ckpt")
    assert again.new_latent_tokens == [] and torch.equal(again.model.lm_head.weight, lm.model.lm_head.weight)


@pytest.mark.parametrize(
    "weights, says",
    [
        (
            "llama",  # under a config of wider MLPs
            "has wrong-shape tensors (the weights' vs LlamaForCausalLM's): model.layers.0.mlp.down_proj.weight "
            "(32, 64) vs (32, 128), model.layers.0.mlp.gate_proj.weight (64, 32) vs (128, 32), "
            "model.layers.0.mlp.up_proj.weight (64, 32) vs (128, 32), ... (6 in all): its weights do not fit its "
            "config.json (LlamaForCausalLM); put back",
        ),
        (
            "gpt2",  # under a Llama config
            "has missing tensors: lm_head.weight, model.embed_tokens.weight, model.layers.0.input_layernorm.weight, "
            "... (21 in all); it holds others LlamaForCausalLM has no place for: transformer.h.0.attn.c_attn.bias, ",
        ),
    ],
)
def test_weights_under_another_models_config_are_one_line(tokenizer, tmp_path, weights, says):
    """A checkpoint's config.json of another model: wrong shapes raised transformers' 'You set
    `ignore_mismatched_sizes` to `False` ... look at the above report!', naming no tensor, and every failure printed
    transformers' load report first (a table, a line per tensor, 30 lines for GPT-2 weights under a Llama config)."""
    import logging

    from dgrpo.model.verified import CheckpointError

    make_lm(tokenizer, weights).save_pretrained(tmp_path / "ckpt")
    make_lm(tokenizer, "llama", intermediate_size=128).save_pretrained(tmp_path / "other")
    shutil.copy(tmp_path / "other" / "config.json", tmp_path / "ckpt" / "config.json")
    (tmp_path / "ckpt" / "manifest.json").unlink()
    with _transformers_log() as logged, pytest.raises(CheckpointError) as e:
        LatentLM.from_pretrained(tmp_path / "ckpt")
    message = str(e.value)
    assert message.startswith(f"the model {(tmp_path / 'ckpt').resolve()} ") and says in message, message
    assert message.endswith("config.json saved with these weights (or the weights saved with it)")
    assert "\n" not in message and logged == []  # (the report dropped: the line says it)
    from safetensors.torch import load_file, save_file  # a load that passes writes transformers' log as it was

    state = load_file(str(tmp_path / "other" / "model.safetensors"))
    save_file({**state, "extra.weight": torch.zeros(2)}, str(tmp_path / "other" / "model.safetensors"))
    (tmp_path / "other" / "manifest.json").unlink()
    with _transformers_log() as logged:
        LatentLM.from_pretrained(tmp_path / "other")
    assert [r for r in logged if "LOAD REPORT" in r.getMessage() and "extra.weight" in r.getMessage()]
    assert all(r.levelno == logging.WARNING for r in logged)


@pytest.mark.slow
def test_a_folder_of_another_kind_is_one_line_saying_what_it_is(tokenizer, tmp_path, run_cli):
    """A BERT encoder was loaded as BertLMHeadModel and refused for its missing head (as if its config were not its
    own), a T5 was 'Unrecognized configuration class <class ...>', and the official Coconut code's save_dir or one
    of its checkpoint_N files was 'holds no model checkpoint' or 'a file': each now says what it is and what to do."""
    from transformers import BertConfig, BertModel, T5Config, T5ForConditionalGeneration

    BertModel(
        BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    ).save_pretrained(tmp_path / "bert")
    T5ForConditionalGeneration(
        T5Config(vocab_size=len(tokenizer), d_model=16, num_layers=1, num_heads=2, d_ff=16, d_kv=8)
    ).save_pretrained(tmp_path / "t5")
    for name in ("bert", "t5"):
        tokenizer.save_pretrained(tmp_path / name)
    (tmp_path / "save_dir").mkdir()
    torch.save({"embedding.weight": torch.zeros(2, 2)}, tmp_path / "save_dir" / "checkpoint_3")
    no_lm = "give a decoder-only LM (GPT-2, Llama, Qwen2, ...)"
    for name, says in (
        ("bert", "is no causal LM: its config.json names BertModel, and BertLMHeadModel, the causal LM of its kind, "),
        ("t5", "it is no causal LM (its config.json is of a kind AutoModelForCausalLM does not load); " + no_lm),
        ("save_dir", "(no config.json with weights, no final/): it holds checkpoint_N files, as the official Coconut"),
        ("save_dir/checkpoint_3", "is a file, not a checkpoint directory: checkpoint_N is the official Coconut code"),
    ):
        r = run_cli("eval", "--model", tmp_path / name, "--data", "builtin:test", "--out", tmp_path / "o")
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
        assert r.stderr.endswith(f"{no_lm}\n" if name in ("bert", "t5") else "dgrpo import-coconut\n"), r.stderr


@contextlib.contextmanager
def _transformers_log():
    """The records transformers' logger hands its handlers within the block."""
    import logging

    seen: list = []

    class Seen(logging.Handler):
        def emit(self, record):
            seen.append(record)

    logger, handler = logging.getLogger("transformers"), Seen()
    logger.addHandler(handler)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)


def test_an_adapter_whose_tokenizer_lacks_the_markers_is_one_line(tokenizer, tmp_path):
    """The same for a LoRA adapter checkpoint (its base, a dgrpo checkpoint, has the markers' rows); an adapter
    dgrpo did not write (no latent_config.json) loads with its base's tokenizer, as before."""
    import copy

    pytest.importorskip("peft")
    from dgrpo.config import LoraConfig
    from dgrpo.model import lora
    from dgrpo.model.verified import CheckpointError

    make_lm(tokenizer, "qwen2").save_pretrained(tmp_path / "base")
    lm = LatentLM.from_pretrained(tmp_path / "base")
    lora.apply_lora(lm, LoraConfig(r=2, alpha=4.0))
    lm.save_pretrained(tmp_path / "adapter")
    (tmp_path / "adapter" / "manifest.json").unlink()
    copy.deepcopy(tokenizer).save_pretrained(tmp_path / "adapter")
    with pytest.raises(CheckpointError, match="its tokenizer \\(316 tokens\\) is not the one dgrpo saved with it: it"):
        LatentLM.from_pretrained(tmp_path / "adapter")
    (tmp_path / "adapter" / "latent_config.json").unlink()  # an adapter dgrpo did not write: its base's tokenizer
    assert LatentLM.from_pretrained(tmp_path / "adapter").peft is not None


@pytest.mark.parametrize("text, message", [("{", "Expecting property name"), ("[1]", "it holds a JSON list")])
def test_eval_of_a_hand_edited_run_config_is_one_line(sft_checkpoint, tmp_path, run_cli, text, message):
    d = tmp_path / "edited"
    shutil.copytree(sft_checkpoint, d)
    (d / "manifest.json").unlink()
    (d / "run_config.json").write_text(text)
    r = run_cli(
        "eval", "--model", d, "--data", "builtin:test", "--limit", 4, "--set", "threads=1", "--out", tmp_path / "e"
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"dgrpo: error: {d / 'run_config.json'} is not valid: ")
    assert message in r.stderr and "\n" not in r.stderr.strip()
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("text", ["{", "[1]"])
def test_init_from_a_hand_edited_run_config_is_one_line(sft_checkpoint, tmp_path, run_cli, text):
    d = tmp_path / "edited"
    shutil.copytree(sft_checkpoint, d)
    (d / "manifest.json").unlink()
    (d / "run_config.json").write_text(text)
    r = run_cli("grpo", "--init", d, *tiny_args(), "--out", tmp_path / "g")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"dgrpo: error: {d / 'run_config.json'} is not valid: ")
    assert "\n" not in r.stderr.strip() and not (tmp_path / "g").exists()


def test_a_missing_local_path_is_not_sent_to_the_hub(sft_checkpoint, tmp_path, monkeypatch):
    from dgrpo.model.verified import CheckpointError

    notok = tmp_path / "notok"  # weights without their tokenizer: transformers would build an empty one
    notok.mkdir()
    for name in ("config.json", "model.safetensors", "latent_config.json"):
        shutil.copy(sft_checkpoint / name, notok)
    with pytest.raises(CheckpointError, match=f"no tokenizer in {notok} \\(none of tokenizer.json"):
        LatentLM.from_pretrained(notok)
    (notok / "model.safetensors").unlink()
    (notok / "dcp").mkdir()  # what fsdp: sharded writes: its shards, to consolidate (it was called damaged)
    with pytest.raises(CheckpointError, match=f"{notok} holds FSDP shards .*: dgrpo consolidate {notok} first"):
        LatentLM.from_pretrained(notok)

    with pytest.raises(CheckpointError, match=f"checkpoint directory not found: {tmp_path / 'nope'}"):
        LatentLM.from_pretrained(tmp_path / "nope")  # (the hub's own error was "Repo id must be in the form ...")
    # a relative path shaped like a hub id: with no hub, one line at once (was ~40 s of the hub library's retries)
    monkeypatch.setattr("dgrpo.model.sources.hub_reachable", lambda: False)
    with pytest.raises(
        CheckpointError, match="model 'runs/nope': not a local directory, not in the Hugging Face cache"
    ):
        LatentLM.from_pretrained("runs/nope")


def test_save_pretrained_replaces_only_a_directory_it_wrote(sft_checkpoint, tmp_path):
    """A folder of the user's files, or a run directory, given to save_pretrained is refused and left as it was (it
    used to be replaced whole); an empty directory, or a model directory written before, is written over."""
    from dgrpo.model.verified import CheckpointError

    lm = LatentLM.from_pretrained(sft_checkpoint)
    mine, run = tmp_path / "mine", tmp_path / "run"
    mine.mkdir()
    (mine / "notes.txt").write_text("important")
    shutil.copytree(sft_checkpoint, run / "final")
    (run / "metrics.jsonl").write_text("{}\n")
    for folder in (mine, run, mine / "notes.txt"):
        with pytest.raises(CheckpointError, match="exists and is not a model directory dgrpo wrote"):
            lm.save_pretrained(folder)
    assert (mine / "notes.txt").read_text() == "important" and sorted(p.name for p in run.iterdir()) == [
        "final",
        "metrics.jsonl",
    ]
    (tmp_path / "empty").mkdir()
    lm.save_pretrained(tmp_path / "empty")
    lm.save_pretrained(run / "final")  # a model directory dgrpo wrote: replaced, as training replaces best/
    assert LatentLM.from_pretrained(tmp_path / "empty").settings == LatentLM.from_pretrained(run / "final").settings


def saved_step(lm, run: Path, step: int = 128) -> Path:
    """A resumable training checkpoint ``run/checkpoints/step-<step, padded>`` written as the trainers write one."""
    from dgrpo.training.checkpoint import save_checkpoint

    optimizer = torch.optim.SGD(lm.parameters(), lr=0.1)
    return save_checkpoint(run, step, lm=lm, optimizer=optimizer, state={"progress": 0})


def test_save_pretrained_never_deletes_a_checkpoints_state_or_the_users_files(sft_checkpoint, tmp_path, monkeypatch):
    """A resumable checkpoint (its optimizer and RNG state) and a model directory holding a file its manifest does
    not list are refused, naming why, and left as they were (both used to be replaced whole); the trainers still
    write over their own checkpoints; ``~`` is the home directory (it used to be a folder named ``~``)."""
    from dgrpo.model.verified import CheckpointError

    lm = LatentLM.from_pretrained(sft_checkpoint)
    step = saved_step(lm, tmp_path / "run")
    before = sorted(p.name for p in step.iterdir())
    for target in (step, step / "model"):
        with pytest.raises(
            CheckpointError, match=f"{step} is \\(or would read as\\) a resumable training checkpoint .*new dir"
        ):
            lm.save_pretrained(target)
    assert sorted(p.name for p in step.iterdir()) == before and (step / "optimizer.pt").is_file()
    assert saved_step(lm, tmp_path / "run") == step  # save_checkpoint replaces its own step directory
    lm.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "README.md").write_text("my notes")
    (tmp_path / "m" / "eval").mkdir()
    (tmp_path / "m" / "eval" / "scores.txt").write_text("0.5")
    with pytest.raises(CheckpointError, match=r"holds files dgrpo did not write \(README.md, eval/scores.txt; not in"):
        lm.save_pretrained(tmp_path / "m")
    assert (tmp_path / "m" / "README.md").read_text() == "my notes"
    LatentLM.from_pretrained(tmp_path / "m")  # the user's files do not stop it from loading
    with pytest.raises(CheckpointError, match=r"m/inner lies inside .*/m, a checkpoint dgrpo wrote"):
        lm.save_pretrained(tmp_path / "m" / "inner")  # outside m's manifest (a run's --resume never deleted it)
    assert not (tmp_path / "m" / "inner").exists()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    lm.save_pretrained("~/saved")
    assert (tmp_path / "home" / "saved" / "manifest.json").is_file() and not (tmp_path / "~").exists()


def test_an_unpadded_step_name_loads_in_every_form(sft_checkpoint, tmp_path, monkeypatch):
    """``checkpoints/step-128`` names the directory written as ``step-00000128``: relative (also shaped like a hub
    id), ``./``-relative and absolute, through from_pretrained and the command line's model sources alike."""
    from dgrpo.model.sources import resolve_model_source

    step = saved_step(LatentLM.from_pretrained(sft_checkpoint), tmp_path / "run")
    monkeypatch.chdir(tmp_path)
    want = str((step / "model").resolve())
    names = ["run/checkpoints/step-128", "./run/checkpoints/step-128", str(tmp_path / "run/checkpoints/step-128")]
    for name in names:
        assert LatentLM.from_pretrained(name).name_or_path == want, name
        assert str(Path(resolve_model_source(name)[0]).resolve()) == want, name
    monkeypatch.chdir(tmp_path / "run")
    assert LatentLM.from_pretrained("checkpoints/step-128").name_or_path == want  # (a hub id's shape)
    assert str(Path(resolve_model_source("checkpoints/step-128")[0]).resolve()) == want


def test_in_memory_misuse_is_one_line(tokenizer, sft_checkpoint):
    """A tokenizer without EOS, no questions, a mask of another shape than its ids: one line each, at the call
    (they used to fail deep inside: "Could not infer dtype of NoneType", "max() arg is an empty sequence", a
    transformers traceback)."""
    import copy

    from dgrpo.model.tiny import build_tiny_model

    for pad in (None, "<pad>"):
        tok = copy.deepcopy(tokenizer)
        tok.eos_token, tok.pad_token = None, pad
        model = build_tiny_model("qwen2", len(tok), hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
        with pytest.raises(ValueError, match="the tokenizer has no EOS token.*set one before building the LatentLM"):
            LatentLM(model, tok)
    lm = LatentLM.from_pretrained(sft_checkpoint)
    with pytest.raises(ValueError, match="encode_questions: no questions"):
        lm.encode_questions([])
    ids, mask = lm.encode_questions(["1 + 2 = ?", "3 * 4 = ?"])
    for bad in (mask[:, 1:], mask[:1]):
        with pytest.raises(ValueError, match=r"prompt ids \(2, \d+\) and mask .* differ in shape"):
            lm.generate(ids, bad, 1, max_new_tokens=2)


def test_model_directories_are_written_atomically_with_a_manifest(sft_checkpoint, tmp_path, monkeypatch):
    """A kill while final/ is written leaves no final/ (only a hidden temporary directory); a complete one has a
    manifest, and a flipped byte in it is detected."""
    from dgrpo.model.verified import MANIFEST, verify

    lm = LatentLM.from_pretrained(sft_checkpoint)
    assert verify(sft_checkpoint) is None and (sft_checkpoint / MANIFEST).is_file()

    class Killed(BaseException):
        pass

    def die(*a, **kw):
        raise Killed  # stands in for SIGKILL between the files and the rename (the slow test uses a real one)

    monkeypatch.setattr("dgrpo.model.verified.replace_dir", die)
    with pytest.raises(Killed):
        lm.save_pretrained(tmp_path / "final")
    assert not (tmp_path / "final").exists()


def test_consolidate_never_runs_a_pickle_from_the_checkpoint(tmp_path, run_cli):
    """A planted dcp/.metadata whose unpickling would run code: refused in one line, and the code never runs."""
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    import pickle

    ckpt = tmp_path / "final"
    (ckpt / "dcp").mkdir(parents=True)
    (ckpt / "dcp" / ".metadata").write_bytes(pickle.dumps(Payload()))
    (ckpt / "config.json").write_text("{}")
    r = run_cli("consolidate", ckpt)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "system, which a checkpoint" in r.stderr
    assert not marker.exists()


def test_hub_id_offline_names_the_id_fast(tmp_path, run_cli, monkeypatch):
    """HF_HUB_OFFLINE set and the id not cached: one line naming both, at once: nothing is tried on the network (no
    probe, no lookup by the hub libraries; a wall-clock bound failed on a busy machine)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # read when the model is resolved, not when huggingface_hub is imported
    tried = connections_tried(monkeypatch)
    r = run_cli("eval", "--model", "Qwen/Qwen2.5-1.5B", "--data", "builtin:test", "--out", tmp_path / "o")
    assert r.returncode == 2 and "'Qwen/Qwen2.5-1.5B'" in r.stderr and "HF_HUB_OFFLINE" in r.stderr
    assert tried == []


def test_fsdp_on_a_torch_without_the_fsdp2_settings_is_a_config_error_before_any_process_group(monkeypatch):
    """The sharded update sets FSDP2 options that torch < 2.13 lacks: such a torch is told so by name (a config
    error: exit 2, one line) before the ranks start their process group, where it would fail in every rank."""
    import torch.distributed as tdist
    from torch.distributed.fsdp import FSDPModule

    from dgrpo.config import ConfigError
    from dgrpo.training.distributed import Dist

    monkeypatch.delattr(FSDPModule, "set_reduce_scatter_unused_params", raising=False)  # (torch < 2.13: not there)
    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)  # (as torchrun sets them)
    monkeypatch.delenv("DGRPO_FSDP", raising=False)
    monkeypatch.setattr(tdist, "init_process_group", lambda *a, **k: pytest.fail("a process group was started"))
    with pytest.raises(ConfigError, match=r"no FSDPModule.set_reduce_scatter_unused_params.*torch >= 2.13.*fsdp=none"):
        Dist.from_env(torch.device("cpu"), fsdp="full")


def _sharded_run(tmp_path, tokenizer) -> tuple[Path, torch.nn.Module]:
    """A run directory whose final/ holds what fsdp=sharded writes (dcp/ shards, no weights), saved in one process."""
    import torch.distributed.checkpoint as dcp

    lm = make_lm(tokenizer)
    staging = tmp_path / "staging"
    dcp.save(lm.model.state_dict(), checkpoint_id=str(staging / "dcp"))
    lm.save_pretrained(tmp_path / "run" / "final", weights=False, extra=lambda d: shutil.move(staging / "dcp", d))
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    return tmp_path / "run", lm.model


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # (the shards are saved in one process here)
def test_consolidate_takes_a_run_directory_and_refuses_a_changed_or_unreadable_shard(tmp_path, tokenizer, run_cli):
    run, model = _sharded_run(tmp_path, tokenizer)
    r = run_cli("consolidate", run)  # a run directory means its final/, as for every other command
    assert r.returncode == 0 and f"wrote {run / 'final'}/model.safetensors" in r.stdout
    back = LatentLM.from_pretrained(run).model.state_dict()
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())

    run, _ = _sharded_run(tmp_path / "b", tokenizer)
    shard = next((run / "final" / "dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    r = run_cli("consolidate", run / "final")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert f"checkpoint {run / 'final'} is damaged: checksum mismatch" in r.stderr
    assert not (run / "final" / "model.safetensors").exists()

    (run / "final" / "manifest.json").unlink()  # nothing vouches for the shards now; a missing one is still one line
    shard.unlink()
    r = run_cli("consolidate", run)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "cannot read the shards in" in r.stderr and "No such file" in r.stderr


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_consolidate_of_shards_under_another_shapes_config_is_one_line(tmp_path, tokenizer, run_cli):
    """A config.json of other sizes than the shards' (not the run's own) ended in load_state_dict's traceback, 'size
    mismatch for ...' per tensor."""
    run, _ = _sharded_run(tmp_path, tokenizer)
    (run / "final" / "manifest.json").unlink()  # (nothing vouches for config.json: a copy from elsewhere)
    config = json.loads((run / "final" / "config.json").read_text())
    key = next(k for k in ("intermediate_size", "n_inner") if config.get(k))
    config[key] *= 2
    (run / "final" / "config.json").write_text(json.dumps(config))
    r = run_cli("consolidate", run)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "the sharded weights do not fit" in r.stderr and "put back the run's own config.json" in r.stderr
    assert not (run / "final" / "model.safetensors").exists()


#: a ``sitecustomize`` module that logs each socket connection the process tries: one line, the call stack of it
CONNECTION_LOG = """import os, socket, traceback
_connect, _connect_ex = socket.socket.connect, socket.socket.connect_ex
def _log(address):
    stack = " < ".join(f"{f.filename}:{f.lineno}" for f in reversed(traceback.extract_stack()[:-2]))
    with open(os.environ["CONNECTION_LOG"], "a") as f:
        f.write(f"{address!r} from {stack}\\n")
def connect(self, address):
    _log(address)
    return _connect(self, address)
def connect_ex(self, address):
    _log(address)
    return _connect_ex(self, address)
socket.socket.connect, socket.socket.connect_ex = connect, connect_ex
"""


@pytest.mark.slow
def test_a_cached_hub_id_loads_at_once_without_network(sft_checkpoint, tmp_path):
    """A hub id in the local cache, on a machine where the hub cannot be reached and HF_HUB_OFFLINE is not set: it
    loads from the cache without waiting for retries (transformers' PEFT-adapter lookup took ~25 s of them). Shown
    by the connections the process tried (a wall-clock bound failed on a busy machine): the reachability probe's,
    once, and none tried again from the same call stack (a retry)."""
    snapshot = tmp_path / "hf" / "hub" / "models--someorg--tiny" / "snapshots" / ("a" * 40)
    shutil.copytree(sft_checkpoint, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("a" * 40)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(CONNECTION_LOG)
    log = tmp_path / "connections"
    path = os.pathsep.join([str(tmp_path / "site"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": ""}
    env |= {"PYTHONPATH": path, "CONNECTION_LOG": str(log)}
    r = dgrpo(
        "eval", "--model", "someorg/tiny", "--data", "builtin:test", "--limit", 1, "--out", tmp_path / "e", env=env
    )
    assert r.returncode == 0, r.stderr[-2000:]
    tried = log.read_text().splitlines()
    probes = [t for t in tried if "dgrpo/hub.py" in t]  # (the log sees the connections)
    assert len(probes) == 1, probes  # one for the settings, the weights and the data (it was one for each lookup)
    again = [t for t in dict.fromkeys(tried) if tried.count(t) > 1]  # (a retry: the same call stack again)
    assert not again, f"{len(tried)} connections tried; {len(again)} of them again, e.g. {again[0]}"
    assert "Retrying" not in r.stderr


def test_the_hub_is_reached_through_a_proxy_which_is_what_is_probed(monkeypatch):
    """With HTTPS_PROXY set the hub libraries go through the proxy: the direct TCP probe would call the hub down, and
    a proxy that cannot be reached counted as a reachable hub (the libraries then retried for ~50 s before a cached
    model was used)."""
    import socket

    from dgrpo.hub import hub_reachable

    monkeypatch.setenv("HF_ENDPOINT", "https://127.0.0.1:9")  # nothing listens there (an https endpoint: HTTPS_PROXY)
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert hub_reachable(timeout=0.5) is False
    with socket.socket() as proxy:  # a proxy that listens
        proxy.bind(("127.0.0.1", 0))
        proxy.listen()
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.getsockname()[1]}")
        assert hub_reachable(timeout=0.5) is True
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the hub's host is not proxied: the direct probe again
        assert hub_reachable(timeout=0.5) is False
    monkeypatch.delenv("NO_PROXY")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # a proxy that is down
    assert hub_reachable(timeout=0.5) is False


def test_a_model_with_bin_weights_only_is_told_to_convert(sft_checkpoint, tmp_path):
    from safetensors.torch import load_file

    from dgrpo.model.verified import CheckpointError

    d = tmp_path / "bin"
    shutil.copytree(sft_checkpoint, d)
    torch.save(load_file(d / "model.safetensors"), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    (d / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="PyTorch .bin weights, and dgrpo loads safetensors only"):
        LatentLM.from_pretrained(d)


def test_a_sharded_checkpoint_of_another_model_is_one_line_before_anything_loads(tokenizer, tmp_path):
    """Shards (``fsdp: sharded``) of a model with other shapes reached torch's loader, whose CheckpointException (a
    BaseException) escaped as a 178-line traceback after the checkpoint was taken; their names and shapes are now
    read from the metadata and checked with the rest of the checkpoint, as a gathered checkpoint's are."""
    import torch.distributed.checkpoint as dcp

    from dgrpo.model.verified import CheckpointError
    from dgrpo.training.checkpoint import read_checkpoint, save_checkpoint, shard_staging
    from dgrpo.training.distributed import TrainingState

    lm = make_lm(tokenizer)
    optimizer = torch.optim.SGD(lm.parameters(), lr=0.1)
    shards = shard_staging(tmp_path, 1) / "dcp"
    dcp.save({"model": lm.model.state_dict(), "optimizer_state": {}}, checkpoint_id=str(shards), no_dist=True)
    groups = {"state": {}, "param_groups": [{"lr": 0.1, "params": [n for n, _ in lm.model.named_parameters()]}]}
    ckpt = save_checkpoint(
        tmp_path, 1, lm=lm, optimizer=optimizer, state={}, fsdp_state=TrainingState(None, groups, shards)
    )
    assert (ckpt / "dcp" / ".metadata").is_file() and not (ckpt / "model" / "model.safetensors").exists()
    loaded = read_checkpoint(ckpt, lm=lm, optimizer=optimizer, sharded=True)  # its own model: reads
    assert loaded.shards == ckpt / "dcp" and loaded.weights == {}
    other = make_lm(tokenizer, intermediate_size=96)
    with pytest.raises(CheckpointError, match=r"^model: wrong shapes: model.layers.0.mlp.\w+_proj.weight \("):
        read_checkpoint(ckpt, lm=other, optimizer=torch.optim.SGD(other.parameters(), lr=0.1), sharded=True)


@pytest.mark.parametrize(
    "failure",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0"),
    ],
    ids=["enospc", "torch-save"],
)
def test_a_full_disk_while_checkpointing_is_one_line_naming_the_write(tokenizer, tmp_path, monkeypatch, failure):
    """A full disk gave a raw traceback (torch.save's RuntimeError, or an OSError ENOSPC): now one CheckpointError
    line naming the checkpoint, the space left and the checkpoint the run resumes from; no temporary folder left."""
    from dgrpo.model.verified import CheckpointError
    from dgrpo.training import checkpoint

    lm = make_lm(tokenizer)
    opt = torch.optim.AdamW(lm.model.parameters())
    kw = {"lm": lm, "optimizer": opt, "state": {"metrics_lines": 0}}
    first = checkpoint.save_checkpoint(tmp_path, 2, **kw)

    def full(*a, **k):
        raise failure

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(CheckpointError) as e:
        checkpoint.save_checkpoint(tmp_path, 4, **kw)
    line = str(e.value)
    assert "\n" not in line and f"could not write checkpoint {tmp_path}/checkpoints/step-00000004" in line
    assert "MiB free on" in line and f"the run resumes from {first}" in line
    assert ("no space left on the device" in line) == isinstance(failure, OSError)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [first.name]
    monkeypatch.setattr(checkpoint.torch, "save", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("CUDA error")))
    with pytest.raises(RuntimeError, match="^CUDA error$"):  # (not the disk's: its own traceback, not a disk line)
        checkpoint.save_checkpoint(tmp_path, 4, **kw)


def test_a_full_disk_while_cutting_the_metrics_is_one_line_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    """checkpoint.truncate_metrics on a full disk: a raw chained OSError and a 0-byte metrics.tmp left behind."""
    from dgrpo.model.verified import CheckpointError
    from dgrpo.training import checkpoint

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 1}\n{"step": 2}\n')
    write = Path.write_text

    def full(self, *a, **k):
        if self.suffix == ".tmp":
            open(self, "w").close()  # (created, then nothing fits)
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return write(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(CheckpointError, match=r"could not write metrics.jsonl \(no space left on the device; .* free"):
        checkpoint.truncate_metrics(metrics, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    assert metrics.read_text() == '{"step": 1}\n{"step": 2}\n'


def test_a_full_disk_elsewhere_in_a_run_is_one_line(tmp_path, monkeypatch, run_cli):
    """A final/, best/ or stage-K/ write on a full disk (an OSError ENOSPC outside the checkpoint's own write): one
    line naming the file, and what the same command does next."""
    from dgrpo.cli import train

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "final" / "model.safetensors"))

    monkeypatch.setattr(train, "run_grpo", full)
    r = run_cli("grpo", "--init", "x", "--out", tmp_path / "run")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "final/model.safetensors: no space left on the device; no checkpoint was written yet" in r.stderr


def test_a_file_a_checkpoint_cannot_load_without_is_not_said_to_be_droppable(tokenizer, tmp_path):
    """A missing weights file (or another the model needs) said 'if the change is yours, delete manifest.json to
    load it': without the manifest the next line was that the directory holds no model (or, for the tokenizer's
    files, no tokenizer). A file the model loads without (run_config.json) keeps that advice."""
    from dgrpo.model.verified import CheckpointError

    lm = make_lm(tokenizer, "qwen2")
    lm.run_config = {"model": {"dtype": "float32"}}
    needed = "(removed since dgrpo wrote it, and the model does not load without it: put it back, or"
    droppable = "(changed since dgrpo wrote it; if the change is yours, delete manifest.json to load it)"
    for name, says, other in (
        ("model.safetensors", needed, None),
        ("config.json", needed, None),
        ("tokenizer.json", needed, None),
        ("tokenizer_config.json", needed, None),
        ("run_config.json", droppable, None),
        ("tokenizer.json", needed, "vocab.txt"),
    ):
        folder = tmp_path / f"{name}-{other}"
        lm.save_pretrained(folder)
        (folder / name).unlink()
        if other is not None:  # (a vocabulary in another format beside it: tokenizer.json alone holds the markers)
            (folder / other).write_text("a\n")
        with pytest.raises(CheckpointError) as e:
            LatentLM.from_pretrained(folder)
        message = str(e.value)
        assert message.startswith(f"checkpoint {folder} is damaged: missing file {name} {says}"), message


def test_weights_cut_short_say_so_and_what_to_do(tokenizer, tmp_path):
    """A model's or an adapter's safetensors cut short (no manifest to tell) was 'SafetensorError: Error while
    deserializing header: incomplete metadata, file not fully covered', with nothing to do about it."""
    pytest.importorskip("peft")
    from dgrpo.config import LoraConfig
    from dgrpo.model import lora
    from dgrpo.model.verified import CheckpointError

    make_lm(tokenizer, "llama").save_pretrained(tmp_path / "model")
    lm = LatentLM.from_pretrained(tmp_path / "model")
    lora.apply_lora(lm, LoraConfig(r=2, alpha=4.0))
    lm.save_pretrained(tmp_path / "adapter")
    for folder, file in (("adapter", "adapter_model.safetensors"), ("model", "model.safetensors")):
        (tmp_path / folder / "manifest.json").unlink()  # (the adapter's own file first, while its base is intact)
        data = (tmp_path / folder / file).read_bytes()
        (tmp_path / folder / file).write_bytes(data[: len(data) // 2])
        with pytest.raises(CheckpointError) as e:
            LatentLM.from_pretrained(tmp_path / folder)
        message = str(e.value)
        assert f"{file} (SafetensorError" in message or f"{folder}: unreadable safetensors" in message, message
        assert "file not fully covered" in message and "\n" not in message, message
        assert message.endswith("): cut short or damaged: copy it again from where it came from"), message


NO_SUCH_HOME = "~dgrpo-no-such-user"


@pytest.mark.parametrize(
    "argv, said",
    [
        (["data", "inspect", f"{NO_SUCH_HOME}/x.jsonl"], "file not found"),
        (["sft", "--set", f"data.train={NO_SUCH_HOME}/x.jsonl", "--set", "data.valid=''"], "file not found"),
        (["eval", "--model", f"{NO_SUCH_HOME}/m", "--data", "builtin:test"], "checkpoint directory not found"),
        (["grpo", "--init", "m", "--set", f"grpo.reward={NO_SUCH_HOME}/r.py:f"], "not found"),
        (["plot", f"{NO_SUCH_HOME}/runs"], "no such directory"),
    ],
    ids=["data", "train", "model", "reward", "plot"],
)
def test_a_home_folder_of_no_user_is_read_as_written(argv, said, tmp_path, run_cli, monkeypatch):
    """A path in a data spec, a config option or a label starting with ``~user`` of no such user (which a shell
    leaves as written) was pathlib's RuntimeError 'Could not determine home directory', a traceback from every
    command; it is the path as written, not found (:func:`dgrpo.paths.expand_home`)."""
    monkeypatch.chdir(tmp_path)
    out = [] if argv[0] == "data" else ["--out", tmp_path / ("o.png" if argv[0] == "plot" else "o")]
    r = run_cli(*argv, *out)
    assert r.returncode != 0 and said in r.stderr and NO_SUCH_HOME in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_every_file_of_a_checkpoint_has_the_mode_the_umask_gives(tokenizer, tmp_path, set_umask, umask, mode):
    """model.safetensors was written 0600 whatever the umask (safetensors 0.8 writes through an owner-only temporary
    file: safetensors#782) beside 0644 configs: on a shared machine a group could read all of a checkpoint but its
    weights. A model directory and a resumable checkpoint (its model/, the reference beside it) alike."""
    from dgrpo.training.checkpoint import save_checkpoint

    lm = make_lm(tokenizer)
    set_umask(umask)
    lm.save_pretrained(tmp_path / "model")
    opt = torch.optim.SGD(lm.model.parameters(), lr=0.1)
    ckpt = save_checkpoint(tmp_path, 1, lm=lm, optimizer=opt, state={}, extra_models={"ref": torch.nn.Linear(2, 2)})
    files = [p for folder in (tmp_path / "model", ckpt) for p in folder.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"model.safetensors", "ref.safetensors", "config.json", "optimizer.pt"}
    assert {p.relative_to(tmp_path): oct(p.stat().st_mode & 0o777) for p in files} == {
        p.relative_to(tmp_path): oct(mode) for p in files
    }
