"""Dataset subsets the paper describes only by their size: the selection rule, on rows made up here."""


def test_openmath_gsm_subset_rule():
    """The paper's GRPO subset of OpenMathInstruct-2 (69,981 items; the paper does not say how): grade-school
    sources, numeric answers, each problem once, a seeded uniform draw in dataset order."""
    from dgrpo.data.subsets import sample_subset

    rows = []
    for i in range(400):
        source = ["augmented_gsm8k", "gsm8k", "augmented_math", "math"][i % 4]
        rows.append(
            {"problem": f"p{i // 2}", "expected_answer": "x+1" if i % 10 == 0 else str(i), "problem_source": source}
        )
    picked = sample_subset(iter(rows), n=50, seed=0)
    assert len(picked) == 50 and picked == sample_subset(iter(rows), n=50, seed=0)
    assert all(r["problem_source"] in ("augmented_gsm8k", "gsm8k") and r["expected_answer"] != "x+1" for r in picked)
    assert len({r["problem"] for r in picked}) == 50  # each problem once
    order = [rows.index(r) for r in picked]
    assert order == sorted(order)  # dataset order
    assert picked != sample_subset(iter(rows), n=50, seed=1)
    eligible = [
        r for r in rows if r["problem_source"] in ("augmented_gsm8k", "gsm8k") and r["expected_answer"] != "x+1"
    ]
    assert len(sample_subset(iter(rows), n=10**6)) == len({r["problem"] for r in eligible})  # fewer when fewer
