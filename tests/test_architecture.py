"""The package's shape: imports flow one way (data -> model -> perturbation -> eval -> training -> demo/bench -> cli),
the module graph has no circle, and the training loop has no function over ~60 lines."""

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "dgrpo"
#: the layer of each top-level part of the package; a module may import its own layer or a lower one
LAYERS = {
    "hub": 0,
    "config": 0,
    "reward": 0,
    "run_layout": 0,
    "progress": 0,
    "plugins": 0,
    "text": 0,
    "paths": 0,
    "wording": 0,
    "data": 1,
    "model": 2,
    "perturbation": 3,
    "eval": 4,
    "training": 5,
    "demo": 6,
    "bench": 6,
    "plotting": 6,
    "cli": 7,
    "__init__": 8,
    "__main__": 8,
}


def module_name(path: Path) -> str:
    """``src/dgrpo/training/grpo.py`` -> ``dgrpo.training.grpo`` (a package's ``__init__`` -> the package)."""
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


FILES = sorted(SRC.rglob("*.py"))
MODULES = {module_name(f) for f in FILES}


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once per process (a test reads it, never changes it)."""
    return ast.parse(path.read_text())


@functools.cache
def imports(path: Path) -> tuple[tuple[str, bool], ...]:
    """(imported dgrpo module, at module level?) for every import in the file (TYPE_CHECKING blocks excluded).
    ``from X import name`` counts as importing ``X.name`` when that is a module of the package, else ``X``. Found
    once per process: the circle test reads every file's, as the one-way test does each file's."""
    tree = parsed(path)
    me = module_name(path).split(".")
    package = me if path.name == "__init__.py" else me[:-1]
    found: list[tuple[str, bool]] = []

    def resolve(base: str, names: list[str]) -> list[str]:
        subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in MODULES]
        return subs or [base]

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom):
                prefix = package[: len(package) - child.level + 1] if child.level else []
                base = ".".join(prefix + ([child.module] if child.module else []))
                if base.startswith("dgrpo"):
                    found.extend((t, top) for t in resolve(base, [a.name for a in child.names]))
            elif isinstance(child, ast.Import):
                found.extend((a.name, top) for a in child.names if a.name.startswith("dgrpo"))
            visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, True)
    return tuple(found)


def layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS["__init__" if len(parts) == 1 else parts[1]]


def test_every_part_has_a_layer():
    for f in FILES:
        parts = module_name(f).split(".")
        assert len(parts) == 1 or parts[1] in LAYERS, f"{f}: add its part to LAYERS"


@pytest.mark.parametrize("path", FILES, ids=lambda p: module_name(p))
def test_imports_flow_one_way(path):
    me = module_name(path)
    for target, _ in imports(path):
        if layer(target) > layer(me):
            pytest.fail(
                f"{me} imports {target}: an arrow up the layers (a {layer(me)} module importing a {layer(target)} one)"
            )


def test_no_import_circle():
    """Imports form no cycle, those inside functions included (a deferred import hid two: model.sources and
    model.lora each imported model.latent_lm, which imported them)."""
    graph = {module_name(f): {t for t, _ in imports(f) if t != module_name(f)} for f in FILES}
    # packages import their submodules through __init__; an edge package -> own submodule is expected
    state: dict[str, int] = {}

    def dfs(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in graph.get(node, ()):
            if dep.startswith(node + "."):
                continue
            if state.get(dep) == 1:
                pytest.fail(
                    "import circle: " + " -> ".join(path[path.index(dep) :] + [dep])
                    if dep in path
                    else f"{node} -> {dep}"
                )
            if state.get(dep) is None:
                dfs(dep, path + [dep])
        state[node] = 2

    for node in graph:
        if node not in state:
            dfs(node, [node])


def test_distributed_stays_below_eval_and_perturbation():
    targets = {t for t, _ in imports(SRC / "training" / "distributed.py")}
    assert not any(t.startswith(("dgrpo.eval", "dgrpo.perturbation")) for t in targets), targets


TRAINING_LOOP = sorted((SRC / "training").glob("*.py")) + [
    SRC / "model" / f for f in ("latent_lm.py", "latent_chain.py", "tokens.py", "decoding.py")
]


@pytest.mark.parametrize("path", TRAINING_LOOP, ids=lambda p: p.name)
def test_training_functions_are_short(path):
    """No function of the training loop (training/, the latent recurrence) over 60 lines (docstring included): the
    loops read top to bottom."""
    for node in ast.walk(parsed(path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            assert n <= 60, f"{path.name}:{node.lineno} {node.name} has {n} lines"


def test_package_attributes() -> None:
    """The top-level package's lazy export is listed, and a missing name is the standard error naming the module."""
    import dgrpo

    with pytest.raises(AttributeError, match=r"^module 'dgrpo' has no attribute 'foo'$"):
        dgrpo.foo  # noqa: B018
    assert {"LatentLM", "load_dataset", "score", "Record"} <= set(dir(dgrpo))
