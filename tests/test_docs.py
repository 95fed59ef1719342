"""The documentation's commands stay true to the code: every ``dgrpo`` command in a code block of README.md and
docs/*.md parses with the command line it documents, and the config it names (files and ``--set`` overrides) loads
and validates. Nothing is run."""

import ast
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a command as written in the docs: `dgrpo`, a venv's, or `python -m dgrpo` / `torchrun ... -m dgrpo`
COMMAND = re.compile(r"^(?:\S*/)?dgrpo\s|^(?:python3?|torchrun)\b.*\s-m\s+dgrpo\s")
#: the endings of file names the docs write like options (model.safetensors)
FILE_TYPES = {"safetensors", "json", "jsonl", "yaml", "py", "md", "pt", "bin", "png", "txt"}


def code_lines(path: Path) -> list[tuple[int, str]]:
    """The lines inside the file's ``` blocks, continuation lines (a trailing backslash) joined, with line numbers."""
    out: list[tuple[int, str]] = []
    inside, pending, start = False, "", 0
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            inside, pending = not inside, ""
            continue
        if not inside:
            continue
        if not pending:
            start = n
        text = line.rstrip()
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        out.append((start, pending + text))
        pending = ""
    return out


def documented_commands() -> list[tuple[str, list[str]]]:
    """Every ``dgrpo`` invocation in the docs' code blocks: (where, the arguments after the command name)."""
    found = []
    for path in DOCS:
        for n, line in code_lines(path):
            for part in re.split(r"&&|;", line):
                part = part.strip()
                if not COMMAND.search(part):
                    continue
                words = shlex.split(part, comments=True)
                at = next(i for i, w in enumerate(words) if w == "dgrpo" or w.endswith("/dgrpo"))
                found.append((f"{path.relative_to(ROOT)}:{n}", words[at + 1 :]))
    return found


COMMANDS = documented_commands()


def test_the_docs_have_commands_to_check():
    names = {argv[0] for _, argv in COMMANDS if argv}
    assert {"demo", "sft", "grpo", "eval"} <= names, names


@pytest.mark.parametrize("where,argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_command_parses_and_its_config_loads(where, argv):
    from dgrpo.cli import build_parser
    from dgrpo.config import Config, load_config

    if argv[:1] == ["bench"]:
        from dgrpo.bench.suite import build_parser as bench_parser

        bench_parser().parse_args(argv[1:])
        return
    if "..." in argv:  # "the other arguments", as in `dgrpo grpo ... --set fsdp=full`: the config part alone
        pairs = list(zip(argv, argv[1:]))
        configs = [v for k, v in pairs if k == "--config"]
        load_config(Config, configs, [v for k, v in pairs if k == "--set"])
        return
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"{where}: `dgrpo {shlex.join(argv)}` does not parse (exit {e.code})")
    if hasattr(args, "config") and hasattr(args, "overrides"):
        load_config(Config, list(args.config), list(args.overrides))


def test_every_config_key_the_docs_name_exists():
    """A dotted option in the docs' code (``grpo.micro_batch_size``, ``model.lora.r``) is a key of the config: a
    renamed or removed option cannot linger in the README, docs/*.md or bench/RESULTS.md. (docs/config.md is
    generated from the config itself.)"""
    from dgrpo.config import Config
    from dgrpo.config.values import _options

    keys = {o.key for o in _options(Config)}
    sections = {k.split(".")[0] for k in keys if "." in k}
    dotted = re.compile(rf"(?<![\w./])(?:{'|'.join(sorted(sections))})(?:\.[a-z_0-9]+)+")
    missing = []
    for path in [*DOCS, ROOT / "bench/RESULTS.md"]:
        if path.name == "config.md":
            continue
        for span in re.findall(r"`([^`\n]+)`", path.read_text()) + [t for _, t in code_lines(path)]:
            for key in dotted.findall(span):
                if key.rsplit(".", 1)[-1] in FILE_TYPES:  # a file (model.safetensors), not an option
                    continue
                if key not in keys and not any(k.startswith(key + ".") for k in keys):
                    missing.append(f"{path.relative_to(ROOT)}: {key}")
    assert not missing, sorted(set(missing))


def documented_spans(path: Path) -> list[tuple[int, str]]:
    """Every backticked span of a doc's prose (it may run over a line break), with the line it starts on."""
    text = path.read_text()
    prose = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.DOTALL)
    return [(prose[: m.start()].count("\n") + 1, m.group(1)) for m in re.finditer(r"`([^`]+)`", prose)]


def command_parser(words: list[str]):
    """The parser of the ``dgrpo`` command that ``words`` (the words after ``dgrpo``) name, subcommands followed
    (``data inspect``, ``config show``); ``bench`` has its own."""
    import argparse

    from dgrpo.cli import build_parser

    if words[:1] == ["bench"]:
        from dgrpo.bench.suite import build_parser as bench_parser

        return bench_parser()
    parser = build_parser()
    for word in words:
        subs = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
        if word not in subs:
            break
        parser = subs[word]
    return parser


def documented_flags() -> list[tuple[str, str, str]]:
    """(where, the command as written, flag) for every ``--flag`` of a ``dgrpo`` command in the docs, in code blocks
    and in the prose's backticked spans (``dgrpo demo [--full | --quick]``, ``dgrpo eval --data builtin:test``)."""
    found = []
    for path in DOCS:
        lines = [(n, t) for n, t in documented_spans(path) if COMMAND.search(t.replace("\n", " "))]
        for n, line in lines + code_lines(path):
            for part in re.split(r"&&|;|\|(?=\s)", line.replace("\n", " ").split(" #")[0]):
                words = part.split()
                at = next((i for i, w in enumerate(words) if w == "dgrpo" or w.endswith("/dgrpo")), None)
                if at is None:
                    continue
                for word in words[at + 1 :]:
                    flag = word.strip("[]()'\"").split("=")[0]
                    if flag.startswith("--") and flag != "--":
                        found.append((f"{path.relative_to(ROOT)}:{n}", " ".join(words[at:]), flag))
    return found


def test_every_flag_the_docs_give_a_command_is_one_of_its_options():
    """A ``--flag`` written after ``dgrpo CMD`` anywhere in the docs is an option of CMD: the code blocks' commands
    parse whole (above), but the prose's are fragments (``dgrpo demo [--out runs/demo] [--full | --quick]``, ``dgrpo
    eval --data builtin:test``) that only this checks, so a renamed flag cannot linger there."""
    flags = documented_flags()
    assert any(f == "--sft-seeds" for _, _, f in flags) and any(f == "--only" for _, _, f in flags), len(flags)
    wrong = []
    for where, command, flag in flags:
        parser = command_parser(command.split()[1:])
        if flag not in parser._option_string_actions:
            wrong.append(f"{where}: {flag} in `{command}`")
    assert not wrong, wrong


#: a repository file the docs name: tests/..., bench/..., experiments/..., .ci/... (and docs/... beside them)
REPO_PATH = re.compile(r"(?<![\w/.])((?:tests|bench|experiments|docs|\.ci)/[\w./-]*[\w-])")
#: a packaged config: builtin/NAME.yaml, paper/NAME.yaml (or configs/...), as --config takes it
PACKAGED = re.compile(r"(?<![\w/.-])(?:configs/)?((?:builtin|paper)/\w+\.yaml)")


def test_every_file_config_and_test_the_docs_name_exists():
    """The repository files (``tests/test_recompute.py``, ``bench/paper_step.py``), packaged configs
    (``paper/grpo_kl_unbiased.yaml``) and tests (``test_demo_workers_give_the_in_process_results``) the docs point a
    reader to exist: a renamed test or script would leave the README pointing at nothing."""
    tests = {name for f in (ROOT / "tests").glob("*.py") for name in re.findall(r"def (test_\w+)", f.read_text())}
    configs = ROOT / "src" / "dgrpo" / "configs"
    named, missing = 0, []
    for path in DOCS:
        text = path.read_text()
        where = path.relative_to(ROOT)
        for name in set(REPO_PATH.findall(text)):
            named += 1
            if not (ROOT / name).exists():
                missing.append(f"{where}: {name}")
        for name in set(PACKAGED.findall(text)):
            named += 1
            if not (configs / name).is_file():
                missing.append(f"{where}: packaged config {name}")
        for name in set(re.findall(r"\b(test_\w+)\b(?!/)", text)):  # (not test_best/<name>/accuracy, a metric)
            named += 1
            if name not in tests and not (ROOT / "tests" / f"{name}.py").exists():
                missing.append(f"{where}: test {name}")
    assert named > 30, named
    assert not missing, sorted(missing)


def test_every_dgrpo_name_the_docs_prose_gives_resolves():
    """A dotted name in the docs' prose (``dgrpo.plotting.load_run``, ``dgrpo.perturbation.HookedPerturbation``,
    ``dgrpo.bench.step_profile.waiting_ops``) is a module, or an attribute of one: the code blocks' imports are
    checked below, the prose's names only here."""
    import importlib

    named, missing = 0, []
    for path in DOCS:
        for n, span in documented_spans(path):
            for dotted in re.findall(r"\bdgrpo(?:\.\w+)+", span):
                named += 1
                module, *rest = dotted.split(".")
                while rest:
                    try:
                        importlib.import_module(f"{module}.{rest[0]}")
                    except ModuleNotFoundError:
                        break
                    module = f"{module}.{rest.pop(0)}"
                obj = importlib.import_module(module)
                for part in rest:
                    if not hasattr(obj, part):
                        missing.append(f"{path.relative_to(ROOT)}:{n}: {dotted}")
                        break
                    obj = getattr(obj, part)
    assert named > 20, named
    assert not missing, missing


#: a setting as the prose writes it: ``grpo.engine: auto``, ``--set grpo.filter=false`` (one of several after --set)
SETTING = re.compile(r"'?([a-z_]+(?:\.[a-z_0-9]+)*)(?:: |=)(.+?)'?")
#: a value that stands for one (``grpo.log_rollouts: N``, ``grpo.rewards: [{fn: ..., weight: ...}]``, ``fsdp: full
#: | sharded``, ``perturbation.kind: name``, ``recompute_kept_layers: k``), or a Python call's argument
#: (``device=resolve_device(cfg.device)``)
PLACEHOLDER = re.compile(r"^[A-Z]+$|^[a-z]$|\.\.\.|\||^name$|[()]")


def setting_error(key: str, value: str) -> str | None:
    """The config's objection to ``key=value``, when it is about that key (not about another one, as a pair set
    apart: ``data.question_key=prompt`` alone is refused for its missing ``data.answer_key``)."""
    from dgrpo.config import Config, ConfigError, load_config

    try:
        load_config(Config, [], [f"{key}={value}"])
    except ConfigError as e:
        return str(e) if str(e).startswith(f"invalid config value {key}:") else None
    return None


#: the options that switch what README's "The method, and where this implementation makes a choice" and
#: docs/why_replayed_dropout.md describe: the paper's equations (advantage, clip, Huberized k3, beta and its annealing,
#: filter, loss normalisation) and the choices where its text allows more than one reading
METHOD_SWITCHES = [
    "perturbation.kind",
    "perturbation.p",
    "perturbation.perturb_prompt",
    "perturbation.perturb_answer",
    "grpo.advantage",
    "grpo.eps_low",
    "grpo.eps_high",
    "grpo.kl_form",
    "grpo.huber_delta",
    "grpo.beta0",
    "grpo.anneal_beta",
    "grpo.filter",
    "grpo.alpha_min",
    "grpo.alpha_max",
    "grpo.aggregation",
    "grpo.mini_epochs",
    "grpo.temperature",
]


def test_the_method_texts_name_the_option_of_every_choice_they_describe():
    """A researcher reading README's method section and docs/why_replayed_dropout.md learns from them how to switch
    each equation and choice they describe: each option is named there (the advantage, the filter's window, the loss
    aggregation, beta's annealing, the Huber threshold and p were described but their options named nowhere in
    either), and is an option of the config."""
    from dgrpo.config import Config
    from dgrpo.config.values import _options

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The method, and where this implementation makes a choice", 1)[1].split("\n## ", 1)[0]
    text = section + (ROOT / "docs" / "why_replayed_dropout.md").read_text()
    named = set(re.findall(r"`([a-z_]+\.[a-z_0-9]+)(?:[:=` ])", text))
    keys = {o.key for o in _options(Config)}
    assert set(METHOD_SWITCHES) <= keys
    assert [k for k in METHOD_SWITCHES if k not in named] == []


def test_every_setting_the_docs_prose_writes_is_a_valid_value_of_its_option():
    """A span of the prose that is a setting (``grpo.engine: auto``, ``--set model.master_weights=true
    grpo.optimizer=adamw``, or in a section's context ``recompute_granularity: layer``: an option of that name in
    some section) gives its option a value the config accepts: a renamed choice (``seq_mean``, ``fresh_mask``,
    ``layer``) cannot linger in the text (the keys alone are checked above, the code blocks' commands whole)."""
    from dgrpo.config import Config
    from dgrpo.config.values import _options

    keys = {o.key for o in _options(Config)}
    checked, wrong = 0, []
    for path in DOCS:
        for n, span in documented_spans(path):
            text = span.strip().removeprefix("--set ")
            parts = [text] if ": " in text else re.split(r"\s+(?:--set\s+)?(?=[a-z_.]+=)", text)
            for part in parts:
                m = SETTING.fullmatch(part)
                if not m or PLACEHOLDER.search(m.group(2)):
                    continue
                name, value = m.groups()
                options = [name] if name in keys else [k for k in keys if k.endswith(f".{name}") and "." not in name]
                if not options:  # (not an option: another program's setting, `coconut: False`)
                    continue
                checked += 1
                errors = [setting_error(key, value) for key in options]
                if all(errors):
                    wrong.append(f"{path.relative_to(ROOT)}:{n}: `{part}`: {errors[0]}")
    assert checked > 70, checked
    assert not wrong, wrong


def library_tour() -> str:
    """The README's library tour: the Python block under its heading."""
    text = (ROOT / "README.md").read_text()
    return text.split("## Library tour", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_the_readme_library_tour_runs_on_the_demo_layout(sft_checkpoint, tmp_path, monkeypatch, capsys):
    """The tour runs as written, in a directory where ``dgrpo demo`` wrote its SFT model (it named a path the demo
    does not write, and paired the demo's model with GSM8K, whose questions do not fit its context)."""
    from dgrpo.config import Config
    from dgrpo.demo.pipeline import Demo
    from dgrpo.demo.pipeline import sft_checkpoint as demo_sft

    where = demo_sft(Demo(Config(), Path("runs/demo"), [], [], {}), 0)  # (runs/demo: `dgrpo demo`'s default --out)
    code = library_tour()
    assert f'LatentLM.from_pretrained("{where}")' in code
    (tmp_path / where).parent.mkdir(parents=True)
    (tmp_path / where).symlink_to(sft_checkpoint)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md (library tour)", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 5 and all(0.0 <= float(x) <= 1.0 for x in printed[1:4])
    pass_at_k = ast.literal_eval(printed[4])  # (pass@k never falls as k grows; pass@8 is at least the vote's)
    assert list(pass_at_k) == ["1", "2", "4", "8"] and sorted(pass_at_k.values()) == list(pass_at_k.values())
    assert pass_at_k["8"] >= float(printed[3])


def library_tour_modules() -> set[str]:
    """The dotted module names of the README's library-tour table: a row's first cell names one module, several (two
    full names), or one and its siblings (``dgrpo.training.run`` then ``checkpoint``, ``tracking``)."""
    text = (ROOT / "README.md").read_text().split("## Library tour", 1)[1].split("\n## ", 1)[0]
    named = set()
    for cell in re.findall(r"^\| (`[^|]*`) \|", text, flags=re.MULTILINE):
        first, *siblings = re.findall(r"`([\w.]+)`", cell)
        named |= {first, *(n if n.startswith("dgrpo.") else f"{first.rsplit('.', 1)[0]}.{n}" for n in siblings)}
    return named


def test_the_readme_library_tour_names_every_module():
    """Each module of src/dgrpo is in the library tour's table, itself or its package (``dgrpo.eval`` stands for
    ``dgrpo.eval.scoring``; a package whose modules have rows, ``dgrpo.model``, needs none), and each name there is a
    module: twenty-two (``dgrpo.model.factory``, ``dgrpo.training.preemption``, ``dgrpo.bench``, ...) had no row."""
    import importlib.util

    named = library_tour_modules()
    assert {"dgrpo.config", "dgrpo.model.latent_lm", "dgrpo.training.checkpoint", "dgrpo.cli"} <= named, named
    modules = {
        ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for path in (ROOT / "src" / "dgrpo").rglob("*.py")
        if (parts := path.relative_to(ROOT / "src").with_suffix("").parts)[-1] != "__main__"
    } - {"dgrpo"}
    listed = {m for m in modules if any(".".join(m.split(".")[:i]) in named for i in range(2, 4))}
    unlisted = sorted(m for m in modules - listed if not any(n.startswith(f"{m}.") for n in listed))
    assert not unlisted, unlisted
    assert not [n for n in named if importlib.util.find_spec(n) is None]


def code_blocks(path: Path) -> list[str]:
    """The text of every ``` block of a doc."""
    return re.findall(r"```[^\n]*\n(.*?)```", path.read_text(), flags=re.DOTALL)


def documented_python_names() -> list[tuple[str, str, str]]:
    """(doc, module, name) for every name a code block of the docs imports (``from dgrpo.X import a, b``, over lines
    in parentheses too) or reaches by its dotted path (``dgrpo.load_dataset``, ``dgrpo.data.load_spec``)."""
    import importlib

    found = []
    for path in DOCS:
        where = str(path.relative_to(ROOT))
        for block in code_blocks(path):
            imports = re.findall(r"^\s*from\s+(dgrpo[\w.]*)\s+import\s+(\([^)]*\)|[^\n#]+)", block, re.MULTILINE)
            for module, names in imports:
                found += [(where, module, n) for n in re.findall(r"(\w+)(?:\s+as\s+\w+)?", names.strip("()"))]
            for dotted in re.findall(r"\bdgrpo(?:\.\w+)+", block):
                module, *rest = dotted.split(".")
                for part in rest:  # the longest prefix that is a module; the next part a name in it
                    try:
                        importlib.import_module(f"{module}.{part}")
                    except ModuleNotFoundError:
                        found.append((where, module, part))
                        break
                    module = f"{module}.{part}"
    return found


def test_every_name_the_docs_import_from_dgrpo_is_public_there():
    """Every name a snippet of the docs imports from a dgrpo module, or reaches as ``dgrpo.module.name``, exists there
    and is in the module's ``__all__`` when it has one (``training_split``, imported by two docs' snippets, was not in
    ``dgrpo.data.__all__``)."""
    import importlib

    names = documented_python_names()
    assert ("docs/from_trl.md", "dgrpo.data", "training_split") in names
    assert ("README.md", "dgrpo", "load_dataset") in names
    missing = []
    for where, module, name in names:
        mod = importlib.import_module(module)
        public = getattr(mod, "__all__", None)
        if not hasattr(mod, name) or (public is not None and name not in public):
            missing.append(f"{where}: {module}.{name}")
    assert not missing, missing


def documented_metrics() -> set[str]:
    """The backticked names in docs/metrics.md's tables (first column)."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    return set(re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE))


def test_every_metric_a_run_logs_is_documented(sft_checkpoint):
    """docs/metrics.md names every key of the SFT run's rows and of a GRPO step's metrics (a new metric without
    its line fails here)."""
    import json

    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import GRPOTrainer

    from conftest import tiny_config

    documented = documented_metrics()
    sft_rows = [json.loads(x) for x in (sft_checkpoint.parent / "metrics.jsonl").read_text().splitlines()]
    cfg = tiny_config(**{"grpo.filter": "false", "grpo.mini_epochs": "2"})
    trainer = GRPOTrainer(LatentLM.from_pretrained(sft_checkpoint), cfg, generate_split(cfg.task, "train"))
    logged = {k for row in sft_rows for k in row} | set(trainer.step())
    assert logged - documented == set()  # (frac_none/<name>: tests/test_reward_none.py)


def documented_fields(heading: str) -> set[str]:
    """The backticked names in the first column of the tables under one ``## `` heading of docs/metrics.md."""
    section = (ROOT / "docs" / "metrics.md").read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.MULTILINE))


@pytest.mark.filterwarnings("ignore:the model's latent markers")  # (an untrained tiny model: its fields only)
def test_the_fields_of_results_json_and_applied_json_are_the_documented_ones(tokenizer):
    """docs/metrics.md's tables of ``results.json`` and ``applied.json`` list exactly the fields the code writes
    (a run's metrics rows are checked above; these files' fields were not): ``EvalResult``'s fields but its
    predictions, and what a GRPO trainer records on this CPU (``device_name``, on CUDA only, is told in prose)."""
    import dataclasses

    from dgrpo.data.synthetic import generate_split
    from dgrpo.eval.evaluate import EvalResult
    from dgrpo.training.grpo import GRPOTrainer

    from conftest import make_lm, tiny_config

    written = {f.name for f in dataclasses.fields(EvalResult)} - {"predictions"}
    assert documented_fields("`results.json` (evaluation)") == written
    cfg = tiny_config()
    applied = GRPOTrainer(make_lm(tokenizer), cfg, generate_split(cfg.task, "train")[:8]).applied()
    assert documented_fields("`applied.json` (what ran)") == {"started_at_step", *applied}


def test_the_python_apis_classes_and_methods_have_docstrings():
    """The classes a Python caller meets (the README's library tour, docs/from_trl.md's loop) and their public methods
    each say what they are: EvalResult and Generation showed only dataclass's generated signature, LatentLM.device /
    base / embed, Record.to_dict, GRPOTrainer.load_state, ... nothing (methods inherit a base class's docstring)."""
    import inspect

    from dgrpo.data import Record
    from dgrpo.eval.evaluate import EvalResult
    from dgrpo.model.decoding import Generation
    from dgrpo.model.latent_lm import LatentLM, LatentSettings
    from dgrpo.perturbation import (
        BoundPerturbation,
        GaussianNoise,
        LockedDropout,
        NativeDropout,
        NoPerturbation,
        Perturbation,
    )
    from dgrpo.training.grpo import GRPOTrainer

    classes = [LatentLM, LatentSettings, Generation, EvalResult, Record, GRPOTrainer]
    classes += [Perturbation, BoundPerturbation, LockedDropout, GaussianNoise, NativeDropout, NoPerturbation]
    missing = []
    for cls in classes:
        if not cls.__doc__ or cls.__doc__.startswith(f"{cls.__name__}("):  # (a dataclass's generated signature)
            missing.append(cls.__name__)
        for name, member in vars(cls).items():
            if not name.startswith("_") and (callable(member) or isinstance(member, (property, classmethod))):
                if not inspect.getdoc(getattr(cls, name)) and not (isinstance(member, property) and member.__doc__):
                    missing.append(f"{cls.__name__}.{name}")
    assert not missing, missing


def logged_keys(out: Path) -> set[str]:
    """Every key of every row of a run's ``metrics.jsonl``."""
    import json

    return {k for line in (out / "metrics.jsonl").read_text().splitlines() for k in json.loads(line)}


def documented_but_not_logged(documented: set[str], logged: set[str]) -> list[str]:
    """The documented names no logged key matches (``reward/<name>`` stands for any ``reward/...`` key)."""
    patterns = {name: re.compile(re.sub(r"<\w+>", "[^/]+", re.escape(name))) for name in documented}
    return sorted(n for n, p in patterns.items() if not any(p.fullmatch(k) for k in logged))


@pytest.mark.slow
def test_every_grpo_metric_docs_metrics_md_names_is_logged(sft_checkpoint, tmp_path):
    """The reverse of the test above, for ``dgrpo grpo``: each key docs/metrics.md's GRPO tables name is in a run's
    rows (one run that logs every optional key: the EMA baseline, a reference renewal, two reward parts, one a
    plug-in, which logs ``frac_none/<name>``, a validation set), and ``summary.json`` and ``rollouts.jsonl`` hold the
    fields it lists (a key renamed in the code, or one the training loop stopped adding, would leave the doc
    describing nothing)."""
    import json

    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import train_grpo

    from conftest import tiny_config

    plugin = tmp_path / "plugin" / "again.py"
    plugin.parent.mkdir()
    plugin.write_text("def again(completions, records):\n    return [float('#' in c) for c in completions]\n")
    rewards = f"[{{fn: numeric, name: correct}}, {{fn: '{plugin}:again', name: again, weight: 0.5}}]"
    out = tmp_path / "run"
    over = {"grpo.advantage": "ema", "grpo.ref_renewal_every": 1, "grpo.steps": 2, "grpo.warmup_steps": 0}
    cfg = tiny_config(**over, **{"grpo.rewards": rewards, "grpo.log_rollouts": 2, "grpo.eval_every": 1})
    valid = {"valid": generate_split(cfg.task, "valid")[:8]}
    train = generate_split(cfg.task, "train")
    train_grpo(
        LatentLM.from_pretrained(sft_checkpoint), cfg, train, out, valid=valid, progress=False, log=lambda *a: None
    )
    assert documented_but_not_logged(documented_fields("GRPO (`dgrpo grpo`)"), logged_keys(out)) == []
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == documented_fields("`summary.json` (GRPO)")
    applied = documented_fields("`applied.json` (what ran)") - {"started_at_step"}  # (summary's: not a start)
    assert set(summary["applied"]) == applied
    rollout = json.loads((out / "rollouts.jsonl").read_text().splitlines()[0])
    section = (ROOT / "docs" / "metrics.md").read_text().split("### `rollouts.jsonl`", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`(\w+)`", section.split("and with two parts", 1)[0])) - {"log_rollouts"}
    assert set(rollout) == listed | {"correct", "again"}


@pytest.mark.slow
def test_every_sft_metric_docs_metrics_md_names_is_logged(tmp_path):
    """The same for ``dgrpo sft``: a short curriculum with a validation set and ``sft.eval_every_epoch`` writes every
    key of docs/metrics.md's SFT tables (training rows, stage-end and epoch rows, the new-best-epoch row)."""
    import torch

    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.factory import load_model
    from dgrpo.training.sft import train_sft

    from conftest import tiny_config

    over = {"task.n_train": 128, "sft.epochs_per_stage": 1, "sft.num_epochs": 3, "sft.warmup_steps": 0}
    cfg = tiny_config(**over, **{"sft.eval_every_epoch": "true"})
    torch.manual_seed(0)
    lm = load_model(cfg.model, cfg.task, seed=0)
    valid = generate_split(cfg.task, "valid")[:8]
    train_sft(lm, generate_split(cfg.task, "train"), cfg, tmp_path, valid=valid, progress=False, log=lambda *a: None)
    assert documented_but_not_logged(documented_fields("SFT (`dgrpo sft`)"), logged_keys(tmp_path)) == []


def python_examples() -> list[tuple[str, str]]:
    """(where, code) for every ```python block of docs/*.md (the README's tour has its own test above), dedented (a
    block in a list item is indented)."""
    import textwrap

    found = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)
        found += [(f"{path.relative_to(ROOT)}#{i}", textwrap.dedent(b)) for i, b in enumerate(blocks)]
    return found


EXAMPLES = python_examples()


@pytest.mark.filterwarnings("ignore:grpo.warmup_steps")  # (one step of the examples' runs: past no warmup)
@pytest.mark.parametrize("where,code", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_a_python_example_of_the_docs_runs(where, code, sft_checkpoint, tmp_path, monkeypatch):
    """Each Python block of docs/*.md runs as written, in a directory where ``dgrpo sft --out runs/sft`` wrote its
    model and ``dgrpo grpo --out runs/grpo`` its run, their training cut to one step (``grpo.steps=100`` in a
    ``--set`` list becomes 1, validated on 8 records): a renamed argument or metric in an example fails here, not in
    a reader's hands."""
    from dgrpo.data.synthetic import generate_split
    from dgrpo.model.latent_lm import LatentLM
    from dgrpo.training.grpo import train_grpo

    from conftest import tiny_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "sft").symlink_to(sft_checkpoint.parent)
    if "runs/grpo" in code:
        cfg = tiny_config(**{"grpo.steps": 2, "grpo.eval_every": 1, "data.test": "[]"})
        valid = {"valid": generate_split(cfg.task, "valid")[:8]}
        lm = LatentLM.from_pretrained(sft_checkpoint)
        train = generate_split(cfg.task, "train")
        train_grpo(lm, cfg, train, "runs/grpo", valid=valid, progress=False, log=lambda *a: None)
    short = re.sub(r'"grpo\.steps=\d+"', '"grpo.steps=1", "data.eval_limit=8"', code)
    assert short != code or "grpo.steps" not in code, "the example's step count is no longer a --set of it"
    exec(compile(short, where, "exec"), {"__name__": "__docs__"})


def test_every_code_name_the_docs_prose_gives_is_defined():
    """A backticked class member (``GRPOTrainer._update``, ``SFTRun.step``, ``Dist.close``, ``Record.meta``) or private
    function (``_finish_stage``, ``_keep_if_best``) that the docs point a reader to is defined in dgrpo's source:
    docs/metrics.md names where each metric is computed, and a renamed method would leave it pointing at nothing.
    (A name of another project's class, ``AutoTokenizer.from_pretrained``, is not dgrpo's: not checked.)"""
    source = "\n".join(p.read_text() for p in (ROOT / "src" / "dgrpo").rglob("*.py"))
    classes = set(re.findall(r"^class (\w+)", source, flags=re.MULTILINE))

    def defined(name: str) -> bool:
        return bool(re.search(rf"^\s*(?:(?:async )?def |class ){name}\b|^\s+{name}\s*[:=]", source, re.MULTILINE))

    named, missing = 0, []
    for path in DOCS:
        if path.name == "config.md":
            continue
        for n, span in documented_spans(path):
            m = re.fullmatch(r"([A-Z]\w*)\.(\w+)(?:\(.*\))?|(_[a-z]\w*)(?:\(.*\))?", span.strip())
            if not m or (m.group(1) and m.group(1) not in classes):
                continue
            named += 1
            if not defined(m.group(2) or m.group(3)):
                missing.append(f"{path.relative_to(ROOT)}:{n}: {span}")
    assert named >= 10, named
    assert not missing, missing


def test_the_readme_lists_every_dataset_name_the_loaders_know():
    """The README's "Dataset names:" paragraph names every dataset the loaders read by name (a new one, or the paper
    recipe's ``openmathinstruct2_gsm``, was missing), and each bare name it lists is one of them."""
    from dgrpo.data.loaders import DATASETS, HUB_DATASETS, OPENMATH_GSM, is_dataset_name

    text = (ROOT / "README.md").read_text()
    paragraph = text.split("\nDataset names: ", 1)[1].split("\n\n", 1)[0]
    listed = set(re.findall(r"`([a-z0-9_]+)`", paragraph.split("`builtin", 1)[0]))
    known = {*DATASETS, *HUB_DATASETS, OPENMATH_GSM}
    assert known <= listed, sorted(known - listed)
    assert all(is_dataset_name(name) for name in listed), sorted(n for n in listed if not is_dataset_name(n))


def test_every_file_and_folder_of_a_run_is_named_in_the_docs():
    """Each file and folder a training run writes in its ``OUT`` (``dgrpo.run_layout``: ``checkpoints/``,
    ``final/``, ``metrics.jsonl``, ``applied.json``, ``.lock``, ...) is named, backticked, somewhere in the docs'
    prose: a run-layout name changed in the code leaves the docs naming the old one, and this names the new."""
    import dgrpo.run_layout as layout

    spans = [span for path in DOCS if path.name != "config.md" for _, span in documented_spans(path)]
    names = {k: v for k, v in vars(layout).items() if k.isupper() and isinstance(v, str)}
    names.pop("WANDB_ID_FILE")  # (W&B's run id: "W&B's `wandb/` and run id", kept for W&B's resume)
    unnamed = [
        f"{key} = {name!r}"
        for key, name in names.items()
        if not any(re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", span) for span in spans)
    ]
    assert len(names) >= 12, names
    assert not unnamed, unnamed


def test_the_readme_states_the_dependency_floors_of_pyproject():
    """The README's "Versions:" paragraph (torch >= 2.10, transformers >= 5.24, `peft` >= 0.19, `wandb` >= 0.23, each
    package's first) gives the floors pyproject.toml requires: a floor raised in one and not the other would tell a
    user a version that fails (or refuses) to install."""
    readme = (ROOT / "README.md").read_text().split("\nVersions: ", 1)[1].split("\n\n", 1)[0]
    pyproject = (ROOT / "pyproject.toml").read_text()
    stated: dict[str, str] = {}
    for name, version in re.findall(r"`?([a-z]+)`? >= (\d+(?:\.\d+)*)", readme):
        stated.setdefault(name, version)  # (the first: "FSDP2 training ... needs torch >= 2.13" is another floor)
    floors = dict(re.findall(r'"([a-z-]+)(?:\[[^]]*\])?>=([\d.]+)', pyproject))
    assert {"torch", "transformers", "peft", "wandb"} <= set(stated), stated
    wrong = {name: (v, floors.get(name)) for name, v in stated.items() if floors.get(name) != v}
    assert not wrong, wrong


def test_ci_floors_installs_the_floors_the_readme_says_at_pyprojects_versions():
    """The README said `.ci/floors` installs "every floor"; it pins eight of pyproject's packages (tokenizers,
    safetensors, pyyaml, tqdm and the test tools come at their newest). The README names the eight it pins, and each
    pin is pyproject's floor (a floor raised in pyproject and not there would check a version pip refuses)."""
    readme = (ROOT / "README.md").read_text().split("`bash .ci/floors` installs the floors of ", 1)[1]
    named = set(re.findall(r"`([a-z-]+)`", readme.split(" in a fresh environment", 1)[0]))
    floors = dict(re.findall(r'"([a-z-]+)(?:\[[^]]*\])?>=([\d.]+)', (ROOT / "pyproject.toml").read_text()))
    pins = dict(re.findall(r"\b([a-z-]+)==([\d.]+)", (ROOT / ".ci" / "floors").read_text()))
    pinned = {name for name in pins if name in floors}
    assert named == pinned and len(pinned) == 8, (named, pinned)
    off = {
        n: (pins[n], floors[n])
        for n in pinned
        if pins[n].split(".")[: len(floors[n].split("."))] != floors[n].split(".")
    }
    assert not off, off


def test_every_install_names_extras_pyproject_defines_and_the_gpu_install_can_run_its_tests():
    """A ``pip install`` of the docs asks only for extras pyproject.toml defines (pip warns of an unknown one and
    goes on), and the README's GPU install holds what its next paragraph's ``pytest -n0 tests/test_cuda.py`` needs:
    the ``test`` extra (pytest, pytest-xdist for pyproject's ``-n``, hypothesis for conftest; ``.[gpu,hub]`` had
    none of them)."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    section = pyproject.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    defined = set(re.findall(r"^([a-z-]+) = \[", section, flags=re.M))
    assert {"gpu", "hub", "test", "dev"} <= defined, defined
    asked = {}
    for path in DOCS:
        for n, line in code_lines(path):
            if "pip install" in line:
                for extras in re.findall(r"(?:\.|dgrpo)\[([a-z,-]+)\]", line):
                    asked[f"{path.relative_to(ROOT)}:{n}"] = extras.split(",")
    assert any("gpu" in extras for extras in asked.values()), asked
    unknown = {where: extras for where, extras in asked.items() if not set(extras) <= defined}
    assert not unknown, unknown
    gpu = (ROOT / "README.md").read_text().split("\n## GPU install\n", 1)[1].split("\n## ", 1)[0]
    install = next(line for line in gpu.splitlines() if "pip install" in line)
    assert "pytest -n0 tests/test_cuda.py" in gpu and "test" in re.search(r"\.\[([a-z,-]+)\]", install)[1].split(",")


def test_the_most_frequent_answer_share_the_builtin_task_doc_states_is_the_tasks():
    """docs/builtin_task.md's share of always answering a split's most frequent digit (whole default splits, and
    their first 500 problems) holds for the task the code generates: it said 11-13% "on a few hundred problems",
    where the test split's first 500 give 13.6% and the validation split's 10.6%."""
    from collections import Counter

    from dgrpo.config import TaskConfig
    from dgrpo.data.synthetic import generate_split

    text = (ROOT / "docs" / "builtin_task.md").read_text()
    m = re.search(
        r"most frequent digit\s+([\d.]+)-([\d.]+)% on the default splits, ([\d.]+)-([\d.]+)% on their first"
        r"\s+(\d+) problems",
        text,
    )
    assert m, "docs/builtin_task.md no longer states the most frequent answer's share as this test reads it"
    whole_lo, whole_hi, first_lo, first_hi, first = (float(x) for x in m.groups())

    def share(records) -> float:
        """The percentage of the records whose answer is their most frequent one."""
        return 100 * Counter(r.answer for r in records).most_common(1)[0][1] / len(records)

    def stated(lo: float, hi: float, shares: list[float]) -> bool:
        """The range as written (one decimal: within 0.06 of the extremes)."""
        return abs(min(shares) - lo) < 0.06 and abs(max(shares) - hi) < 0.06

    splits = [generate_split(TaskConfig(), s) for s in ("train", "valid", "test", "ood_steps", "ood_numbers")]
    whole = [share(s) for s in splits]
    head = [share(s[: int(first)]) for s in splits]
    assert stated(whole_lo, whole_hi, whole), whole
    assert stated(first_lo, first_hi, head), head


def test_the_demo_config_and_docs_quote_the_published_runs_sft_accuracies():
    """builtin/demo.yaml's header and docs/builtin_task.md quote the published ``--full`` run's SFT validation
    accuracies: they are docs/demo/results.md's "valid" column, seed by seed (demo.yaml said 26.2% for seed 1, whose
    published figure is 26.4%)."""
    results = (ROOT / "docs" / "demo" / "results.md").read_text()
    published = re.findall(r"^\| \d+ \| ([\d.]+%) \|", results.split("## Per SFT seed", 1)[1], flags=re.MULTILINE)
    assert len(published) == 4, published
    demo_yaml = (ROOT / "src" / "dgrpo" / "configs" / "builtin" / "demo.yaml").read_text()
    quoted_yaml = re.search(r"SFT seeds 0-3 end at\s*#?\s*([\d.%, and#\s]+?) validation accuracy", demo_yaml)
    doc = (ROOT / "docs" / "builtin_task.md").read_text()
    quoted_doc = re.search(r"the four seeds end stage 2 at ([\d.%, and\n]+?) \(", doc)
    assert quoted_yaml and quoted_doc, "the quotes moved: update this test"
    for quote in (quoted_yaml.group(1), quoted_doc.group(1)):
        assert re.findall(r"[\d.]+%", quote) == published, (quote, published)


def test_every_bench_item_the_docs_name_is_one_of_the_suite():
    """A ``--only ITEMS`` of ``dgrpo bench`` in the docs (and bench/RESULTS.md's rows) names items the suite has:
    the flag itself is checked above, its value (a free comma list) only here."""
    from dgrpo.bench.suite import ITEM_KEYS

    named, unknown = 0, []
    for path in [*DOCS, ROOT / "bench/RESULTS.md"]:
        for items in re.findall(r"--only[ =]([a-z_]+(?:,[a-z_]+)*)", path.read_text()):
            for item in items.split(","):
                named += 1
                if item not in ITEM_KEYS:
                    unknown.append(f"{path.relative_to(ROOT)}: --only {item}")
    assert named >= 5, named
    assert not unknown, unknown


def test_the_readme_counts_the_bad_input_cases_tests_test_reliability_runs():
    """The README's reliability section says how many bad inputs are tested (one line, exit 2 each): that count is
    tests/test_reliability.py's table."""
    from test_reliability import CASES

    m = re.search(r"a table of (\d+) cases is tested", (ROOT / "README.md").read_text())
    assert m, "the README no longer counts the bad-input cases as this test reads it"
    assert int(m.group(1)) == len(CASES)


def test_every_flag_the_docs_give_a_bench_or_experiments_script_is_one_of_its_options(monkeypatch, capsys):
    """A ``--flag`` the docs (and bench/RESULTS.md) write after ``bench/NAME.py`` or ``experiments/NAME.py``
    (``python bench/paper_step.py --tiny --device cpu --steps 1 --profile``) is in the script's ``--help``: these
    scripts are not ``dgrpo`` commands, so the checks above do not read them."""
    from conftest import run_script

    invocation = re.compile(r"(?<![\w/])((?:bench|experiments)/\w+\.py)\b([^`|;#]*)")
    flags: dict[str, set[tuple[str, str]]] = {}
    for path in [*DOCS, ROOT / "bench/RESULTS.md"]:
        texts = [t for _, t in code_lines(path)] + [s for _, s in documented_spans(path)]
        for text in texts:
            for script, rest in invocation.findall(text.replace("\n", " ")):
                for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", rest):
                    flags.setdefault(script, set()).add((str(path.relative_to(ROOT)), flag))
    assert any(f == "--profile" for _, f in flags.get("bench/paper_step.py", ())), flags
    unknown = []
    for script, named in sorted(flags.items()):
        code, out, err = run_script(ROOT / script, ["--help"], monkeypatch, capsys)
        assert code == 0, (script, err)
        options = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", out))
        unknown += [f"{where}: {script} {flag}" for where, flag in sorted(named) if flag not in options]
    assert not unknown, unknown


def test_the_engine_ratios_the_readme_quotes_are_bench_item_12s():
    """The README's GPU recipe section quotes bench item 12 (the fast engine against eager on CPU): each step ratio it
    gives is one bench/RESULTS.md records for that item. It gave 0.90x, 0.97x, 0.91x "in three runs", which the file
    does not hold, and not the runs that reached 1.02x and 1.05x."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## The paper's full-scale recipe (GPU)", 1)[1].split("\n## ", 1)[0]
    quoted = section.split("(bench item 12,", 1)[1].split(").", 1)[0]
    results = (ROOT / "bench/RESULTS.md").read_text()
    item = results.split("## Fast rollout engine vs eager (item 12)", 1)[1].split("\n## ", 1)[0]
    ratios = re.findall(r"(?<![\d.])\d\.\d+x", quoted)
    assert len(ratios) >= 3, quoted
    assert [r for r in ratios if not re.search(rf"(?<![\d.]){re.escape(r)}", item)] == [], (ratios, quoted)
