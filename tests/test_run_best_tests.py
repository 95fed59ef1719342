"""The test sets of a run's best/ (``dgrpo.cli.train.evaluate_best``): a best/ that holds the final model's weights
(a run that never updated after it) is not tested a second time."""

import dataclasses

import pytest

from conftest import make_lm, tiny_config


@pytest.fixture
def best_and_final(tmp_path, tokenizer):
    """``tmp_path/best`` saved from a tiny model, and that model loaded back (the trained model at the run's end)."""
    from dgrpo.model.latent_lm import LatentLM

    make_lm(tokenizer).save_pretrained(tmp_path / "best")
    return tmp_path, LatentLM.from_pretrained(tmp_path / "best")


def test_a_best_of_the_final_weights_is_tested_once_and_reported_for_both(best_and_final, monkeypatch, capsys):
    """A GRPO run whose every step after best/ was filtered (no update) tested best/ and final/, the same weights,
    twice: best/ takes the final model's test accuracies, said in a line; best/ of other weights is tested."""
    import dgrpo.cli.train as train_cli
    from dgrpo.training.distributed import Dist

    out, final = best_and_final
    cfg, tests = tiny_config(), {"builtin:test": []}
    tested: list[str] = []
    monkeypatch.setattr(train_cli, "evaluate_test_sets", lambda *a, checkpoint="final": tested.append(checkpoint) or {})
    scores = {"test/builtin_test/accuracy": 0.25}
    got = train_cli.evaluate_best(1, cfg.grpo.steps, tests, cfg, out, Dist.single(), "cpu", final=(final, scores))
    assert got == {"test_best/builtin_test/accuracy": 0.25} and tested == []
    loading = f"dgrpo: loading {out / 'best'} (from {out / 'best'}) ...\n"  # (best/ loads, to compare its weights)
    said, line = capsys.readouterr().out.strip().split("\n")
    assert said + "\n" == loading
    assert line.startswith("dgrpo: best/ (1) holds the final model's weights (no update after it): not tested again")
    assert line.endswith(f"its test results are the final model's ({out / 'eval' / 'builtin_test'})")
    settings = final.settings
    final.settings = dataclasses.replace(settings, n_latent=settings.n_latent + 1)  # (read with more thoughts)
    train_cli.evaluate_best(1, cfg.grpo.steps, tests, cfg, out, Dist.single(), "cpu", final=(final, scores))
    assert tested == ["best"] and capsys.readouterr().out == loading
    final.settings = settings
    final.model.model.norm.weight.data[0] += 1  # (an update after best/ was written)
    train_cli.evaluate_best(1, cfg.grpo.steps, tests, cfg, out, Dist.single(), "cpu", final=(final, scores))
    assert tested == ["best", "best"] and capsys.readouterr().out == loading


def test_a_best_of_the_final_weights_is_said_at_the_runs_end_as_under_fsdp(best_and_final, monkeypatch, capsys):
    """In one process the line came among the test results, before the run's "done in" and summary lines; under FSDP
    (which can tell only once final/ is written) after them. Given the run's list of end lines (``advice``), it is
    said there in one process too: printed by print_consolidation_lines, as under FSDP."""
    import dgrpo.cli.train as train_cli
    from dgrpo.training.distributed import Dist

    out, final = best_and_final
    cfg, tests, advice = tiny_config(), {"builtin:test": []}, []
    scores = {"test/builtin_test/accuracy": 0.25}
    monkeypatch.setattr(train_cli, "evaluate_test_sets", lambda *a, **k: pytest.fail("tested again"))
    got = train_cli.evaluate_best(1, 3, tests, cfg, out, Dist.single(), "cpu", final=(final, scores), advice=advice)
    loading = f"dgrpo: loading {out / 'best'} (from {out / 'best'}) ...\n"
    assert got == {"test_best/builtin_test/accuracy": 0.25} and capsys.readouterr().out == loading
    train_cli.print_consolidation_lines(out, Dist.single(), advice)
    assert capsys.readouterr().out.splitlines() == [train_cli.final_best_line(1, tests, out)]
    rank1 = dataclasses.replace(Dist.single(), rank=1)  # (rank 0 alone says it)
    assert train_cli.final_as_best(1, tests, out, rank1, scores, advice := []) == got and advice == []
