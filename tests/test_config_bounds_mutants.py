"""What a second pass of mutation testing over ``dgrpo.config`` found untested (tests/test_config_mutants.py holds the
first's): the paper's stated values in the defaults and the paper recipe, range bounds at their edges, the reading of
``--set`` and of files, and the independence of two configs' list defaults. Each test kills a mutant the other config
tests let live (named in its docstring); none loads a model or data."""

import pytest

from dgrpo.config import Config, ConfigError, load_config, matching_keys, parse_layer_spec

from conftest import config_refusal, default_config

# ---- the paper's values (Table 2 and Sec. 5.3 of ../shared/paper/dropout_grpo_paper.tex.txt)


def test_the_defaults_hold_the_papers_stated_values():
    """The defaults are Dropout-GRPO: p = 0.1, 16 prompts per step, peak lr 1e-5, clip 0.10 / 0.12, beta0 = 5e-3
    annealed with the lr, Huber delta 5, filter window [0.20, 0.95], reference renewed every 500 steps, the
    mean-only advantage, sequence-mean aggregation, the EMA ablation's alpha 0.95 (mutants: any of them changed; the
    docs table is generated from the code, so it would follow a changed default)."""
    cfg = Config()
    g, p = cfg.grpo, cfg.perturbation
    assert (p.kind, p.p) == ("locked", 0.1)
    assert (g.prompts_per_step, g.lr, g.eps_low, g.eps_high, g.beta0, g.anneal_beta) == (
        16,
        1e-5,
        0.10,
        0.12,
        5e-3,
        True,
    )
    assert (g.huber_delta, g.alpha_min, g.alpha_max, g.filter, g.ref_renewal_every) == (5.0, 0.20, 0.95, True, 500)
    assert (g.advantage, g.aggregation, g.ema_alpha, g.replay) == ("drgrpo", "seq_mean", 0.95, "seed")


def test_the_paper_recipe_holds_table_2():
    """``paper/grpo_dropout.yaml`` is Table 2 entry by entry (K = 32, 16 prompts, p = 0.1, lr 1e-5 with 200 warmup
    steps of 3000, beta0 5e-3, clip 0.10 / 0.12, window [0.20, 0.95], delta 5, renewal 500) with bf16 weights and the
    8-bit optimizer of Sec. 5.3; the ablations differ from it in their keys only (tests/test_config.py), so this pins
    them all (the end-to-end check of the recipe is a slow test)."""
    cfg = load_config(Config, "paper/grpo_dropout")
    g, p = cfg.grpo, cfg.perturbation
    assert (g.group_size, g.prompts_per_step, p.p, p.kind) == (32, 16, 0.1, "locked")
    assert (g.lr, g.warmup_steps, g.steps, g.beta0, g.anneal_beta) == (1e-5, 200, 3000, 5e-3, True)
    assert (g.eps_low, g.eps_high, g.alpha_min, g.alpha_max, g.huber_delta) == (0.10, 0.12, 0.20, 0.95, 5.0)
    assert (g.ref_renewal_every, g.advantage, g.aggregation, g.temperature) == (500, "drgrpo", "seq_mean", 0.0)
    assert (cfg.model.dtype, g.optimizer) == ("bfloat16", "adamw8bit")


def test_two_configs_do_not_share_a_list_default():
    """A list default is each config's own: appending to one config's test sets or sites leaves a new config's
    defaults as they were (mutant: the default list object shared between instances)."""
    first = Config()
    first.data.test.append("gsm8k")
    first.perturbation.sites.append("attn")
    second = Config()
    assert second.data.test == ["builtin:test", "builtin:ood_steps", "builtin:ood_numbers"]
    assert second.perturbation.sites == ["mlp"]


# ---- range bounds at their edges


def test_a_learning_rate_of_one_is_the_largest_taken():
    """``lr`` lies in (0, 1]: 1 is taken in both sections, 1.5 refused (mutant: ``(0, 1)``)."""
    cfg = default_config("grpo.lr=1", "sft.lr=1", "sft.weight_decay=0")
    assert (cfg.grpo.lr, cfg.sft.lr) == (1.0, 1.0)
    assert "must be in (0, 1], got 1.5" in config_refusal("grpo.lr", "grpo.lr=1.5")


@pytest.mark.parametrize("betas", ["[0.9, 0.99, 0.5]", "[0.9]", "[false, 0.999]"])
def test_adam_betas_are_two_numbers_not_booleans(betas):
    """``adam_betas`` is (beta1, beta2): three numbers, one, or a YAML boolean (false == 0 to Python) are refused
    (mutants: ``len >= 2``, a boolean taken as the number 0)."""
    for section in ("grpo", "sft"):
        assert "expected two numbers in [0, 1)" in config_refusal(
            f"{section}.adam_betas", f"{section}.adam_betas={betas}"
        )


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.lora.r=-1", "model.lora.r"),
        ("sft.max_latent_stage=-1", "sft.max_latent_stage"),
        ("eval.n_latent=-2", "eval.n_latent"),
        ("grpo.n_latent=-2", "grpo.n_latent"),
        ("eval.batch_size=0", "eval.batch_size"),
        ("eval.max_new_tokens=0", "eval.max_new_tokens"),
        ("grpo.steps=0", "grpo.steps"),
        ("grpo.max_skip_streak=-1", "grpo.max_skip_streak"),
    ],
)
def test_a_count_below_its_floor_is_refused(override, key):
    """Each count has a floor: LoRA rank and the last latent stage >= 0, the latent count >= -1 (-1: the
    checkpoint's), eval's batch and answer length >= 1, at least one GRPO step, a stop streak >= 0 (mutants: each
    floor lowered or its check dropped)."""
    assert "must be >= " in config_refusal(key, override)


def test_the_floors_themselves_are_taken():
    """The floors' own values are valid: no adapters, the first stage as the last latent one, the checkpoint's latent
    count, no question cut, one GRPO step, never stopping on filtered steps (mutants: floors raised by one)."""
    cfg = default_config(
        "model.lora.r=0",
        "sft.max_latent_stage=0",
        "eval.n_latent=-1",
        "data.max_question_tokens=0",
        "grpo.steps=1",
        "grpo.warmup_steps=0",
        "grpo.max_skip_streak=0",
    )
    assert (cfg.sft.max_latent_stage, cfg.data.max_question_tokens, cfg.grpo.steps) == (0, 0, 1)


def test_a_huber_threshold_of_exactly_the_maximum_is_taken():
    """``grpo.huber_delta`` may be MAX_HUBER_DELTA (50: the plain k3), not above (mutant: ``< MAX_HUBER_DELTA``)."""
    assert default_config("grpo.huber_delta=50").grpo.huber_delta == 50.0
    assert "at most 50" in config_refusal("grpo.huber_delta", "grpo.huber_delta=50.5")


def test_a_built_in_model_of_exactly_the_parameter_cap_is_taken():
    """One layer of hidden size 500 and MLP width 666,000 holds 4 x 500^2 + 3 x 500 x 666,000 = 1,000,000,000
    parameters, the cap itself: taken; one more unit of MLP width is refused (mutants: ``< cap``, the MLP counted
    twice, not three times, per unit of width)."""
    shape = ("model.num_layers=1", "model.hidden_size=500", "model.num_heads=2")
    assert default_config(*shape, "model.intermediate_size=666000").model.intermediate_size == 666000
    assert "over the 1,000,000,000" in config_refusal(
        "model.hidden_size, num_layers, intermediate_size", *shape, "model.intermediate_size=666001"
    )


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_rotary_architectures_need_an_even_head_size(arch):
    """Qwen2 and Llama rotate pairs of a head's dimensions: hidden 12 over 4 heads (size 3) is refused for both, taken
    for GPT-2 (mutant: only qwen2 checked)."""
    head3 = ("model.hidden_size=12", "model.num_heads=4")
    assert "heads need an even size" in config_refusal("model.hidden_size", f"model.arch={arch}", *head3)
    assert default_config("model.arch=gpt2", *head3).model.hidden_size == 12


def test_the_validation_split_counts_towards_the_operations_bound():
    """2,000,000 validation problems of 6 operations are 12,000,000 operations, over the 10,000,000 bound, though the
    training split's are not (mutant: only n_train counted)."""
    assert "asks for 12,000,000" in config_refusal("task.n_steps", "task.n_valid=2000000", "task.n_steps=6")


def test_a_task_of_seven_steps_with_too_few_problems_is_refused():
    """modulus 2, operands up to 1 (5 operations), 7 steps: 2 x 5^7 = 156,250 distinct problems, fewer than the
    203,000 asked (mutant: the count skipped from 7 steps on, as it is past 64)."""
    message = config_refusal(
        "task.n_train", "task.modulus=2", "task.max_operand=1", "task.n_steps=7", "task.n_train=200000"
    )
    assert "more than the 156,250 there are" in message


@pytest.mark.parametrize("override", ["data.test=[builtin:test, '']", "data.test=[builtin:test, '  ']"])
def test_an_empty_test_set_name_is_refused(override):
    """Every test set is a dataset name: an empty or blank item is refused (mutant: any text taken)."""
    assert "expected a list of dataset names" in config_refusal("data.test", override)


def test_an_empty_lora_module_name_is_refused():
    """``model.lora.target_modules`` names modules: an empty name is refused (mutant: any text taken)."""
    assert "expected module names" in config_refusal(
        "model.lora.target_modules", "model.lora.target_modules=[q_proj, '']"
    )


def test_an_unknown_perturbation_site_is_refused():
    """``perturbation.sites`` takes attn, mlp, residual only: a misspelt site is refused, not silently unperturbed
    (mutant: any name taken)."""
    assert "expected a non-empty list of attn, mlp, residual" in config_refusal(
        "perturbation.sites", "perturbation.sites=[mpl]"
    )


def test_kept_layers_refuse_a_negative_count_even_with_layer_recomputation():
    """``recompute_kept_layers=-1`` is refused where layers are recomputed per layer (mutant: the >= 0 check
    dropped, only the granularity checked)."""
    recompute = ("sft.recompute=true", "sft.recompute_granularity=layer")
    assert "must be >= 0, got -1" in config_refusal(
        "sft.recompute_kept_layers", *recompute, "sft.recompute_kept_layers=-1"
    )


def test_the_reward_null_control_needs_a_group_advantage():
    """``grpo.shuffle_rewards`` permutes within groups: with advantage=ema it is refused even at K = 2 (mutant: only
    the group size checked), and ema's K must still be >= 1 (mutant: its floor lowered to 0)."""
    message = config_refusal(
        "grpo.shuffle_rewards", "grpo.shuffle_rewards=true", "grpo.advantage=ema", "grpo.group_size=2"
    )
    assert "a group advantage" in message
    assert "must be >= 1, got 0" in config_refusal("grpo.group_size", "grpo.advantage=ema", "grpo.group_size=0")


def test_the_filter_window_check_on_a_reward_total_is_skipped_under_ema():
    """Under advantage=ema the group filter is not applied, so a total of built-in scorers reaching 2 is taken there
    (mutant: checked under ema too, refusing a valid REINFORCE run); with a group advantage it is refused."""
    rewards = "grpo.rewards=[{fn: numeric}, {fn: exact}]"
    assert len(default_config(rewards, "grpo.advantage=ema", "grpo.group_size=1").grpo.rewards) == 2
    config_refusal("grpo.filter", rewards)


def test_the_cold_temperature_warning_starts_below_0_05():
    """A temperature of 0.02 is said to carry almost no gradient; 0.05 and greedy 0 are not (mutant: the threshold
    moved)."""
    said = [line for line in default_config("grpo.temperature=0.02").inert_settings() if "grpo.temperature=" in line]
    assert len(said) == 1 and "nearly one-hot" in said[0]
    for t in ("0.05", "0"):
        assert not [
            line for line in default_config(f"grpo.temperature={t}").inert_settings() if "grpo.temperature=" in line
        ]


# ---- reading --set, Python values and files


def test_set_strips_the_spaces_around_key_and_value():
    """``--set 'grpo.steps = 7'`` and ``'logging.run_name= trial'`` set the option, its value without the spaces
    (mutants: the key or the value kept unstripped)."""
    cfg = default_config("grpo.steps = 7", "logging.run_name= trial")
    assert (cfg.grpo.steps, cfg.logging.run_name) == (7, "trial")


def test_set_with_an_empty_value_empties_a_list():
    """``--set data.test=`` is no test set, as ``data.test=[]`` (mutant: the empty value read as YAML's null,
    refused as no list)."""
    assert default_config("data.test=").data.test == []


def test_a_text_option_given_a_quote_it_does_not_close_keeps_the_text_as_typed():
    """``logging.run_name='a' #2`` starts with a quote that does not end it: the text as typed, quote and all (mutant:
    any leading quote read as YAML, which gives 'a', the rest a comment)."""
    assert default_config("logging.run_name='a' #2").logging.run_name == "'a' #2"


def test_several_files_apply_in_the_order_given(tmp_path):
    """``load_config(Config, [a, b])`` applies a, then b: b's value wins (mutant: the files applied in reverse)."""
    (tmp_path / "a.yaml").write_text("grpo:\n  steps: 3\n  lr: 2.0e-5\n")
    (tmp_path / "b.yaml").write_text("grpo:\n  steps: 5\n")
    cfg = load_config(Config, [tmp_path / "a.yaml", tmp_path / "b.yaml"])
    assert (cfg.grpo.steps, cfg.grpo.lr) == (5, 2e-5)


def test_an_int_with_a_leading_zero_and_underscore_is_base_ten_in_a_file(tmp_path):
    """``seed: 0_10`` is ten, as ``010`` is (YAML 1.1 would read the octal 8) (mutant: the underscore left to
    YAML's octal)."""
    (tmp_path / "c.yaml").write_text("seed: 0_10\n")
    assert load_config(Config, tmp_path / "c.yaml").seed == 10


def test_the_smallest_int64_is_taken_and_one_below_refused():
    """An int option holds int64 from -2^63 (mutant: ``-2^63 < n``)."""
    assert default_config(f"seed={-(2**63)}").seed == -(2**63)
    assert "must fit in a signed 64-bit integer" in config_refusal("seed", f"seed={-(2**63) - 1}")


@pytest.mark.parametrize("text", ["null", "y", "maybe"])
def test_a_boolean_set_in_python_refuses_other_words(text):
    """In Python a boolean option reads true / false / yes / no / on / off / 1 / 0 as text, nothing else: 'null' is
    not False (mutant: more words taken)."""
    cfg = Config()
    cfg.grpo.filter = text
    with pytest.raises(ConfigError, match=r"^invalid config value grpo.filter: expected true or false"):
        cfg.validate()


def test_a_layer_spec_is_read_without_its_surrounding_spaces():
    """``perturbation.layers`` written with spaces around it (a quoted YAML value) means the same layers (mutant:
    the spaces kept, the spec refused)."""
    assert parse_layer_spec(" 0:2 ") == ("slice", (0, 2))
    assert parse_layer_spec(" all ") == ("all", None)


def test_a_partial_section_name_names_no_option():
    """``dgrpo config show gr`` names nothing: a section or a top-level option is named whole (mutant: any start of
    a key taken)."""
    assert matching_keys(Config, "gr") == []
    assert matching_keys(Config, "seed") == ["seed"]


@pytest.mark.parametrize(
    ("over", "words"),
    [("grpo.engine=eager", "grpo.engine=eager"), ("model.compile=true", "model.compile=true"), ("fsdp=full", "FSDP")],
)
def test_the_latent_chain_forced_on_is_refused_when_the_config_loads(over, words):
    """``grpo.update_latent_graphs=true`` beside the eager engine, the compiled layers or FSDP is refused as the
    config loads, naming the obstacle (before any model is loaded); ``auto`` turns itself off there and is taken
    (mutants: each obstacle dropped from :meth:`Config.latent_chain_obstacle`)."""
    assert words in config_refusal("grpo.update_latent_graphs", "grpo.update_latent_graphs=true", over)
    assert default_config("grpo.update_latent_graphs=auto", over).grpo.update_latent_graphs == "auto"


def test_lora_is_refused_with_sharded_fsdp_too():
    """LoRA trains with plain data parallelism only: ``fsdp=sharded`` is refused as ``full`` is (mutant: only full
    refused)."""
    assert "set fsdp=none" in config_refusal("model.lora.r", "model.lora.r=8", "fsdp=sharded")


def test_perturb_answer_false_under_a_zero_rate_is_said_to_change_nothing():
    """``perturbation.p=0`` perturbs nothing, so ``perturb_answer=false`` beside it is said to change nothing, as
    under kind=none (mutant: only kind=none said)."""
    lines = default_config("perturbation.p=0", "perturbation.perturb_answer=false").inert_settings()
    assert any(line.startswith("perturbation.perturb_answer=false changes nothing") for line in lines)


def test_a_blank_base_is_refused_as_naming_no_file(tmp_path):
    """``base: '  '`` names no config file: refused as such (mutant: looked up as a file named by spaces)."""
    (tmp_path / "c.yaml").write_text("base: '  '\nseed: 1\n")
    with pytest.raises(ConfigError, match="base must name a config file, got '  '"):
        load_config(Config, tmp_path / "c.yaml")


def test_the_mps_device_is_taken():
    """``device=mps`` (Apple GPUs) is one of the documented devices (mutant: mps left out of the pattern)."""
    assert default_config("device=mps").device == "mps"


def test_a_reward_name_must_be_text():
    """A ``grpo.rewards`` item's name names its metric: a number is refused, not made the text '3' (mutant: the
    check dropped)."""
    assert "name must be text" in config_refusal("grpo.rewards", "grpo.rewards=[{fn: numeric, name: 3}]")


def test_a_reward_item_without_a_function_is_refused():
    """A ``grpo.rewards`` item needs ``fn``: one with a name only is refused in one line, not a KeyError where the
    filter's range is checked (mutant: the check dropped)."""
    assert "needs fn: module:function" in config_refusal("grpo.rewards", "grpo.rewards=[{name: r, weight: 1}]")
