"""What mutation testing of ``dgrpo.config`` found untested: each test kills a mutant of the validation, coercion or
override code that the other config tests let live (the mutant named in its docstring). Each one loads a config
from the defaults and ``--set`` overrides (no model, no data: fast)."""

import pytest

from dgrpo.config import Config, ConfigError, TaskConfig, load_config

from conftest import config_refusal, default_config


def test_lr_times_weight_decay_of_exactly_one_is_refused():
    """lr x weight_decay = 1 zeroes every weight at AdamW's first step: refused; just below 1 is taken (mutant:
    ``lr * weight_decay <= 1``)."""
    assert "lr x weight_decay must be below 1" in config_refusal(
        "grpo.weight_decay", "grpo.lr=0.5", "grpo.weight_decay=2"
    )
    assert default_config("grpo.lr=0.5", "grpo.weight_decay=1.5").grpo.weight_decay == 1.5


def test_an_adam_beta_of_one_is_refused():
    """A beta of 1 keeps Adam's moment at its start for ever: [0, 1) (mutant: ``0 <= b <= 1``)."""
    assert "in [0, 1)" in config_refusal("grpo.adam_betas", "grpo.adam_betas=[0.9,1.0]")
    assert default_config("grpo.adam_betas=[0,0.999]").grpo.adam_betas == [0.0, 0.999]


def test_a_lora_dropout_outside_zero_one_is_refused():
    """``model.lora.dropout`` lies in [0, 1): 1 and -0.1 are refused (mutant: the bound dropped)."""
    config_refusal("model.lora.dropout", "model.lora.dropout=1")
    config_refusal("model.lora.dropout", "model.lora.dropout=-0.1")


def test_ood_max_operand_starts_at_ten():
    """The ood_numbers split draws operands from 10..ood_max_operand: 9 draws from nothing and is refused, 10 is
    taken (mutant: ``>= 9``)."""
    assert "must be >= 10, got 9" in config_refusal("task.ood_max_operand", "task.ood_max_operand=9", "task.n_test=10")
    assert default_config("task.ood_max_operand=10", "task.n_test=10").task.ood_max_operand == 10


def test_a_split_of_exactly_max_problems_is_taken():
    """A split may hold :attr:`TaskConfig.MAX_PROBLEMS` problems, not one more (mutant: ``< MAX_PROBLEMS``). Five
    steps, so that there are that many distinct problems, and 10,000,000 operations, the other bound, exactly
    (mutant: ``< MAX_OPERATIONS``)."""
    top = TaskConfig.MAX_PROBLEMS
    assert default_config(f"task.n_train={top}", "task.n_steps=5").task.n_train == top
    assert "at most 2,000,000 problems per split" in config_refusal(
        "task.n_train", f"task.n_train={top + 1}", "task.n_steps=4"
    )


def test_question_key_and_answer_key_go_together():
    """A column mapping needs both keys: one alone is refused, naming the missing one (mutant: the check dropped)."""
    assert "go together" in config_refusal("data.answer_key", "data.question_key=q")
    assert "go together" in config_refusal("data.question_key", "data.answer_key=a")
    assert default_config("data.question_key=q", "data.answer_key=a").data.answer_key == "a"


def test_a_uniform_prob_of_one_is_taken():
    """``sft.uniform_prob`` is a probability, [0, 1] with 1 included (every sample's stage drawn uniformly), above
    is refused (mutant: ``[0, 1)``)."""
    assert default_config("sft.uniform_prob=1").sft.uniform_prob == 1.0
    config_refusal("sft.uniform_prob", "sft.uniform_prob=1.01")


def test_a_stage_of_zero_epochs_is_taken():
    """``sft.stage_epochs`` item 0 skips the stage, as documented; -1 is refused (mutant: items ``> 0``)."""
    assert default_config("sft.stage_epochs=[1,0,2]").sft.stage_epochs == [1, 0, 2]
    config_refusal("sft.stage_epochs", "sft.stage_epochs=[1,-1]")


def test_an_empty_list_of_sites_is_refused():
    """``perturbation.sites=[]`` would perturb nothing while the run says it drops out: refused (mutant: the
    non-empty check dropped)."""
    assert "expected a non-empty list" in config_refusal("perturbation.sites", "perturbation.sites=[]")


def test_a_clip_below_of_zero_is_taken():
    """``grpo.eps_low`` and ``grpo.ema_alpha`` lie in [0, 1): 0 is taken (eps_low 0: the ratio's lower bound is 1),
    1 refused (mutant: ``(0, 1)``)."""
    cfg = default_config("grpo.eps_low=0", "grpo.ema_alpha=0")
    assert (cfg.grpo.eps_low, cfg.grpo.ema_alpha) == (0.0, 0.0)
    config_refusal("grpo.ema_alpha", "grpo.ema_alpha=1")


def test_a_negative_kl_coefficient_is_refused():
    """``grpo.beta0`` >= 0: 0 disables the KL term, a negative one would reward drifting from the reference
    (mutant: beta0 left out of the >= 0 check)."""
    assert "must be >= 0, got -0.001" in config_refusal("grpo.beta0", "grpo.beta0=-0.001")
    assert default_config("grpo.beta0=0").grpo.beta0 == 0.0


def test_a_filter_window_of_one_point_is_taken():
    """``grpo.alpha_min`` = ``grpo.alpha_max`` keeps the groups of exactly that accuracy (a window of one point);
    alpha_min above alpha_max is refused (mutant: ``alpha_min < alpha_max``)."""
    cfg = default_config("grpo.alpha_min=0.5", "grpo.alpha_max=0.5")
    assert cfg.grpo.alpha_min == cfg.grpo.alpha_max == 0.5
    assert "alpha_min (0.6) > alpha_max (0.5)" in config_refusal(
        "grpo.alpha_min", "grpo.alpha_min=0.6", "grpo.alpha_max=0.5"
    )


@pytest.mark.parametrize(
    ("key", "overrides", "words"),
    [
        ("grpo.engine", ("grpo.engine=fast", "perturbation.kind=native"), "set grpo.engine=eager"),
        ("model.master_weights", ("model.master_weights=true", "grpo.optimizer=adamw8bit"), "set grpo.optimizer=adamw"),
        ("model.lora.r", ("model.lora.r=8", "fsdp=full"), "set fsdp=none"),
    ],
)
def test_settings_that_exclude_each_other_are_refused(key, overrides, words):
    """Each pair of settings that cannot run together is refused, naming the way out; either one alone is taken
    (mutants: each exclusion dropped)."""
    assert words in config_refusal(key, *overrides)
    for one in overrides:
        default_config(one)


def test_a_boolean_given_as_text_in_python_reads_as_written():
    """A boolean option set in Python to the text 'false' / 'no' / 'off' / '0' reads False at validation, 'True' /
    'yes' / 'on' True, as a file's or ``--set``'s would (mutants: 'false' or 'no' read as True, the text read
    case-sensitively; 'on' / 'off' refused, as they were)."""
    words = (("false", False), ("no", False), ("0", False), ("True", True), ("yes", True), ("FALSE", False))
    for text, value in words + (("on", True), ("Off", False)):
        cfg = Config()
        cfg.grpo.filter = text
        assert cfg.validate().grpo.filter is value, text
    cfg = load_config(Config, start={"perturbation": {"perturb_prompt": "No"}})
    assert cfg.perturbation.perturb_prompt is False


def test_a_boolean_option_refuses_numbers_other_than_zero_and_one():
    """``grpo.filter=2`` is no boolean: refused; 1 and 0 are true and false (mutant: 2 taken as True)."""
    assert "expected true or false, got 2" in config_refusal("grpo.filter", "grpo.filter=2")
    assert default_config("grpo.filter=0").grpo.filter is False
    assert default_config("grpo.filter=1").grpo.filter is True


def test_a_number_option_refuses_a_python_boolean():
    """``grpo.beta0 = True`` set in Python is no number (float(True) is 1.0): refused (mutant: a bool read as a
    float)."""
    cfg = Config()
    cfg.grpo.beta0 = True
    with pytest.raises(ConfigError, match=r"^invalid config value grpo.beta0: expected a number, got True$"):
        cfg.validate()


def test_comma_text_skips_empty_items():
    """``attn,,mlp`` and ``mlp,`` spell the lists [attn, mlp] and [mlp]: an empty item between commas is no item
    (mutant: empty items kept, an empty site name refused)."""
    assert default_config("perturbation.sites=attn,,mlp").perturbation.sites == ["attn", "mlp"]
    assert default_config("perturbation.sites=mlp,").perturbation.sites == ["mlp"]


def test_a_text_option_takes_the_text_as_typed():
    """``logging.run_name=trial #2`` is the name as typed: YAML would read ``#2`` as a comment and ``- a`` as a
    list (mutant: a text option's value read as YAML)."""
    assert default_config("logging.run_name=trial #2").logging.run_name == "trial #2"
    assert default_config("logging.run_name=- a").logging.run_name == "- a"


def test_a_steps_column_needs_the_question_and_answer_columns():
    """``data.steps_key`` maps a column beside question_key and answer_key: alone it is refused (mutant: the check
    dropped)."""
    assert "set them too" in config_refusal("data.steps_key", "data.steps_key=steps")
    assert default_config("data.question_key=q", "data.answer_key=a", "data.steps_key=s").data.steps_key == "s"


@pytest.mark.parametrize("override", ["model.lora.alpha=0", "grpo.huber_delta=0", "grpo.huber_delta=-1"])
def test_a_scale_of_zero_or_below_is_refused(override):
    """``model.lora.alpha`` (the adapters' scale) and ``grpo.huber_delta`` (the KL's Huber threshold) must be > 0
    (mutants: each > 0 check dropped)."""
    key = override.split("=")[0]
    assert "must be > 0" in config_refusal(key, override)


@pytest.mark.parametrize("item", ["-1", "+2", "1.5e-3"])
def test_comma_text_reads_signed_and_exponent_numbers_as_brackets_do(item):
    """In comma text a signed number or a decimal with an exponent is a number, as in brackets: a test-set list
    holding one is refused either way, with the same list in the message (mutants: the sign or the exponent read as
    text, a dataset named ``-1`` taken)."""
    with_commas = config_refusal("data.test", f"data.test=a,{item}")
    assert with_commas == config_refusal("data.test", f"data.test=[a,{item}]")


def test_kept_layers_need_recomputation_at_layer_granularity():
    """``grpo.recompute_kept_layers`` keeps layers out of per-layer recomputation: with granularity call it means
    nothing and is refused (mutant: recompute=true alone taken)."""
    message = config_refusal(
        "grpo.recompute_kept_layers",
        "grpo.recompute=true",
        "grpo.recompute_granularity=call",
        "grpo.recompute_kept_layers=1",
    )
    assert "recompute_granularity=layer" in message
    cfg = default_config("grpo.recompute=true", "grpo.recompute_granularity=layer", "grpo.recompute_kept_layers=1")
    assert cfg.grpo.recompute_kept_layers == 1


def test_the_longer_ood_split_counts_towards_the_operations_bound():
    """The ood_steps split's problems have n_steps + ood_extra_steps operations: 2,000,000 of 4 + 2 is 12,000,000,
    over the bound, though 2,000,000 x 4 is not (mutant: the ood split counted at n_steps)."""
    message = config_refusal("task.n_steps", "task.n_test=2000000", "task.n_steps=4", "task.ood_extra_steps=2")
    assert "asks for 12,000,000" in message


def test_as_many_problems_as_there_are_is_taken():
    """modulus 2, operands up to 1 (5 operations), 1 step: 10 distinct problems; 8 + 1 + 1 are taken, 9 + 1 + 1
    refused (mutant: ``asked < count``)."""
    task = ("task.modulus=2", "task.max_operand=1", "task.n_steps=1", "task.n_valid=1", "task.n_test=1")
    assert default_config(*task, "task.n_train=8").task.n_train == 8
    assert "more than the 10 there are" in config_refusal("task.n_train", *task, "task.n_train=9")


def test_an_unknown_logging_backend_is_refused():
    """``logging.backends`` names jsonl, tensorboard or wandb only (mutant: the check dropped)."""
    assert "unknown backend(s) mlflow" in config_refusal("logging.backends", "logging.backends=[jsonl,mlflow]")


def test_an_empty_training_set_name_is_refused():
    """``data.train`` must name a dataset (mutant: the empty name taken)."""
    assert "must name a dataset" in config_refusal("data.train", "data.train=")


def test_only_the_plugin_choice_takes_a_class_spec():
    """``perturbation.kind`` takes a plug-in ``package.module:Class``; another choice option refuses one, naming
    its choices (mutant: every choice option taking a plug-in spec)."""
    assert default_config("perturbation.kind=my.noise:Kind").perturbation.kind == "my.noise:Kind"
    assert "expected adamw or adamw8bit; got 'my.optim:Opt'" in config_refusal(
        "grpo.optimizer", "grpo.optimizer=my.optim:Opt"
    )
