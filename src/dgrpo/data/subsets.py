"""The GRPO training subset of OpenMathInstruct-2 used by the paper's recipe (``openmathinstruct2_gsm``).

The paper's Table 1 trains GRPO on 69,981 items of OpenMathInstruct-2 (plus GSM-Hard and SVAMP) and says they
were chosen to match GSM8K-Aug in style and difficulty, but not how. This is our rule, stated so it can be
reproduced: one streaming pass over ``nvidia/OpenMathInstruct-2`` (split ``train``) keeps the rows whose
``problem_source`` is ``augmented_gsm8k`` or ``gsm8k`` (grade-school problems; not the MATH-derived ones) and whose
``expected_answer`` is one number, drops repeated problems (the dataset has many solutions per problem), and
draws 69,981 of them uniformly at random with seed 0 (reservoir sampling), returned in dataset order.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Iterator
from typing import Any

from ..reward import normalize_number

OPENMATH_HUB_ID = "nvidia/OpenMathInstruct-2"
GSM_SOURCES = ("augmented_gsm8k", "gsm8k")
PAPER_SUBSET_SIZE = 69_981


def gsm_style(rows: Iterable[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index, row) for rows from grade-school sources with a numeric answer, each problem once."""
    seen: set[bytes] = set()
    for i, row in enumerate(rows):
        if row.get("problem_source") not in GSM_SOURCES or normalize_number(str(row.get("expected_answer"))) is None:
            continue
        key = hashlib.blake2b(str(row.get("problem")).encode(), digest_size=8).digest()
        if key in seen:
            continue
        seen.add(key)
        yield i, row


def sample_subset(rows: Iterable[dict[str, Any]], n: int = PAPER_SUBSET_SIZE, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows of :func:`gsm_style` drawn uniformly at random in one pass (reservoir sampling, Algorithm R),
    in their original order. Fewer when there are fewer."""
    rng = random.Random(seed)
    reservoir: list[tuple[int, dict[str, Any]]] = []
    for k, item in enumerate(gsm_style(rows)):
        if k < n:
            reservoir.append(item)
        else:
            j = rng.randint(0, k)
            if j < n:
                reservoir[j] = item
    return [row for _, row in sorted(reservoir, key=lambda item: item[0])]


def stream_openmath(split: str = "train") -> Iterable[dict[str, Any]]:
    """OpenMathInstruct-2's rows, streamed from the hub (the optional ``datasets`` package)."""
    import datasets

    return datasets.load_dataset(OPENMATH_HUB_ID, split=split, streaming=True)
