"""The schema of a recorded config: what a file someone handed over may hold, checked before anything is built.

A checkpoint's torchnlq.json, an export's or a Hugging Face folder's config.json and a data folder's meta.json
are read (bounded in size and nesting) by :func:`torchnlq.files.read_json`, then checked here against a declared
schema of :class:`Field` s: each value of its exact JSON type (an integer is an ``int``, not ``32.0``, ``"32"`` or
``true``), finite and in its range, an object's own keys checked in turn. :func:`check_record` returns the plain
values or raises one ConfigError line naming the key; the caller adds the file. Pure, so that the model package
checks :meth:`ModelArgs.from_dict <torchnlq.models.args.ModelArgs.from_dict>` with it too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

#: The longest string a recorded field may hold (names, choices, hashes, paths).
MAX_TEXT = 4096
_KINDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a JSON object",
          list: "a JSON list"}
_TYPES = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", dict: "an object", list: "a list",
          type(None): "null"}


@dataclass(frozen=True)
class Field:
    """One recorded value: its JSON type and range, ``None`` allowed or not, required or not.

    ``lo``/``hi`` bound a number inclusively, ``above`` exclusively from below; ``fields`` is an object's own
    schema (its other keys ignored), ``values`` the schema of every value of an object used as a map.
    """

    kind: type
    lo: float | None = None
    hi: float | None = None
    above: float | None = None
    null: bool = False
    required: bool = False
    choices: tuple[str, ...] | None = None
    fields: Mapping[str, Field] | None = None
    values: Field | None = None

    def expected(self) -> str:
        """What the value must be, in words: "an integer from 1 to 1,024 (or null)"."""
        words = _KINDS[self.kind]
        if self.choices:
            words = f"one of {', '.join(map(repr, self.choices))}"
        if self.above is not None:
            words += f" above {self.above:g}"
        if self.lo is not None and self.hi is not None:
            words += f" from {self.lo:,} to {self.hi:,}"
        elif self.lo is not None:
            words += f" of at least {self.lo:,}"
        elif self.hi is not None:
            words += f" of at most {self.hi:,}"
        return words + (" (or null)" if self.null else "")


def integer(lo: int | None = None, hi: int | None = None, **kw: Any) -> Field:
    """An integer field (never a float, a string or a boolean)."""
    return Field(int, lo, hi, **kw)


def number(lo: float | None = None, hi: float | None = None, **kw: Any) -> Field:
    """A finite number field (an integer is taken as the float it equals)."""
    return Field(float, lo, hi, **kw)


def shown(value: Any) -> str:
    """A recorded value as JSON, cut at 40 characters (a line stays a line)."""
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _bad(key: str, value: Any, field: Field, why: str | None = None) -> ConfigError:
    what = why or f"{shown(value)} is {_TYPES.get(type(value), type(value).__name__)}, not {field.expected()}"
    return ConfigError(f"invalid {key}: {what}")


def check_value(value: Any, field: Field, key: str) -> Any:
    """``value`` checked against ``field`` (an int for a float field becomes the float); ConfigError naming ``key``."""
    if value is None:
        if field.null:
            return None
        raise _bad(key, value, field)
    kind = type(value)
    if field.kind is float and kind is int:
        if abs(value) > 2**1023:  # no float holds it
            raise _bad(key, value, field, f"{shown(value)} is not {field.expected()}")
        value, kind = float(value), float
    if kind is not field.kind:  # bool is an int subclass, and JSON's true is no integer: exact types only
        raise _bad(key, value, field)
    if kind is float and not math.isfinite(value):
        raise _bad(key, value, field, f"{shown(value)} is not {field.expected()} (it is not finite)")
    out_of_range = kind in (int, float) and (
        (field.lo is not None and value < field.lo) or (field.hi is not None and value > field.hi)
        or (field.above is not None and value <= field.above))
    if out_of_range or (kind is str and field.choices and value not in field.choices):
        raise _bad(key, value, field, f"{shown(value)} is not {field.expected()}")
    if kind is str and len(value) > MAX_TEXT:
        raise _bad(key, value, field, f"a string of {len(value):,} characters, more than {MAX_TEXT:,}")
    if kind is dict:
        if field.fields is not None:
            value = {**value, **check_record(value, field.fields, key)}
        if field.values is not None:
            value = {k: check_value(v, field.values, f"{key}.{k}") for k, v in value.items()}
    if kind is list and field.values is not None:
        value = [check_value(v, field.values, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


def check_record(record: Any, schema: Mapping[str, Field], key: str, *, unknown: str | None = None
                 ) -> dict[str, Any]:
    """The keys of ``schema`` that ``record`` (a parsed JSON object) holds, checked; a required one missing, or
    any value of another type or range, is one ConfigError naming ``key.name``. ``unknown``: a message for keys
    the schema lacks (None: they are ignored, e.g. the many keys of a Hugging Face config.json)."""
    if not isinstance(record, dict):
        raise _bad(key, record, Field(dict))
    if unknown is not None:
        extra = sorted(str(k) for k in record if k not in schema)
        if extra:
            raise ConfigError(f"{key} has unknown keys {', '.join(extra)}{unknown}")
    checked = {}
    for name, field in schema.items():
        if name in record:
            checked[name] = check_value(record[name], field, f"{key}.{name}" if key else name)
        elif field.required:
            raise ConfigError(f"invalid {key + '.' if key else ''}{name}: it is missing ({field.expected()} is needed)")
    return checked
