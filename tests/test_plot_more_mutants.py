"""Fast checks of :mod:`dgrpo.plotting` and ``dgrpo plot`` found by a second pass of mutation testing: which rows and
columns a run's curve is read from, which runs are one arm, the warnings and refusals of a group that could not share
a curve, colours and legends, and the command line's parsing (its ``plot`` call captured: no figure drawn)."""

import math
import warnings
from pathlib import Path

import pytest

from dgrpo.data.records import DataError
from dgrpo.plotting import config_label, draw, find_runs, group_runs, load_run, run_series

from conftest import write_run

EVAL = "eval/valid/accuracy"
LOCKED: dict = {"seed": 0, "perturbation": {"kind": "locked", "p": 0.1}, "grpo": {"temperature": 0.0, "group_size": 4}}


def sizes(groups: dict) -> dict[str, int]:
    return {name: len(runs) for name, runs in groups.items()}


# ------------------------------------------------------------------------ a run's rows and columns
def test_the_default_eval_column_is_an_accuracy_not_a_mean_score_logged_before_it(tmp_path: Path) -> None:
    """A partial-credit run logs ``eval/valid/mean_score`` beside the accuracy: the eval panel's default column is the
    first *accuracy* (``eval/<name>/accuracy``), whatever the order of the row's keys."""
    rows = [{"step": t, "eval/valid/mean_score": 0.9, EVAL: 0.1 * t} for t in (0, 2)]
    run = load_run(write_run(tmp_path / "r", LOCKED, rows))
    assert run_series(run, "eval") == {0: 0.0, 2: 0.2}


def test_a_row_without_a_step_is_not_read(tmp_path: Path) -> None:
    """A row with no ``step`` (not one dgrpo writes) is neither a training nor an eval row: it does not pick the eval
    panel's default column."""
    rows = [{"eval/other/accuracy": 0.9, "reward_mean": 1.0}, {"step": 0, EVAL: 0.25}, {"step": 1, "reward_mean": 0.5}]
    run = load_run(write_run(tmp_path / "r", LOCKED, rows))
    assert run.evals == [{"step": 0, EVAL: 0.25}] and run.steps == [{"step": 1, "reward_mean": 0.5}]
    assert run_series(run, "eval") == {0: 0.25}


def test_non_finite_values_are_left_out_of_a_curve(tmp_path: Path) -> None:
    """NaN and infinity (JSON's ``NaN``, ``Infinity``: a diverged step) are no points, as null is not."""
    values = [0.5, math.nan, math.inf, 0.25]
    rows = [{"step": t, "reward_mean": v} for t, v in enumerate(values)]
    assert run_series(load_run(write_run(tmp_path / "r", LOCKED, rows)), "reward_mean") == {0: 0.5, 3: 0.25}


def test_a_config_that_is_not_a_json_object_is_no_config(tmp_path: Path) -> None:
    """``config.json`` holding a list is read as no config (the run's label comes from its rows and name), not kept
    as a list that grouping then fails on."""
    run = load_run(write_run(tmp_path / "r", ["grpo", 1], [{"step": 0, EVAL: 0.5}]))
    assert run.config == {}
    assert sizes(group_runs([run])) == {"r": 1}


def test_a_config_of_dotted_keys_is_read_as_a_nested_one(tmp_path: Path) -> None:
    """A flat config (``{"perturbation.kind": "none", "grpo.temperature": 0.7}``) gives the label its nested form
    would: its dotted keys are looked up whole first."""
    flat = {"perturbation.kind": "none", "grpo.temperature": 0.7}
    assert config_label(load_run(write_run(tmp_path / "r", flat, [{"step": 0, EVAL: 0.5}]))) == "token sampling"


def test_a_config_without_a_temperature_is_the_default_greedy_decoding(tmp_path: Path) -> None:
    """perturbation.kind none and no grpo.temperature: the default (0, greedy) is ``deterministic``, not a
    TypeError."""
    run = load_run(write_run(tmp_path / "r", {"perturbation": {"kind": "none"}}, [{"step": 0, EVAL: 0.5}]))
    assert config_label(run) == "deterministic"


def test_a_run_directory_named_is_that_run_not_the_runs_below_it(tmp_path: Path) -> None:
    """A run directory given is the run, even where another run sits below it; a folder without metrics.jsonl is
    searched."""
    outer = write_run(tmp_path / "outer", LOCKED, [{"step": 0, EVAL: 0.5}])
    inner = write_run(outer / "inner", LOCKED, [{"step": 0, EVAL: 0.5}])
    assert find_runs([outer]) == [outer]
    assert find_runs([tmp_path]) == [outer, inner]


def test_an_eval_key_with_a_source_matches_the_column_logged_without_it(tmp_path: Path) -> None:
    """``--eval-key builtin:valid`` draws a run that logged ``eval/valid/accuracy`` (the commands' name of the set)."""
    run = load_run(write_run(tmp_path / "r", LOCKED, [{"step": 0, EVAL: 0.25}, {"step": 2, EVAL: 0.5}]))
    assert run_series(run, "eval", "builtin:valid") == {0: 0.25, 2: 0.5}


# ------------------------------------------------------------------------ which runs are one arm
def test_seed_folders_above_the_run_folders_make_one_arm(tmp_path: Path) -> None:
    """``runs/seed0/dropout`` and ``runs/seed1/dropout``, each seed from its own SFT checkpoint (its
    model.name_or_path differs): one arm ``dropout`` sitting at ``runs/dropout``, not two lines of one seed each."""
    for s in (0, 1):
        config = {**LOCKED, "seed": s, "model": {"name_or_path": f"sft/seed{s}/final"}}
        write_run(tmp_path / "runs" / f"seed{s}" / "dropout", config, [{"step": 0, EVAL: 0.5}])
    runs = [load_run(p) for p in find_runs([tmp_path / "runs"])]
    assert sizes(group_runs(runs)) == {"dropout": 2}


def test_demo_seeds_that_share_their_sft_seed_in_two_folders_are_one_arm(tmp_path: Path) -> None:
    """``exp1/arm/sft0_rl0`` and ``exp2/arm/sft0_rl1`` are two seeds (SFT seed 0, RL seeds 0 and 1), not one seed
    twice: one arm, not split by folder."""
    for exp, rl in (("exp1", 0), ("exp2", 1)):
        write_run(tmp_path / exp / "arm" / f"sft0_rl{rl}", {**LOCKED, "seed": rl}, [{"step": 0, EVAL: 0.5}])
    runs = [load_run(p) for p in find_runs([tmp_path])]
    assert sizes(group_runs(runs)) == {"arm": 2}


def test_a_label_over_a_crashed_run_and_an_already_loaded_one_skips_the_crashed_one(tmp_path: Path) -> None:
    """``--label mine=crashed,good`` where ``good`` is also a run given on its own: the crashed run (no row yet) is
    skipped with a warning, and the label draws ``good``; it was refused as if no run were left."""
    good = load_run(write_run(tmp_path / "good", LOCKED, [{"step": 0, EVAL: 0.5}]))
    crashed = write_run(tmp_path / "crashed", LOCKED, [])
    with pytest.warns(UserWarning, match=r"skipped .*crashed/metrics.jsonl: no readable rows"):
        groups = group_runs([good], {"mine": [crashed, tmp_path / "good"]})
    assert sizes(groups) == {"mine": 1}


def test_a_label_s_warning_counts_the_settings_of_the_runs_with_a_config(tmp_path: Path) -> None:
    """A label over two learning rates and a run without config.json: 3 runs, 2 settings (the run without a config is
    no third setting), the key that differs named."""
    for name, lr in (("a", 1e-4), ("b", 1e-3)):
        write_run(tmp_path / name, {**LOCKED, "grpo": {**LOCKED["grpo"], "lr": lr}}, [{"step": 0, EVAL: 0.5}])
    write_run(tmp_path / "bare", None, [{"step": 0, EVAL: 0.5}])
    with pytest.warns(UserWarning, match=r"^--label mine: its 3 runs are 2 settings \(they differ in grpo.lr\)"):
        group_runs([], {"mine": [tmp_path / "a", tmp_path / "b", tmp_path / "bare"]})


# ------------------------------------------------------------------------ the figure
def test_a_step_logged_twice_is_one_point_the_later_row_s(tmp_path: Path) -> None:
    """A run resumed by an earlier dgrpo (which appended without cutting the rows after its checkpoint) repeats steps
    2-3: each step is one point, the resumed (later) row's value, in step order."""
    values = [(1, 0.1), (2, 0.2), (3, 0.3), (2, 0.25), (3, 0.35), (4, 0.45)]
    run = load_run(write_run(tmp_path / "r", LOCKED, [{"step": t, "reward_mean": v} for t, v in values]))
    assert run_series(run, "reward_mean") == {1: 0.1, 2: 0.25, 3: 0.35, 4: 0.45}


def test_why_a_group_has_nothing_to_show_names_the_cause(tmp_path: Path) -> None:
    """The note of an empty reward_std panel says K = 1 only when every run has K = 1; an empty eval panel names the
    column it looked for."""
    from dgrpo.plotting.draw import _missing_note

    k1 = load_run(write_run(tmp_path / "k1", {**LOCKED, "grpo": {"group_size": 1}}, [{"step": 1, "reward_mean": 0.5}]))
    k4 = load_run(write_run(tmp_path / "k4", LOCKED, [{"step": 1, "reward_mean": 0.5}]))
    assert _missing_note("a", [k1], "reward_std", None) == "a: no within-group std (K = 1)"
    assert _missing_note("a", [k1, k4], "reward_std", None) == "a: no reward_std values"
    assert _missing_note("a", [k4], "eval", "valid") == "a: no eval/valid/accuracy rows"


def test_each_group_gets_its_own_colour(tmp_path: Path) -> None:
    """Two groups that a fixed colour fits (by name, or by their runs' config) do not share it: the first takes it,
    the other a colour of the cycle; a group of several arms' runs takes no arm's colour; other groups take the
    cycle's colours in turn."""
    from dgrpo.plotting.draw import ARM_COLORS, OTHER_COLORS, group_colors

    dropout = load_run(write_run(tmp_path / "d", LOCKED, [{"step": 0, EVAL: 0.5}]))
    det = load_run(write_run(tmp_path / "n", {"perturbation": {"kind": "none"}}, [{"step": 0, EVAL: 0.5}]))
    blue, grey = ARM_COLORS["dropoutgrpo"], ARM_COLORS["deterministic"]
    assert group_colors({"Dropout-GRPO": [det], "dropout_grpo": [det]}) == {
        "Dropout-GRPO": blue,
        "dropout_grpo": grey,  # (by its runs' config)
    }
    assert group_colors({"a/grpo": [dropout], "b/grpo": [dropout]}) == {"a/grpo": blue, "b/grpo": OTHER_COLORS[0]}
    assert group_colors({"mine": [dropout, det]}) == {"mine": OTHER_COLORS[0]}
    assert list(group_colors({"x": [], "y": [], "z": []}).values()) == list(OTHER_COLORS[:3])


def test_the_legend_counts_the_seeds_drawn_and_the_axis_names_the_set(tmp_path: Path) -> None:
    """An arm of 3 runs, the first without the eval column: its legend says "mean of 2 seeds" (the runs in the mean),
    and the set its other runs logged titles the panel; a set not named valid is labelled "accuracy", not "validation
    accuracy"; seeds that share no step are a note (in italics) saying so; lines of up to 30 points have markers,
    longer ones none; the title is over the figure."""
    dev = "eval/dev/accuracy"
    write_run(tmp_path / "arm" / "seed0", LOCKED, [{"step": 1, "reward_mean": 0.5}])  # (first: no eval column)
    for s in (1, 2):
        write_run(tmp_path / "arm" / f"seed{s}", LOCKED, [{"step": t, dev: 0.1 * (t + s)} for t in (0, 2, 4)])
    write_run(tmp_path / "long", LOCKED, [{"step": t, dev: 0.5} for t in range(31)])
    for s in (0, 1):  # (seeds evaluated at other steps: no step to average over)
        write_run(tmp_path / "apart" / f"seed{s}", LOCKED, [{"step": 2 * t + s, dev: 0.5} for t in (0, 1)])
    groups = {name: [load_run(p) for p in find_runs([tmp_path / name])] for name in ("arm", "long", "apart")}
    fig, desc = draw(groups, panels=("eval",), title="arms")
    ax = fig.axes[0]
    legend = ax.get_legend()
    assert legend is not None and fig.get_suptitle() == "arms"
    said = ["arm: mean of 2 seeds (band: min-max)", "long", "apart: runs share no step"]
    assert [t.get_text() for t in legend.get_texts()] == said and desc["notes"]["eval"] == said[2:]
    assert [t.get_fontstyle() for t in legend.get_texts()] == ["normal", "normal", "italic"]  # (notes: italics)
    assert (ax.get_ylabel(), ax.get_title()) == ("accuracy (greedy, no dropout)", "accuracy on dev")
    assert [line.get_marker() for line in ax.get_lines()] == ["o", "None"]
    assert desc["panels"]["eval"] == {"arm": 3, "long": 31} and desc["bands"]["eval"] == ["arm"]
    assert desc["eval_keys"] == [dev]


def test_draw_refuses_no_panel_no_run_and_a_bare_reward_part(tmp_path: Path) -> None:
    """No panel, ``reward/`` without a part's name, and groups with no run are one-line DataErrors, before any
    drawing."""
    run = load_run(write_run(tmp_path / "r", LOCKED, [{"step": 1, "reward_mean": 0.5, "reward/format": 1.0}]))
    with pytest.raises(DataError, match=r"^unknown panel\(s\) \(none\); choose from eval, "):
        draw({"r": [run]}, panels=())
    with pytest.raises(DataError, match=r"^unknown panel\(s\) reward/; choose from "):
        draw({"r": [run]}, panels=("reward/",))
    no_runs: list[dict[str, list]] = [{}, {"a": [], "b": []}]
    for groups in no_runs:
        with pytest.raises(DataError, match="^no runs to plot$"):
            draw(groups, panels=("reward_mean",))


def test_an_eval_key_is_not_checked_when_the_eval_panel_is_left_out(tmp_path: Path) -> None:
    """An eval key beside panels without ``eval`` is warned of as unused, not refused as a column no run logged."""
    run = load_run(write_run(tmp_path / "r", LOCKED, [{"step": 1, "reward_mean": 0.5}]))
    with pytest.warns(UserWarning, match=r"^the eval key goes to the eval panel"):
        _, desc = draw({"r": [run]}, panels=("reward_mean",), eval_key="nosuchset")
    assert desc["panels"] == {"reward_mean": {"r": 1}}


def test_a_run_without_a_config_is_no_other_scorer(tmp_path: Path) -> None:
    """A run without config.json beside an exact-match run: no scorer is known for it, so no 'different eval.scorer
    rules' warning (it was counted as the default, numeric)."""
    rows = [{"step": 0, EVAL: 0.5}]
    bare = load_run(write_run(tmp_path / "bare", None, rows))
    exact = load_run(write_run(tmp_path / "exact", {**LOCKED, "eval": {"scorer": "exact"}}, rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        draw({"bare": [bare], "exact": [exact]}, panels=("eval",))


def test_a_group_of_sft_and_grpo_runs_is_refused_only_where_an_eval_panel_would_average_them(tmp_path: Path) -> None:
    """The rollout panels draw GRPO steps alone (an SFT run has none): a label over SFT and GRPO runs draws them, and
    an SFT group is a note saying it has none; its eval panel would average steps that count different things, and
    is refused."""
    sft = load_run(write_run(tmp_path / "sft", {"seed": 0}, [{"step": 2, "stage": 0, EVAL: 0.1}]))
    grpo = load_run(write_run(tmp_path / "grpo", LOCKED, [{"step": 1, "frac_groups_kept": 0.5}]))
    _, desc = draw({"mine": [sft, grpo], "sft": [sft]}, panels=("kept",))
    assert desc["panels"] == {"kept": {"mine": 1}} and desc["notes"] == {"kept": ["sft: no GRPO steps"]}
    with pytest.raises(DataError, match=r"^mine: holds SFT runs \(sft\) and GRPO runs \(grpo\)"):
        draw({"mine": [sft, grpo]}, panels=("eval",))


def test_plot_refuses_an_unknown_figure_format_before_reading_any_run(tmp_path: Path) -> None:
    """A wrong suffix is said first, not after the runs are searched (a missing run would hide it)."""
    from dgrpo.plotting import plot

    with pytest.raises(DataError, match=r"f.jpg: unknown figure format '.jpg'"):
        plot([tmp_path / "nowhere"], tmp_path / "f.jpg")


def test_describe_counts_each_panel_s_groups_lines_and_notes() -> None:
    from dgrpo.plotting import describe

    desc = {
        "panels": {"eval": {"a": 3, "b": 2}, "kept": {}},
        "lines": {"eval": 3, "kept": 0},
        "notes": {"eval": [], "kept": ["a: no GRPO steps", "b: no GRPO steps"]},
        "out": "fig.png",
    }
    assert describe(desc) == "fig.png: eval: 2 group(s), 3 line(s); kept: 0 group(s), 0 line(s), 2 note(s)"


# ------------------------------------------------------------------------ dgrpo plot's arguments
@pytest.fixture
def plotted(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The arguments of each ``plotting.plot`` call ``dgrpo plot`` makes (nothing is drawn)."""
    import dgrpo.plotting

    calls: list[dict] = []

    def plot(paths, out, **kwargs):
        calls.append({"paths": paths, "out": out, **kwargs})
        return {"panels": {}, "out": str(out)}

    monkeypatch.setattr(dgrpo.plotting, "plot", plot)
    return calls


def test_cli_plot_passes_labels_panels_and_references_as_given(tmp_path: Path, plotted: list[dict]) -> None:
    """A label given twice is one group of both runs' lists (spaces around names and runs dropped); a panel named
    twice (or with spaces) is one panel; references of 0 and 1 (an accuracy's bounds) are lines; the eval key and
    title are passed on."""
    from dgrpo.cli import main

    argv = ["plot", "r0", "--out", "f.png", "--label", " A = r1, r2 ", "--label", "A=r3", "--label", "B=r4"]
    argv += ["--panels", "eval, kept,eval", "--reference", "floor=0", "--reference", " top = 1.0"]
    assert main([*argv, "--eval-key", "valid", "--title", "t"]) == 0
    assert plotted == [
        {
            "paths": ["r0"],
            "out": "f.png",
            "groups": {"A": ["r1", "r2", "r3"], "B": ["r4"]},
            "panels": ("eval", "kept"),
            "eval_key": "valid",
            "reference": {"floor": 0.0, "top": 1.0},
            "title": "t",
        }
    ]


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--label", "=r1"], "--label wants NAME=RUN[,RUN...], got '=r1'"),
        (["--reference", "below=-0.1"], "--reference below=-0.1: an accuracy as the runs log it, a fraction in [0, 1]"),
        (["--reference", "above=1.5"], "--reference above=1.5: an accuracy as the runs log it"),
        ([], "no runs given: name run directories, or groups with --label NAME=RUN[,RUN...]"),
    ],
)
def test_cli_plot_refuses_a_bad_label_reference_or_no_run(argv, said, plotted, capsys) -> None:
    from dgrpo.cli import main

    assert main(["plot", "--out", "f.png", *argv]) == 2
    assert said in capsys.readouterr().err and plotted == []


def test_a_label_whose_runs_do_not_exist_splits_at_its_first_equals_sign() -> None:
    """``a=b=c`` with no run ``c`` nor ``b=c``: the name is ``a`` (the error then names the run ``b=c``)."""
    from dgrpo.cli.plot import parse_pairs

    assert parse_pairs(["a=b=c"], "--label") == [("a", "b=c")]


def test_cli_plot_refuses_torchrun(monkeypatch: pytest.MonkeyPatch, plotted: list[dict], capsys) -> None:
    from dgrpo.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["plot", "r0", "--out", "f.png"]) == 2
    assert "dgrpo plot runs in one process" in capsys.readouterr().err and plotted == []


def test_an_empty_group_beside_others_is_a_note_not_a_traceback(tmp_path: Path) -> None:
    """``draw({"a": [], "b": [run]})``: the eval panel's note for ``a`` read its first run (an IndexError); it says the
    group has no runs, and the group stays in the GRPO groups' eval panel (no SFT panel of its own)."""
    run = load_run(write_run(tmp_path / "r", LOCKED, [{"step": 0, EVAL: 0.5}]))
    _, desc = draw({"a": [], "b": [run]}, panels=("eval",))
    assert desc["panels"] == {"eval": {"b": 1}} and desc["notes"] == {"eval": ["a: no runs"]}


def test_the_mean_is_drawn_in_step_order_whatever_the_set_order(tmp_path: Path) -> None:
    """Steps 1 and 32 (a set lists 32 first): the curve's x values are sorted, not in the set's order."""
    from dgrpo.plotting.draw import aggregate

    assert aggregate([{32: 1.0, 1: 0.0}, {1: 0.5, 32: 0.5}]) == ([1, 32], [0.25, 0.75], [0.0, 0.5], [0.5, 1.0])


def test_an_eval_key_logged_by_any_run_is_accepted_and_the_refusal_names_what_was_logged(tmp_path: Path) -> None:
    """``--eval-key other`` logged by the second run only is drawn (not refused because the first run lacks it); with
    no eval column logged at all, the refusal says "none"."""
    first = load_run(write_run(tmp_path / "a", LOCKED, [{"step": 0, EVAL: 0.5}]))
    second = load_run(write_run(tmp_path / "b", LOCKED, [{"step": 0, "eval/other/accuracy": 0.75}]))
    _, desc = draw({"a": [first], "b": [second]}, panels=("eval",), eval_key="other")
    assert desc["panels"] == {"eval": {"b": 1}} and desc["notes"] == {"eval": ["a: no eval/other/accuracy rows"]}
    bare = load_run(write_run(tmp_path / "c", LOCKED, [{"step": 1, "reward_mean": 0.5}]))
    with pytest.raises(DataError, match=r"^--eval-key valid: no run logged it \(eval columns logged: none\)$"):
        draw({"c": [bare]}, panels=("eval",), eval_key="valid")


def test_every_reward_part_panel_asked_for_is_checked(tmp_path: Path) -> None:
    """A misspelt part after a logged one is refused too (not only the first panel's)."""
    run = load_run(write_run(tmp_path / "r", LOCKED, [{"step": 1, "reward_mean": 0.5, "reward/format": 1.0}]))
    with pytest.raises(DataError, match=r"^no run logged reward/fromat \(reward parts logged: reward/format\)$"):
        draw({"r": [run]}, panels=("reward/format", "reward/fromat"))


def test_runs_that_differ_only_in_where_they_log_are_one_arm(tmp_path: Path) -> None:
    """``logging`` (like seed, threads, device) says how a run was executed, not which setting: two such runs are the
    config's one arm, not two lines named by their folders."""
    for name, sinks in (("first", ["jsonl"]), ("second", ["jsonl", "tensorboard"])):
        write_run(tmp_path / name, {**LOCKED, "logging": {"backends": sinks}}, [{"step": 0, EVAL: 0.5}])
    runs = [load_run(p) for p in find_runs([tmp_path])]
    assert sizes(group_runs(runs)) == {"Dropout-GRPO": 2}


def test_a_label_named_as_a_folder_arm_says_the_folders_name_it(tmp_path: Path) -> None:
    """The refusal of ``--label dropout`` beside ``dropout_seed0`` says the other run is grouped so by its folder's
    name (not by its config)."""
    seeded = load_run(write_run(tmp_path / "dropout_seed0", LOCKED, [{"step": 0, EVAL: 0.5}]))
    mine = write_run(tmp_path / "mine", LOCKED, [{"step": 0, EVAL: 0.5}])
    with pytest.raises(DataError, match=r"are grouped under that name too \(by their folders' names\)"):
        group_runs([seeded], {"dropout": [mine]})


def test_a_figure_s_suffix_may_be_upper_case() -> None:
    from dgrpo.plotting.draw import check_format

    assert [check_format(f"fig{s}") for s in (".PNG", ".Pdf", ".svg")] == ["png", "pdf", "svg"]


def test_the_eval_panel_is_titled_by_the_set_a_later_seed_logged(tmp_path: Path) -> None:
    """An arm whose first seed logged no eval row yet (a run in its first step): the panel is titled by the set its
    other seed logged, not the default title."""
    early = load_run(write_run(tmp_path / "seed0", LOCKED, [{"step": 1, "reward_mean": 0.5}]))
    dev = load_run(write_run(tmp_path / "seed1", LOCKED, [{"step": 0, "eval/dev/accuracy": 0.5}]))
    fig, desc = draw({"arm": [early, dev]}, panels=("eval",))
    assert desc["eval_keys"] == ["eval/dev/accuracy"] and fig.axes[0].get_title() == "accuracy on dev"
