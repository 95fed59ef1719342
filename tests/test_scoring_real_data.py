"""The numeric verifier (``dgrpo.reward.score``) against every gold of the real evaluation data (GSM8K, SVAMP,
MultiArith, GSM-Hard in $DGRPO_DATA_DIR, else ../shared/data): the ways a model writes a gold's number score 1, as
do the gold given as the file writes it (SVAMP's ``51.0``, GSM-Hard's float); numbers near it score 0."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest

from dgrpo.data.loaders import load_dataset
from dgrpo.reward import score

from conftest import SHARED_DATA

DATA = SHARED_DATA  # $DGRPO_DATA_DIR, else ../shared/data
if not DATA.is_dir():
    pytest.skip(f"data folder {DATA} not present (set DGRPO_DATA_DIR)", allow_module_level=True)

#: each file with its gold as the file writes it: (loader's name, split, file, the raw gold of each row, in order)
FILES = {
    "gsm8k-train": ("gsm8k", "train", "gsm8k/train.jsonl"),
    "gsm8k-test": ("gsm8k", "test", "gsm8k/test.jsonl"),
    "svamp": ("svamp", "test", "svamp/SVAMP.json"),
    "multiarith": ("multiarith", "test", "multiarith/MultiArith.json"),
    "multiarith-pal": ("", "", "multiarith/mawpsmultiarith.jsonl"),
    "gsm_hard": ("gsm_hard", "test", "gsm_hard/gsmhardv2.jsonl"),
}


@pytest.fixture(autouse=True)
def _data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    """Names resolve to the shared data folder whatever the working directory."""
    monkeypatch.setenv("DGRPO_DATA_DIR", str(DATA))


def _raw_golds(rel: str) -> list[tuple[str, object]]:
    """Each row's gold as written in the file (its text: GSM8K's ``40,000``, SVAMP's ``51.0``, GSM-Hard's
    ``5186630.5999999996``) and as JSON reads it (a float for SVAMP, MultiArith and GSM-Hard)."""
    text = (DATA / rel).read_text("utf-8")
    if rel.startswith("gsm8k/"):
        golds = [json.loads(line)["answer"].rpartition("####")[2].strip() for line in text.splitlines()]
        return [(g, g) for g in golds]
    key = {"svamp": "Answer", "multiarith/MultiArith": "lSolutions", "multiarith/mawps": "target", "gsm_hard": "target"}
    name = next(v for k, v in key.items() if rel.startswith(k))
    literals = re.findall(rf'"{name}":\s*\[?\s*([-+0-9.eE]+)', text)
    rows = json.loads(text) if rel.endswith(".json") else [json.loads(line) for line in text.splitlines()]
    values = [row[name][0] if name == "lSolutions" else row[name] for row in rows]
    assert len(literals) == len(values)
    return list(zip(literals, values))


def _records(case: str) -> list[tuple[str, str, object]]:
    """(the loader's gold, the file's text of it, JSON's value of it) for each row of ``case``."""
    name, split, rel = FILES[case]
    records = load_dataset(name, split) if name else load_dataset(str(DATA / rel))
    raw = _raw_golds(rel)
    assert len(records) == len(raw)
    return [(r.answer, text, value) for r, (text, value) in zip(records, raw)]


def _written(gold: str, literal: str) -> set[str]:
    """The ways of writing a gold's number a model may use: as the loader keeps it, as the file writes it, with
    thousands commas, and a whole number also with ``.0`` and ``.00``."""
    d = Decimal(gold)
    sign, (whole, _, frac) = ("-" if d < 0 else ""), gold.lstrip("-").partition(".")
    forms = {gold, literal, f"{sign}{int(whole):,}" + (f".{frac}" if frac else "")}
    if d == d.to_integral_value():
        forms |= {f"{gold}.0", f"{gold}.00"}
    return forms


def _misses(gold: str) -> set[str]:
    """Numbers a gold must not accept: off by one either way, a digit of its whole part changed, and the gold inside
    a longer number (a digit before or after its whole part, a decimal after a whole number)."""
    d = Decimal(gold)
    sign, (whole, dot, frac) = ("-" if d < 0 else ""), gold.lstrip("-").partition(".")
    out = {format(d + 1, "f"), format(d - 1, "f"), f"{sign}1{whole}{dot}{frac}", f"{sign}{whole}7{dot}{frac}"}
    for i in {0, len(whole) // 2, len(whole) - 1}:
        changed = whole[:i] + str((int(whole[i]) + 1) % 10) + whole[i + 1 :]
        out.add(f"{sign}{changed}{dot}{frac}")
    if not frac:
        out.add(f"{gold}.5")
    return {m for m in out if Decimal(m) != d}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(FILES))
def test_every_way_of_writing_a_real_gold_scores_1_and_near_numbers_score_0(case: str) -> None:
    wrong: list[tuple[str, object]] = []
    for gold, literal, value in _records(case):
        for form in _written(gold, literal):
            texts: tuple[str, ...] = (
                f"The answer is {form}.",
                f"#### {form}",
                f"so \\boxed{{{form}}}.",
                f"**Answer:** ${form}",
            )
            texts += (f"9 * 2 = 3. In all {form} dollars.",)  # (no marker: the last number)
            wrong += [(t, g) for t in texts for g in dict.fromkeys((gold, literal, value)) if score(t, g) != 1.0]
        for miss in _misses(gold):
            wrong += [(t, gold) for t in (f"The answer is {miss}.", f"#### {miss}") if score(t, gold) != 0.0]
    assert wrong == []


@pytest.mark.slow
def test_gsm_hard_non_integer_golds_take_their_roundings_and_not_their_whole_part() -> None:
    """GSM-Hard's 303 non-integer golds: written to 2 or 4 decimals (a nonzero rounding) or as Python prints the
    float, a prediction scores 1; its whole part alone scores 0 (``3244047`` for ``3244047.0999999996``), and so does
    a rounding to 0 (no absolute tolerance: ``0.00`` for ``0.0016791648``)."""
    wrong = []
    fractional = [(g, v) for g, _, v in _records("gsm_hard") if "." in g]
    assert len(fractional) == 303
    for gold, value in fractional:
        d = Decimal(gold)
        for places in ("0.01", "0.0001"):
            rounded = d.quantize(Decimal(places))
            if score(f"The answer is {rounded}.", value) != float(rounded != 0):
                wrong.append((str(rounded), gold))
        if score(f"The answer is {value!r}.", gold) != 1.0:
            wrong.append((repr(value), gold))
        whole = int(d)
        if abs(d - whole) > Decimal("0.001") and score(f"#### {whole}", gold) != 0.0:
            wrong.append((str(whole), gold))
    assert wrong == []


def test_the_real_golds_are_read_as_the_files_mean_them() -> None:
    """Every row is read, its gold the number the file writes (GSM8K's ``40,000`` as 40000; SVAMP's and MultiArith's
    whole floats as integers; GSM-Hard's float as that float: ``5186630.5999999996`` is the float 5186630.6, more
    digits than a float holds)."""
    for case, (_, _, rel) in FILES.items():
        for gold, literal, value in _records(case):
            written = Decimal(literal.replace(",", ""))
            assert Decimal(gold) == (Decimal(repr(value)) if isinstance(value, float) else written), (case, gold)
            assert float(gold) == float(written), (case, gold, literal)
            if not rel.startswith("gsm_hard"):
                assert "." not in gold, (case, gold)
    counts = {case: len(_records(case)) for case in FILES}
    assert counts == {
        "gsm8k-train": 7473,
        "gsm8k-test": 1319,
        "svamp": 1000,
        "multiarith": 600,
        "multiarith-pal": 600,
        "gsm_hard": 1319,
    }
