"""bench/paper_step.py's --prompt-widths narrower than the problems: one line and exit 2, before a trainer is built (on
a GPU node, after building Qwen2.5-1.5B's shape twice, it was a traceback out of the first step)."""

import re
from pathlib import Path

from conftest import run_script

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "paper_step.py"


def test_a_prompt_width_under_the_problems_own_is_refused_in_one_line_before_any_step(monkeypatch, capsys):
    small = ["--set", "grpo.prompts_per_step=2", "--set", "grpo.group_size=4", "--set", "grpo.max_new_tokens=4"]
    argv = ["--tiny", "--device", "cpu", "--steps", "1", *small, "--prompt-widths", "60,5"]
    code, out, err = run_script(SCRIPT, argv, monkeypatch, capsys)
    assert code == 2 and out == "", (code, out)  # (nothing printed: the trainers' header line comes after them)
    line = err.strip().splitlines()[-1]
    m = re.fullmatch(
        r"paper_step\.py: error: --prompt-widths 5: the problems alone take (\d+) tokens; give at least that", line
    )
    assert m and 5 < int(m[1]) <= 60, line
