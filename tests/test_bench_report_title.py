"""bench.md's title says what ran: the whole suite ("full run", as bench/RESULTS.md calls one) or an --only subset."""

import json
import types

import pytest
from test_bench_mutants import _fake_suite

from dgrpo.bench import suite
from dgrpo.bench.report import Row


def _item(ctx):
    return [Row(ctx.section, "1. item", "rollouts", "conf", "vals", "a / b", 2.0)], {}


@pytest.mark.parametrize(
    "only, quick, title",
    [
        (None, False, "# dgrpo bench (full run)\n"),
        ("rollouts", False, "# dgrpo bench (full shapes; --only rollouts, not the whole suite)\n"),
        (None, True, "# dgrpo bench (quick smoke run: tiny shapes, the numbers are not the claims)\n"),
        ("rollouts,", True, "(quick smoke run: tiny shapes, the numbers are not the claims; --only rollouts, not the"),
    ],
)
def test_a_subset_of_the_items_is_not_titled_a_full_run(tmp_path, monkeypatch, only, quick, title):
    """`dgrpo bench --only flops` wrote "# dgrpo bench (full run)", the words RESULTS.md uses for the whole suite."""
    _fake_suite(monkeypatch, dict.fromkeys(suite.ITEM_KEYS, _item), cuda=False)  # (stand-ins: no item runs)
    args = types.SimpleNamespace(out=str(tmp_path), quick=quick, only=only, section="cpu")
    assert suite.run_suite(args, []) == 0
    assert title in (tmp_path / "bench.md").read_text()
    meta = json.loads((tmp_path / "bench.json").read_text())["meta"]
    assert meta["only"] == (["rollouts"] if only else None)
