"""The folder a run started in (``applied.json``'s ``started_in``), and ``dgrpo eval RUN`` reading the run's own
relative test sets (``data.test``, recorded as typed) from there when they name nothing from the working directory."""

from __future__ import annotations

import pytest

from conftest import make_lm, tiny_config


@pytest.mark.filterwarnings("ignore:the model's latent markers")
def test_a_grpo_trainer_records_the_folder_it_started_in(tokenizer, tmp_path, monkeypatch):
    """applied.json's entry (and summary.json's ``applied``, the same dict) names the folder the process started in:
    a run's data.test is recorded as typed, relative to it."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.training.grpo import GRPOTrainer

    monkeypatch.chdir(tmp_path)
    cfg = tiny_config()
    trainer = GRPOTrainer(make_lm(tokenizer), cfg, generate_split(cfg.task, "train")[:8])
    monkeypatch.chdir("/")  # (made in tmp_path: a later change of folder does not change it)
    assert trainer.applied()["started_in"] == str(tmp_path)
