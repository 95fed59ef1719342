"""Every value coerced to its option's type as it is applied (:func:`_coerce`): a ``Literal`` option's choices, a
float finite and of a size float32 holds, an int that fits in int64, a boolean's spellings, lists; the numbers and
booleans YAML gives as written (:class:`_Written`), and the options of a config class (:func:`_options`)."""

from __future__ import annotations

import functools
import math
import re
import typing
from collections.abc import Callable, Iterator
from dataclasses import fields, is_dataclass
from typing import Any, Literal, NamedTuple

from .base import (
    _INT64_MAX,
    _INT64_MIN,
    FLOAT32_MAX,
    FLOAT32_TINY,
    FSDP_ENV,
    REGISTERED_CHOICES,
    ConfigError,
    _invalid,
    fsdp_mode,
)


def _one_of(choices: tuple[str, ...]) -> str:
    """``a, b or c``."""
    return choices[0] if len(choices) == 1 else f"{', '.join(choices[:-1])} or {choices[-1]}"


def _to_str(value: Any, key: str) -> str:
    """A scalar as a string; a number or a boolean of a YAML file as written (``off``, ``yes``: YAML reads true,
    off, yes... as booleans), a boolean given in Python as 'true' / 'false'."""
    if isinstance(value, (dict, list)):
        listed = isinstance(value, list) and key == "perturbation.layers" and all(type(v) is int for v in _plain(value))
        hint = f" (layer indices are one text: {','.join(str(v) for v in _plain(value))})" if listed else ""
        raise _invalid(key, f"expected a string, got {_plain(value)!r}{hint}")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, _Written):  # (of a YAML file: the text as written, as --set's)
        return value.yaml_text
    return "" if value is None else str(value)


#: the choice options that also take a plug-in, ``path/to/file.py:Class`` or ``package.module:Class`` (imported when
#: the run builds it: dgrpo.perturbation.kind_class)
PLUGIN_CHOICES = {"perturbation.kind": "a kind of your own as its class, path/to/file.py:Class or package.module:Class"}


def _to_choice(value: Any, choices: tuple[str, ...], key: str) -> str:
    """A ``Literal`` option: one of ``choices`` (or, for :data:`PLUGIN_CHOICES`, a plug-in spec); a list or a mapping
    is refused with the choices too (it was 'expected a string', which named none)."""
    scalar = not isinstance(value, (dict, list))
    text = _to_str(value, key) if scalar else ""
    if isinstance(value, _TextBool) and text not in choices:  # (a YAML boolean: 'true' / 'false', as auto switches')
        text = _to_str(value.value, key)
    plugged = key in PLUGIN_CHOICES and re.fullmatch(r"[^:\s].*:[A-Za-z_]\w*", text)
    if not scalar or (text not in choices and not plugged):
        got = repr(value.yaml_text if isinstance(value, _TextBool) else _plain(value))  # (kind: off was 'false')
        if isinstance(value, bool):
            got = f"{text!r} (YAML reads true, false, yes, no, on, off as booleans)"
        plugin = f", or {PLUGIN_CHOICES[key]}" if key in PLUGIN_CHOICES else ""
        raise _invalid(key, f"expected {_one_of(choices)}{plugin}; got {got}")
    return text


def _to_bool(value: Any, key: str) -> bool:
    """A boolean: a YAML boolean, the number 1 or 0, or true / false / yes / no / on / off / 1 / 0 as text (the words
    a YAML file or ``--set`` reads as booleans: ``on`` set from Python was refused)."""
    if isinstance(value, (bool, _TextBool)):
        return bool(value)
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
        return value.lower() in ("true", "yes", "on", "1")
    raise _invalid(key, f"expected true or false, got {value!r}")


def _to_int(value: Any, key: str) -> int:
    """An integer that fits in int64: an int, an integral float (``1e3``) or their text."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise _invalid(key, f"expected an integer, got {value!r}")
    number: int | float
    if not isinstance(value, str):
        number = value
    else:
        try:
            number = int(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                raise _invalid(key, f"expected an integer, got {value!r}") from None
    if isinstance(number, float):
        if not (math.isfinite(number) and number.is_integer()):
            raise _invalid(key, f"expected an integer, got {value!r}")
        number = int(number)
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise _invalid(key, f"must fit in a signed 64-bit integer, got {value}")
    return int(number)


def _to_float(value: Any, key: str) -> float:
    """A finite float: a number or its text (``1e-5``); NaN and +-inf are rejected, and so is a size float32 does not
    hold as a normal number (:data:`FLOAT32_TINY`, :data:`FLOAT32_MAX`)."""
    if isinstance(value, bool):
        raise _invalid(key, f"expected a number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _invalid(key, f"expected a number, got {value!r}") from None
    except OverflowError:  # an integer beyond the float range
        raise _invalid(key, f"must be a finite number, got {value}") from None
    if not math.isfinite(number):
        raise _invalid(key, f"must be a finite number, got {number}")
    if not (number == 0 or FLOAT32_TINY <= abs(number) <= FLOAT32_MAX):
        raise _invalid(
            key, f"must be 0 or of a size float32 holds, {FLOAT32_TINY:.2g} to {FLOAT32_MAX:.2g}, got {number:g}"
        )
    return number


def _to_list(value: Any, key: str) -> list:
    """A list: a YAML list, or comma-separated text (whose numbers are numbers: ``1,1,2`` as ``[1, 1, 2]``,
    ``0.9,0.999`` as ``[0.9, 0.999]``, the same lists as in brackets), or one number alone, a list of it (``2`` as
    ``[2]``, as one text item ``mlp`` is ``['mlp']``; it was refused). Items stay as YAML reads them: a list of
    numbers reads its text items itself (:func:`_numbers`); a boolean or a mapping alone is no list."""
    if isinstance(value, str):
        value = [_list_item(v.strip()) for v in value.split(",") if v.strip()]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list):
        raise _invalid(key, f"expected a list, got {value!r}")
    return _plain(list(value))


def _fits_in(asked: int, modulus: int, ops: int, n_steps: int) -> bool:
    """``asked <= modulus * ops ** n_steps``, without computing the power once it is past any split's size (a
    thousands-step task made a number of more digits than Python prints, a billion-step one hung)."""
    if ops >= 2 and n_steps > 64:  # (2^64 problems: more than any split holds)
        return True
    return asked <= modulus * ops**n_steps


def _count(modulus: int, ops: int, n_steps: int) -> str:
    """``modulus * ops ** n_steps`` as an error shows it (built before the check: past 2^64, not computed)."""
    return "more than 2^64" if ops >= 2 and n_steps > 64 else f"{modulus * ops**n_steps:,}"


def _numbers(items: list, read: Callable[[Any, str], Any], key: str) -> list:
    """The items of a list of numbers read as numbers by ``read`` (YAML 1.1 reads ``1e-3``, without a '.', and
    ``03``, a leading 0, as text), whose refusal of a number stands (adam_betas=[0.9, 1e-300] was 'expected two
    numbers in [0, 1)', and [0.9, 1.0e-300] was taken, though no float option holds a size float32 lacks); other
    items as they are, for the caller's check."""
    out = []
    for item in items:
        try:
            out.append(read(item, key) if isinstance(item, (str, int, float)) and not isinstance(item, bool) else item)
        except ConfigError:
            if _is_number(item):
                raise
            out.append(item)
    return out


def _is_number(item: Any) -> bool:
    """Whether ``item`` is a number, or text Python reads as one."""
    try:
        float(item)
    except (TypeError, ValueError, OverflowError):
        return False
    return not isinstance(item, bool)


def _list_item(text: str) -> int | float | str:
    """One item of a comma-separated list: a whole number, a decimal number, else the text, as YAML 1.1 reads the
    item in brackets (an exponent's sign written: ``1.5e3`` is text there, and was 1500.0 in comma text)."""
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    return float(text) if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+)([eE][+-]\d+)?", text) else text


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """``value`` (from YAML or ``--set``) as an option of type ``tp``, or a one-line ConfigError naming ``key``."""
    if key == "fsdp":  # (its choices, or a spelling DGRPO_FSDP takes)
        return _to_fsdp(value, key)
    if typing.get_origin(tp) is Literal:
        return _to_choice(value, (*typing.get_args(tp), *REGISTERED_CHOICES.get(key, ())), key)
    if tp is list or typing.get_origin(tp) is list:
        return _to_list(value, key)
    converters = {bool: _to_bool, int: _to_int, float: _to_float, str: _to_str}
    return converters[tp](value, key) if tp in converters else _plain(value)


def _to_fsdp(value: Any, key: str) -> str:
    """``fsdp``: none, full or sharded, or a spelling :data:`FSDP_ENV` takes (0 / false / off, 1 / true / on, any
    case), with the same meaning (``fsdp: off`` in a file was refused, ``DGRPO_FSDP=off`` taken)."""
    scalar = not isinstance(value, (dict, list))
    text = _to_str(value, key) if scalar else ""
    try:
        return fsdp_mode(text, key)
    except ConfigError:  # (the text as written: fsdp: yes was 'got True', which the choices seemed to name)
        got = repr(text if scalar else value)
        raise _invalid(
            key, f"expected none, full or sharded (or 0 / false / off, 1 / true / on, as {FSDP_ENV}); got {got}"
        ) from None


class _Written:
    """A number or a boolean a YAML file wrote, with its text as written (``yaml_text``): a text option takes the
    text, and :func:`_plain` makes it the plain value."""

    __slots__ = ()
    yaml_text: str


class _TextInt(_Written, int):
    """An int a YAML file wrote."""


class _TextFloat(_Written, float):
    """A float a YAML file wrote."""


class _TextBool(_Written):
    """A boolean a YAML file wrote (``true``, ``off``, ``yes``...), with its text as written (``yaml_text``): a boolean
    option takes the boolean (``value``), a text option the text (``run_name: off`` was the name 'false'). Python's
    bool cannot be subclassed: it compares, hashes, prints and tests as its boolean, and :func:`_plain` makes it
    one."""

    __slots__ = ("value", "yaml_text")

    def __init__(self, value: bool, yaml_text: str) -> None:
        self.value, self.yaml_text = value, yaml_text

    def __bool__(self) -> bool:
        return self.value

    def __eq__(self, other: object) -> bool:
        return self.value == (other.value if isinstance(other, _TextBool) else other)

    def __hash__(self) -> int:
        return hash(self.value)

    def __repr__(self) -> str:
        return repr(self.value)

    def __str__(self) -> str:
        return str(self.value)


def _plain(value: Any) -> Any:
    """``value`` with the numbers and booleans of :class:`ConfigLoader` (in lists and mappings too) as plain ints,
    floats and bools."""
    if isinstance(value, _TextBool):
        return value.value
    if isinstance(value, _TextInt):
        return int(value)
    if isinstance(value, _TextFloat):
        return float(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}  # (keys are names: ConfigLoader.construct_mapping)
    return value


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """The resolved type annotations of dataclass ``cls``'s options, resolved once per class (every override and every
    coercion asked again: loading tiny.yaml with nine overrides took 16.9 ms, now 4.8 ms); read only."""
    return typing.get_type_hints(cls)


def _field_type(cls: type, name: str) -> Any:
    """The resolved type annotation of option ``name`` of dataclass ``cls``."""
    return _type_hints(cls)[name]


def _section_error(key: str, tp: type, value: object) -> ConfigError:
    """A section given as something else than its class (``Config(grpo={"steps": 3})``: an AttributeError deep in the
    checks, 'dict' object has no attribute ...), and how to give values by key."""
    start = "{...}"
    for part in reversed(key.split(".")):
        start = f"{{{part!r}: {start}}}"
    return ConfigError(
        f"{key}: expected a {tp.__name__}, got {type(value).__name__}; values by key go through "
        f"load_config(Config, start={start}) or are set on the section ({key}.NAME = value)"
    )


def _coerce_fields(obj: Any, prefix: str) -> None:
    """Coerce every option of dataclass ``obj`` (and its sections) to its type in place (:func:`_coerce`); a section
    that is not an instance of its class is a one-line ConfigError (:func:`_section_error`)."""
    cls: type = type(obj)
    hints = _type_hints(cls)
    for f in fields(obj):
        tp, value, key = hints[f.name], getattr(obj, f.name), f"{prefix}{f.name}"
        if isinstance(tp, type) and is_dataclass(tp) and not isinstance(value, tp):
            raise _section_error(key, tp, value)
        if is_dataclass(value):
            _coerce_fields(value, key + ".")
        else:
            setattr(obj, f.name, _coerce(value, tp, key))


class Option(NamedTuple):
    """One option, for the documentation."""

    key: str  # dotted, e.g. grpo.lr
    type: Any
    default: Any
    doc: str


def _options(cls: type, prefix: str = "") -> Iterator[Option]:
    """Every option of dataclass ``cls``, depth first, in declaration order."""
    inst, hints = cls(), _type_hints(cls)
    for f in fields(cls):
        v = getattr(inst, f.name)
        if is_dataclass(v):
            yield from _options(type(v), f"{prefix}{f.name}.")
        else:
            yield Option(f"{prefix}{f.name}", hints[f.name], v, f.metadata.get("doc", ""))


@functools.cache
def _option_types(cls: type) -> dict[str, Any]:
    """Every option's type by its dotted key (``grpo.lr``: float), computed once per class; read only."""
    return {o.key: o.type for o in _options(cls)}
