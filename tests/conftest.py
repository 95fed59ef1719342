import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(min(2, os.cpu_count() or 1))

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def tokenizer():
    from dgrpo.config import TaskConfig
    from dgrpo.data.synthetic import tokenizer_corpus
    from dgrpo.data.tokenizer import train_word_tokenizer

    return train_word_tokenizer(tokenizer_corpus(TaskConfig()))


@pytest.fixture(scope="session")
def task_records():
    from dgrpo.config import TaskConfig
    from dgrpo.data.synthetic import generate_split

    return generate_split(TaskConfig(n_test=64), "test")


def make_lm(tokenizer, arch="qwen2", seed=0, **kw):
    import copy

    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.model.tiny import build_tiny_model

    tok = copy.deepcopy(tokenizer)
    kw = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "intermediate_size": 64, **kw}
    return LatentLM(build_tiny_model(arch, len(tok), seed=seed, **kw), tok)


def tiny_config(**over):
    """A Config for fast CPU tests: tiny model, small built-in task, short SFT and GRPO."""
    from dgrpo.config import Config, set_value

    cfg = Config()
    base = {
        "model.hidden_size": "64", "model.num_layers": "2", "model.num_heads": "4", "model.intermediate_size": "128",
        "task.n_train": "2048", "task.n_valid": "64", "task.n_test": "64",
        "sft.epochs_per_stage": "2", "sft.num_epochs": "4", "sft.max_latent_stage": "1", "sft.batch_size": "64", "sft.lr": "3e-3",
        "sft.warmup_steps": "5", "data.test": "[builtin:test]", "eval.batch_size": "64", "eval.max_new_tokens": "40",
        "grpo.steps": "3", "grpo.prompts_per_step": "8", "grpo.group_size": "4", "grpo.max_new_tokens": "40", "grpo.eval_every": "2",
        "grpo.warmup_steps": "1", "grpo.lr": "1e-4", "threads": "2",
    }
    base.update({k: str(v) for k, v in over.items()})
    for k, v in base.items():
        set_value(cfg, k, v)
    return cfg.validate()


@pytest.fixture(scope="session")
def sft_checkpoint(tmp_path_factory):
    """A tiny built-in-task model after a short Coconut SFT (stage 0 -> 1), saved in HF format."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    cfg = tiny_config()
    torch.manual_seed(0)
    lm = load_model(cfg.model, cfg.task, seed=0)
    out = tmp_path_factory.mktemp("sft")
    train_sft(lm, generate_split(cfg.task, "train"), cfg, out, log=lambda *a: None)
    return out / "final"
