"""Every command's --help says what it does and shows an example that parses; bench's answers without torch; bench.md
notes the items that ran."""

import argparse
import shlex
import subprocess
import sys

import pytest
from test_bench_mutants import _fake_suite
from test_bench_report_title import _item

from dgrpo.bench import suite
from dgrpo.bench.options import build_parser as bench_parser
from dgrpo.cli import build_parser


def _commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    """(words after ``dgrpo``, parser) of every command and sub-command (``data inspect``), then ``bench``'s own."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if name != "bench":  # (its arguments pass unparsed to the suite's parser)
                    yield (*words, name), sub
                    yield from _commands(sub, (*words, name))
    if not words:
        yield ("bench",), bench_parser()


def _examples(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> list[list[str]]:
    """The argv (after the command's words) of each example in its help that runs this very command."""
    start = ["dgrpo", *words]
    found = []
    for line in (parser.epilog or "").replace("\\\n", " ").splitlines():  # (continued lines joined)
        argv = shlex.split(line, comments=True)
        argv = argv[: argv.index(">")] if ">" in argv else argv  # (the shell's redirection)
        if argv[: len(start)] == start:
            found.append(argv[len(start) :])
    return found


def test_every_help_says_what_the_command_does_and_has_an_example_of_it_that_parses():
    """`dgrpo data inspect --help` and `dgrpo config show --help` had no description and no example (their parent's
    help had them), `dgrpo bench --help` no example."""
    seen = []
    for words, parser in _commands(build_parser()):
        seen.append(" ".join(words))
        assert len(parser.description or "") > 30, words
        examples = _examples(parser, words)
        assert examples, words
        for argv in examples:
            if words == ("bench",):
                parser.parse_args(argv)
            else:
                build_parser().parse_args([*words, *argv])  # (exits 2 on an example that does not parse)
    assert {"data inspect", "config show", "bench", "sft", "grpo", "eval", "export"} <= set(seen)


def test_bench_help_answers_before_torch_loads():
    """`dgrpo bench --help` (and a usage error) loaded torch for the torchrun check, then again in the suite's child
    process: 2-8 s, where `dgrpo --help` answers at once."""
    code = (
        "import sys\nfrom dgrpo.cli import main\ntry:\n    main(['bench', '--help'])\nexcept SystemExit as e:\n"
        "    print(e.code, sorted({'torch', 'numpy'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "--only ITEMS" in out and "examples:" in out and out.splitlines()[-1] == "0 []"


def _notes(tmp_path, monkeypatch, only, broken=()) -> str:
    """bench.md's notes after a CPU run of stand-in items (``broken``: the keys whose item fails)."""

    def failing(ctx):
        raise RuntimeError("it broke")

    items = {k: failing if k in broken else _item for k in suite.ITEM_KEYS}
    _fake_suite(monkeypatch, items, cuda=False)
    args = argparse.Namespace(out=str(tmp_path), quick=True, only=only, section="cpu")
    suite.run_suite(args, [])
    return (tmp_path / "bench.md").read_text().split("## Notes")[1]


def test_bench_md_notes_only_the_items_that_ran(tmp_path, monkeypatch, capsys):
    """A bench.md of `--only flops` noted how every item measures (SFT, soak, the 8-bit optimizer, ...)."""
    notes = _notes(tmp_path, monkeypatch, "flops")
    assert "- FLOPs:" in notes and "OMP_WAIT_POLICY=PASSIVE is set by the suite" in notes
    for other in ("- Rollouts:", "- SFT:", "- GRPO steps:", "- Memory:", "- LoRA", "- Soak:", "- 8-bit optimizer"):
        assert other not in notes, other
    # an item that failed keeps its note (its error is in the table above); LoRA's "memory as above" has Memory's
    notes = _notes(tmp_path, monkeypatch, "sft,lora", broken={"sft"})
    assert "- SFT:" in notes and "- LoRA" in notes and "- Memory:" in notes and "- FLOPs:" not in notes
    # the whole CPU section: every note but the GPU-only optimizer's
    notes = _notes(tmp_path, monkeypatch, None)
    assert notes.count("\n- ") == 8 and "- Soak:" in notes and "8-bit optimizer" not in notes
    capsys.readouterr()  # (the failed item's traceback)


def test_the_suites_usage_errors_are_answered_before_its_child_starts(monkeypatch, capsys):
    """`dgrpo bench` without --out (or with --help) started the suite's child process, which loaded torch to say so."""

    from dgrpo.bench import launch

    monkeypatch.delenv(launch.CHILD_ENV, raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(launch, "run_child", lambda cmd, env: pytest.fail("the child started"))
    with pytest.raises(SystemExit) as e:
        launch.main(["--quick"])
    assert e.value.code == 2 and "--out" in capsys.readouterr().err


def test_grpos_help_states_the_defaults_it_runs():
    """`dgrpo grpo --help` said "Dropout-GRPO (and its ablations)" and nothing of what the defaults run; what it now
    says of them is the config's defaults (a changed default fails here, not silently in the help)."""
    from dgrpo.cli.train import GRPO_ABOUT
    from dgrpo.config import Config

    cfg = Config()
    g, pert = cfg.grpo, cfg.perturbation
    assert (g.group_size, g.prompts_per_step, g.temperature) == (8, 16, 0.0)  # "K = 8 ... 16 prompts ... greedy"
    assert (pert.kind, pert.p, pert.sites, pert.layers) == ("locked", 0.1, ["mlp"], "all")
    assert pert.perturb_answer and g.replay == "seed"  # "held over ... its answer, and the update replays that mask"
    said = " ".join(GRPO_ABOUT.split())
    for part in ("K = 8", "16 prompts", "kind=locked", "p = 0.1", "every layer's MLP output", "greedy"):
        assert part in said, part
