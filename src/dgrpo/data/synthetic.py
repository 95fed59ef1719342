"""The built-in synthetic task: multi-step modular arithmetic word problems in GSM8K-Aug style.

A problem is a chain of ``n_steps`` operations evaluated left to right modulo ``modulus``::

    question: Start with 3. Add 4. Times 7. Minus 5. Answer mod 10.
    steps:    <<3+4=7>>  <<7*7=9>>  <<9-5=4>>
    answer:   4

``+``/``-`` take operands 1..max_operand, ``*`` takes 3, 7 or 9 (units coprime to 10, so the answer
stays close to uniform: chance is about 1/modulus). Everything is a deterministic function of the
task seed. Splits: ``train``, ``valid``, ``test`` and two out-of-distribution test splits,
``ood_steps`` (``n_steps + ood_extra_steps`` operations) and ``ood_numbers`` (``+``/``-`` operands
10..ood_max_operand). Test and validation questions never appear in ``train``.

Why this shape: every operation is four tokens (``Add 4.``: ``ĠAdd``, ``Ġ``, ``4``, ``.``), so a tiny
from-scratch transformer finds the k-th operand at a fixed offset; it learns one latent step easily but chains
several poorly (see ``docs/builtin_task.md``), which puts a 2-latent + 2-written-step model in the band
where RL has room to help.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from ..config import ConfigError, TaskConfig
from .records import DataError, Record

SPLITS = ("train", "valid", "test", "ood_steps", "ood_numbers")
_MUL = (3, 7, 9)
_PHRASES = {"+": "Add {x}.", "-": "Minus {x}.", "*": "Times {x}."}


def make_problem(rng: random.Random, n_steps: int, modulus: int, lo: int, hi: int) -> Record:
    """One problem with operands of + and - drawn from [lo, hi]."""
    value = rng.randrange(modulus)
    parts = [f"Start with {value}."]
    steps = []
    for _ in range(n_steps):
        op = rng.choice("+-*")
        x = rng.choice(_MUL) if op == "*" else rng.randint(lo, hi)
        new = {"+": value + x, "-": value - x, "*": value * x}[op] % modulus
        parts.append(_PHRASES[op].format(x=x))
        steps.append(f"<<{value}{op}{x}={new}>>")
        value = new
    parts.append(f"Answer mod {modulus}.")
    return Record(question=" ".join(parts), steps=steps, answer=str(value))


def generate_split(cfg: TaskConfig, split: str) -> list[Record]:
    """Deterministic records of one split (the test splits are generated first and excluded from valid and train,
    valid's questions from train: a best checkpoint chosen on valid never reads a test problem)."""
    if split not in SPLITS:
        raise DataError(f"built-in task has splits {', '.join(SPLITS)}; got {split!r}")
    held_out: set[str] = set()
    out = []
    for name in ("test", "valid", "ood_steps", "ood_numbers", "train"):
        n_steps, lo, hi, n = cfg.n_steps, 1, cfg.max_operand, cfg.n_test
        if name == "valid":
            n = cfg.n_valid
        elif name == "train":
            n = cfg.n_train
        elif name == "ood_steps":
            n_steps += cfg.ood_extra_steps
        elif name == "ood_numbers":
            lo, hi = 10, cfg.ood_max_operand
        rng = random.Random(f"{cfg.seed}/{name}")
        recs: list[Record] = []
        seen: set[str] = set()
        attempts = 0
        while len(recs) < n:
            attempts += 1
            if attempts > 50 * n + 1000:
                raise DataError(f"built-in task: cannot draw {n} distinct {name} problems; lower n or raise n_steps")
            r = make_problem(rng, n_steps, cfg.modulus, lo, hi)
            if r.question in seen or (name in ("valid", "train") and r.question in held_out):
                continue
            seen.add(r.question)
            r.meta = {"source": "builtin", "split": name}
            recs.append(r)
        if name == split:
            out = recs
            break
        held_out |= seen
    return out


def parse_builtin_name(name: str, split: str | None, task: TaskConfig | None = None) -> tuple[TaskConfig, str]:
    """``builtin``, ``builtin:test`` or ``builtin:test?n_steps=6&modulus=10`` -> (task config, split). The options
    in the name apply over ``task`` (the run's task; the defaults when None) and are validated."""
    cfg = task or TaskConfig()
    rest = name[len("builtin") :]
    query = ""
    if "?" in rest:
        rest, query = rest.split("?", 1)
    if rest.startswith(":"):
        split = split or rest[1:]
    elif rest:
        raise DataError(f"cannot parse built-in dataset name {name!r}; expected builtin[:split][?key=value&...]")
    given: set[str] = set()
    for item in filter(None, query.split("&")):
        k, _, v = item.partition("=")
        if not hasattr(cfg, k):
            raise DataError(f"built-in task has no option {k!r}")
        if k in given:
            raise DataError(f"built-in dataset {name!r}: the option {k} is given twice")
        given.add(k)
        if not re.fullmatch(r"-?\d{1,30}", v):  # (a '+' joins datasets: builtin:test?n=+5 is split there first)
            raise DataError(f"built-in task option {k} expects an integer, got {v!r} (datasets are joined by '+')")
        cfg = replace(cfg, **{k: int(v)})
    try:
        cfg.validate("task")
    except ConfigError as e:
        raise DataError(f"built-in dataset {name!r}: {e}") from None
    return cfg, split or "test"


def load_builtin(name: str, split: str | None = None, task: TaskConfig | None = None) -> list[Record]:
    cfg, split = parse_builtin_name(name, split, task)
    return generate_split(cfg, split)


def tokenizer_corpus(cfg: TaskConfig) -> list[str]:
    """Text that covers every word the task (and its OOD splits) can produce, to train the tokenizer."""
    rng = random.Random(f"{cfg.seed}/tokenizer")
    texts = []
    for n_steps, lo, hi in (
        (cfg.n_steps, 1, cfg.max_operand),
        (cfg.n_steps + cfg.ood_extra_steps, 10, cfg.ood_max_operand),
    ):
        for _ in range(200):
            r = make_problem(rng, n_steps, cfg.modulus, lo, hi)
            texts.append(r.question + "\n" + "\n".join(r.steps) + "\n#### " + r.answer)
    texts.append("The answer is 0 1 2 3 4 5 6 7 8 9 . , $ % ( ) / : ? Question: Answer:")
    return texts
