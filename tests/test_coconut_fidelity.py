"""The SFT curriculum checked against Coconut's rules: those of the paper (Hao et al., 2024, "Training Large Language
Models to Reason in a Continuous Latent Space", Sec. 3 and 4) and of facebookresearch/coconut (commit 27273cb), read
side by side and restated here in this file's own terms (a rule function and hand-worked cases), not a transcription
of that code. The rules: the stage of epoch e is e // epochs_per_stage; at stage k <= max_latent_stage the first k
reasoning steps give way to k * c continuous thoughts; past max_latent_stage every step is gone, with
max_latent_stage * c thoughts (pad_latent_to_max) or min(steps, max_latent_stage) * c; cot keeps every step and
no_cot none, both without thoughts; the loss supervises the steps still written, the answer and EOS, never the
question, the markers or the thoughts. For every stage, c_thought and pad_latent_to_max, the tokens dgrpo runs and
those it supervises follow them, up to the differences the README lists (``#### x`` for Coconut's ``### x``; the
markers kept in the cot / no_cot baselines). The records are made-up word problems in GSM8K-Aug's step format
(``<<expression=value>>``, one step a line), no dataset rows."""

import itertools
import random
from collections import Counter

import pytest
import torch

from dgrpo.config import Config, load_config
from dgrpo.data.records import Record
from dgrpo.training.curriculum import (
    curriculum_stage,
    final_settings,
    latent_layout,
    make_example,
    stage_of_epoch,
    stage_settings,
)
from dgrpo.training.sft import sft_loss

from conftest import make_lm

#: made-up problems of 1, 3 and 4 steps (one with decimals)
EGGS = Record("A box holds 6 eggs. How many eggs are in 7 boxes?", ["<<6*7=42>>"], "42")
PENCILS = Record(
    "Mia buys 4 packs of 5 pencils. She keeps 8 pencils and shares the rest equally with 2 friends. "
    "How many pencils does each friend get?",
    ["<<4*5=20>>", "<<20-8=12>>", "<<12/2=6>>"],
    "6",
)
ROLLS = Record(
    "A baker bakes 3 trays of 12 rolls in the morning and twice as many rolls in the afternoon. He sells 48 rolls. "
    "How many rolls are left?",
    ["<<3*12=36>>", "<<2*36=72>>", "<<36+72=108>>", "<<108-48=60>>"],
    "60",
)
TANK = Record(
    "A tank holds 30 liters. A hose fills it at 2.5 liters a minute for 4 minutes, then at 5 liters a minute. "
    "How many minutes does it take to fill the tank?",
    ["<<2.5*4=10>>", "<<30-10=20>>", "<<20/5=4>>", "<<4+4=8>>"],
    "8",
)
RECORDS = [EGGS, PENCILS, ROLLS, TANK]


def sft_config(*sets: str, file: str | None = None) -> Config:
    """The default config (or ``file``) with ``sft.`` overrides, e.g. ``sft_config("c_thought=2")``."""
    return load_config(Config, file, [f"sft.{s}" for s in sets])


def curriculum_rule(
    stage: int, n_steps: int, *, c: int, max_stage: int, pad: bool, mode: str = "coconut"
) -> tuple[int, int]:
    """(steps removed, continuous thoughts) for a chain of ``n_steps`` at ``stage``, as the paper states the
    curriculum. Stage k <= ``max_stage``: the first k steps are removed (all of them when the chain is shorter) and
    k thought slots of ``c`` thoughts each stand in their place. Past ``max_stage`` no step is written; the thought
    slots are ``max_stage`` with ``pad`` (pad_latent_to_max), else one per step up to ``max_stage``. cot writes every
    step and no_cot none, neither with thoughts; pause lays out as coconut (its thoughts are <|latent|> inputs)."""
    if mode == "cot":
        return 0, 0
    if mode == "no_cot":
        return n_steps, 0
    if stage <= max_stage:
        still_written = max(n_steps - stage, 0)
        slots = stage
    else:
        still_written = 0
        slots = max_stage if pad else min(n_steps, max_stage)
    return n_steps - still_written, slots * c


#: (steps in the chain, c, max_latent_stage, pad) -> (steps removed, thoughts) at stages 0, 1, 2, ..., worked by hand
HAND_LAYOUTS = {
    (4, 2, 3, False): [(0, 0), (1, 2), (2, 4), (3, 6), (4, 6), (4, 6)],
    (4, 2, 3, True): [(0, 0), (1, 2), (2, 4), (3, 6), (4, 6), (4, 6)],
    (2, 2, 3, False): [(0, 0), (1, 2), (2, 4), (2, 6), (2, 4), (2, 4)],
    (2, 2, 3, True): [(0, 0), (1, 2), (2, 4), (2, 6), (2, 6), (2, 6)],
    (1, 3, 2, False): [(0, 0), (1, 3), (1, 6), (1, 3), (1, 3)],
    (1, 3, 2, True): [(0, 0), (1, 3), (1, 6), (1, 6), (1, 6)],
    (3, 1, 1, False): [(0, 0), (1, 1), (3, 1), (3, 1)],
}


@pytest.mark.parametrize(("n_steps", "c", "max_stage", "pad"), list(HAND_LAYOUTS))
def test_hand_worked_layouts(n_steps, c, max_stage, pad):
    """A few chains worked out by hand, stage by stage: the stage's steps removed and its thoughts (a chain shorter
    than the stage keeps the stage's k * c thoughts up to max_latent_stage, then takes one slot per step without
    pad_latent_to_max); the rule function agrees with every hand value."""
    want = HAND_LAYOUTS[n_steps, c, max_stage, pad]
    cfg = sft_config(f"c_thought={c}", f"max_latent_stage={max_stage}", f"pad_latent_to_max={pad}")
    assert [latent_layout(k, n_steps, cfg) for k in range(len(want))] == want
    assert [curriculum_rule(k, n_steps, c=c, max_stage=max_stage, pad=pad) for k in range(len(want))] == want


def test_every_mode_stage_and_chain_follows_the_rule():
    """The sweep: modes coconut, pause, cot, no_cot; c 1-3; max_latent_stage 0-4; pad true / false; chains of 0-8
    steps; stages 0-7."""
    modes = ["coconut", "pause", "cot", "no_cot"]
    for mode, c, max_stage, pad in itertools.product(modes, [1, 2, 3], range(5), [True, False]):
        cfg = sft_config(f"mode={mode}", f"c_thought={c}", f"max_latent_stage={max_stage}", f"pad_latent_to_max={pad}")
        for n_steps, stage in itertools.product(range(9), range(8)):
            want = curriculum_rule(stage, n_steps, c=c, max_stage=max_stage, pad=pad, mode=mode)
            assert latent_layout(stage, n_steps, cfg) == want, (mode, c, max_stage, pad, n_steps, stage)


def expected_sequence(lm, rec: Record, removed: int, thoughts: int) -> dict:
    """The sequence Coconut trains: the question and a newline (with the tokenizer's BOS where it adds one),
    <|start-latent|>, ``thoughts`` <|latent|> slots, <|end-latent|>, each step still written on its own line, the
    answer line and EOS; labels on the written steps, the answer and EOS only (-100 elsewhere)."""
    tok = lm.tokenizer
    question = list(tok(rec.question + "\n")["input_ids"])
    steps = [list(tok(s + "\n", add_special_tokens=False)["input_ids"]) for s in rec.steps[removed:]]
    answer = list(tok("#### " + rec.answer, add_special_tokens=False)["input_ids"]) + [lm.eos_id]
    written = list(itertools.chain(*steps)) + answer
    hidden = question + [lm.start_id] + [lm.latent_id] * thoughts + [lm.end_id]
    return {"input_ids": hidden + written, "labels": [-100] * len(hidden) + written}


def dgrpo_sequence(lm, rec: Record, stage: int, cfg: Config) -> dict:
    """What ``sft_loss`` runs for ``rec`` at ``stage`` (:func:`_tokens`)."""
    return _tokens(lm, make_example(rec, stage, cfg, random.Random(0)))


@pytest.fixture(scope="module")
def lm(tokenizer):
    return make_lm(tokenizer)


def test_two_stages_spelled_out(lm):
    """Two sequences written out piece by piece: the 3-step chain at stage 2 (c = 2: 4 thoughts, its last step
    written) and the 1-step chain at stage 5, past max_latent_stage 3 (no step; 6 thoughts with pad_latent_to_max,
    2 without)."""
    tok, (S, L, E, eos) = lm.tokenizer, (lm.start_id, lm.latent_id, lm.end_id, lm.eos_id)

    def enc(text: str, special: bool = False) -> list[int]:
        return list(tok(text, add_special_tokens=special)["input_ids"])

    q = enc(PENCILS.question + "\n", special=True)
    written = enc("<<12/2=6>>\n") + enc("#### 6") + [eos]
    want = {"input_ids": q + [S, L, L, L, L, E] + written, "labels": [-100] * (len(q) + 6) + written}
    assert dgrpo_sequence(lm, PENCILS, 2, sft_config("c_thought=2", "max_latent_stage=3")) == want
    q = enc(EGGS.question + "\n", special=True)
    written = enc("#### 42") + [eos]
    for pad, thoughts in ((True, 6), (False, 2)):
        cfg = sft_config("c_thought=2", "max_latent_stage=3", f"pad_latent_to_max={pad}")
        hidden = q + [S] + [L] * thoughts + [E]
        want = {"input_ids": hidden + written, "labels": [-100] * len(hidden) + written}
        assert dgrpo_sequence(lm, EGGS, 5, cfg) == want


@pytest.mark.parametrize("mode", ["coconut", "pause"])
@pytest.mark.parametrize("c_thought", [1, 2, 3])
@pytest.mark.parametrize("pad", [True, False])
def test_each_stage_runs_and_supervises_coconuts_tokens(lm, mode, c_thought, pad):
    """Stages 0 to 5 with max_latent_stage 3 (stages 4 and 5 write no step) for chains of 1, 3 and 4 steps: the input
    tokens, <|latent|> where Coconut has its thoughts (pause: the same <|latent|> tokens as inputs), and the labels on
    the remaining steps, the answer and EOS only."""
    cfg = sft_config(f"mode={mode}", f"c_thought={c_thought}", "max_latent_stage=3", f"pad_latent_to_max={pad}")
    for rec, stage in itertools.product(RECORDS, range(6)):
        removed, thoughts = curriculum_rule(stage, len(rec.steps), c=c_thought, max_stage=3, pad=pad)
        assert dgrpo_sequence(lm, rec, stage, cfg) == expected_sequence(lm, rec, removed, thoughts), (rec.steps, stage)


@pytest.mark.parametrize(("mode", "removes_steps"), [("cot", False), ("no_cot", True)])
def test_baselines_are_coconuts_with_the_markers_kept(lm, mode, removes_steps):
    """cot trains every step and no_cot the answer alone, at every epoch, without thoughts, as Coconut's baselines do;
    dgrpo keeps <|start-latent|> <|end-latent|> between question and target (Coconut's baselines have no markers)."""
    cfg = sft_config(f"mode={mode}")
    for rec, epoch in itertools.product(RECORDS, range(cfg.sft.num_epochs)):
        stage = stage_of_epoch(epoch, cfg)
        assert stage == 0  # the baselines have no curriculum
        removed = len(rec.steps) if removes_steps else 0
        assert dgrpo_sequence(lm, rec, stage, cfg) == expected_sequence(lm, rec, removed, 0)


def test_stage_schedule_and_validation_thoughts():
    """Stage = epoch // epochs_per_stage (by hand for 3 epochs a stage, then swept); no_curriculum trains the last
    epoch's stage throughout. A stage's checkpoint answers with min(stage, max_latent_stage) * c thoughts (with
    pad_latent_to_max for every chain; without it, for a chain of at least max_latent_stage steps: Coconut then
    takes the gold chain's length into account, dgrpo does not)."""
    cfg = sft_config("epochs_per_stage=3", "num_epochs=10")
    assert [stage_of_epoch(e, cfg) for e in range(10)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    for eps in (1, 3, 5):
        cfg = sft_config(f"epochs_per_stage={eps}", "num_epochs=25")
        assert [stage_of_epoch(e, cfg) for e in range(25)] == [e // eps for e in range(25)]
        assert [curriculum_stage(e, [], eps) for e in range(25)] == [e // eps for e in range(25)]
    cfg = sft_config("mode=no_curriculum", "epochs_per_stage=3", "num_epochs=10")
    assert {stage_of_epoch(e, cfg) for e in range(10)} == {3}
    for pad in (True, False):
        cfg = sft_config("c_thought=2", "max_latent_stage=3", f"pad_latent_to_max={pad}")
        assert [stage_settings(k, cfg).n_latent for k in range(7)] == [0, 2, 4, 6, 6, 6, 6]
    for pad, c, max_stage, stage in itertools.product([True, False], [1, 2, 3], range(4), range(7)):
        cfg = sft_config(f"c_thought={c}", f"max_latent_stage={max_stage}", f"pad_latent_to_max={pad}")
        assert stage_settings(stage, cfg).n_latent == min(stage, max_stage) * c


def test_uniform_prob_mixes_stages_zero_to_the_chains_steps(lm):
    """uniform_prob = 1: each example is trained at a stage drawn uniformly from 0 .. its own number of steps (not
    max_latent_stage), each stage laid out as the curriculum lays it out: a 4-step chain with c = 2 and
    max_latent_stage 3 sees its five layouts about equally often, a 1-step chain its two."""
    cfg = sft_config("uniform_prob=1.0", "c_thought=2", "max_latent_stage=3")
    for rec, layouts in (
        (ROLLS, [(0, 0), (1, 2), (2, 4), (3, 6), (4, 6)]),
        (EGGS, [(0, 0), (1, 2)]),
    ):
        want = [expected_sequence(lm, rec, *layout)["input_ids"] for layout in layouts]
        rng, seen = random.Random(1), Counter[int]()
        for _ in range(100 * len(layouts)):
            tokens = _tokens(lm, make_example(rec, 0, cfg, rng))["input_ids"]
            assert tokens in want
            seen[want.index(tokens)] += 1
        assert sorted(seen) == list(range(len(layouts)))
        assert all(50 <= n <= 150 for n in seen.values()), seen


def test_paper_config_with_their_overrides_is_coconuts_gsm8k_run():
    """paper/sft_coconut.yaml with the overrides its comment gives for Hao et al.'s GSM8K run (--init from a CoT run,
    stage 0 skipped: sft.stage_epochs=[0], sft.num_epochs=22, sft.c_thought=2, sft.max_latent_stage=3): their run
    starts at epoch 3 and ends at 25 with 3 epochs a stage, so epoch e here is their epoch e + 3, stage (e + 3) // 3;
    stages 1-3 replace 1-3 steps by 2, 4, 6 thoughts, and from their epoch 12 on no step is written and every chain
    thinks 6 thoughts (pad_latent_to_max); the final checkpoint answers with 6; lr and weight decay are theirs."""
    overrides = ["stage_epochs=[0]", "num_epochs=22", "c_thought=2", "max_latent_stage=3"]
    cfg = sft_config(*overrides, file="paper/sft_coconut.yaml")
    assert (cfg.sft.lr, cfg.sft.weight_decay, cfg.sft.pad_latent_to_max) == (1e-4, 0.01, True)
    stages = [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 5, 5, 5, 6, 6, 6, 7, 7, 7, 8]  # their epochs 3 .. 24, by hand
    assert stages == [(e + 3) // 3 for e in range(22)]
    assert [stage_of_epoch(e, cfg) for e in range(cfg.sft.num_epochs)] == stages
    four_steps = [(1, 2)] * 3 + [(2, 4)] * 3 + [(3, 6)] * 3 + [(4, 6)] * 13
    one_step = [(1, 2)] * 3 + [(1, 4)] * 3 + [(1, 6)] * 3 + [(1, 6)] * 13
    assert [latent_layout(k, 4, cfg) for k in stages] == four_steps
    assert [latent_layout(k, 1, cfg) for k in stages] == one_step
    for k, n_steps in itertools.product(stages, range(1, 9)):
        assert latent_layout(k, n_steps, cfg) == curriculum_rule(k, n_steps, c=2, max_stage=3, pad=True)
    assert [stage_settings(k, cfg).n_latent for k in stages] == [2] * 3 + [4] * 3 + [6] * 16
    assert final_settings(cfg).n_latent == 6


def coconut_nll(model, input_ids: list[int], labels: list[int], latent_id: int):
    """Summed NLL of one example's labels as coconut.py's ``Coconut.forward`` computes it, written without its kv
    cache: each <|latent|> position's input is the last hidden state of the position before it (``hidden_states[-1]``
    of a forward over everything before it), every other position its token's embedding; then one forward over the
    whole sequence, logits shifted against the labels. Returns (NLL sum, supervised tokens)."""
    emb = model.get_input_embeddings()
    seq: list[torch.Tensor] = []
    for t in input_ids:
        if t == latent_id:
            out = model(inputs_embeds=torch.stack(seq)[None], output_hidden_states=True)
            seq.append(out.hidden_states[-1][0, -1])
        else:
            seq.append(emb(torch.tensor(t)))
    logits = model(inputs_embeds=torch.stack(seq)[None]).logits[0, :-1]
    shifted = torch.tensor(labels[1:])
    kept = shifted != -100
    nll = torch.nn.functional.cross_entropy(logits[kept], shifted[kept], reduction="sum")
    return nll, int(kept.sum())


def test_sft_loss_is_coconuts_loss_on_a_mixed_batch(tokenizer):
    """One batch of examples at different stages (uniform_prob = 1: 0 to 4 steps latent, several latent counts in
    one batch, ragged questions and targets): sft_loss normalised by the batch's target tokens is Coconut.forward's
    loss (the mean NLL over the batch's labels), on a GPT-2, for coconut's continuous thoughts."""
    lm = make_lm(tokenizer, arch="gpt2", seed=1)
    lm.model.eval()
    cfg = sft_config("uniform_prob=1.0", "c_thought=2", "max_latent_stage=3")
    rng = random.Random(3)
    examples = [make_example(rec, 0, cfg, rng) for rec in RECORDS * 3]
    assert len({ex.n_latent for ex in examples}) >= 3
    with torch.no_grad():
        total, n_tokens = sft_loss(lm, examples, cfg, normalizer=1.0)
        nll, count = 0.0, 0
        for ex in examples:
            seq = _tokens(lm, ex)
            part, n = coconut_nll(lm.model, seq["input_ids"], seq["labels"], lm.latent_id)
            nll, count = nll + part, count + n
    assert n_tokens == count
    torch.testing.assert_close(total / n_tokens, nll / count, rtol=1e-5, atol=1e-6)


def _tokens(lm, ex) -> dict:
    """What ``sft_loss`` runs for an SFTExample: the question (ending in <|start-latent|>), the latents,
    <|end-latent|>, the written target with EOS; and which of those tokens the loss supervises (labels, -100 else)."""
    q_ids, q_mask = lm.encode_questions([ex.question])
    t_ids, t_mask = lm.encode_targets([ex.target])
    question = [int(t) for t, m in zip(q_ids[0], q_mask[0]) if m]
    target = [int(t) for t, m in zip(t_ids[0], t_mask[0]) if m]
    tokens = question + [lm.latent_id] * ex.n_latent + [lm.end_id] + target
    return {"input_ids": tokens, "labels": [-100] * (len(tokens) - len(target)) + target}


def test_stages_past_max_latent_stage_are_one_layout_and_a_runs_last_epoch_ends_its_stage():
    """Every stage past max_latent_stage lays out as max_latent_stage + 1 (all steps latent: best/ compares their
    epochs as one layout, not stage max_latent_stage's, which still writes the last step); the run's last epoch ends
    its stage even when the stage has epochs left (3 epochs a stage, 4 epochs: stage 1 stops after one epoch, which
    still gets the stage's end: its validation and stage-1/ checkpoint)."""
    from dgrpo.training.curriculum import Curriculum, layout_stage

    cfg = sft_config("max_latent_stage=3")
    assert [layout_stage(k, cfg) for k in range(7)] == [0, 1, 2, 3, 4, 4, 4]
    plan = Curriculum(sft_config("epochs_per_stage=3", "num_epochs=4"), steps_per_epoch=10)
    assert [plan.last_of_stage(e) for e in range(4)] == [False, False, True, True]


def test_no_curriculum_mixes_stages_under_uniform_prob_too():
    """sft.uniform_prob applies to no_curriculum as to coconut and pause (its warning and help say so): an example
    of the final stage is laid out at a stage drawn from 0 to its steps (ROLLS, 4 steps, c = 2, max_latent_stage 3:
    0, 2, 4 or 6 thoughts), not always at the final stage's 6."""
    cfg = sft_config("mode=no_curriculum", "uniform_prob=1.0", "c_thought=2", "max_latent_stage=3")
    final = stage_of_epoch(cfg.sft.num_epochs - 1, cfg)
    rng = random.Random(0)
    assert {make_example(ROLLS, final, cfg, rng).n_latent for _ in range(100)} == {0, 2, 4, 6}


def test_pause_trains_and_answers_with_its_latent_tokens_as_inputs(tokenizer):
    """sft.mode=pause: its checkpoints answer in pause mode (no_curriculum in coconut's), and its loss feeds the
    <|latent|> tokens' own embeddings (a plain forward over the token sequence), not the previous hidden state as
    Coconut's thoughts do: sft_loss is the plain NLL of the labels, and differs from the coconut loss."""
    assert stage_settings(2, sft_config("mode=pause")).mode == "pause"
    assert stage_settings(2, sft_config("mode=no_curriculum")).mode == "coconut"
    lm = make_lm(tokenizer, arch="gpt2", seed=1)
    lm.model.eval()
    pause = sft_config("mode=pause", "c_thought=2", "max_latent_stage=3")
    examples = [make_example(rec, 2, pause, random.Random(0)) for rec in (PENCILS, ROLLS)]
    with torch.no_grad():
        total, n_tokens = sft_loss(lm, examples, pause, normalizer=1.0)
        plain = [coconut_nll(lm.model, **_tokens(lm, ex), latent_id=-1) for ex in examples]  # (no position replaced)
        coconut, _ = sft_loss(lm, examples, sft_config("c_thought=2", "max_latent_stage=3"), normalizer=1.0)
    assert n_tokens == sum(n for _, n in plain)
    torch.testing.assert_close(total, sum(nll for nll, _ in plain), rtol=1e-5, atol=1e-5)
    assert abs(float(total - coconut)) > 1e-3
