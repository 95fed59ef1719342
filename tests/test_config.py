"""The typed configuration: choices, finite numbers, int64 range, one key per message, the layer grammar,
``base:`` chains, packaged configs and the generated option docs (no subprocess, fast)."""

import dataclasses
import re
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dgrpo.config import (
    CONFIG_DIR,
    Config,
    ConfigError,
    ConfigLoader,
    config_markdown,
    describe,
    load_config,
    merge_file,
    packaged_configs,
    parse_layer_spec,
    resolve_config_path,
    to_dict,
    unused_sft_settings,
)

ROOT = Path(__file__).resolve().parents[1]


def options_of(tp_filter) -> list[tuple[str, typing.Any]]:
    """(dotted key, type) of every option whose type passes ``tp_filter``."""
    out = []
    for section in [None, *(f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(f.default_factory))]:
        cls = Config if section is None else type(getattr(Config(), section))
        for name, tp in typing.get_type_hints(cls).items():
            if not dataclasses.is_dataclass(tp) and tp_filter(tp):
                out.append((name if section is None else f"{section}.{name}", tp))
    return out


LITERALS = options_of(lambda tp: typing.get_origin(tp) is typing.Literal)
FLOATS = [k for k, _ in options_of(lambda tp: tp is float)]
INTS = [k for k, _ in options_of(lambda tp: tp is int)]


def error(*overrides: str) -> str:
    """The one-line message ``load_config`` raises for these overrides."""
    with pytest.raises(ConfigError) as e:
        load_config(Config, None, list(overrides))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def flat(d: dict, prefix: str = "") -> dict:
    out: dict = {}
    for k, v in d.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def diff(a: Config, b: Config) -> dict:
    """{key: value in b} for every option whose value differs."""
    fa, fb = flat(to_dict(a)), flat(to_dict(b))
    return {k: fb[k] for k in fa if fa[k] != fb[k]}


# ---- types


def test_the_option_lists_are_found():
    keys = {"perturbation.kind", "sft.mode", "grpo.advantage", "grpo.engine", "fsdp", "model.arch", "model.kernels"}
    keys |= {"grpo.recompute_granularity", "sft.recompute_granularity", "model.compile_backend", "model.compile_mode"}
    keys |= {"grpo.best_metric", "sft.best_metric"}
    assert keys | {
        "sft.bf16",
        "grpo.update_latent_graphs",
        "model.compile_head",
        "sft.reset_every",
        "sft.lr_schedule",
        "model.latent_token_init",
    } <= {k for k, _ in LITERALS}
    assert len(LITERALS) == 27  # (with grpo.best_metric and sft.best_metric)
    assert {"grpo.lr", "sft.lr", "perturbation.p", "eval.top_p"} <= set(FLOATS)
    assert {"seed", "task.seed", "grpo.steps"} <= set(INTS)


@pytest.mark.parametrize("key,tp", LITERALS, ids=[k for k, _ in LITERALS])
def test_choice_options_reject_other_words_naming_key_and_choices(key, tp):
    msg = error(f"{key}=bogus")
    assert msg.startswith(f"invalid config value {key}: expected ")
    assert all(c in msg for c in typing.get_args(tp)) and "'bogus'" in msg
    for choice in typing.get_args(tp):  # and accept each of their choices
        assert flat(to_dict(load_config(Config, None, [f"{key}={choice}"])))[key] == choice


def test_choice_message_format():
    assert error("perturbation.kind=x") == (
        "invalid config value perturbation.kind: expected locked, native, gaussian or none, or a kind of your own as "
        "its class, path/to/file.py:Class or package.module:Class; got 'x'"
    )
    assert "expected none, full or sharded" in error("fsdp=maybe")  # (off: none, as DGRPO_FSDP reads it)


def test_plugin_kind_accepts_a_path_with_a_drive_colon():
    """A Windows path has a colon of its own: the spec's name is after the last one, as the importer reads it."""
    spec = r"C:\plugins\kind.py:MyKind"
    assert load_config(Config, None, [f"perturbation.kind={spec}"]).perturbation.kind == spec
    assert "got 'C:\\\\plugins\\\\kind.py:'" in error(r"perturbation.kind=C:\plugins\kind.py:")


def test_yaml_booleans_still_accepted_by_bf16():
    assert load_config(Config, None, ["sft.bf16=true"]).sft.bf16 == "true"
    assert load_config(Config, None, ["sft.bf16=off"]).sft.bf16 == "false"
    assert load_config(Config, None, ["sft.bf16=auto"]).sft.bf16 == "auto"


@pytest.mark.parametrize("key", FLOATS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", ".inf", ".nan", "1e999"])
def test_every_float_rejects_nan_and_inf(key, value):
    msg = error(f"{key}={value}")
    assert msg.startswith(f"invalid config value {key}: must be a finite number, got ")


@pytest.mark.parametrize("key", INTS)
def test_every_int_must_fit_int64(key):
    assert error(f"{key}=1e30") == f"invalid config value {key}: must fit in a signed 64-bit integer, got 1e30"
    assert f"invalid config value {key}:" in error(f"{key}={2**63}")
    assert f"invalid config value {key}: expected an integer" in error(f"{key}=inf")


def test_ints_accept_integral_numbers_and_text():
    assert load_config(Config, None, ["seed=1e3"]).seed == 1000
    assert load_config(Config, None, [f"seed={2**63 - 1}"]).seed == 2**63 - 1
    assert "expected an integer" in error("seed=1.5")


# ---- ranges: each message names the key that is wrong


@pytest.mark.parametrize(
    "override",
    [
        "eval.shots=-1",
        "eval.limit=-1",
        "eval.top_p=0",
        "eval.temperature=-1",
        "sft.max_grad_norm=-1",
        "sft.max_grad_norm=nan",
        "sft.warmup_steps=-1",
        "sft.save_every=-1",
        "sft.keep_last=0",
        "sft.max_nonfinite=0",
        "sft.batch_size=0",
        "sft.grad_accum=0",
        "sft.weight_decay=-1",
        "sft.lr=0",
        "sft.uniform_prob=1.5",
        "grpo.mini_epochs=0",
        "grpo.micro_batch_size=0",
        "grpo.rollout_batch_size=0",
        "grpo.temperature=-1",
        "grpo.top_p=0",
        "grpo.top_p=1.5",
        "grpo.eval_every=-1",
        "grpo.log_every=0",
        "grpo.eps_low=1",
        "grpo.eps_high=-0.1",
        "grpo.alpha_min=-0.1",
        "grpo.alpha_max=1.5",
        "grpo.weight_decay=-1",
        "grpo.min_lr_ratio=2",
        "grpo.warmup_steps=-1",
        "grpo.lr=0",
        "grpo.max_grad_norm=-1",
        "grpo.save_every=-1",
        "grpo.keep_last=0",
        "grpo.max_nonfinite=0",
        "data.max_question_tokens=-1",
        "data.max_target_tokens=0",
        "data.eval_limit=-1",
        "model.num_heads=0",
        "task.modulus=1",
        "task.n_steps=100000",  # (drew problems for an hour before they were found too long for the model)
        "perturbation.p=1",
        "perturbation.sigma=-1",
        "threads=-1",
        "sft.stage_epochs=[1,-1]",
        "sft.stage_epochs=[1.5]",
        "sft.lr=2",
        "grpo.lr=1e38",  # (Adam's float32 step size overflowed at the first step: a traceback)
        "model.hidden_size=12",  # (qwen2, 4 heads of 3 dimensions: the rotary embedding failed in the first forward)
    ],
)
def test_each_range_message_names_its_key(override):
    key = override.split("=")[0]
    assert error(override).startswith(f"invalid config value {key}: ")


def test_relations_between_options():
    assert "grpo.alpha_min" in error("grpo.alpha_min=0.9", "grpo.alpha_max=0.5")
    assert "K >= 2" in error("grpo.group_size=1")
    assert load_config(Config, None, ["grpo.group_size=1", "grpo.advantage=ema"]).grpo.group_size == 1
    assert "sft.grad_accum" in error("sft.batch_size=10", "sft.grad_accum=4")
    assert "model.hidden_size" in error("model.hidden_size=130")
    # the built-in model's size: its layers' parameters are capped (1e6 wide: the allocator's traceback; 1e5 layers:
    # minutes of building without a word); Qwen2.5-1.5B's layer shape at 8 layers is within the cap
    for too_big in (["model.hidden_size=1000000", "model.num_heads=2"], ["model.num_layers=100000"]):
        assert "the built-in model would hold about " in error(*too_big)
    qwen_layers = ["model.hidden_size=1536", "model.num_heads=12", "model.intermediate_size=8960", "model.num_layers=8"]
    assert load_config(Config, None, qwen_layers).model.num_layers == 8
    weights = ["perturbation.kind=gaussian", "perturbation.gaussian_target=weights"]
    assert error(*weights, "perturbation.sites=[mlp,residual]").startswith("invalid config value perturbation.sites: ")
    assert load_config(Config, None, [*weights, "perturbation.sites=[attn,mlp]"]).perturbation.sites == ["attn", "mlp"]
    assert load_config(Config, None, ["perturbation.kind=gaussian", "perturbation.sites=[residual]"])  # activations
    assert "unknown config key 'sft.nope' (known: " in error("sft.nope=1")
    assert "every item has weight 0" in error("grpo.rewards=[{fn: numeric, weight: 0}]")
    assert error("grpo.rewards=[{fn:numeric,weight:2}]").endswith(
        "unknown key(s) fn:numeric, weight:2 (expected fn, weight, name) (YAML reads `fn:numeric` as one key: a space "
        "after the colon, `fn: numeric`)"
    )
    logged = load_config(Config, None, ["grpo.rewards=[{fn: numeric}, {fn: exact, weight: 0}]"]).grpo.rewards
    assert [item.get("weight", 1.0) for item in logged] == [1.0, 0]  # (a part logged beside the total)


def test_an_unknown_key_suggests_the_one_meant():
    assert "unknown config key 'grpo.lr_'; did you mean grpo.lr? (known: " in error("grpo.lr_=1")
    assert "unknown config key 'lr'; did you mean sft.lr or grpo.lr? (known: " in error("lr=1")
    assert "; did you mean perturbation? " in error("perturbaton.p=0.1")
    assert "unknown config key 'sft.beta0'; did you mean grpo.beta0? (known: " in error("sft.beta0=1")  # (grpo.)
    assert "grpo.steps" not in error("sft.max_steps=3")  # (SFT has no steps option: grpo.steps is not SFT's)


@pytest.mark.parametrize(
    "override, says",
    [
        ("grpo.num_generations=4", "'grpo.num_generations' (TRL's num_generations is grpo.group_size here; see docs/"),
        ("grpo.learning_rate=1e-6", "(TRL's learning_rate is grpo.lr here; see docs/from_trl.md) (known: "),
        ("grpo.beta=0.04", "(TRL's beta is grpo.beta0 here"),  # (not also 'did you mean grpo.beta0?')
        ("grpo.max_completion_length=64", "(TRL's max_completion_length is grpo.max_new_tokens here"),
        ("grpo.epsilon=0.2", "(TRL's epsilon is grpo.eps_low here"),
        ("grpo.num_iterations=2", "(TRL's num_iterations is grpo.mini_epochs here"),
        ("max_prompt_length=128", "(TRL's max_prompt_length is data.max_question_tokens here"),
        ("grpo.output_dir=runs/x", "(TRL's output_dir is --out here"),
        ("sft.learning_rate=1e-4", "(TRL's learning_rate is sft.lr here"),  # a section's own option of that name
    ],
)
def test_an_unknown_key_that_is_a_trl_name_names_the_option_it_is_here(override, says):
    """A TRL user's grpo.num_generations=4 was a plain unknown key (docs/from_trl.md maps the names)."""
    msg = error(override)
    assert says in msg and "did you mean" not in msg, msg


def test_a_column_key_given_alone_says_which_is_set_and_what_the_other_names():
    """data.answer_key=solution alone (a TRL dataset's column) said 'invalid config value data.question_key: ...'
    without saying that answer_key was the one set and question_key the one to add."""
    said = error("data.answer_key=solution")
    assert "data.answer_key is set, so name the question's column too (e.g. data.question_key=question)" in said
    said = error("data.question_key=prompt")
    assert said.startswith("invalid config value data.answer_key: ") and "data.question_key is set" in said


def test_the_trl_names_are_docs_from_trl_table():
    """Every name :data:`TRL_NAMES` maps is a row of docs/from_trl.md's table that names its dgrpo key."""
    from dgrpo.config import TRL_NAMES

    rows = [line for line in (ROOT / "docs" / "from_trl.md").read_text().splitlines() if line.startswith("| `")]
    for name, key in TRL_NAMES.items():
        row = next((r for r in rows if re.search(rf"`{name}\b", r.split(" | ")[0])), None)
        assert row is not None and f"`{key}" in row, (name, key, row)


def test_every_trl_name_of_docs_from_trl_table_is_answered_with_its_option():
    """Each TRL name in the first column of docs/from_trl.md's table is either an option of the same name here or
    one :data:`TRL_NAMES` maps to the table's key: a TRL YAML's top-level adam_beta1 or gradient_accumulation_steps
    (rows of the table) was a plain unknown key, without the hint num_generations gets."""
    from dgrpo.config import TRL_NAMES

    rows = [line for line in (ROOT / "docs" / "from_trl.md").read_text().splitlines() if line.startswith("| `")]
    for row in rows:
        trl, ours = row.split(" | ")[:2]
        for name in re.findall(r"`(\w+)", trl):
            same = re.search(rf"`(\w+\.)?{name}`", ours)
            assert same or (name in TRL_NAMES and f"`{TRL_NAMES[name]}" in ours), (name, row)
            if not same:
                assert f"(TRL's {name} is {TRL_NAMES[name]} here" in error(f"{name}=1"), name


def test_trl_options_the_guide_lists_as_not_here_say_so():
    """TRL's options that docs/from_trl.md lists under "Not here" were a bare unknown key; they say that there is no
    counterpart and what there is instead, and the guide names each."""
    from dgrpo.config.files import TRL_ABSENT, TRL_SFT_NAMES

    guide = (ROOT / "docs" / "from_trl.md").read_text()
    not_here = guide[guide.index("Not here:") :].split("\n\n")[0]
    for name, why in TRL_ABSENT.items():
        where = "in GRPO" if name in TRL_SFT_NAMES else "here"
        said = f"(TRL's {name} has no counterpart {where}{': ' + why if why else ''}"
        assert said in error(f"{name}=1") and said in error(f"grpo.{name}=1"), name
        assert f"`{name}`" in not_here, name


@pytest.mark.parametrize(
    "override, says",
    [
        ("grpo.warmup_ratio=0.1", "(TRL's warmup_ratio has no counterpart here: grpo.warmup_steps counts GRPO steps;"),
        ("top_k=50", "(TRL's top_k has no counterpart here: sampling has grpo.temperature and grpo.top_p"),
        ("grpo.generation_batch_size=64", "generates grpo.prompts_per_step x grpo.group_size rollouts"),
        ("steps_per_generation=4", "one optimizer step per generation batch (grpo.mini_epochs: several"),
        ("grpo.lr_scheduler_type=linear", "(TRL's lr_scheduler_type has no counterpart in GRPO: the lr warms up"),
        ("num_train_epochs=3", "GRPO runs grpo.steps steps of grpo.prompts_per_step prompts, in shuffled passes over"),
        ("grpo.delta=1.5", "(TRL's delta has no counterpart here: the ratio of a token of negative advantage has no "),
        ("delta=1.5", "grpo.huber_delta is the threshold of the KL estimate's Huber form, another thing"),
        ("top_entropy_quantile=0.2", "(TRL's top_entropy_quantile has no counterpart here: every answer token is in"),
        ("adam_epsilon=1e-6", "(TRL's adam_epsilon has no counterpart here: AdamW's eps is torch's 1e-8, TRL's"),
        ("grpo.fp16=true", "(TRL's fp16 has no counterpart here: no float16, in the weights or autocast: model.dtype"),
        ("grpo.disable_dropout=true", "(TRL's disable_dropout has no counterpart here: the model's own dropout"),
        ("ref_model_mixup_alpha=0.6", "the reference is renewed as a hard copy of the policy (alpha 1) every grpo."),
        ("grpo.num_generations_eval=4", "validation decodes one answer per prompt, under eval.* and no perturbation"),
        ("multi_objective_aggregation=x", "the weighted parts of grpo.rewards are summed, then the advantage is"),
    ],
)
def test_a_trl_option_dgrpo_lacks_says_what_there_is_instead(override, says):
    """TRL options the guide did not name (warmup_ratio, top_k, ...) were a bare unknown key."""
    assert says in error(override)


@pytest.mark.parametrize(
    "override, says",
    [
        ("sft.gradient_accumulation_steps=4", "(TRL's gradient_accumulation_steps is sft.grad_accum here; see docs/"),
        ("gradient_accumulation_steps=4", "however split; in SFT it is sft.grad_accum; see docs/"),
        ("sft.num_train_epochs=3", "(TRL's num_train_epochs is sft.num_epochs here; see docs/from_trl.md)"),
        ("num_train_epochs=3", "; in SFT it is sft.num_epochs; see docs/from_trl.md)"),
        ("sft.lr_scheduler_type=constant", "(TRL's lr_scheduler_type is sft.lr_schedule here"),
        ("sft.per_device_train_batch_size=8", "is sft.batch_size here: examples per optimizer step over all processes"),
    ],
)
def test_a_trl_name_in_sft_is_answered_with_sfts_option(override, says):
    """The TRL names were GRPO's in every section: sft.gradient_accumulation_steps had no hint though sft.grad_accum
    is the option meant, and a top-level one named GRPO's alone."""
    assert says in error(override)


def test_a_grpo_reason_is_not_given_in_another_section():
    """warmup_ratio's reason names grpo.warmup_steps: in sft it would send an SFT user to GRPO's option; and a key
    in grpo is answered with GRPO's option alone (SFT's is said at the top level only)."""
    assert "grpo." not in error("sft.warmup_ratio=0.1") and "TRL" not in error("eval.top_k=5")
    said = error("grpo.gradient_accumulation_steps=4")
    assert "(TRL's gradient_accumulation_steps is grpo.micro_batch_size here: rollouts per" in said
    assert "sft." not in said


def test_trls_peft_config_is_told_each_lora_option():
    said = error("grpo.peft_config=x")
    assert "(TRL's peft_config is model.lora.r here (LoraConfig's r; its lora_alpha and target_modules are" in said


@pytest.mark.parametrize(
    "override, says",
    [
        ("model.lora.lora_alpha=32", "(PEFT's lora_alpha is model.lora.alpha here: the adapter adds alpha / r x B A"),
        ("model.lora.lora_dropout=0.05", "(PEFT's lora_dropout is model.lora.dropout here: anything but 0 is replaced"),
        ("model.lora.rank=8", "(rank is model.lora.r here: LoraConfig's r, the adapter rank"),
        ("model.lora.lora_r=8", "(lora_r is model.lora.r here: LoraConfig's r"),
    ],
)
def test_a_peft_name_in_model_lora_names_the_option_it_is_here(override, says):
    """A PEFT user's model.lora.lora_alpha=32 was a bare unknown key beside the list of model.lora's options."""
    msg = error(override)
    assert says in msg and "did you mean" not in msg, msg


@pytest.mark.parametrize(
    "override, says",
    [
        ("model.lora.use_rslora=true", "scaled by alpha / r, PEFT's default; rsLoRA's alpha / sqrt(r) with lora_alpha"),
        ("model.lora.use_dora=true", "(PEFT's use_dora has no counterpart here: plain LoRA (PEFT's default)"),
        ("model.lora.bias=all", "(PEFT's bias has no counterpart here: biases stay frozen, PEFT's default 'none'"),
        ("model.lora.modules_to_save=[lm_head]", "no module trains whole beside the adapters, only the latent"),
        ("model.lora.init_lora_weights=gaussian", "PEFT's default: B is 0, so the adapter starts as a no-op"),
        ("model.lora.fan_in_fan_out=true", "PEFT sets it itself for the layers that need it (GPT-2's Conv1D)"),
        ("model.lora.layers_to_transform=[0]", "model.lora.target_modules takes a module's dotted name to adapt one"),
    ],
)
def test_a_peft_option_dgrpo_lacks_says_what_the_adapters_do(override, says):
    """PEFT's use_rslora, bias, ... in model.lora were a bare unknown key: each says what dgrpo's adapters do."""
    assert says in error(override)


def test_peft_names_are_answered_in_model_lora_only():
    """Each PEFT name is answered in model.lora; elsewhere (grpo.bias, eval.rank) it is no LoRA option: no answer."""
    from dgrpo.config.files import PEFT_ABSENT, PEFT_NAMES

    for name in [*PEFT_NAMES, *PEFT_ABSENT]:
        said = error(f"model.lora.{name}=1")
        assert f"(PEFT's {name} " in said or f"({name} is model.lora.r here" in said, said
        assert "model.lora" not in error(f"grpo.{name}=1") + error(f"eval.{name}=1"), name


def test_a_wandb_project_name_wandb_refuses_is_refused_with_wandb_only():
    """W&B refuses / \\ # ? % : and more than 128 characters in a project name: said at validation when wandb is a
    backend (the team of team/proj goes in logging.entity); without wandb, logging.project is not read."""
    assert error("logging.backends=[jsonl,wandb]", "logging.project=team/proj") == (
        "invalid config value logging.project: W&B refuses the name (Invalid project name 'team/proj': cannot contain "
        "characters '/,\\\\,#,?,%,:', found '/'): choose another; a team or user goes in logging.entity"
    )
    assert error("logging.backends=[wandb]", "logging.project=a?b%").endswith("found '?,%'): choose another")
    assert "exceeded 128 characters): choose another" in error(
        "logging.backends=[wandb]", f"logging.project={'x' * 129}"
    )
    for ok in ("logging.project=" + "x" * 128, "logging.project=my-proj_1.0 v2", "logging.backends=[tensorboard]"):
        load_config(Config, None, ["logging.backends=[wandb,tensorboard]", ok])
    load_config(Config, None, ["logging.project=team/proj"])  # (jsonl alone: no W&B project)


def test_trls_count_of_micro_batches_is_told_that_grpos_option_is_their_size():
    """TRL's gradient_accumulation_steps counts micro-batches, grpo.micro_batch_size is their size (its inverse): the
    hint said only "is grpo.micro_batch_size here", which reads as the same number."""
    for key in ("grpo.gradient_accumulation_steps=4", "grpo.per_device_train_batch_size=4"):
        assert "is grpo.micro_batch_size here: rollouts per forward and backward of the update" in error(key)


@pytest.mark.parametrize(
    "override, says",
    [
        ("sft.warmup_ratio=0.03", "(TRL's warmup_ratio has no counterpart in SFT: sft.warmup_steps counts optimizer"),
        ("sft.max_steps=100", "(TRL's max_steps has no counterpart in SFT: SFT runs sft.num_epochs epochs"),
        ("sft.adam_epsilon=1e-6", "(TRL's adam_epsilon has no counterpart in SFT: AdamW's eps is torch's 1e-8"),
        ("sft.fp16=true", "(TRL's fp16 has no counterpart in SFT: no float16 autocast: sft.bf16 autocasts to"),
    ],
)
def test_a_trl_sft_option_sft_lacks_says_what_sft_has_instead(override, says):
    """A TRL SFT recipe's warmup_ratio and max_steps in sft were a bare unknown key (the GRPO reasons, rightly, not
    given there): each now says what SFT has instead, and the guide says it too."""
    from dgrpo.config.files import TRL_SFT_ABSENT

    assert says in error(override)
    guide = (ROOT / "docs" / "from_trl.md").read_text()
    sft = guide[guide.index("`dgrpo sft` under TRL's") :].split("\n\n")[0]
    assert all(f"no `{name}`" in sft for name in TRL_SFT_ABSENT), sft


def test_the_trl_answers_name_only_real_options_and_the_guide_names_sfts():
    """Each option a TRL (or PEFT) answer names exists (no invented feature): its reasons, its notes and the options
    it maps to; and docs/from_trl.md gives SFT's names."""
    from dgrpo.config import files
    from dgrpo.config.values import _options

    known = {option.key for option in _options(Config)}  # (nested ones too: model.lora.r)
    tables = [files.TRL_ABSENT, files.TRL_SFT_NAMES, files.TRL_SFT_ABSENT, files.TRL_NAMES, files._NOTES]
    tables += [files.PEFT_NAMES, files.PEFT_ABSENT, files._PEFT_NOTES]  # (model.lora's answers to PEFT's names)
    reasons = [*files._NOTES, *(why for table in tables for why in table.values())]
    named = re.findall(r"\b(?:grpo|sft|model|data|eval|logging)(?:\.\w+)+", " ".join(reasons))
    assert named and set(named) <= known, set(named) - known
    assert {"grpo.huber_delta", "model.dtype", "eval.batch_size", "sft.bf16", "model.lora.alpha"} <= set(named)
    assert {"model.lora.dropout", "model.lora.train_latent_tokens", "model.lora.target_modules"} <= set(named)
    guide = (ROOT / "docs" / "from_trl.md").read_text()
    sft = guide[guide.index("`dgrpo sft` under TRL's") :].split("\n\n")[0]
    for name, key in files.TRL_SFT_NAMES.items():
        assert f"`{name}`" in sft and f"`{key}`" in sft, name


@pytest.mark.parametrize(
    "override, says",
    [
        ("per_device_eval_batch_size=8", "(TRL's per_device_eval_batch_size is eval.batch_size here: prompts per gen"),
        ("sft.per_device_eval_batch_size=8", "(TRL's per_device_eval_batch_size is eval.batch_size here"),  # not sft's
        ("grpo.per_device_eval_batch_size=8", "(TRL's per_device_eval_batch_size is eval.batch_size here"),
        ("model.torch_dtype=bfloat16", "(TRL's torch_dtype is model.dtype here: the weights' dtype, float32 or bfloat"),
        ("torch_dtype=float16", "(TRL's torch_dtype is model.dtype here: the weights' dtype, float32 or bfloat16 (no"),
        ("sft.torch_dtype=bfloat16", "(TRL's torch_dtype is model.dtype here"),  # (a section both commands share)
        ("sft.report_to=[wandb]", "(TRL's report_to is logging.backends here"),
        ("model.gradient_checkpointing=true", "(TRL's gradient_checkpointing is grpo.recompute here; in SFT it is sft"),
        ("model.learning_rate=1e-5", "(TRL's learning_rate is grpo.lr here; in SFT it is sft.lr; see docs/"),
        ("model.gradient_accumulation_steps=2", "; in SFT it is sft.grad_accum; see docs/"),  # (SFT's other name)
        ("bf16=true", "(TRL's bf16 is model.dtype here: the weights' dtype, float32 or bfloat16 (no float16, no 'au"),
        ("bf16=true", "; in SFT it is sft.bf16: bf16 autocast, on CUDA only by default (auto); see docs/from_trl.md)"),
    ],
)
def test_a_trl_name_of_a_shared_section_or_in_model_names_its_option(override, says):
    """TRL's per_device_eval_batch_size, ModelConfig's torch_dtype and a training option written under ``model:``
    (gradient_checkpointing, as Hugging Face's model.gradient_checkpointing_enable) were bare unknown keys; a TRL name
    of the model, data, eval or logging section is that option in whichever section it is written (in sft,
    per_device_eval_batch_size would have been sft.batch_size, the training batch, by its leaf's name)."""
    msg = error(override)
    assert says in msg and "did you mean" not in msg, msg


def test_the_eps_a_trl_answer_states_is_the_optimizers():
    """TRL's adam_epsilon is answered "AdamW's eps is torch's 1e-8": GRPO's and SFT's optimizers, with float32
    masters or without, take it."""
    import torch

    from dgrpo.training.grpo import build_optimizer
    from dgrpo.training.sft import new_optimizer

    for masters in (False, True):
        cfg = load_config(Config, None, [f"model.master_weights={masters}", "model.dtype=bfloat16"])
        for opt in (
            build_optimizer([torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))], cfg, torch.device("cpu")),
            new_optimizer([torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))], cfg),
        ):
            assert opt.param_groups[0]["eps"] == 1e-8, (masters, type(opt))


def test_trls_max_steps_row_says_a_grpo_step_is_mini_epochs_optimizer_steps():
    """TRL's max_steps counts optimizer steps (num_iterations of them per generation batch); grpo.steps counts GRPO
    steps of grpo.mini_epochs optimizer steps each, at one lr: the row mapped them one to one, so a TRL user's
    max_steps=N with num_iterations=2 became twice the optimizer steps and half the schedule's."""
    rows = [line for line in (ROOT / "docs" / "from_trl.md").read_text().splitlines() if line.startswith("| `")]
    row = next(r for r in rows if r.startswith("| `max_steps` |"))
    assert "`max_steps` = `grpo.steps` x `grpo.mini_epochs`" in row, row


# ---- perturbation.layers


@pytest.mark.parametrize(
    "spec,parsed",
    [
        ("all", ("all", None)),
        ("3", ("list", [3])),
        ("-1", ("list", [-1])),
        ("0:4", ("slice", (0, 4))),
        ("-2:", ("slice", (-2, None))),
        (":3", ("slice", (None, 3))),
        ("1,3,5", ("list", [1, 3, 5])),
        ("1, 3", ("list", [1, 3])),
    ],
)
def test_layer_grammar_accepts(spec, parsed):
    assert parse_layer_spec(spec) == parsed
    assert load_config(Config, None, [f"perturbation.layers={spec}"]).perturbation.layers == spec


@pytest.mark.parametrize("spec", ["abc", "1:2:3", "1.5", "", "1,,3", "a:b"])
def test_layer_grammar_rejects(spec):
    with pytest.raises(ConfigError, match="invalid config value perturbation.layers: expected all"):
        parse_layer_spec(spec)
    assert error(f"perturbation.layers={spec}").startswith("invalid config value perturbation.layers: ")


def test_a_site_or_layer_named_twice_is_refused():
    """Each would carry two masks (dropout 1 - (1 - p)^2 there): refused, in the config and against the model."""
    from dgrpo.model.anatomy import select_layers

    assert (
        error("perturbation.sites=[mlp, mlp]")
        == "invalid config value perturbation.sites: a site is named twice in ['mlp', 'mlp']"
    )
    assert (
        error("perturbation.layers=0,0") == "invalid config value perturbation.layers: a layer is named twice in '0,0'"
    )
    with pytest.raises(ConfigError, match="perturbation.layers: '-1,1' names a layer twice"):
        select_layers("-1,1", 2)
    assert select_layers("-1,0", 2) == [1, 0]


def test_colons_stay_strings_in_set_values_and_files(tmp_path):
    assert load_config(Config, None, ["perturbation.layers=1:3"]).perturbation.layers == "1:3"  # not 63
    f = tmp_path / "c.yaml"
    f.write_text("perturbation: {layers: 1:3}\n")
    assert load_config(Config, f).perturbation.layers == "1:3"
    f.write_text("perturbation:\n  layers: 3\n")
    assert load_config(Config, f).perturbation.layers == "3"
    f.write_text("perturbation:\n  layers: '-2:'\n")
    assert load_config(Config, f).perturbation.layers == "-2:"


def test_rewards_need_distinct_names():
    """Two grpo.rewards items of one name (given, or their fn) would log into one reward/<name> metric and leave
    grpo.filter_reward ambiguous: refused in one line naming both items."""
    for rewards in ("[{fn: numeric, name: a}, {fn: exact, name: a}]", "[{fn: numeric}, {fn: numeric, weight: 2}]"):
        with pytest.raises(ConfigError, match=r"grpo.rewards: item 1 is named '(a|numeric)' like item 0"):
            load_config(Config, None, [f"grpo.rewards={rewards}"])
    with pytest.raises(
        ConfigError, match=r"grpo.rewards: item 0: unknown key\(s\) wieght \(expected fn, weight, name\)"
    ):
        load_config(Config, None, ["grpo.rewards=[{fn: numeric, wieght: 2}]"])
    ok = load_config(
        Config, None, ["grpo.rewards=[{fn: numeric}, {fn: numeric, name: twice, weight: 2}]", "grpo.filter=0"]
    )
    assert len(ok.grpo.rewards) == 2


def test_a_filter_reward_that_names_none_of_the_rewards_is_refused_when_the_config_loads():
    """grpo.filter_reward must name one of grpo.rewards: a misspelt name was found only once the trainer was built
    (the command line checks it before, a Python caller did not); beside a single grpo.reward (or a Python
    reward_fn) the name is known only then, and is not checked here."""
    rewards = "grpo.rewards=[{fn: numeric, name: correct}, {fn: exact, weight: 0}]"
    with pytest.raises(
        ConfigError, match=r"grpo.filter_reward: 'corect' is not one of grpo.rewards \(correct, exact\)"
    ):
        load_config(Config, None, [rewards, "grpo.filter_reward=corect"])
    assert load_config(Config, None, [rewards, "grpo.filter_reward=correct"]).grpo.filter_reward == "correct"
    assert load_config(Config, None, ["grpo.filter_reward=mine"]).grpo.filter_reward == "mine"


def test_a_reward_file_without_a_name_is_named_as_a_module_function_is():
    """A ``path/to/file.py:function`` part without a ``name`` was named by its spec: its metric was
    ``reward//abs/path/file.py:function`` (``dgrpo grpo`` makes the path absolute). It is ``file:function``, as
    ``package.module:function`` is named; built-in scorers and given names are kept; two parts that would share a
    name are refused, asking for names."""
    from dgrpo.config import reward_name

    assert reward_name({"fn": "/abs/path/my_rewards.py:accuracy"}) == "my_rewards:accuracy"
    assert reward_name({"fn": "rewards/len.py:short"}) == "len:short"
    assert reward_name({"fn": "~/r.py:f", "name": "mine"}) == "mine"
    assert reward_name({"fn": "numeric"}) == "numeric"
    assert reward_name({"fn": "my_pkg.rewards:accuracy"}) == "my_pkg.rewards:accuracy"
    cfg = load_config(Config, None, ["grpo.rewards=[{fn: /a/r.py:f}, {fn: numeric}]", "grpo.filter_reward=numeric"])
    assert [reward_name(item) for item in cfg.grpo.rewards] == ["r:f", "numeric"]
    with pytest.raises(ConfigError, match=r"grpo.rewards: item 1 is named 'r:f' like item 0 .*give each its own name"):
        load_config(Config, None, ["grpo.rewards=[{fn: /a/r.py:f}, {fn: /b/r.py:f}]"])


def test_a_reward_weight_written_in_exponent_form_is_the_number():
    """YAML reads 1e-3 (no dot) as text; the scalar options read it as the number, and so does a reward's weight
    (it was refused as 'must be a finite number, got '1e-3'')."""
    for text in ("1e-3", "'0.001'"):
        cfg = load_config(Config, None, [f"grpo.rewards=[{{fn: numeric, weight: {text}}}]"])
        assert cfg.grpo.rewards[0]["weight"] == 0.001
    with pytest.raises(ConfigError, match=r"grpo.rewards item 0 weight: expected a number, got 'abc'"):
        load_config(Config, None, ["grpo.rewards=[{fn: numeric, weight: abc}]"])


def test_the_ood_steps_split_has_more_steps():
    with pytest.raises(ConfigError, match="task.ood_extra_steps"):  # (-10 gave problems of 0 steps, silently)
        load_config(Config, None, ["task.ood_extra_steps=-10"])


def test_comma_text_is_the_list_it_spells():
    """``--set key=a,b`` is the list ``[a, b]`` (spaces around items dropped), whole numbers as numbers."""
    for text in ("1,1,2", "1, 1, 2", "[1, 1, 2]"):
        assert load_config(Config, None, [f"sft.stage_epochs={text}"]).sft.stage_epochs == [1, 1, 2]
    for text in ("attn,mlp", "attn, mlp", "[attn, mlp]"):
        assert load_config(Config, None, [f"perturbation.sites={text}"]).perturbation.sites == ["attn", "mlp"]
    test = load_config(Config, None, ["data.test=builtin:test, gsm8k:test"]).data.test
    assert test == ["builtin:test", "gsm8k:test"]


def test_comma_text_reads_an_item_as_brackets_do():
    """Comma text gives the list that brackets give, item by item as YAML 1.1 reads it: ``1.5e3`` (no sign in its
    exponent) is text in brackets, and was the number 1500.0 in comma text, which a test-set list refused."""
    for item in ("1.5e3", "1.5e-3", "1.", ".5", "-2", "2e3"):
        brackets = load_config(Config, None, [f"sft.adam_betas=[0.9,{item}]"], validate=False).sft.adam_betas
        commas = load_config(Config, None, [f"sft.adam_betas=0.9,{item}"], validate=False).sft.adam_betas
        assert commas == brackets, item
    cfg = load_config(Config, None, ["data.test=a.jsonl,1.5e3"], validate=False)
    assert cfg.data.test == ["a.jsonl", "1.5e3"]


def test_one_item_alone_is_a_one_item_list():
    """A list option given one item without brackets is the list of it: a number as a text item is (``2`` was refused
    as no list while ``mlp`` was ``['mlp']``); a boolean or a mapping alone is still no list."""
    assert load_config(Config, None, ["sft.stage_epochs=2"]).sft.stage_epochs == [2]
    assert load_config(Config, None, ["perturbation.sites=mlp"]).perturbation.sites == ["mlp"]
    with pytest.raises(ConfigError, match=r"sft\.adam_betas: expected two numbers .*got \[0\.9\]"):
        load_config(Config, None, ["sft.adam_betas=0.9"])  # (a list of one: its own check names what is wrong)
    with pytest.raises(ConfigError, match=r"sft\.stage_epochs: expected a list of epoch counts >= 0"):
        load_config(Config, None, ["sft.stage_epochs=-1"])
    for value in ("true", "{a: 1}"):
        with pytest.raises(ConfigError, match=r"sft\.stage_epochs: expected a list, got"):
            load_config(Config, None, [f"sft.stage_epochs={value}"])


def test_loader_keeps_ordinary_numbers():
    data = yaml.load("a: 1:30\nb: 190\nc: 1.0e-5\nd: 1e-5\ne: -3\nf: 0:4.5\ng: .inf", Loader=ConfigLoader)
    assert data == {"a": "1:30", "b": 190, "c": 1.0e-5, "d": "1e-5", "e": -3, "f": "0:4.5", "g": float("inf")}


def test_a_leading_zero_is_base_ten_and_exponents_in_lists_are_numbers():
    """YAML 1.1 read ``010`` as octal 8 and a list's ``1e-3`` as text (refused by adam_betas)."""
    cfg = load_config(Config, None, ["grpo.steps=010", "sft.adam_betas=[0.9, 1e-3]", "data.test=[007.jsonl, '1e3']"])
    assert (cfg.grpo.steps, cfg.sft.adam_betas, cfg.data.test) == (10, [0.9, 1e-3], ["007.jsonl", "1e3"])
    assert load_config(Config, None, ["sft.adam_betas=0.9,1e-3"]).sft.adam_betas == [0.9, 1e-3]
    assert load_config(Config, None, ["sft.stage_epochs=[03, 2]"]).sft.stage_epochs == [3, 2]  # (a list of counts)


def test_a_bracketed_list_takes_names_holding_a_question_mark():
    """PyYAML's ``[...]`` refuses ``?`` in an unquoted item: ``data.test=[svamp, builtin:test?n_steps=3]`` (a name
    with its options, as documented) became the two names ``[svamp`` and ``builtin:test?n_steps=3]``."""
    names = ["svamp", "builtin:test?n_steps=3&n_test=8"]
    assert load_config(Config, None, ["data.test=[svamp, builtin:test?n_steps=3&n_test=8]"]).data.test == names
    assert load_config(Config, None, ["data.test=[ builtin:test?n_steps=3 ]"]).data.test == ["builtin:test?n_steps=3"]
    assert load_config(Config, None, ["data.test=[svamp,'builtin:test?n_steps=3&n_test=8']"]).data.test == names
    assert load_config(Config, None, ["sft.stage_epochs=[1, 2]"]).sft.stage_epochs == [1, 2]  # (YAML reads these)


def test_booleans_take_1_and_0_and_an_emptied_section_is_empty(tmp_path):
    """``filter: 1`` was refused while ``filter: '1'`` passed; a section whose keys are all commented out is None to
    YAML, which was refused as no mapping."""
    assert load_config(Config, None, ["grpo.filter=0"]).grpo.filter is False
    (tmp_path / "c.yaml").write_text("grpo:\n  filter: 1\nsft:\n  # lr: 1e-4\n")
    cfg = load_config(Config, tmp_path / "c.yaml")
    assert cfg.grpo.filter is True and cfg.sft == Config().sft


# ---- files: base chains, merge_file, packaged configs


def test_base_in_the_same_folder_and_the_child_wins(tmp_path):
    (tmp_path / "parent.yaml").write_text("grpo: {lr: 0.5, steps: 7}\nperturbation: {kind: none}\n")
    (tmp_path / "child.yaml").write_text("base: parent.yaml\ngrpo: {lr: 0.25}\n")
    cfg = load_config(Config, tmp_path / "child.yaml")
    assert (cfg.grpo.lr, cfg.grpo.steps, cfg.perturbation.kind) == (0.25, 7, "none")


def test_base_chain_with_relative_paths_and_set_last(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "root.yaml").write_text("seed: 1\ngrpo: {steps: 3}\n")
    (tmp_path / "a" / "mid.yaml").write_text("base: ../root.yaml\nseed: 2\n")
    (tmp_path / "b" / "leaf.yaml").write_text("base: ../a/mid.yaml\ngrpo: {steps: 5}\n")
    cfg = load_config(Config, tmp_path / "b" / "leaf.yaml", ["grpo.steps=9"])
    assert (cfg.seed, cfg.grpo.steps) == (2, 9)


def test_several_config_files_apply_in_order_each_with_its_base_chain(tmp_path):
    """``--config a.yaml --config c.yaml``, c's base b: a, then b, then c; so b's lr overrides a's (docs/config.md)."""
    (tmp_path / "a.yaml").write_text("grpo: {lr: 0.5, steps: 7}\n")
    (tmp_path / "b.yaml").write_text("grpo: {lr: 0.25, group_size: 4}\n")
    (tmp_path / "c.yaml").write_text("base: b.yaml\ngrpo: {group_size: 6}\n")
    cfg = load_config(Config, [tmp_path / "a.yaml", tmp_path / "c.yaml"])
    assert (cfg.grpo.lr, cfg.grpo.steps, cfg.grpo.group_size) == (0.25, 7, 6)
    assert "a later file's base overrides an earlier file's keys" in " ".join(config_markdown().split())


def test_base_may_be_a_packaged_name(tmp_path):
    (tmp_path / "mine.yaml").write_text("base: paper/grpo_dropout\ngrpo: {steps: 10}\n")
    cfg = load_config(Config, tmp_path / "mine.yaml")
    assert (cfg.grpo.steps, cfg.grpo.group_size, cfg.perturbation.sites) == (10, 32, ["attn"])


def test_base_and_config_may_start_at_the_home_folder(tmp_path, monkeypatch):
    """``base: ~/configs/a.yaml`` (and ``--config '~/...'``, quoted) name the home folder, as a data spec's ``~`` does:
    they were 'config file not found: ~/configs/a.yaml' (the ``~`` taken for a folder of that name)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "configs").mkdir(parents=True)
    (tmp_path / "home" / "configs" / "a.yaml").write_text("grpo: {steps: 11}\n")
    (tmp_path / "run.yaml").write_text("base: ~/configs/a.yaml\nseed: 3\n")
    cfg = load_config(Config, tmp_path / "run.yaml")
    assert (cfg.grpo.steps, cfg.seed) == (11, 3)
    assert load_config(Config, "~/configs/a.yaml").grpo.steps == 11


def test_base_cycle_and_missing_base_are_one_line_errors(tmp_path):
    (tmp_path / "x.yaml").write_text("base: y.yaml\n")
    (tmp_path / "y.yaml").write_text("base: x.yaml\n")
    with pytest.raises(ConfigError, match="cycle") as e:
        load_config(Config, tmp_path / "x.yaml")
    assert "x.yaml" in str(e.value) and "y.yaml" in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "z.yaml").write_text("base: nope.yaml\n")
    with pytest.raises(ConfigError, match="z.yaml: config file not found: .*nope.yaml"):
        load_config(Config, tmp_path / "z.yaml")
    (tmp_path / "w.yaml").write_text("base: [a, b]\n")
    with pytest.raises(ConfigError, match="base must name a config file"):
        load_config(Config, tmp_path / "w.yaml")


def test_errors_in_a_file_name_the_file(tmp_path):
    (tmp_path / "bad.yaml").write_text("grpo: {lr: .nan}\n")
    (tmp_path / "child.yaml").write_text("base: bad.yaml\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: invalid config value grpo\.lr: must be a finite number"):
        load_config(Config, tmp_path / "child.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(Config, tmp_path / "list.yaml")


def test_merge_file_keeps_the_existing_config_and_does_not_validate(tmp_path):
    cfg = load_config(Config, None, ["grpo.lr=0.5", "grpo.steps=3"])
    assert merge_file(cfg, "builtin/grpo_sampling") is cfg
    assert (cfg.grpo.lr, cfg.grpo.steps, cfg.grpo.temperature, cfg.perturbation.kind) == (0.5, 3, 1.0, "none")
    (tmp_path / "k1.yaml").write_text("grpo: {group_size: 1}\n")  # invalid without advantage=ema: not checked here
    assert merge_file(cfg, tmp_path / "k1.yaml").grpo.group_size == 1
    with pytest.raises(ConfigError, match="K >= 2"):
        cfg.validate()


def test_an_empty_file_loads_as_the_defaults(tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    assert to_dict(load_config(Config, tmp_path / "empty.yaml")) == to_dict(Config())


@pytest.mark.parametrize("name", packaged_configs())
def test_every_packaged_config_loads_and_validates(name):
    load_config(Config, name).validate()


def test_packaged_configs_are_the_folder():
    names = packaged_configs()
    assert "paper/grpo_dropout.yaml" in names and "builtin/sft.yaml" in names and "tiny.yaml" in names
    assert len(names) == len(list(CONFIG_DIR.rglob("*.yaml")))


PAPER_ABLATIONS = {
    "grpo_deterministic": {"perturbation.kind": "none", "grpo.max_skip_streak": 0},
    "grpo_sampling": {"perturbation.kind": "none", "grpo.temperature": 1.0},
    "grpo_fresh_masks": {"grpo.replay": "fresh_mask"},
    "grpo_native": {"perturbation.kind": "native"},
    "grpo_kl_unbiased": {"grpo.kl_form": "unbiased"},
    "reinforce_ema": {
        "grpo.advantage": "ema",
        "grpo.group_size": 1,
        "grpo.filter": False,
        "grpo.prompts_per_step": 512,
    },
}


@pytest.mark.parametrize("name", sorted(PAPER_ABLATIONS))
def test_paper_ablation_differs_from_the_recipe_in_its_keys_only(name):
    recipe = load_config(Config, "paper/grpo_dropout")
    assert diff(recipe, load_config(Config, f"paper/{name}")) == PAPER_ABLATIONS[name]
    assert yaml.safe_load((CONFIG_DIR / "paper" / f"{name}.yaml").read_text())["base"] == "grpo_dropout.yaml"


BUILTIN_ARMS = {
    "dropout_grpo": {},
    "sft": {},
    "grpo_deterministic": {"perturbation.kind": "none", "grpo.max_skip_streak": 0},
    "grpo_sampling": {"perturbation.kind": "none", "grpo.temperature": 1.0},
    "grpo_fresh_masks": {"grpo.replay": "fresh_mask"},
    "reinforce_ema": {
        "grpo.advantage": "ema",
        "grpo.group_size": 1,
        "grpo.filter": False,
        "grpo.prompts_per_step": 128,
    },
}


@pytest.mark.parametrize("name", sorted(BUILTIN_ARMS))
def test_builtin_arm_sets_only_what_differs_from_the_defaults(name):
    assert diff(Config(), load_config(Config, f"builtin/{name}")) == BUILTIN_ARMS[name]
    keys = flat(yaml.load((CONFIG_DIR / "builtin" / f"{name}.yaml").read_text(), Loader=ConfigLoader) or {})
    assert set(keys) == set(BUILTIN_ARMS[name])  # no key restates a default


def test_tiny_config_is_the_quick_set():
    assert diff(Config(), load_config(Config, "tiny")) == {
        "model.hidden_size": 64,
        "model.num_layers": 2,
        "model.intermediate_size": 128,
        "task.n_steps": 2,
        "task.n_train": 2048,
        "task.n_valid": 64,
        "task.n_test": 64,
        "sft.num_epochs": 4,
        "sft.max_latent_stage": 1,
        "sft.lr": 3e-3,
        "sft.warmup_steps": 5,
        "grpo.steps": 4,
        "grpo.prompts_per_step": 8,
        "grpo.eval_every": 2,
        "grpo.warmup_steps": 1,
        "grpo.max_new_tokens": 24,
        "grpo.lr": 1e-4,
        "perturbation.p": 0.3,
        "eval.max_new_tokens": 24,
        "data.eval_limit": 0,
    }  # (num_heads 4, epochs_per_stage 2, batch_size 64, group_size 8 are the defaults too)


@pytest.mark.parametrize(
    "name", ["paper/grpo_dropout", "paper/grpo_dropout.yaml", "configs/paper/grpo_dropout.yaml", "builtin/sft", "tiny"]
)
def test_resolve_config_path_finds_packaged_names(name):
    path = resolve_config_path(name)
    assert path.is_file() and path.parent.parent in (CONFIG_DIR, CONFIG_DIR.parent)


def test_resolve_config_path_prefers_an_existing_file(tmp_path, monkeypatch):
    (tmp_path / "paper").mkdir()
    (tmp_path / "paper" / "grpo_dropout.yaml").write_text("seed: 5\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_config_path("paper/grpo_dropout.yaml") == Path("paper/grpo_dropout.yaml")
    assert load_config(Config, "paper/grpo_dropout.yaml").seed == 5
    assert resolve_config_path("paper/grpo_dropout") == CONFIG_DIR / "paper" / "grpo_dropout.yaml"


def test_unknown_config_name_lists_the_packaged_ones():
    with pytest.raises(ConfigError) as e:
        resolve_config_path("paper/nope")
    msg = str(e.value)
    assert msg.startswith("config file not found: paper/nope (not a file, and not a packaged config: ")
    assert "paper/grpo_dropout.yaml" in msg and "builtin/sft.yaml" in msg and "\n" not in msg


# ---- documentation


def test_docs_config_md_is_current():
    """Regenerate with: dgrpo config show --markdown > docs/config.md"""
    assert (ROOT / "docs" / "config.md").read_text() == config_markdown()


def test_every_option_has_a_doc():
    lines = describe(Config)
    assert len(lines) == len(flat(to_dict(Config())))
    for line in lines:
        assert line.split("#", 1)[1].strip(), line


def test_markdown_lists_every_option_and_the_choices():
    md = config_markdown()
    for key in flat(to_dict(Config())):
        assert f"| `{key}` |" in md
    assert "| locked \\| native \\| gaussian \\| none |" in md
    assert "## grpo" in md and "base:" in md


def test_describe_filters_a_section():
    lines = describe(Config, section="grpo")
    assert lines and all(line.startswith("grpo.") for line in lines)
    assert len(lines) == len(dataclasses.fields(type(Config().grpo)))
    assert any(
        line.startswith("perturbation.kind = 'locked'  # [locked | native | gaussian | none]")
        for line in describe(Config)
    )
    with pytest.raises(ConfigError, match="no config option is named by"):
        describe(Config, section="nope")


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["perturbation.p=0"], ["perturbation.p=0 makes perturbation.kind=locked perturb nothing.*one answer"]),
        (["perturbation.kind=native", "perturbation.p=0", "grpo.engine=eager"], ["kind=native perturb nothing"]),
        (
            ["perturbation.kind=gaussian", "perturbation.sigma=0", "grpo.temperature=1"],
            ["perturbation.sigma=0.*differ only by their sampled tokens"],
        ),
        (["perturbation.kind=none", "grpo.replay=fresh_mask"], ["grpo.replay=fresh_mask changes nothing"]),
        (["perturbation.kind=none", "perturbation.perturb_answer=false"], ["perturb_answer=false changes nothing"]),
        (["perturbation.perturb_answer=false"], []),  # (the ablation, with locked dropout acting on the latents)
        (["perturbation.p=0", "grpo.replay=fresh_mask"], ["perturbation.p=0", "grpo.replay=fresh_mask"]),
        (["grpo.top_p=0.9"], ["grpo.top_p=0.9 changes nothing with grpo.temperature=0: greedy"]),
        (["grpo.temperature=1e-6"], ["grpo.temperature=1e-06: .* carry almost no gradient"]),
        (["grpo.temperature=0.7", "grpo.top_p=0.9"], []),
        # eval.top_p under greedy evaluation was accepted and did nothing, without a word (grpo.top_p's is said)
        (
            ["eval.top_p=0.9"],
            [r"^eval.top_p=0.9 changes nothing with eval.temperature=0: greedy decoding samples none"],
        ),
        (["eval.temperature=0.7", "eval.top_p=0.9"], []),
        # how activations are recomputed, without recomputation: accepted and ignored, without a word
        (
            ["grpo.recompute_granularity=call"],
            [r"^grpo.recompute_granularity=call changes nothing with grpo.recompute="],
        ),
        (["grpo.recompute=true", "grpo.recompute_granularity=call", "grpo.recompute_latent_steps=false"], []),
        # p is not gaussian's scale (p=0 does not make it perturb nothing), nor sigma dropout's: each was accepted and
        # did nothing, without a word
        (
            ["perturbation.kind=gaussian", "perturbation.p=0"],
            [r"^perturbation.p=0.0 changes nothing with perturbation.kind=gaussian: .*perturbation.sigma sets"],
        ),
        (["perturbation.sigma=0.5"], [r"^perturbation.sigma=0.5 changes nothing with perturbation.kind=locked: it is"]),
        (
            ["perturbation.kind=native", "perturbation.sigma=0", "grpo.engine=eager"],
            [r"^perturbation.sigma=0.0 changes nothing with perturbation.kind=native: .*perturbation.p sets"],
        ),
        (["perturbation.kind=gaussian", "perturbation.sigma=0.5"], []),
        (["perturbation.kind=none", "perturbation.p=0.3", "perturbation.sigma=0.3"], []),
        (["perturbation.kind=none"], []),  # the deterministic ablation is what it says
        (  # a warmup longer than the run: the lr never reached grpo.lr and best/ was never kept, without a word
            ["grpo.steps=3"],
            [r"^grpo.warmup_steps=10 is more than grpo.steps=3: .* peaks at 3e-06, not grpo.lr=1e-05, and best/ is"],
        ),
        (["grpo.steps=10"], [r"as many as grpo.steps=10: .*at its last step only .*best/ can only be the final model"]),
        (["grpo.steps=3", "grpo.save_best=false"], [r"not grpo.lr=1e-05; set grpo.warmup_steps below grpo.steps$"]),
        (["grpo.steps=11"], []),
        # options of a part of GRPO the config turns off were accepted and did nothing, without a word
        (["grpo.ema_alpha=0.9"], [r"^grpo.ema_alpha=0.9 changes nothing with grpo.advantage=drgrpo \(it is the EMA"]),
        (["grpo.advantage=ema", "grpo.group_size=1", "grpo.filter=false", "grpo.ema_alpha=0.9"], []),
        (
            ["grpo.beta0=0", "grpo.kl_form=paper", "grpo.ref_renewal_every=10"],
            [r"^grpo.kl_form=paper, grpo.ref_renewal_every=10 change nothing with grpo.beta0=0 \(no KL term, no ref"],
        ),
        (["grpo.beta0=0"], []),
        (["grpo.filter=false", "grpo.alpha_min=0.1"], [r"^grpo.alpha_min=0.1 changes nothing with grpo.filter=false$"]),
        # the fast engine's option under the eager one was accepted and did nothing, without a word (true, its
        # default, is not said: the config cannot tell it from one set on purpose)
        (
            ["grpo.engine=eager", "grpo.keep_graphs=false"],
            [r"^grpo.keep_graphs=false changes nothing with grpo.engine=eager \(it keeps the fast engine's"],
        ),
        (["grpo.engine=eager", "grpo.keep_graphs=true"], []),
        (["grpo.engine=fast", "grpo.keep_graphs=false"], []),
        (["grpo.keep_graphs=false"], []),  # (auto: fast on CUDA)
        # and the eager engine's cache under the fast one, which always runs over a static cache
        (
            ["grpo.engine=fast", "grpo.rollout_cache=static"],
            [r"^grpo.rollout_cache=static changes nothing with grpo.engine=fast \(its decoders always run over"],
        ),
        (["grpo.engine=auto", "grpo.rollout_cache=static"], []),  # (auto: eager off CUDA, where it applies)
        (
            ["grpo.advantage=ema", "grpo.group_size=1", "grpo.alpha_max=0.9"],
            [r"^grpo.alpha_max=0.9 changes nothing with grpo.advantage=ema \(no group accuracy to filter on\)$"],
        ),
    ],
)
def test_inert_settings_are_named_one_line_each(overrides, says):
    lines = load_config(Config, None, overrides).inert_settings()
    assert len(lines) == len(says)
    for pattern, line in zip(says, lines, strict=True):
        assert re.search(pattern, line), (pattern, line)


def test_no_packaged_config_has_inert_settings():
    for name in packaged_configs():
        assert load_config(Config, name).inert_settings() == [], name


@pytest.mark.parametrize(
    "overrides, says",
    [
        # the latent layout's options under a mode without latent thoughts were accepted and did nothing, no word said
        (
            ["sft.mode=cot", "sft.c_thought=3", "sft.pad_latent_to_max=true"],
            [r"^sft.c_thought=3, sft.pad_latent_to_max=true change nothing with sft.mode=cot \(no latent thoughts\)$"],
        ),
        (["sft.mode=no_cot", "sft.c_thought=2"], [r"^sft.c_thought=2 changes nothing with sft.mode=no_cot"]),
        (["sft.mode=cot"], []),
        (["sft.mode=pause", "sft.c_thought=3", "sft.pad_latent_to_max=true"], []),  # (pause tokens: read)
    ],
)
def test_unused_sft_settings_are_named_in_one_line(overrides, says):
    lines = unused_sft_settings(load_config(Config, None, overrides).sft)
    assert len(lines) == len(says)
    for pattern, line in zip(says, lines, strict=True):
        assert re.search(pattern, line), (pattern, line)


def test_the_cot_run_that_paper_sft_coconut_describes_is_said_to_be_clean():
    """The CoT run of Hao et al.'s way (paper/sft_coconut.yaml's comment) resets the file's latent layout, which a CoT
    run does not read; without the reset the warning would name both options."""
    text = (CONFIG_DIR / "paper" / "sft_coconut.yaml").read_text()
    cot = ["sft.mode=cot", "sft.num_epochs=25", "sft.eval_every_epoch=true", "sft.c_thought=1"]
    cot.append("sft.pad_latent_to_max=false")
    assert " ".join(cot) in " ".join(line.lstrip("# ") for line in text.splitlines())
    assert unused_sft_settings(load_config(Config, "paper/sft_coconut", cot).sft) == []
    assert len(unused_sft_settings(load_config(Config, "paper/sft_coconut", cot[:3]).sft)) == 1
    for name in packaged_configs():
        assert unused_sft_settings(load_config(Config, name).sft) == [], name


@pytest.mark.parametrize(
    "text, says",
    [
        ("grpo:\n  lr: 3.0e-5\n\ngrpo:\n  steps: 3\n", "key 'grpo' is given twice in one mapping (line 4, column 1)"),
        ("grpo:\n  lr: 3.0e-5\n  lr: 1\n", "the key 'lr' is given twice in one mapping (line 3, column 3)"),
        ("grpo: {lr: 1e-5\n", "(line 2, column 1)"),
        ("grpo:\n\tlr: 1\n", "found character '\\t' that cannot start any token (line 2, column 1)"),
        ("grpo:\n  ? [lr]\n  : 1\n", "a key must be a name, got ['lr'] (line 2, column 5)"),  # (was a TypeError)
        ("data:\n  test: [svamp, builtin:test?n_steps=3]\n", "but got '?': quote an item holding '?'"),
    ],
)
def test_a_yaml_mistake_is_one_line_with_its_place(tmp_path, text, says):
    """A key written twice lost the first one's settings silently (PyYAML keeps the last); a syntax error said
    neither line nor column."""
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(Config, str(f))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_yaml_merge_key_may_be_overridden(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("grpo:\n  <<: {lr: 1.0e-3, steps: 3}\n  lr: 2.0e-3\n")
    cfg = load_config(Config, str(f))
    assert (cfg.grpo.lr, cfg.grpo.steps) == (2e-3, 3)


@pytest.mark.parametrize(
    "override, want",
    [
        ("logging.project=007", "007"),
        ("logging.run_name=0x10", "0x10"),
        ("logging.run_name=1_000", "1_000"),
        ("data.valid=off", "off"),
        ("logging.project=on", "on"),
        ("logging.project='007'", "007"),  # quoted: YAML unquotes it
        ("data.valid=null", ""),  # YAML's null is the empty text, as in a file
        ("data.valid=", ""),
    ],
)
def test_set_keeps_a_text_option_as_typed(override, want):
    """--set read every value as YAML, so a text option became what YAML made of it: 007 -> '7', off -> 'false'
    (a dataset named false), on -> 'true'."""
    cfg = load_config(Config, None, [override])
    section, name = override.split("=", 1)[0].split(".")
    assert getattr(getattr(cfg, section), name) == want


def test_a_list_given_to_a_text_option_names_the_key():
    """--set data.train=[builtin:train] was kept as the text '[builtin:train]': the run failed later naming a dataset
    '[builtin', never the key. Quoted, it is the text."""
    with pytest.raises(ConfigError, match=r"data.train: expected one text value, got a list '\[builtin:train\]'"):
        load_config(Config, None, ["data.train=[builtin:train]"])
    with pytest.raises(ConfigError, match=r"model.name_or_path: expected one text value, got a mapping"):
        load_config(Config, None, ["model.name_or_path={a: b}"])
    assert load_config(Config, None, ["logging.run_name='[exp 1]'"]).logging.run_name == "[exp 1]"


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["task.n_test=3000000"], "task.n_test: at most 2,000,000 problems per split"),
        (
            ["task.n_steps=1", "task.n_train=200"],
            "n_train + n_valid + n_test = 3,200 distinct problems, more than the 210",
        ),
        (
            ["task.ood_max_operand=10", "task.n_steps=1", "task.n_train=10", "task.n_valid=10", "task.n_test=60"],
            "n_test = 60 distinct ood_numbers problems, more than the 50 there are",
        ),
    ],
)
def test_a_builtin_task_that_cannot_be_drawn_is_refused_at_once(overrides, says):
    """Such a task drew problems for up to 50 times the count before giving up (or, for a huge count, without
    bound: 'builtin:test?n_test=10**23')."""
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(Config, None, overrides)
    load_config(Config, "tiny.yaml")  # (n_steps 2: 2,176 of 4,410 problems)


def test_two_test_sets_writing_one_results_folder_are_refused():
    """``data.test=[builtin:test, builtin_test]`` wrote both results into eval/builtin_test, the second over the
    first; a test set's folder and metric key hold no ``?``, ``=`` or ``&``."""
    from dgrpo.run_layout import results_name

    assert error("data.test=[builtin:test, builtin_test]") == (
        "invalid config value data.test: builtin:test and builtin_test would write one results folder "
        "(eval/builtin_test): name each test set once"
    )
    assert "name each test set once" in error("data.test=[gsm8k, gsm8k]")
    assert results_name("builtin:test?n_steps=6&modulus=10") == "builtin_test_n_steps_6_modulus_10"
    assert results_name("gsm_hard+svamp") == "gsm_hard+svamp" and results_name("données/é.jsonl") == "données_é.jsonl"
    assert load_config(Config, None, ["data.test=[]"]).data.test == []


def test_the_filter_on_a_total_of_builtin_scorers_past_1_is_refused_when_the_config_loads():
    """Found after the model loaded and the first rollouts before; the built-in scorers give 0 or 1 each."""
    from dgrpo.config import BUILTIN_SCORERS
    from dgrpo.eval.scoring import SCORERS

    assert BUILTIN_SCORERS == tuple(SCORERS)
    two = "grpo.rewards=[{fn: numeric}, {fn: exact}]"
    assert error(two).startswith("invalid config value grpo.filter: the accuracy window applies to the total reward")
    assert "reaches -0.5" in error("grpo.rewards=[{fn: numeric}, {fn: exact, weight: -0.5}]")
    for fine in (["grpo.rewards=[{fn: numeric, weight: 0.5}, {fn: exact, weight: 0.5}]"], [two, "grpo.filter=false"]):
        load_config(Config, None, fine)
    load_config(Config, None, [two, "grpo.filter_reward=numeric"])
    load_config(Config, None, ["grpo.rewards=[{fn: numeric}, {fn: my.py:f}]"])  # (a plug-in: checked on gold answers)


def test_all_linear_beside_module_names_is_refused():
    """PEFT reads all-linear only alone: beside names it was checked as a module name and said to match nothing."""
    assert error("model.lora.target_modules=[all-linear, q_proj]") == (
        "invalid config value model.lora.target_modules: all-linear stands alone (it names every linear layer but the "
        "LM head), got ['all-linear', 'q_proj']"
    )


def test_a_task_of_thousands_of_steps_is_checked_without_a_power_of_thousands_of_digits():
    """task.n_steps from ~3000 on died in a ValueError traceback (an int of more than 4300 digits in the error text,
    built even when the check passed); at 10^9 the check hung computing the number of problems (now refused by the
    operations per split, at once)."""
    small = ["task.n_train=100", "task.n_valid=10", "task.n_test=10"]
    assert load_config(Config, None, [*small, "task.n_steps=5000"]).task.n_steps == 5000
    with pytest.raises(ConfigError, match=r"task.n_steps: at most 10,000,000 operations per split"):
        load_config(Config, None, [*small, "task.n_steps=1000000000"])
    with pytest.raises(ConfigError, match=r"103,000 distinct problems, more than the 50 there are"):
        load_config(Config, None, ["task.n_train=100000", "task.n_steps=1", "task.max_operand=1"])


def test_adam_betas_are_floats_whatever_the_yaml_wrote():
    """[0, 0.999] passed the check and was recorded as given; torch then refused it after the data and the model
    loaded ("betas must be either both floats or both Tensors")."""
    betas = load_config(Config, None, ["sft.adam_betas=[0, 0.999]"]).sft.adam_betas
    assert betas == [0.0, 0.999] and all(type(b) is float for b in betas)


def test_threads_and_weight_decay_have_upper_bounds():
    """threads=100000 failed to start threads and crashed the interpreter (exit 139); weight_decay=1e30 made every
    weight non-finite at the first step, and the error advised a lower learning rate."""
    with pytest.raises(ConfigError, match=r"^invalid config value threads: at most 1024 "):
        load_config(Config, None, ["threads=100000"])
    assert load_config(Config, None, ["threads=1024"]).threads == 1024
    for section, lr in (("sft", 1e-3), ("grpo", 1e-5)):
        with pytest.raises(ConfigError, match=rf"^invalid config value {section}.weight_decay: lr x weight_decay "):
            load_config(Config, None, [f"{section}.lr={lr}", f"{section}.weight_decay={2 / lr}"])
        assert load_config(Config, None, [f"{section}.lr={lr}", f"{section}.weight_decay=0.1"])


def test_a_section_given_as_a_dict_is_a_one_line_error_naming_it():
    """``Config(grpo={"steps": 3})`` (a dict where the section's dataclass goes: Hydra's habit) was an AttributeError
    deep in validate ('dict' object has no attribute 'engine'); a nested section (model.lora) likewise."""
    with pytest.raises(ConfigError, match=r"^grpo: expected a GRPOConfig, got dict; .*start=\{'grpo': \{\.\.\.\}\}"):
        Config(grpo={"steps": 3}).validate()
    model = dataclasses.replace(Config().model, lora={"r": 4})
    with pytest.raises(ConfigError, match=r"^model.lora: expected a LoraConfig, got dict; .*'model': \{'lora'"):
        Config(model=model).validate()


def test_load_config_refuses_what_a_python_caller_slips_on_in_one_line():
    """The class left out was "'str' object is not callable"; overrides as a dict said "--set expects key=value, got
    'grpo.steps' (a positional argument goes before --set)", as one string it was read a character at a time; a tuple
    of files was a TypeError of pathlib's (a tuple of overrides already worked)."""
    with pytest.raises(TypeError, match=r"^load_config: the first argument is the config class, got str"):
        load_config("tiny.yaml")
    with pytest.raises(TypeError, match=r"overrides must be a list of 'key=value' strings.*got dict \(a dict: "):
        load_config(Config, "tiny.yaml", {"grpo.steps": 3})
    with pytest.raises(TypeError, match=r"overrides must be a list of 'key=value' strings.*got str$"):
        load_config(Config, "tiny.yaml", "grpo.steps=3")
    both = load_config(Config, ("tiny.yaml", "builtin/grpo_sampling.yaml"), ("grpo.steps=3",))
    assert (both.model.hidden_size, both.perturbation.kind, both.grpo.steps) == (64, "none", 3)


def test_a_config_files_base_written_in_another_case_is_named(tmp_path):
    """``Base: tiny.yaml`` was 'unknown config key 'Base'' beside the sections' names, with no word of ``base``."""
    from dgrpo.config import Config, ConfigError, load_config

    path = tmp_path / "mine.yaml"
    path.write_text("Base: tiny.yaml\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'Base'; did you mean base \(lower case: the file this"):
        load_config(Config, [str(path)], [])


def test_a_dotted_key_in_a_config_file_says_the_file_nests_it(tmp_path):
    """``grpo.steps: 3`` in a YAML file (--set's form) was 'unknown config key 'grpo.steps'' beside a list of known
    keys that holds grpo, with no word of the nesting a file needs."""
    from dgrpo.config import Config, ConfigError, load_config

    path = tmp_path / "mine.yaml"
    path.write_text("grpo.steps: 3\n")
    with pytest.raises(ConfigError, match=r"'grpo.steps'; a config file nests it, grpo: \{steps: ...\} \(grpo.steps="):
        load_config(Config, [str(path)], [])
    path.write_text("model.lora.r: 8\n")
    with pytest.raises(ConfigError, match=r"nests it, model: \{lora: \{r: ...\}\} \(model.lora.r=... is the form"):
        load_config(Config, [str(path)], [])
    path.write_text("model: {lora.r: 8}\n")  # (within a section: --set's form is the whole key, it said lora.r=...)
    with pytest.raises(ConfigError, match=r"nests it, lora: \{r: ...\} \(model.lora.r=... is the form of --set\)"):
        load_config(Config, [str(path)], [])


def test_a_key_in_other_case_is_told_its_name():
    """``--set GRPO.steps=3`` had no 'did you mean' (difflib compares case: GRPO and grpo score 0)."""
    from dgrpo.config import Config, ConfigError, load_config

    with pytest.raises(ConfigError, match=r"unknown config key 'GRPO'; did you mean grpo\?"):
        load_config(Config, None, ["GRPO.steps=3"])
    with pytest.raises(ConfigError, match=r"unknown config key 'grpo.Steps'; did you mean grpo.steps\?"):
        load_config(Config, None, ["grpo.Steps=3"])


def test_a_cuda_index_torch_cannot_read_as_written_is_refused():
    """torch's device index is 8 bits: ``device=cuda:128`` was accepted and became cuda:-128, ``cuda:32767`` the
    current device (``cuda``), and ``cuda:99999999999999999999`` or ``cuda:007`` a traceback once the run had begun."""
    from dgrpo.config import Config, ConfigError, load_config

    for device in ("cuda:128", "cuda:32767", "cuda:99999999999999999999", "cuda:007", "cuda:"):
        with pytest.raises(
            ConfigError, match=r"^invalid config value device: expected .*cuda:N \(N a GPU index, 0 to 127"
        ):
            load_config(Config, None, [f"device={device}"])
    assert [load_config(Config, None, [f"device={d}"]).device for d in ("cuda:0", "cuda:127", "cuda")] == [
        "cuda:0",
        "cuda:127",
        "cuda",
    ]


def test_a_float_float32_cannot_hold_is_refused():
    """A float option meets float32 or bfloat16 tensors: ``grpo.eps_high=1e300`` was accepted and overflowed torch's
    clamp in a traceback at the first update ("value cannot be converted to type float without overflow"), and
    ``grpo.temperature=1e-300``, 0 in float32, made every loss NaN; 0 itself and float32's extremes are accepted."""
    from dgrpo.config import Config, ConfigError, load_config

    float32_max, float32_tiny = 3.4028234663852886e38, 1.1754943508222875e-38  # (numpy.finfo(numpy.float32))
    for setting in ("grpo.eps_high=1e300", "grpo.temperature=1e-300", "perturbation.sigma=-1e39", "grpo.lr=1e-40"):
        key = setting.partition("=")[0]
        with pytest.raises(ConfigError, match=rf"^invalid config value {key}: must be 0 or of a size float32 holds, "):
            load_config(Config, None, [setting])
    with pytest.raises(ConfigError, match=r"grpo.rewards item 0 weight: must be 0 or of a size float32 holds"):
        load_config(Config, None, ["grpo.rewards=[{fn: numeric, weight: 1.0e300}]", "grpo.filter=false"])
    cfg = load_config(Config, None, [f"grpo.eps_high={float32_max!r}", f"grpo.temperature={float32_tiny!r}"])
    assert (cfg.grpo.eps_high, cfg.grpo.temperature) == (float32_max, float32_tiny)
    assert load_config(Config, None, ["grpo.temperature=0", "grpo.beta0=0.0"]).grpo.beta0 == 0.0


def test_a_filter_bound_out_of_range_is_named_itself():
    """``grpo.alpha_max=-1`` was refused as 'grpo.alpha_min: alpha_min (0.2) > alpha_max (-1.0)', naming the option
    left at its default, and ``grpo.alpha_min=2.5`` as above alpha_max, not as outside [0, 1]."""
    from dgrpo.config import Config, ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^invalid config value grpo.alpha_max: must be in \[0, 1\], got -1.0$"):
        load_config(Config, None, ["grpo.alpha_max=-1"])
    with pytest.raises(ConfigError, match=r"^invalid config value grpo.alpha_min: must be in \[0, 1\], got 2.5$"):
        load_config(Config, None, ["grpo.alpha_min=2.5"])
    with pytest.raises(
        ConfigError, match=r"^invalid config value grpo.alpha_min: alpha_min \(0.9\) > alpha_max \(0.5\)"
    ):
        load_config(Config, None, ["grpo.alpha_min=0.9", "grpo.alpha_max=0.5"])


def test_a_choice_option_given_a_list_or_a_mapping_names_its_choices():
    """``--set sft.mode=[cot]`` was 'invalid config value sft.mode: expected a string, got ['cot']': no word of the
    values sft.mode takes (a scalar of another kind named them)."""
    from dgrpo.config import Config, ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^invalid config value sft.mode: expected coconut, cot, no_cot, pause or "):
        load_config(Config, None, ["sft.mode=[cot]"])
    with pytest.raises(ConfigError, match=r"^invalid config value perturbation.kind: expected locked, native, gauss"):
        load_config(Config, None, ["perturbation.kind={locked: 1}"])
    with pytest.raises(ConfigError, match=r"^invalid config value sft.bf16: expected auto, true or false; got \[\]$"):
        load_config(Config, None, ["sft.bf16=[]"])


def test_an_option_in_the_wrong_section_is_told_its_section_nested_ones_too():
    """The LoRA options live in model.lora: ``--set model.r=8`` (or ``grpo.target_modules``, ``r``) was 'unknown
    config key' with no 'did you mean' (the sections searched were the top level's only), and a close spelling in
    the section hid the option of that very name elsewhere (``task.train``: task.n_train only; ``grpo.seed``:
    nothing)."""
    from dgrpo.config import Config, ConfigError, load_config

    for setting, hint in (
        ("model.r=8", "model.lora.r"),
        ("grpo.target_modules=[q_proj]", "model.lora.target_modules"),
        ("r=8", "model.lora.r"),
        ("task.train=a.jsonl", "task.n_train or data.train"),
        ("grpo.seed=3", "seed or task.seed"),
    ):
        key = setting.partition("=")[0]
        with pytest.raises(ConfigError, match=rf"^unknown config key '{key}'; did you mean {hint}\? \(known: "):
            load_config(Config, None, [setting])


def test_model_options_another_model_option_leaves_unused_are_said():
    """``model.lora.alpha=32`` without adapters (``model.lora.r=0``), ``model.compile_backend=eager`` without
    ``model.compile``, ``model.master_weights=true`` on float32 weights: each was accepted and did nothing, without a
    word; GRPO and SFT training now warn (one line per group), and say nothing where the options act."""
    from dgrpo.config import Config, load_config, packaged_configs, unused_model_settings

    def said(*overrides: str, config: str | None = None) -> list[str]:
        cfg = load_config(Config, config, list(overrides))
        lines = unused_model_settings(cfg.model)
        assert set(lines) <= set(cfg.inert_settings())  # (GRPO's warnings at its start; SFT's list has them too)
        return lines

    assert said("model.lora.alpha=32", "model.lora.dropout=0.1") == [
        "model.lora.alpha=32.0, model.lora.dropout=0.1 change nothing with model.lora.r=0 (no adapters: every weight "
        "is trained)"
    ]
    assert said("model.compile_backend=eager") == [
        "model.compile_backend=eager changes nothing with model.compile=false"
    ]
    assert said("model.master_weights=true") == [
        "model.master_weights=true changes nothing with model.dtype=float32 (float32 weights)"
    ]
    assert said("model.master_weights=true", "model.dtype=bfloat16", "model.lora.r=2") == [
        "model.master_weights=true changes nothing with LoRA (float32 adapters)"
    ]
    assert said("model.lora.r=4", "model.lora.alpha=32") == []
    assert said("model.compile=true", "model.compile_backend=eager") == []
    assert said("model.master_weights=true", "model.dtype=bfloat16") == []
    assert [name for name in packaged_configs() if said(config=name)] == []
    import warnings

    from dgrpo.data.records import Record
    from dgrpo.training.sft import _warn_at_start

    with warnings.catch_warnings(record=True) as caught:  # SFT's start warns of them too
        warnings.simplefilter("always")
        cfg = load_config(Config, None, ["model.compile_mode=max-autotune-no-cudagraphs"])
        _warn_at_start([Record("q", ["s"], "1", {})] * 4, None, cfg)
    assert "model.compile_mode=max-autotune-no-cudagraphs changes nothing with model.compile=false" in [
        str(w.message) for w in caught
    ]


def test_a_text_option_written_as_a_number_in_a_file_keeps_its_text(tmp_path):
    """A config file's ``model: {revision: 1.10}`` was the revision '1.1' (another tag), ``logging: {run_name:
    1_000}`` the name '1000', ``project: 0x1F`` '31': YAML read them as numbers, and their text was lost, while
    ``--set model.revision=1.10`` kept '1.10'. Number options read the same numbers as before, as plain ints and
    floats."""
    from dgrpo.config import Config, load_config, to_dict

    path = tmp_path / "mine.yaml"
    path.write_text(
        "model: {revision: 1.10}\nlogging: {run_name: 1_000, project: 0x1F}\n"
        "grpo: {steps: 0x10, lr: 2.50e-5, adam_betas: [0.9, 0.99], filter: 1}\nsft: {stage_epochs: [1, 2]}\n"
    )
    cfg = load_config(Config, [str(path)], [])
    assert (cfg.model.revision, cfg.logging.run_name, cfg.logging.project) == ("1.10", "1_000", "0x1F")
    assert (cfg.grpo.steps, cfg.grpo.lr, cfg.grpo.filter, cfg.sft.stage_epochs) == (16, 2.5e-5, True, [1, 2])
    assert load_config(Config, None, ["model.revision=1.10"]).model.revision == "1.10"

    def types(value: object) -> set[type]:
        if isinstance(value, dict):
            return set().union(*map(types, value.values()))
        return set().union(*map(types, value)) if isinstance(value, list) else {type(value)}

    assert types(to_dict(cfg)) <= {int, float, str, bool}


def test_a_text_option_written_as_a_boolean_in_a_file_keeps_its_text(tmp_path):
    """A config file's ``logging: {run_name: off}`` was the run name 'false', ``model: {revision: yes}`` the revision
    'true': YAML reads off, yes... as booleans, and the text was lost (``--set logging.run_name=off`` kept 'off').
    Boolean options still read yes / no / on / off, an auto switch's choices 'true' / 'false' too, lists their
    booleans, and a base file's text reaches the file built on it."""
    (tmp_path / "base.yaml").write_text("logging: {project: On}\n")
    path = tmp_path / "mine.yaml"
    path.write_text(
        "base: base.yaml\nlogging: {run_name: off, entity: 'no'}\n"
        "model: {revision: yes, compile_head: yes, trust_remote_code: no}\n"
        "grpo: {filter: off, keep_graphs: on}\nsft: {recompute: yes}\n"
    )
    cfg = load_config(Config, [str(path)], [])
    assert (cfg.logging.run_name, cfg.logging.entity, cfg.logging.project, cfg.model.revision) == (
        "off",
        "no",
        "On",
        "yes",
    )
    assert (cfg.model.compile_head, cfg.model.trust_remote_code, cfg.grpo.filter, cfg.grpo.keep_graphs) == (
        "true",
        False,
        False,
        True,
    )
    assert type(cfg.grpo.keep_graphs) is bool and type(cfg.sft.recompute) is bool and cfg.sft.recompute
    assert load_config(Config, None, ["logging.run_name=off", "model.revision=yes"]).logging.run_name == "off"
    (tmp_path / "kind.yaml").write_text("perturbation: {kind: off}\n")  # (no 'off' among the choices: named as written)
    with pytest.raises(ConfigError, match=r"or package.module:Class; got 'off'$"):
        load_config(Config, [str(tmp_path / "kind.yaml")], [])
    (tmp_path / "layers.yaml").write_text("perturbation: {layers: [1, 3, 5]}\n")  # (a YAML list of indices)
    with pytest.raises(ConfigError, match=re.escape("got [1, 3, 5] (layer indices are one text: 1,3,5)")):
        load_config(Config, [str(tmp_path / "layers.yaml")], [])


def _option_values(obj: typing.Any, prefix: str = "") -> Iterator[tuple[str, object]]:
    """(dotted key, value) of every option of config ``obj``, its sections' included."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _option_values(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", value


def _plain_types(value: object) -> set[type]:
    """The types of ``value`` and, in a list or a mapping, of its items (keys included)."""
    if isinstance(value, dict):
        return {dict}.union(*map(_plain_types, value), *map(_plain_types, value.values()))
    return {list}.union(*map(_plain_types, value)) if isinstance(value, list) else {type(value)}


@pytest.mark.parametrize("name", packaged_configs())
def test_every_packaged_config_holds_plain_values(name):
    """The loader's numbers and booleans (which keep their text for text options) never reach a loaded config: every
    option of every packaged config is a plain bool, int, float or str, or a list or mapping of them."""
    for key, value in _option_values(load_config(Config, name)):
        assert _plain_types(value) <= {bool, int, float, str, list, dict}, (key, value)


@pytest.mark.parametrize(
    "written, mode",
    [("off", "none"), ("false", "none"), ("0", "none"), ("no_thanks", None), ("on", "full"), ("true", "full")]
    + [("1", "full"), ("FULL", "full"), ("sharded", "sharded"), ("none", "none"), ("yes", None)],
)
def test_fsdp_in_a_file_takes_the_spellings_of_the_environment_variable(tmp_path, monkeypatch, written, mode):
    """``fsdp: off`` or ``fsdp: true`` in a config file (and ``--set fsdp=off``) was refused, 'expected none, full or
    sharded', while ``DGRPO_FSDP=off`` was taken as none: the key reads what the variable reads, as the same mode."""
    from dgrpo.config import FSDP_ENV, fsdp_from_env

    monkeypatch.setenv(FSDP_ENV, written)
    try:
        from_env = fsdp_from_env()
    except ConfigError:
        from_env = None
    assert from_env == mode
    path = tmp_path / "fsdp.yaml"
    path.write_text(f"fsdp: {written}\n")
    for args in (([str(path)], []), (None, [f"fsdp={written}"])):
        if mode is None:
            with pytest.raises(ConfigError, match=r"expected none, full or sharded \(or 0 / false / off, 1 / true"):
                load_config(Config, *args)
        else:
            assert load_config(Config, *args).fsdp == mode


@pytest.mark.parametrize(
    "overrides, says",
    [
        (
            ["perturbation.kind=native", "perturbation.sites=[mlp, residual]", "perturbation.layers=0:2"],
            r"^perturbation.sites=\['mlp', 'residual'\], perturbation.layers=0:2 change nothing with "
            r"perturbation.kind=native \(the model's own attention dropout, in every layer\)$",
        ),
        (
            ["perturbation.kind=native", "perturbation.gaussian_target=weights"],
            r"^perturbation.gaussian_target=weights changes nothing with perturbation.kind=native",
        ),
        (
            ["perturbation.kind=locked", "perturbation.gaussian_target=weights"],
            r"^perturbation.gaussian_target=weights changes nothing with perturbation.kind=locked",
        ),
        (["perturbation.kind=native", "perturbation.sites=[attn]"], None),  # (where native dropout acts)
        (["perturbation.kind=native"], None),
        (["perturbation.kind=gaussian", "perturbation.gaussian_target=weights", "perturbation.sites=[attn]"], None),
        (["perturbation.kind=none", "perturbation.gaussian_target=weights"], None),
    ],
)
def test_placement_options_native_and_locked_do_not_read_are_named(overrides, says):
    """Native dropout reads neither perturbation.sites nor layers nor gaussian_target, locked dropout not
    gaussian_target (dgrpo.perturbation's from_config): each was accepted and did nothing, without a word.
    paper/grpo_native.yaml keeps paper/grpo_dropout.yaml's sites: [attn] and is clean (the test above)."""
    lines = [line for line in load_config(Config, None, overrides).inert_settings() if "perturbation." in line]
    if says is None:
        assert lines == []
    else:
        assert len(lines) == 1 and re.search(says, lines[0]), lines


def test_model_compile_of_the_builtin_gpt2_is_refused_before_data_or_model(tmp_path, monkeypatch, capsys):
    """``model.compile=true`` with the built-in model's ``model.arch=gpt2`` was refused only once the data was read
    and the model built, though the config names the architecture; a model loaded (--init) is checked when loaded."""
    from dgrpo.cli import main
    from dgrpo.cli import train as cli_train
    from dgrpo.model.factory import check_builtin_compiles

    def no_data(*args: object, **kwargs: object) -> None:
        raise AssertionError("the data was read before the refusal")

    monkeypatch.setattr(cli_train, "read_setting", no_data)
    out = tmp_path / "run"
    args = ["sft", "--config", "tiny.yaml", "--set", "model.arch=gpt2", "--set", "model.compile=true"]
    assert main([*args, "--out", str(out)]) == 2
    assert "model.compile: the compiled layers run qwen2, llama decoders" in capsys.readouterr().err
    assert not out.exists()
    gpt2 = load_config(Config, None, ["model.arch=gpt2", "model.compile=true"]).model
    check_builtin_compiles(gpt2, init="runs/sft")  # (a checkpoint's architecture: known once loaded)
    check_builtin_compiles(load_config(Config, None, ["model.compile=true"]).model)


@pytest.mark.parametrize("written", ["yes", "No", "2", "1.0"])
def test_a_refused_fsdp_value_is_named_as_written(tmp_path, written):
    """``fsdp: yes`` was refused as 'got True' beside choices that name true: the value as the file wrote it."""
    path = tmp_path / "c.yaml"
    path.write_text(f"fsdp: {written}\n")
    for source in ({"path": path}, {"overrides": [f"fsdp={written}"]}):
        with pytest.raises(ConfigError, match=rf"invalid config value fsdp: expected .*; got '{written}'$"):
            load_config(Config, **source)


@pytest.mark.parametrize("written", ["on", "No", "1", "1.10"])
def test_an_unknown_key_written_as_a_yaml_boolean_or_number_is_named_as_written(tmp_path, written):
    """A key YAML reads as a boolean or a number (``on: 3``) was named as Python prints it: 'unknown config key
    'grpo.True''; the loader keeps the text, and the key is named as the file wrote it."""
    path = tmp_path / "c.yaml"
    path.write_text(f"grpo:\n  {written}: 3\n")
    with pytest.raises(ConfigError, match=rf"unknown config key 'grpo\.{re.escape(written)}' \(known: "):
        load_config(Config, path)


@pytest.mark.parametrize("weight", ["1" + "0" * 400, "-1" + "0" * 400, ".nan", "-.inf"])
def test_a_reward_weight_past_floats_range_is_one_line(weight):
    """``grpo.rewards`` with an integer weight past float's range was an OverflowError traceback (math.isfinite of
    it); such a weight, as a NaN or an infinite one, is refused naming the item's weight."""
    with pytest.raises(ConfigError, match=r"^invalid config value grpo.rewards item 0 weight: must be a finite number"):
        load_config(Config, None, [f"grpo.rewards=[{{fn: exact, weight: {weight}}}]"])


@pytest.mark.parametrize(
    "override, hint",
    [("lora={r: 8}", "lora'; did you mean model.lora?"), ("grpo.lora.r=8", "grpo.lora'; did you mean model.lora?")],
)
def test_an_unknown_key_is_told_the_nested_section_of_its_name(override, hint):
    """``lora: {r: 8}`` at the top (PEFT's own word, without model:) was 'unknown config key 'lora'' beside a list
    of the top's sections that lacks it: a nested section of that name is named, as a nested option is."""
    with pytest.raises(ConfigError, match=rf"unknown config key '{re.escape(hint)} \(known: "):
        load_config(Config, None, [override])


@pytest.mark.parametrize("betas", ["[0.9, 1e-300]", "[0.9, 1.0e-300]", "0.9,1e-300"])
def test_adam_betas_hold_sizes_float32_holds_as_every_float_option(betas):
    """``adam_betas=[0.9, 1.0e-300]`` was taken (a float option refuses 1e-300, 0 in float32) and ``[0.9, 1e-300]``
    (text to YAML 1.1) refused as 'expected two numbers in [0, 1)', which it is: both are refused by the rule."""
    with pytest.raises(ConfigError, match=r"^invalid config value grpo.adam_betas: must be 0 or of a size float32"):
        load_config(Config, None, [f"grpo.adam_betas={betas}"])


@pytest.mark.parametrize("written", ["2024-12-05T10:00:00Z", "2001-12-14 21:59:43.10 -5", "2024-12-05"])
def test_a_timestamp_in_a_file_is_the_text_it_was_written_as(tmp_path, written):
    """YAML reads a timestamp as a datetime: ``run_name: 2024-12-05T10:00:00Z`` was the name '2024-12-05
    10:00:00+00:00' (``--set`` kept it as typed), and a list item a date no text check took. No option takes a
    date: a timestamp is its text, in a text option as in a list."""
    path = tmp_path / "c.yaml"
    path.write_text(f"logging:\n  run_name: {written}\ndata:\n  test: [{written}]\n")
    cfg = load_config(Config, path)
    assert (cfg.logging.run_name, cfg.data.test) == (written, [written])
    assert load_config(Config, None, [f"logging.run_name={written}"]).logging.run_name == written


@pytest.mark.parametrize(
    "text, says",
    [
        ("1: a\non: b\n", "unknown config key '1'"),  # (was 'the key True is given twice': 1 == True to Python)
        ("grpo:\n  on: 1\n  yes: 2\n", "unknown config key 'grpo.on'"),  # (was 'the key True is given twice')
        ("grpo:\n  1: a\n  1.0: b\n", "unknown config key 'grpo.1'"),  # (was 'the key 1.0 is given twice')
        ("on: a\non: b\n", "the key 'on' is given twice in one mapping (line 2, column 1)"),  # (was 'the key True')
        ("grpo:\n  rewards:\n    - {fn: numeric, on: 1}\n", "item 0: unknown key(s) on (expected"),  # (was True)
    ],
)
def test_a_yaml_key_is_the_name_it_was_written_as(tmp_path, text, says):
    """Every key of a config names an option or a part of a reward item, none a number or a boolean: a key YAML reads
    as one (``on``, ``yes``, ``1``) is the text it was written as. ``1:`` beside ``on:`` were two keys refused as one
    given twice, 'the key True' (1 == True == 1.0 to Python), and a reward item's ``on:`` was the unknown key True."""
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(Config, str(f))


@pytest.mark.parametrize(
    "written, layers",
    [("+1", ["list", [1]]), ("+0:+2", ["slice", (0, 2)]), ("-2:+3", ["slice", (-2, 3)]), ("+1, 3", ["list", [1, 3]])],
)
def test_a_layer_index_with_a_plus_sign_is_that_layer_in_a_file_and_in_set(tmp_path, written, layers):
    """``layers: +1`` in a file was the layer 1 while YAML read it as a number; the file's text is kept now, and
    ``+1`` was refused by the layer grammar, in a file as from ``--set``. A '+' sign is read as Python reads it."""
    f = tmp_path / "c.yaml"
    f.write_text(f"perturbation:\n  layers: {written}\n")
    for cfg in (load_config(Config, str(f)), load_config(Config, None, [f"perturbation.layers={written}"])):
        assert list(parse_layer_spec(cfg.perturbation.layers)) == layers


@pytest.mark.parametrize(
    "written, says",
    [
        ("1_0", "a layer index is written without '_', got '1_0': 10 for one layer, 1,0 for several"),
        ("+1,1", "a layer is named twice in '+1,1'"),  # (its text differs: '+1' and '1' were two items)
        ("01, 1", "a layer is named twice in '01, 1'"),
    ],
)
def test_a_layer_index_yaml_1_1_read_as_a_number_is_refused_alike_in_a_file_and_in_set(tmp_path, written, says):
    """``layers: 1_0`` was the layer 10 while YAML 1.1 read it as a number ('_' separates its digits); no index of
    the layer grammar is written so: refused, saying what to write, in a file as from ``--set``. A layer given twice
    in two spellings is refused as one given twice is."""
    f = tmp_path / "c.yaml"
    f.write_text(f"perturbation:\n  layers: {written}\n")
    for source, sets in ((str(f), []), (None, [f"perturbation.layers={written}"])):
        with pytest.raises(ConfigError, match=re.escape(f"invalid config value perturbation.layers: {says}") + "$"):
            load_config(Config, source, sets)
