"""``dgrpo plot`` and :mod:`dgrpo.plotting` on run directories written by hand (no training, no subprocess)."""

import warnings
from pathlib import Path

import numpy as np
import pytest

from dgrpo.cli import main
from dgrpo.data.records import DataError
from dgrpo.plotting import arm_of, config_label, draw, find_runs, group_runs, load_run, plot, plot_runs

from conftest import write_run

EVAL = "eval/builtin:valid/accuracy"


def grpo_config(kind: str = "locked", temperature: float = 0.0, advantage: str = "drgrpo", k: int = 4) -> dict:
    return {
        "seed": 0,
        "perturbation": {"kind": kind, "p": 0.1},
        "grpo": {"temperature": temperature, "advantage": advantage, "group_size": k},
    }


def grpo_rows(seed: int, steps: int = 6, k: int = 4, level: float = 0.3) -> list[dict]:
    rows: list[dict] = [{"step": 0, EVAL: level}]
    for t in range(1, steps + 1):
        std = None if k == 1 else 0.1 + 0.01 * seed + 0.02 * t
        rows.append(
            {
                "step": t,
                "reward_mean": level + 0.02 * t,
                "reward_std": std,
                "frac_groups_kept": 0.5,
                "distinct_answers": 1.0 + 0.1 * t,
            }
        )
        if t % 2 == 0:
            rows.append({"step": t, EVAL: level + 0.01 * t + 0.005 * seed})
    return rows


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """Two arms x 2-3 seeds (demo layout), REINFORCE with K = 1, an SFT run, a seed-suffix pair with a torn line."""
    for s in range(3):
        write_run(tmp_path / "arms" / "dropout_grpo" / f"seed{s}", grpo_config("locked"), grpo_rows(s))
    for s in range(2):
        write_run(tmp_path / "arms" / "grpo_deterministic" / f"seed{s}", grpo_config("none"), grpo_rows(s, level=0.2))
    write_run(tmp_path / "reinforce", grpo_config("none", 0.0, "ema", 1), grpo_rows(0, k=1, level=0.25))
    sft_rows = [{"step": t, "loss": 2.0 / t} for t in range(1, 5)]
    sft_rows += [
        {"step": 2, "stage": 0, "eval/valid/accuracy": 0.1},
        {"step": 4, "stage": 1, "eval/valid/accuracy": 0.2},
        {"step": 4, "best_epoch": 1, "best/valid/accuracy": 0.2},
        {"step": 4, "stage": 2, "n_latent": 2, "time_s": 1.0},  # a stage's end not evaluated (no data.valid)
    ]
    write_run(tmp_path / "sft", {"seed": 0, "sft": {"lr": 1e-4}}, sft_rows)
    sampling = grpo_config("none", temperature=0.7)
    write_run(tmp_path / "sampling_s0", sampling, grpo_rows(0, level=0.22))
    write_run(tmp_path / "sampling_s1", sampling, grpo_rows(1, level=0.22), tail='{"step": 7, "reward_me')
    return tmp_path


def all_groups(root: Path) -> dict:
    return group_runs([load_run(p) for p in find_runs([root])])


def test_load_run_splits_rows_and_skips_a_torn_last_line(runs: Path) -> None:
    run = load_run(runs / "sampling_s1")
    assert run.name == "sampling_s1" and run.config["grpo"]["temperature"] == 0.7
    assert len(run.steps) == 6 and len(run.evals) == 4
    assert run.steps[-1]["step"] == 6 and run.is_grpo
    sft = load_run(runs / "sft")
    assert not sft.is_grpo and len(sft.evals) == 2 and len(sft.steps) == 4
    assert all("loss" in r for r in sft.steps)  # (its new-best-epoch row is no training row)


def test_bad_run_directories_are_one_line_data_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty: no metrics.jsonl") as e:
        load_run(tmp_path / "empty")
    assert "\n" not in str(e.value)
    write_run(tmp_path / "torn", None, [], tail='{"step": 1, "rew')
    with pytest.raises(DataError, match="no readable rows"):
        load_run(tmp_path / "torn")
    write_run(tmp_path / "middle", None, [], tail='{"step": 1\n{"step": 2}\n')
    with pytest.raises(DataError, match=r"metrics.jsonl:1: not a JSON object row"):
        load_run(tmp_path / "middle")
    with pytest.raises(DataError, match="no metrics.jsonl in it"):
        find_runs([tmp_path / "empty"])
    with pytest.raises(DataError, match="no such directory"):
        find_runs([tmp_path / "nowhere"])
    with pytest.raises(DataError, match="metrics.jsonl: a file, not a directory \\(name the run directory that"):
        find_runs([tmp_path / "middle" / "metrics.jsonl"])


@pytest.mark.parametrize(
    "name, arm",
    [("dropout_seed0", "dropout"), ("dropout-seed-2", "dropout"), ("Dropout_SEED1", "Dropout"), ("x-s3", "x")],
)
def test_arm_by_seed_suffix(tmp_path: Path, name: str, arm: str) -> None:
    run = load_run(write_run(tmp_path / name, grpo_config(), grpo_rows(0)))
    assert arm_of(run) == arm


def test_arm_by_seed_directories(tmp_path: Path) -> None:
    assert arm_of(load_run(write_run(tmp_path / "arm_a" / "seed3", grpo_config(), grpo_rows(0)))) == "arm_a"
    assert arm_of(load_run(write_run(tmp_path / "s1" / "arm_b", grpo_config(), grpo_rows(0)))) == "arm_b"
    # the demo's runs: RUNS/demo/arms/<arm>/sft<K>_rl<J>, one arm over its SFT and RL seeds
    demo = [write_run(tmp_path / "arms" / "grpo_null" / f"sft{k}_rl0", grpo_config(), grpo_rows(k)) for k in (0, 1)]
    assert {arm_of(load_run(d)) for d in demo} == {"grpo_null"}


@pytest.mark.parametrize(
    "config, label",
    [
        (grpo_config("none", 0.0), "deterministic"),
        (grpo_config("none", 1.0), "token sampling"),
        (grpo_config("none", 0.0, "ema", 1), "REINFORCE + EMA"),
        (grpo_config("locked"), "Dropout-GRPO"),
        (grpo_config("native"), "Dropout-GRPO"),
        (grpo_config("gaussian"), "Dropout-GRPO"),
        ({**grpo_config("locked"), "grpo": {"shuffle_rewards": True, "group_size": 4}}, "null control"),
    ],
)
def test_arm_by_config(tmp_path: Path, config: dict, label: str) -> None:
    run = load_run(write_run(tmp_path / "run", config, grpo_rows(0)))
    assert arm_of(run) == config_label(run) == label
    sft = load_run(write_run(tmp_path / "other", config, [{"step": 1, "epoch": 0, "stage": 0, "loss": 1.0}]))
    assert arm_of(sft) == "SFT"


def test_grouping_of_a_mixed_directory_and_explicit_labels(runs: Path) -> None:
    groups = all_groups(runs)
    sizes = {name: len(rs) for name, rs in groups.items()}
    assert sizes == {"dropout_grpo": 3, "grpo_deterministic": 2, "REINFORCE + EMA": 1, "sampling": 2, "SFT": 1}
    with pytest.warns(UserWarning, match=r"--label (mine|arms): its \d runs are 2 settings") as said:
        explicit = group_runs(
            [load_run(p) for p in find_runs([runs])],
            {"mine": [runs / "sampling_s0", runs / "reinforce"], "arms": [runs / "arms"]},
        )
    assert len(said) == 2  # (each mixes arms: one mean, as labelled, and said so)
    assert list(explicit)[:2] == ["mine", "arms"]
    assert {n: len(rs) for n, rs in explicit.items()} == {"mine": 2, "arms": 5, "sampling": 1, "SFT": 1}


@pytest.mark.slow
def test_plot_runs_describes_what_it_drew(runs: Path, tmp_path: Path) -> None:
    groups = all_groups(runs)
    desc = plot_runs(
        groups,
        tmp_path / "fig.png",
        panels=("eval", "reward_std", "kept"),
        reference={"Coconut SFT": 0.247, "CoT": 0.3},
        title="demo arms",
    )
    assert (tmp_path / "fig.png").stat().st_size > 1000
    assert desc["panels"]["eval"] == {"dropout_grpo": 4, "grpo_deterministic": 4, "REINFORCE + EMA": 4, "sampling": 4}
    assert desc["panels"]["eval_sft"] == {"SFT": 2}  # (its optimizer steps: an axis of its own)
    assert set(desc["panels"]["reward_std"]) == {"dropout_grpo", "grpo_deterministic", "sampling"}
    # mean lines (+ reference lines in both eval panels)
    assert desc["lines"] == {"eval": 4 + 2, "eval_sft": 1 + 2, "reward_std": 3, "kept": 4}
    assert desc["bands"]["eval"] == ["dropout_grpo", "grpo_deterministic", "sampling"]
    assert desc["notes"]["reward_std"] == ["REINFORCE + EMA: no within-group std (K = 1)", "SFT: no GRPO steps"]
    assert desc["notes"]["eval"] == desc["notes"]["eval_sft"] == []
    assert desc["eval_keys"] == [EVAL, "eval/valid/accuracy"]
    # the torn last line of sampling_s1 is skipped: its steps still align with sampling_s0 (6 shared steps)
    assert desc["panels"]["kept"]["sampling"] == 6


@pytest.mark.slow
def test_eval_key_selects_one_eval_column(runs: Path, tmp_path: Path) -> None:
    """A full column name selects that column; a dataset name matches it with or without a source prefix (the
    commands log eval/valid/accuracy; a Python-API run may name its set builtin:valid: the same validation set)."""
    fig, desc = draw(all_groups(runs), panels=("eval",), eval_key="eval/valid/accuracy")
    assert desc["panels"] == {"eval": {}, "eval_sft": {"SFT": 2}} and desc["eval_keys"] == ["eval/valid/accuracy"]
    assert any("no eval/valid/accuracy rows" in n for n in desc["notes"]["eval"])
    for key in ("valid", "builtin:valid"):
        fig, desc = draw(all_groups(runs), panels=("eval",), eval_key=key)
        assert {**desc["panels"]["eval"], **desc["panels"]["eval_sft"]}.keys() == set(all_groups(runs))
        assert desc["notes"]["eval"] == desc["notes"]["eval_sft"] == []
    with pytest.raises(DataError, match=r"--eval-key gsm8k:test: no run logged it \(eval columns logged: .*valid"):
        draw(all_groups(runs), panels=("eval",), eval_key="gsm8k:test")  # (a typo drew an empty panel, exit 0)


@pytest.mark.parametrize("suffix", [".png", ".pdf", ".svg"])
def test_every_format_is_written(runs: Path, tmp_path: Path, suffix: str) -> None:
    out = tmp_path / "out" / f"fig{suffix}"
    plot([runs / "arms"], out)
    assert out.stat().st_size > 1000


def test_unknown_suffix_and_panel_are_data_errors(runs: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"fig.jpg: unknown figure format '.jpg'") as e:
        plot([runs], tmp_path / "fig.jpg")
    assert "\n" not in str(e.value)
    with pytest.raises(DataError, match="unknown panel"):
        plot([runs], tmp_path / "fig.png", panels=("loss",))


def test_legends_sit_outside_the_axes(runs: Path) -> None:
    fig, desc = draw(all_groups(runs), panels=("eval", "reward_std"), reference={"Coconut SFT": 0.247})
    assert [len(ax.collections) for ax in fig.axes] == [3, 0, 3]  # min-max bands: the groups with >= 2 runs
    assert [len(ax.get_lines()) for ax in fig.axes] == list(desc["lines"].values()) == [5, 2, 3]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    boxes = []
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None
        box = legend.get_window_extent(renderer)
        boxes.append(box)
        for other in fig.axes:
            assert not box.overlaps(other.get_window_extent(renderer))  # clear of every panel's data area
        assert not box.overlaps(ax.xaxis.label.get_window_extent(renderer))
        assert box.width > 0 and box.height > 0
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def test_cli_plot(runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.svg"
    argv = ["plot", str(runs / "arms"), str(runs / "reinforce"), "--out", str(out), "--panels", "eval,reward_std"]
    argv += ["--reference", "Coconut SFT=0.247", "--label", f"mine={runs / 'sampling_s0'},{runs / 'sampling_s1'}"]
    assert main([*argv, "--title", "arms"]) == 0
    line = capsys.readouterr().out.strip()
    assert out.stat().st_size > 1000 and str(out) in line and "\n" not in line
    assert "eval: 4 group(s), 5 line(s)" in line


def test_cli_plot_labels_may_hold_an_equals_sign(runs: Path, tmp_path: Path, capsys) -> None:
    """``--label "p = 0.2=RUN"`` (the help's example): the name ends at the ``=`` after which the runs exist."""
    from dgrpo.cli.plot import parse_pairs

    out, both = tmp_path / "sweep.png", f"{runs / 'sampling_s0'},{runs / 'sampling_s1'}"
    assert parse_pairs([f"p = 0.2={both}"], "--label") == [("p = 0.2", both)]
    assert main(["plot", "--label", f"p = 0.2={both}", "--out", str(out)]) == 0 and out.stat().st_size > 1000
    assert main(["plot", "--label", f"p = 0.2={tmp_path / 'nowhere'}", "--out", str(out)]) == 2  # (no such run)


def test_a_reference_or_eval_key_without_the_eval_panel_is_warned_of(tmp_path: Path) -> None:
    """``--reference`` and ``--eval-key`` are drawn in the eval panel only: given with ``--panels reward_std`` they
    were dropped without a word."""
    groups = group_runs([load_run(write_run(tmp_path / "r", grpo_config(), grpo_rows(0)))])
    with pytest.warns(
        UserWarning,
        match=r"^the reference lines and the eval key go to the eval panel, which the panels \(reward_std\) leave out$",
    ):
        draw(groups, panels=("reward_std",), reference={"SFT": 0.2}, eval_key="valid")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        draw(groups, panels=("reward_std",))


def test_cli_plot_references_may_hold_an_equals_sign(runs: Path, tmp_path: Path) -> None:
    """``--reference "SFT (p = 0.1)=0.247"``: the value is what follows the last ``=`` (it split at the first, and
    refused '0.1)=0.247' as not a number)."""
    from dgrpo.cli.plot import parse_pairs

    assert parse_pairs(["SFT (p = 0.1)=0.247"], "--reference") == [("SFT (p = 0.1)", "0.247")]
    out = tmp_path / "ref.png"
    assert main(["plot", str(runs / "arms"), "--reference", "SFT (p = 0.1)=0.247", "--out", str(out)]) == 0
    assert out.stat().st_size > 1000


def test_cli_plot_bad_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nowhere: no such directory" in err
    assert main(["plot", str(tmp_path), "--out", str(tmp_path / "x.png"), "--reference", "oops"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err
    for refs, expect in ((["a=24.7"], "a fraction in [0, 1]"), (["a=0.2", "a=0.3"], "a: given twice (0.2 and 0.3)")):
        argv = ["plot", str(tmp_path), "--out", str(tmp_path / "x.png")]
        assert main([*argv, *(x for r in refs for x in ("--reference", r))]) == 2
        assert expect in capsys.readouterr().err


@pytest.mark.slow
def test_cli_plot_unwritable_figure_is_one_line(runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file where the figure's folder should be, or a folder named like the figure: one line, exit 2."""
    (tmp_path / "a_file").write_text("")
    (tmp_path / "a_folder.png").mkdir()
    for out, why in ((tmp_path / "a_file" / "x.png", "File exists"), (tmp_path / "a_folder.png", "Is a directory")):
        assert main(["plot", str(runs), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{out}: cannot write the figure there ({why})" in err, err


def test_runs_of_one_label_but_other_settings_are_not_averaged(tmp_path: Path) -> None:
    """A sweep plotted by directory (no seed in the names): the config's label groups runs only when they differ in
    the seed alone; otherwise each run is its own line, named by its directory (and its parent's, where needed)."""
    base = grpo_config("locked")
    write_run(tmp_path / "a" / "lr_low", {**base, "seed": 0}, grpo_rows(0))
    write_run(tmp_path / "a" / "lr_high", {**base, "seed": 0, "grpo": {**base["grpo"], "lr": 1e-4}}, grpo_rows(1))
    write_run(tmp_path / "b" / "lr_high", {**base, "seed": 0, "grpo": {**base["grpo"], "lr": 1e-3}}, grpo_rows(2))
    assert {n: len(rs) for n, rs in all_groups(tmp_path).items()} == {"lr_low": 1, "a/lr_high": 1, "b/lr_high": 1}
    # the same setting under two seeds (and another thread count) stays one arm, labelled by the config
    other = tmp_path / "seeds"
    write_run(other / "first", {**base, "seed": 0, "threads": 1}, grpo_rows(0))
    write_run(other / "second", {**base, "seed": 1, "threads": 2}, grpo_rows(1))
    assert {n: len(rs) for n, rs in all_groups(other).items()} == {"Dropout-GRPO": 2}


def test_a_run_that_logged_nothing_is_skipped_with_a_warning(runs: Path, tmp_path: Path) -> None:
    """A run that crashed at start (empty metrics.jsonl) below the plotted directory made the whole plot fail."""
    write_run(runs / "crashed", grpo_config(), [])
    out = tmp_path / "fig.png"
    with pytest.warns(UserWarning, match=r"skipped .*crashed/metrics.jsonl: no readable rows"):
        desc = plot([runs], out, panels=("eval",))
    assert out.stat().st_size > 1000 and set(desc["panels"]["eval"]) == set(all_groups(runs / "arms")) | {
        "REINFORCE + EMA",
        "sampling",
    }
    assert desc["panels"]["eval_sft"] == {"SFT": 2}
    with pytest.warns(UserWarning, match="crashed"):  # in a labelled group beside a run that logged
        desc = plot([], out, groups={"mine": [runs / "crashed", runs / "sft"]}, panels=("eval",))
    assert desc["panels"]["eval"] == {"mine": 2}
    with pytest.raises(DataError, match=r"crashed/metrics.jsonl: no readable rows"):  # nothing else to draw
        plot([runs / "crashed"], out)


@pytest.mark.slow
def test_panels_may_be_one_name_or_a_logged_reward_part(runs: Path, tmp_path: Path) -> None:
    """panels="reward_mean" was read letter by letter ("unknown panel(s) r, e, w, ..."); reward/<part> draws one
    part of grpo.rewards as the run logged it."""
    desc = plot([runs / "arms"], tmp_path / "one.png", panels="reward_mean")
    assert list(desc["panels"]) == ["reward_mean"] and len(desc["panels"]["reward_mean"]) == 2
    rows = [{**r, "reward/correct": 0.1 * r["step"]} if "reward_mean" in r else r for r in grpo_rows(0)]
    write_run(tmp_path / "parts", grpo_config(), rows)
    desc = plot([tmp_path / "parts", runs / "arms"], tmp_path / "parts.png", panels=["reward/correct"])
    assert desc["panels"]["reward/correct"] == {"Dropout-GRPO": 6}
    assert any("no reward/correct values" in n for n in desc["notes"]["reward/correct"])  # the runs without it
    # a part no run logged (a misspelling) is an error naming the logged parts, not an empty panel
    with pytest.raises(DataError, match=r"no run logged reward/corect \(reward parts logged: reward/correct\)"):
        plot([tmp_path / "parts"], tmp_path / "x.png", panels=["reward/correct", "reward/corect"])
    with pytest.raises(DataError, match=r"unknown panel\(s\) rewards; choose from .* or reward/<part>"):
        plot([runs], tmp_path / "x.png", panels="rewards")


def test_a_grpo_run_in_its_first_step_is_not_called_sft(tmp_path: Path) -> None:
    """Its only row is the step-0 evaluation: it was labelled SFT, with the note 'no GRPO steps'."""
    early = load_run(write_run(tmp_path / "early", grpo_config("locked"), [{"step": 0, EVAL: 0.3}]))
    assert early.is_grpo and config_label(early) == "Dropout-GRPO"


def test_a_seed_that_stopped_early_is_named_where_the_mean_stops(tmp_path: Path) -> None:
    """The mean is over the steps every seed reached; a seed cut short cut the curve without a word."""
    write_run(tmp_path / "arm" / "seed0", grpo_config("locked"), grpo_rows(0, steps=6))
    write_run(tmp_path / "arm" / "seed1", grpo_config("locked"), grpo_rows(1, steps=4))
    desc = plot([tmp_path / "arm"], tmp_path / "fig.png", panels=("kept",))
    assert desc["panels"]["kept"]["arm"] == 4
    assert desc["notes"]["kept"] == ["arm: mean to step 4, where its shortest run stops (the longest: 6)"]


@pytest.mark.slow
def test_the_command_line_says_a_warning_in_one_line(runs: Path, tmp_path: Path) -> None:
    """dgrpo's warnings on the command line are 'dgrpo: warning: ...' lines (they were Python's 'file:line:
    UserWarning:' followed by a line of dgrpo's source)."""
    from conftest import dgrpo

    (runs / "crashed").mkdir()
    (runs / "crashed" / "metrics.jsonl").write_text("")
    r = dgrpo("plot", runs / "crashed", runs / "sft", "--out", tmp_path / "fig.png")
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [
        f"dgrpo: warning: skipped {runs / 'crashed' / 'metrics.jsonl'}: no readable rows (a run that stopped before "
        "logging a step?)"
    ]


@pytest.mark.slow
def test_runs_scored_by_other_rules_are_warned_about_in_the_eval_panel(tmp_path: Path) -> None:
    """An exact-match run beside numeric ones was overlaid without a word."""
    write_run(tmp_path / "a", grpo_config(), grpo_rows(0))  # (no eval.scorer: the default, numeric)
    write_run(tmp_path / "b", {**grpo_config(), "eval": {"scorer": "numeric"}}, grpo_rows(1))
    write_run(tmp_path / "c", {**grpo_config(), "eval": {"scorer": "exact"}}, grpo_rows(2))
    with pytest.warns(UserWarning, match=r"different eval.scorer rules: numeric \(a, b\); exact \(c\)"):
        plot([tmp_path / "a", tmp_path / "b", tmp_path / "c"], tmp_path / "fig.png")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot([tmp_path / "a", tmp_path / "b"], tmp_path / "fig.png")  # one rule: no warning
        plot([tmp_path / "a", tmp_path / "c"], tmp_path / "fig.png", panels=("reward_std",))  # no eval panel


def test_seeds_that_validated_on_different_data_are_not_averaged(tmp_path: Path) -> None:
    """Each run's first eval column was plotted: an arm whose seeds validated on different data was drawn as one mean
    over them, with a band from one to the other, without a word; --eval-key picks one column for all."""
    write_run(tmp_path / "a" / "seed0", grpo_config(), [{"step": 0, EVAL: 0.1}, {"step": 2, EVAL: 0.3}])
    other = [{"step": 0, "eval/other/accuracy": 0.9}, {"step": 2, "eval/other/accuracy": 0.9}]
    write_run(tmp_path / "a" / "seed1", grpo_config(), other)
    said = r"a: its runs validated on different data \(builtin:valid \(seed0\); other \(seed1\)\)"
    with pytest.raises(DataError, match=said):
        plot([tmp_path / "a"], tmp_path / "fig.png")
    desc = plot([tmp_path / "a"], tmp_path / "fig.png", eval_key="valid")
    assert EVAL in desc["eval_keys"]  # (seed1 has no such column: seed0 alone is drawn)
    for seed in (2, 3, 4):  # (more than three runs: the first three named and how many more, as elsewhere)
        write_run(tmp_path / "a" / f"seed{seed}", grpo_config(), other)
    with pytest.raises(DataError, match=r"; other \(seed1, seed2, seed3 and 1 more\)\); their mean"):
        plot([tmp_path / "a"], tmp_path / "fig.png")


def test_an_eval_key_takes_a_dataset_with_or_without_its_source_prefix_as_one_set(tmp_path: Path) -> None:
    """``--eval-key valid`` reads a run's ``builtin:valid`` as the same set (``_eval_key``'s rule), but a group whose
    seeds logged one each was refused as validated on different data, advising ``--eval-key`` with one of them:
    either matched both again. Under an explicit name they are one set; without one they are still refused."""
    write_run(tmp_path / "a" / "seed0", grpo_config(), [{"step": 0, EVAL: 0.1}, {"step": 2, EVAL: 0.3}])
    short = [{"step": 0, "eval/valid/accuracy": 0.2}, {"step": 2, "eval/valid/accuracy": 0.5}]
    write_run(tmp_path / "a" / "seed1", grpo_config(), short)
    seeds = {"a": [load_run(p) for p in find_runs([tmp_path / "a"])]}
    with pytest.raises(DataError, match=r"pass --eval-key with one of builtin:valid, valid$"):
        draw(seeds, panels=("eval",))
    for key in ("valid", "builtin:valid"):
        _, desc = draw(seeds, panels=("eval",), eval_key=key)
        assert desc["panels"]["eval"] == {"a": 2} and len(desc["bands"]["eval"]) == 1  # (one mean over both seeds)
    _, desc = draw(seeds, panels=("eval",), eval_key="eval/valid/accuracy")  # (a full column: that column only)
    assert desc["eval_keys"] == ["eval/valid/accuracy"] and desc["bands"]["eval"] == []


def test_seeds_whose_data_valid_differ_are_drawn_as_one_mean_with_a_warning(tmp_path: Path) -> None:
    """The commands log a run's data.valid as ``eval/valid/...`` whatever it is: seeds of one folder that validated
    on other files were one mean without a word (one column name, so not refused as different data)."""
    rows = [{"step": 0, "eval/valid/accuracy": 0.1}, {"step": 2, "eval/valid/accuracy": 0.3}]
    for seed, valid in enumerate(["mine_a.jsonl", "mine_b.jsonl", "mine_a.jsonl"]):
        write_run(tmp_path / "arm" / f"seed{seed}", {**grpo_config(), "data": {"valid": valid}}, rows)
    seeds = {"arm": [load_run(p) for p in find_runs([tmp_path / "arm"])]}
    said = r"^arm: its runs' eval/valid is their data.valid, which differs between them \(mine_a.jsonl \(seed0, seed2\)"
    with pytest.warns(UserWarning, match=said + r"; mine_b.jsonl \(seed1\)\); their mean mixes those sets$"):
        _, desc = draw(seeds, panels=("eval",))
    assert desc["panels"]["eval"] == {"arm": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        draw({"arm": seeds["arm"][::2]}, panels=("eval",))  # (one data.valid)
        draw(seeds, panels=("reward_std",))  # (no eval panel)


def test_a_run_in_two_label_groups_is_drawn_in_both_with_a_warning(runs: Path, tmp_path: Path) -> None:
    """``--label A=<folder> --label B=<a run below it>`` drew that run in A's mean and as B, without a word."""
    arm = runs / "arms" / "dropout_grpo"
    with pytest.warns(UserWarning, match=r"several --label groups are drawn in each: \S+/seed1 \(A, B\); their"):
        groups = group_runs([], {"A": [arm], "B": [arm / "seed1"]})
    assert {name: [r.name for r in members] for name, members in groups.items()} == {
        "A": ["seed0", "seed1", "seed2"],
        "B": ["seed1"],
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        group_runs([], {"A": [arm / "seed0"], "B": [arm / "seed1"]})


def test_an_sft_runs_curve_is_over_its_optimizer_steps_never_on_the_grpo_step_axis(runs: Path, tmp_path: Path) -> None:
    """An SFT run's steps are its optimizer steps: its validation curve was drawn on the GRPO runs' axis, labelled
    "step" (800 SFT steps beside 6 GRPO steps squashed the GRPO curves into the left edge), and alone it read as GRPO
    steps. Beside GRPO runs it has a panel of its own, over "SFT optimizer step"; a group of both is refused."""
    rows = [{"step": 400 * t, "epoch": t - 1, "stage": t - 1, "eval/valid/accuracy": 0.1 * t} for t in (1, 2)]
    sft = load_run(write_run(tmp_path / "long_sft", {"seed": 0}, [{"step": 1, "loss": 2.0}, *rows]))
    grpo = [load_run(p) for p in find_runs([runs / "arms" / "dropout_grpo"])]
    fig, desc = draw({"Dropout-GRPO": grpo, "SFT": [sft]}, panels=("eval", "kept"), eval_key="valid")
    assert [ax.get_xlabel() for ax in fig.axes] == ["GRPO step", "SFT optimizer step", "GRPO step"]
    assert list(desc["panels"]) == ["eval", "eval_sft", "kept"] and desc["panels"]["eval_sft"] == {"SFT": 2}
    grpo_eval, sft_eval = fig.axes[:2]
    sft_xs = [np.asarray(line.get_xdata()).tolist() for line in sft_eval.get_lines()]
    assert grpo_eval.get_xlim()[1] < 10 and sft_xs == [[400, 800]]
    assert sft_eval.get_title() == "SFT: accuracy on valid" and grpo_eval.get_title() == "accuracy on builtin:valid"
    fig, desc = draw({"SFT": [sft]}, panels=("eval",))  # alone: one panel, over its optimizer steps
    assert [ax.get_xlabel() for ax in fig.axes] == ["SFT optimizer step"] and desc["panels"] == {"eval": {"SFT": 2}}
    fig, _ = draw({"Dropout-GRPO": grpo}, panels=("eval",))
    assert [ax.get_xlabel() for ax in fig.axes] == ["GRPO step"]
    with pytest.raises(DataError, match=r"^mine: holds SFT runs \(long_sft\) and GRPO runs \(seed0, .*own group$"):
        draw({"mine": [sft, *grpo]}, panels=("eval",), eval_key="valid")


def test_a_run_named_twice_is_one_seed_not_two(runs: Path, tmp_path: Path) -> None:
    """A run directory given twice under other names (relative and absolute, through ``..``, a link) was loaded
    twice and averaged with itself: the legend said "mean of 2 seeds (band: min-max)" of one run."""
    seed0 = runs / "arms" / "dropout_grpo" / "seed0"
    link = tmp_path / "link_to_seed0"
    link.symlink_to(seed0)
    named = [seed0, seed0 / ".." / "seed0", link]
    assert find_runs(named) == [seed0]
    desc = plot(named, tmp_path / "fig.png")
    assert desc["panels"]["eval"] == {"dropout_grpo": 4} and desc["bands"]["eval"] == []


@pytest.mark.parametrize("option", ["--title", "--label", "--reference"])
def test_math_text_matplotlib_cannot_draw_is_one_line(runs: Path, tmp_path: Path, capsys, option: str) -> None:
    """A title, group or reference name with a pair of $ is math text to matplotlib; one it cannot parse raised a
    ValueError traceback as the figure was laid out. Math text it can draw, and a lone $, are drawn."""
    run = str(runs / "reinforce")
    bad = r"p $\badcmd$"
    given = {"--title": [run, "--title", bad], "--label": ["--label", f"{bad}={run}"]}
    args = given.get(option, [run, "--reference", f"{bad}=0.2"])
    assert main(["plot", *args, "--out", str(tmp_path / "bad.png")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"dgrpo: error: the {option[2:].replace('label', 'group')} 'p $")
    assert "Unknown symbol" in err and not (tmp_path / "bad.png").exists()
    assert main(["plot", run, "--title", "$p = 0.1$, budget $5", "--out", str(tmp_path / "ok.png")]) == 0


def test_runs_of_other_settings_that_share_their_name_and_parents_name_stay_apart(tmp_path: Path) -> None:
    """``lr1e-5/out/grpo`` and ``lr1e-4/out/grpo`` (two settings, one label) were both named ``out/grpo`` (the run's
    name and its parent's): one group, their learning rates averaged into one line with a "2 seeds" band."""
    base = grpo_config("locked")
    for lr, seed in ((1e-5, 0), (1e-4, 1)):
        config = {**base, "grpo": {**base["grpo"], "lr": lr}}
        write_run(tmp_path / f"lr{lr:g}" / "out" / "grpo", config, grpo_rows(seed))
    write_run(tmp_path / "other" / "grpo", {**base, "grpo": {**base["grpo"], "lr": 3e-5}}, grpo_rows(2))
    groups = {n: len(rs) for n, rs in all_groups(tmp_path).items()}
    assert groups == {"lr0.0001/out/grpo": 1, "lr1e-05/out/grpo": 1, "other/grpo": 1}


def test_eval_key_of_a_mean_score_column_draws_the_mean_score(tmp_path: Path) -> None:
    """``--eval-key eval/valid/mean_score`` (a partial-credit scorer's mean: grpo.best_metric=mean_score keeps best/
    by it) was refused as "no run logged it", naming the very dataset the runs logged it for. It is drawn, titled as
    a mean score; a column of another metric is refused in one line naming what the panel draws."""
    rows = [{"step": t, "eval/valid/accuracy": 0.2, "eval/valid/mean_score": 0.3 + 0.1 * t} for t in (0, 2)]
    run = write_run(tmp_path / "r", grpo_config(), [*rows, *grpo_rows(0)[1:]])
    groups = group_runs([load_run(run)])
    fig, desc = draw(groups, panels=("eval",), eval_key="eval/valid/mean_score")
    assert desc["panels"]["eval"] == {"Dropout-GRPO": 2} and desc["eval_keys"] == ["eval/valid/mean_score"]
    assert (fig.axes[0].get_title(), fig.axes[0].get_ylabel()) == (
        "mean score on valid",
        "mean score (greedy, no dropout)",
    )
    with pytest.raises(DataError, match=r"^--eval-key eval/valid/loss: the eval panel draws eval/<name>/accuracy "):
        draw(groups, panels=("eval",), eval_key="eval/valid/loss")


def test_where_the_mean_stops_is_the_last_step_all_seeds_logged(tmp_path: Path) -> None:
    """Seeds that logged their last value at other steps (grpo.steps 7 and 10, evaluated every 2 steps and at the
    end): the mean stops at 6, the last step they share; the note said "mean to step 7", where no mean was drawn."""
    for seed, steps in ((0, 7), (1, 10)):
        rows = [{"step": t, EVAL: 0.1 * seed + 0.01 * t} for t in range(0, steps, 2)] + [{"step": steps, EVAL: 0.5}]
        write_run(tmp_path / "arm" / f"seed{seed}", grpo_config("locked"), rows)
    desc = plot([tmp_path / "arm"], tmp_path / "fig.png", panels=("eval",))
    assert desc["panels"]["eval"]["arm"] == 4
    assert desc["notes"]["eval"] == ["arm: mean to step 6, the last step all its runs logged (they stop at 7 to 10)"]


def test_an_unreadable_config_or_metrics_file_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config.json that is not UTF-8 (a damaged file) and a metrics.jsonl that cannot be read (no permission)
    were tracebacks (UnicodeDecodeError, PermissionError)."""
    run = write_run(tmp_path / "r", None, grpo_rows(0))
    (run / "config.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(DataError, match=r"config.json: not UTF-8 text \(byte 0\)$"):
        load_run(run)
    (run / "config.json").unlink()
    read_text = Path.read_text

    def refused(self: Path, encoding: str | None = None, errors: str | None = None) -> str:
        if self.name == "metrics.jsonl":
            raise PermissionError(13, "Permission denied")
        return read_text(self, encoding, errors)

    monkeypatch.setattr(Path, "read_text", refused)
    with pytest.raises(DataError, match=r"metrics.jsonl: cannot read it \(Permission denied\)$"):
        load_run(run)


def test_a_folder_of_links_to_runs_finds_them(runs: Path, tmp_path: Path) -> None:
    """A folder assembled from links to the runs compared (``ln -s ../runs/a cmp/a``) was 'no metrics.jsonl in it or
    in any directory below it' (Path.rglob does not follow links); a link to a folder above ends there."""
    cmp = tmp_path / "cmp"
    cmp.mkdir()
    (cmp / "det").symlink_to(runs / "arms" / "grpo_deterministic")
    (cmp / "reinforce").symlink_to(runs / "reinforce")
    (cmp / "self").symlink_to(cmp)  # (a loop: cmp/self/self/...)
    found = find_runs([cmp])
    assert found == [cmp / "det" / "seed0", cmp / "det" / "seed1", cmp / "reinforce"]
    assert {n: len(rs) for n, rs in all_groups(cmp).items()} == {"grpo_deterministic": 2, "REINFORCE + EMA": 1}


def test_a_run_path_may_start_at_the_home_folder(runs: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """``--label "p = 0.2=~/runs/a,~/runs/b"``: the shell expands no ``~`` after a comma (nor in quotes); dgrpo plot
    said '~/runs/b: no such directory'. A run directory given as ``~/...`` is read from the home folder too."""
    monkeypatch.setenv("HOME", str(runs))
    out = tmp_path / "home.png"
    assert main(["plot", "--label", "p = 0.2=~/sampling_s0,~/sampling_s1", "--out", str(out)]) == 0
    assert "p = 0.2" in group_runs([], {"p = 0.2": ["~/sampling_s0", "~/sampling_s1"]})
    assert find_runs(["~/reinforce"]) == [runs / "reinforce"]


def test_a_run_given_as_a_link_is_named_as_given(tmp_path: Path) -> None:
    """``cmp/p01_seed0`` linked to ``store/run_17``: the run was named ``run_17`` (its target's name), so its seed
    suffix was lost and the two linked seeds were grouped by their config instead of as ``p01``. A link in a folder
    of seed links (``cmp/arm/seed0``) is grouped by the folder it sits in."""
    cmp = tmp_path / "cmp"
    (cmp / "arm").mkdir(parents=True)
    for s, target in enumerate(("run_17", "run_23")):
        write_run(tmp_path / "store" / target, grpo_config(), grpo_rows(s))
        (cmp / f"p01_seed{s}").symlink_to(tmp_path / "store" / target)
        (cmp / "arm" / f"seed{s}").symlink_to(tmp_path / "store" / target)
    run = load_run(cmp / "p01_seed0")
    assert run.name == "p01_seed0" and arm_of(run) == "p01"
    assert arm_of(load_run(cmp / "arm" / "seed1")) == "arm"
    groups = group_runs([load_run(cmp / "p01_seed0"), load_run(cmp / "p01_seed1")])
    assert {n: [r.name for r in rs] for n, rs in groups.items()} == {"p01": ["p01_seed0", "p01_seed1"]}


def test_runs_of_one_name_in_other_folders_are_one_arm_only_as_seeds_of_one_setting(tmp_path: Path) -> None:
    """``a/grpo_seed0``, ``a/grpo_seed1`` and ``b/grpo_seed0``, ``b/grpo_seed1`` were one group ``grpo``, a "mean of
    4 seeds" over two experiments, whether their learning rates differed or they were two experiments of one config
    (seed 0 twice). They are split by folder; seeds of one setting spread over folders stay one arm, and so do the
    seeds in one folder whose configs differ (the demo's arms/<arm>/sft<K>_rl<J>: each from its SFT checkpoint)."""
    base = grpo_config("locked")

    def grouped(root: Path) -> dict:
        return {n: sorted(str(r.path.relative_to(root)) for r in rs) for n, rs in all_groups(root).items()}

    for folder, lr in (("a", 1e-4), ("b", 1e-3)):
        for s in (0, 1):
            config = {**base, "seed": s, "grpo": {**base["grpo"], "lr": lr}}
            write_run(tmp_path / "lrs" / folder / f"grpo_seed{s}", config, grpo_rows(s))
            write_run(tmp_path / "twice" / folder / f"grpo_seed{s}", {**base, "seed": s}, grpo_rows(s))
            more = tmp_path / "more" / folder / f"grpo_seed{2 * (folder == 'b') + s}"
            write_run(more, {**base, "seed": 2 * (folder == "b") + s}, grpo_rows(s))
            write_run(tmp_path / "dirs" / f"exp_{folder}" / "arm" / f"seed{s}", {**base, "seed": s}, grpo_rows(s))
    for root in ("lrs", "twice"):
        assert grouped(tmp_path / root) == {
            "a/grpo": ["a/grpo_seed0", "a/grpo_seed1"],
            "b/grpo": ["b/grpo_seed0", "b/grpo_seed1"],
        }
    assert grouped(tmp_path / "dirs") == {
        "exp_a/arm": ["exp_a/arm/seed0", "exp_a/arm/seed1"],
        "exp_b/arm": ["exp_b/arm/seed0", "exp_b/arm/seed1"],
    }
    assert {n: len(rs) for n, rs in all_groups(tmp_path / "more").items()} == {"grpo": 4}  # four seeds of one setting
    for k in (0, 1):  # one arm's seeds from two SFT checkpoints (their model differs), in one folder
        config = {**base, "seed": 100 * k, "model": {"name_or_path": f"sft/seed{k}/final"}}
        write_run(tmp_path / "demo" / "arms" / "dropout_grpo" / f"sft{k}_rl0", config, grpo_rows(k))
    assert {n: len(rs) for n, rs in all_groups(tmp_path / "demo" / "arms").items()} == {"dropout_grpo": 2}


def test_a_label_named_as_the_other_runs_group_is_refused(tmp_path: Path, capsys) -> None:
    """``--label dropout=runs/mine`` beside ``runs/dropout_seed0``, ``runs/dropout_seed1`` (grouped as ``dropout``)
    drew one line, a mean over the labelled run and the other two, unsaid; so did a label named as the other runs'
    config group. Refused in one line naming the clash; the label with the other runs in it, or another name, draws."""
    base = grpo_config("locked")
    for s in (0, 1):
        write_run(tmp_path / f"dropout_seed{s}", base, grpo_rows(s))
    mine = write_run(tmp_path / "mine", {**base, "grpo": {**base["grpo"], "lr": 1e-3}}, grpo_rows(2))
    other = write_run(tmp_path / "other" / "run", grpo_config("none"), grpo_rows(3))
    runs = [load_run(p) for p in (tmp_path / "dropout_seed0", tmp_path / "dropout_seed1", other)]
    with pytest.raises(DataError, match=r"^--label dropout: the other runs .*dropout_seed0, .*dropout_seed1 are gro"):
        group_runs(runs, {"dropout": [mine]})
    with pytest.raises(
        DataError,
        match=r"^--label deterministic: the other runs .*run are grouped under that name too \(by their config\)",
    ):
        group_runs(runs, {"deterministic": [mine]})
    with pytest.warns(UserWarning, match=r"^--label dropout: its 3 runs are 2 settings"):  # (mine's lr)
        both = group_runs(runs, {"dropout": [mine, tmp_path / "dropout_seed0", tmp_path / "dropout_seed1"]})
    assert {n: len(rs) for n, rs in both.items()} == {"dropout": 3, "deterministic": 1}
    assert {n: len(rs) for n, rs in group_runs(runs, {"mine": [mine]}).items()} == {
        "mine": 1,
        "dropout": 2,
        "deterministic": 1,
    }
    argv = ["plot", str(tmp_path / "dropout_seed0"), str(tmp_path / "dropout_seed1"), "--label", f"dropout={mine}"]
    assert main([*argv, "--out", str(tmp_path / "fig.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--label dropout: the other runs" in err and not (tmp_path / "fig.png").exists()


def test_a_label_over_runs_of_other_settings_is_one_mean_with_a_warning(tmp_path: Path) -> None:
    """A ``--label`` is the user's group: one mean over all its runs. Over the seeds of two learning rates it was drawn
    as "mean of 4 seeds (band: min-max)" without a word that the band spans two settings; a warning names the keys
    that differ. Seeds of one setting (other seed, threads) draw no warning."""
    base = grpo_config("locked")
    for folder, lr in (("a", 1e-4), ("b", 1e-3)):
        for s in (0, 1):
            config = {**base, "seed": s, "threads": s + 1, "grpo": {**base["grpo"], "lr": lr}}
            write_run(tmp_path / f"{folder}_s{s}", config, grpo_rows(s))
    write_run(tmp_path / "no_config", None, grpo_rows(2))  # (a run without config.json: no setting to compare)
    with pytest.warns(UserWarning, match=r"^--label mine: its 4 runs are 2 settings \(they differ in grpo.lr\); drawn"):
        desc = plot([], tmp_path / "fig.png", groups={"mine": [tmp_path / f"{f}_s{s}" for f in "ab" for s in (0, 1)]})
    assert desc["panels"]["eval"] == {"mine": 4} and desc["bands"]["eval"] == ["mine"] and desc["lines"]["eval"] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        group_runs([], {"a": [tmp_path / "a_s0", tmp_path / "a_s1", tmp_path / "no_config"]})


def test_a_label_over_one_arm_s_seeds_from_other_checkpoints_draws_no_warning(tmp_path: Path) -> None:
    """The demo's arms/<arm>/sft<K>_rl<J>: each RL seed starts from its SFT seed's checkpoint (model.name_or_path
    differs), and the automatic grouping keeps them one arm; ``--label Dropout=runs/demo/arms/dropout_grpo`` warned
    "its 2 runs are 2 settings (they differ in model.name_or_path)". A key that differs between the seeds of one place
    is a seed's; a label over two arms still names the keys that tell them apart, not the seed's."""
    arms = tmp_path / "demo" / "arms"
    for arm, kind in (("dropout_grpo", "locked"), ("grpo_sampling", "none")):
        for k in (0, 1):
            config = {**grpo_config(kind), "seed": 100 * k, "model": {"name_or_path": f"sft/seed{k}/final"}}
            write_run(arms / arm / f"sft{k}_rl0", config, grpo_rows(k))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        groups = group_runs([], {"Dropout": [arms / "dropout_grpo"]})
    assert {n: len(rs) for n, rs in groups.items()} == {"Dropout": 2}
    said = r"^--label both: its 4 runs are 2 settings \(they differ in perturbation.kind\); drawn"
    with pytest.warns(UserWarning, match=said):
        group_runs([], {"both": [arms]})


def test_runs_without_a_config_of_one_name_in_other_folders_are_drawn_apart(tmp_path: Path) -> None:
    """Two runs without config.json and with no seed in their names, ``exp1/final`` and ``exp2/final``, were one group
    ``final`` (their name: the config says no arm), "mean of 2 seeds" of two runs nothing says are seeds of one
    experiment. Each is drawn apart, named by its folders; one alone keeps its name."""
    for exp, s in (("exp1", 0), ("exp2", 1)):
        write_run(tmp_path / exp / "final", None, grpo_rows(s))
    assert {n: len(rs) for n, rs in all_groups(tmp_path).items()} == {"exp1/final": 1, "exp2/final": 1}
    assert list(all_groups(tmp_path / "exp1")) == ["final"]


def test_a_link_beside_a_run_does_not_rename_it(tmp_path: Path, monkeypatch) -> None:
    """``runs/latest -> grpo_seed1`` beside ``grpo_seed0`` and ``grpo_seed1``: the run was found once, through the
    link when the folder listing gave it first, and then named ``latest`` (a run is named as given or found), so seed
    1 left its arm: two lines of one seed each, ``grpo`` and ``Dropout-GRPO``. It is found under its own name; a link
    to a run found nowhere else keeps the link's name."""
    import os

    walk = os.walk

    def links_first(top: str, **kwargs):  # (the listing order that showed it, whatever the file system's)
        for folder, subfolders, files in walk(top, **kwargs):
            subfolders.sort(key=lambda name: not os.path.islink(os.path.join(folder, name)))
            yield folder, subfolders, files

    monkeypatch.setattr(os, "walk", links_first)
    base = grpo_config("locked")
    for s in (0, 1):
        write_run(tmp_path / "runs" / f"grpo_seed{s}", {**base, "seed": s}, grpo_rows(s))
    (tmp_path / "runs" / "latest").symlink_to("grpo_seed1")
    (tmp_path / "cmp").mkdir()
    (tmp_path / "cmp" / "p01_seed1").symlink_to(tmp_path / "runs" / "grpo_seed1")
    runs = tmp_path / "runs"
    assert find_runs([runs]) == [runs / "grpo_seed0", runs / "grpo_seed1"]
    assert {n: [r.name for r in rs] for n, rs in all_groups(runs).items()} == {"grpo": ["grpo_seed0", "grpo_seed1"]}
    assert find_runs([tmp_path / "cmp"]) == [tmp_path / "cmp" / "p01_seed1"]


def test_seeds_in_two_folders_each_from_its_own_checkpoint_are_one_arm(tmp_path: Path) -> None:
    """``batch1/grpo_seed0,1`` and ``batch2/grpo_seed2,3``, each seed started from its own SFT checkpoint (as the
    demo's are: model.name_or_path differs from seed to seed) were split into ``batch1/grpo`` and ``batch2/grpo``:
    the folders' settings differed as wholes, though only in the key that differs between the seeds of one folder
    too. They are one arm of 4 seeds, as the seeds of one folder are; another learning rate still splits them."""
    base = grpo_config("locked")
    for s in range(4):
        config = {**base, "seed": s, "model": {"name_or_path": f"sft/seed{s}/final"}}
        write_run(tmp_path / "same" / f"batch{1 + s // 2}" / f"grpo_seed{s}", config, grpo_rows(s))
        lr = {**config, "grpo": {**base["grpo"], "lr": 1e-4 * (1 + s // 2)}}
        write_run(tmp_path / "lrs" / f"batch{1 + s // 2}" / f"grpo_seed{s}", lr, grpo_rows(s))
    assert {n: len(rs) for n, rs in all_groups(tmp_path / "same").items()} == {"grpo": 4}
    assert {n: len(rs) for n, rs in all_groups(tmp_path / "lrs").items()} == {"batch1/grpo": 2, "batch2/grpo": 2}
