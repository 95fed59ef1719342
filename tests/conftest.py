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
