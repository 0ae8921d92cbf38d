"""Load a JobConfig from a TOML file plus ``--section.key value`` overrides.

Every value, from the file or the command line, goes through the same checks (known key, type,
choices, range); any failure is a one-line :class:`ConfigError` naming the key.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
import sys
import types
import typing
import unicodedata
from pathlib import Path
from typing import Any

from torchnlq.config.job_config import REMOVED_OPTIONS, JobConfig, entry_type
from torchnlq.config.plugins import import_plugins
from torchnlq.config.render import LIST_SPELLING, iter_options
from torchnlq.models.config import REMOVED_QUERY_FIELDS
from torchnlq.errors import ConfigError, closest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib


#: A config is a few KB; a file far larger is not one (and would cost its size to parse).
MAX_CONFIG_BYTES = 2**20

# The config path as an option, as torchtitan spells it (not a field: it names where the fields come from).
CONFIG_FILE_OPTION = "job.config_file"
#: The attribute of a config section holding the names of the keys the config set (models/family.py reads it).
SET_KEYS = "set_by_config"


def load_job_config(args: list[str]) -> JobConfig:
    """Build the config from ``[CONFIG.toml] [--section.key value | --section.key=value ...]``, file first."""
    path, overrides = _split_args(args)
    # Plugins first: a plugin family declares [model.<name>] sections that the rest of the file may set.
    import_plugins(_plugins_named(path, overrides))
    cfg = JobConfig()
    if path is not None:
        apply_file(cfg, path)
    described = copy.deepcopy(cfg)
    for key, raw in overrides:
        set_from_string(cfg, key, raw)
    if "job.description" not in {key for key, _ in overrides}:
        flag_changes_to_description(cfg, described)
    return cfg


def _plugins_named(path: str | None, overrides: list[tuple[str, str | None]]) -> list[str]:
    """``job.plugins`` as the file (with the files it extends) and the overrides set it, read before the rest."""
    cfg = JobConfig()
    if path is not None:
        apply_file(cfg, path, only="job")
    for key, raw in overrides:
        if key == "job.plugins":
            set_from_string(cfg, key, raw)
    return cfg.job.plugins


def read_toml(path: str) -> dict[str, Any]:
    """Read a TOML file, turning a missing or malformed file into one clear line."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file '{path}' is a folder; pass a TOML file such as train_configs/debug_model.toml")
    if not p.is_file():
        raise ConfigError(f"config file '{path}' not found; pass a TOML file such as train_configs/debug_model.toml")
    if p.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(f"config file '{path}' is {p.stat().st_size:,} bytes; a config is a few KB: "
                          "pass the TOML file")
    try:
        raw = p.read_bytes()
        # A UTF-8 byte-order mark (Windows editors write one) is valid UTF-8 text; TOML's grammar has no room for it.
        text = raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file '{path}' is not valid TOML: {e}{_invisible_at(text, str(e))}") from None
    except RecursionError:
        raise ConfigError(
            f"config file '{path}' is nested too deeply for a config; pass a train_configs/ file") from None
    except UnicodeDecodeError as e:
        utf16 = " (it starts with a UTF-16 byte-order mark)" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise ConfigError(
            f"config file '{path}' is not UTF-8 text{utf16} (byte {e.object[e.start]:#04x} at offset {e.start}); "
            "TOML files must be UTF-8: save it as UTF-8"
        ) from None


def flatten(table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"dim": 8}}`` -> ``{"model.dim": 8}`` (arrays, of tables too, stay values): a parsed TOML file or
    a fingerprint as dotted keys, so a difference can be named exactly."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        out.update(flatten(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def _invisible_at(text: str, message: str) -> str:
    """Where a TOML error points at a character one cannot see (a zero-width space in a key), its code point."""
    where = re.search(r"at line (\d+), column (\d+)", message)
    if not where:
        return ""
    lines = text.splitlines()
    line_no, column = int(where.group(1)), int(where.group(2))
    line = lines[line_no - 1] if 0 < line_no <= len(lines) else ""
    for char in line[max(column - 2, 0): column]:  # tomllib's column may point at the character or just after it
        if not char.isascii():
            return f": the line holds U+{ord(char):04X} ({unicodedata.name(char, 'unnamed')}) there; retype it"
    return ""


def apply_file(cfg: JobConfig, path: str, _seen: tuple[str, ...] = (), only: str | None = None) -> None:
    """Apply a TOML file; a top-level ``extends = "other.toml"`` (relative to the
    file) is applied first, so a variant config holds only what differs, and a top-level
    ``unset = ["data.path", ...]`` then returns the options it names to their built-in defaults
    (TOML has no null: this is how a variant drops a key its base sets). ``only``: apply that section alone."""
    resolved = str(Path(path).resolve())
    if resolved in _seen:
        raise ConfigError(f"config file '{path}' extends itself (cycle: {' -> '.join(_seen + (resolved,))})")
    data = read_toml(path)
    base = data.pop("extends", None)
    unset = data.pop(UNSET_KEY, None)
    if only is not None:
        data = {only: data[only]} if only in data else {}
        if isinstance(unset, list):
            unset = [name for name in unset if isinstance(name, str) and name.startswith(f"{only}.")]
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{path}: extends must be a file name string, got {base!r}")
        apply_file(cfg, str(Path(path).parent / base), _seen + (resolved,), only)
    described = copy.deepcopy(cfg)
    if unset is not None:
        unset_options(cfg, unset, path, data)
    apply_mapping(cfg, data, source=path)
    if "description" not in data.get("job", {}):
        flag_changes_to_description(cfg, described)


#: The top-level key of a config file that returns inherited options to their built-in defaults.
UNSET_KEY = "unset"


def unset_options(cfg: JobConfig, names: Any, source: str, data: dict[str, Any]) -> None:
    """Return each option in ``names`` (dotted, as on the command line) to its built-in default; ``data`` is the
    rest of the file, which may not set an option it unsets."""
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ConfigError(f"{source}: {UNSET_KEY} is a list of option names, e.g. {UNSET_KEY} = [\"data.path\"]; "
                          f"got {names!r:.80}")
    defaults = JobConfig()
    for name in names:
        try:
            obj, f = _resolve(cfg, name)
            default, _ = _resolve(defaults, name)
        except ConfigError as e:
            raise ConfigError(f"{source}: {UNSET_KEY}: {e}") from None
        section: Any = data
        for part in name.split("."):
            section = section.get(part) if isinstance(section, dict) else None
        if section is not None:
            raise ConfigError(f"{source}: {UNSET_KEY} names {name} and the file also sets it: keep one")
        setattr(obj, f.name, copy.deepcopy(getattr(default, f.name)))
        mark_set(obj, f.name, was_set=False)


#: The note flag_changes_to_description appends: (the author's text, "key=value, ...").
CHANGED_NOTE = re.compile(r"(.*) \[changed: ([^\]]*)\]", re.DOTALL)


def flag_changes_to_description(cfg: JobConfig, described: JobConfig) -> None:
    """Append to ``job.description`` the options changed since ``described``, the config its text was written for.

    A description inherited through ``extends`` or kept under command-line overrides would otherwise
    describe another run (a "linear query" run training the residual one). Where the run lives and what
    it logs ([job], [metrics], [checkpoint] but its initial load) cannot make it lie, so they are not listed.
    """
    if not cfg.job.description:
        return
    changed = {
        name: f"{name}={str(value).lower() if isinstance(value, bool) else value}"
        if isinstance(value, (str, int, float)) else name
        for (name, _, value), (_, _, old) in zip(iter_options(cfg), iter_options(described))
        if value != old and not name.startswith(("job.", "metrics."))
        and not (name.startswith("checkpoint.") and not name.startswith("checkpoint.initial_load"))
    }
    if not changed:
        return
    # A description that already lists changes (a saved config.toml run again) gets one list, the newest value
    # of each option, not a second bracket beside a stale first one.
    text, listed = cfg.job.description, {}
    earlier = CHANGED_NOTE.fullmatch(text)
    if earlier:
        text = earlier.group(1)
        listed = {entry.split("=", 1)[0]: entry for entry in earlier.group(2).split(", ")}
    cfg.job.description = f"{text} [changed: {', '.join((listed | changed).values())}]"


def config_path(args: list[str]) -> str | None:
    """The TOML file ``args`` name (positionally or as --job.config_file), or None: the built-in defaults."""
    return _split_args(args)[0]


def _split_args(args: list[str]) -> tuple[str | None, list[tuple[str, str | None]]]:
    """Separate the optional config path from the ``--key value`` overrides."""
    path: str | None = None
    overrides: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            key = arg[2:]
            raw: str | None
            if "=" in key:
                key, raw = key.split("=", 1)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                raw = args[i + 1]
                i += 1
            else:
                raw = None  # bare flag: "true" for booleans
            if key == CONFIG_FILE_OPTION:  # torchtitan's spelling of the config path
                if not raw:
                    raise ConfigError(f"--{CONFIG_FILE_OPTION} needs a TOML file, e.g. --{CONFIG_FILE_OPTION} "
                                      "train_configs/debug_model.toml")
                path = _one_path(path, raw)
            else:
                overrides.append((key, raw))
        else:
            path = _one_path(path, arg)
        i += 1
    return path, overrides


def _one_path(path: str | None, new: str) -> str:
    """The config path, given once (positionally or as --job.config_file)."""
    if path is not None:
        raise ConfigError(
            f"two config files given ('{path}' and '{new}'): pass one, either first or as --{CONFIG_FILE_OPTION}, "
            "then --section.key value overrides (a variant config can extend another: extends = \"base.toml\")"
        )
    return new


def _fields(section: Any) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(section)}


def _suggest(name: str, choices: list[str]) -> str:
    match = closest(name, choices)
    return f"; did you mean '{match}'?" if match else f" (known: {', '.join(sorted(choices))})"


def check_key_text(key: str) -> None:
    """A key holding a character no option name has (invisible, non-ASCII, control) is named with its code point:
    in an error message a zero-width space would be invisible."""
    for index, char in enumerate(key):
        if not (char.isascii() and char.isprintable()) or char.isspace():
            name = unicodedata.name(char, "a control character")
            raise ConfigError(f"key '{key.encode('unicode_escape').decode()}' contains U+{ord(char):04X} ({name}) at "
                              f"position {index}; option names are plain ASCII: retype the key")


def _resolve(cfg: JobConfig, dotted: str) -> tuple[Any, dataclasses.Field]:
    """Find the section object and field for ``a.b.c``; unknown parts are errors."""
    check_key_text(dotted)
    if dotted.startswith("model.query.") and dotted.split(".", 2)[2] in REMOVED_QUERY_FIELDS:
        raise ConfigError(f"{dotted} was removed: {REMOVED_QUERY_FIELDS[dotted.split('.', 2)[2]]}; delete it")
    if dotted in REMOVED_OPTIONS:
        raise ConfigError(f"{dotted} was removed: {REMOVED_OPTIONS[dotted]}; delete it")
    parts = dotted.split(".")
    if len(parts) < 2:
        raise ConfigError(f"option '--{dotted}' must be --section.key (e.g. --training.steps)")
    obj: Any = cfg
    for depth, part in enumerate(parts):
        fields = _fields(obj)
        where = ".".join(parts[:depth]) or "config"
        if part not in fields:
            kind = "section" if depth == 0 else "key"
            raise ConfigError(
                f"unknown {kind} '{'.'.join(parts[: depth + 1])}' in {where}{_suggest(part, list(fields))}")
        if depth == len(parts) - 1:
            break
        obj = getattr(obj, part)
        if not dataclasses.is_dataclass(obj):
            raise ConfigError(f"'{'.'.join(parts[: depth + 1])}' is a key, not a section")
    value = getattr(obj, parts[-1])
    if dataclasses.is_dataclass(value):
        raise ConfigError(
            f"'{dotted}' is a section, not a key; set one of its keys, e.g. --{dotted}.{next(iter(_fields(value)))}"
        )
    return obj, fields[parts[-1]]


def apply_mapping(cfg: JobConfig, data: dict[str, Any], source: str = "config", prefix: str = "") -> None:
    """Apply a parsed TOML mapping (sections and nested sections) onto ``cfg``."""
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            try:
                check_key_text(dotted)
            except ConfigError as e:
                raise ConfigError(f"{source}: {e}") from None
            # A table must be a section; _resolve on a child key reports unknown sections.
            if "." not in dotted and key not in _fields(cfg):
                raise ConfigError(f"{source}: unknown section '[{key}]'{_suggest(key, list(_fields(cfg)))}")
            apply_mapping(cfg, value, source, prefix=f"{dotted}.")
            if not value:
                _resolve_section(cfg, dotted, source)
        else:
            if not prefix:
                if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
                    raise ConfigError(
                        f"{source}: [[{key}]] is an array of tables, written once per entry; a config section is "
                        f"written once, as [{key}]"
                    )
                raise ConfigError(f"{source}: key '{key}' is outside any section; put it under a [section] header")
            try:
                obj, f = _resolve(cfg, dotted)
            except ConfigError as e:
                raise ConfigError(f"{source}: {e}") from None
            item = entry_type(obj, f.name)
            if item is not None:
                setattr(obj, f.name, _entries(dotted, value, item, source))
                continue
            setattr(obj, f.name, check_value(dotted, value, _field_type(obj, f.name), f.metadata))
            mark_set(obj, f.name)


def mark_set(section: Any, name: str, was_set: bool = True) -> None:
    """Record on ``section`` that the config (a file or a flag) set its key ``name`` (or, ``was_set`` False, unset
    it): :data:`SET_KEYS` tells a key set to its default from one left alone (``model.from_checkpoint``: keys the
    run's config sets win over the folder's, whatever their value)."""
    keys = section.__dict__.setdefault(SET_KEYS, set())
    (keys.add if was_set else keys.discard)(name)


def _entries(dotted: str, value: Any, item: type, source: str) -> list[Any]:
    """A TOML array of tables (``[[optimizer.groups]]``) as a list of ``item`` dataclasses, every key checked."""
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ConfigError(f"{source}: {dotted} is written as [[{dotted}]] tables, one per entry; got {value!r:.60}")
    entries = []
    for index, table in enumerate(value):
        entry = item()
        fields = _fields(entry)
        for key, raw in table.items():
            where = f"{dotted}[{index}].{key}"
            if key not in fields:
                try:
                    check_key_text(where)
                except ConfigError as e:
                    raise ConfigError(f"{source}: {e}") from None
                raise ConfigError(f"{source}: unknown key '{where}'{_suggest(key, list(fields))}")
            setattr(entry, key, check_value(where, raw, _field_type(entry, key), fields[key].metadata))
        entries.append(entry)
    return entries


def _resolve_section(cfg: JobConfig, dotted: str, source: str) -> None:
    obj: Any = cfg
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(obj) or part not in _fields(obj):
            raise ConfigError(f"{source}: unknown section '[{dotted}]'")
        obj = getattr(obj, part)


def set_from_string(cfg: JobConfig, dotted: str, raw: str | None) -> None:
    """Apply one command-line override; ``raw`` is None for a bare flag."""
    obj, f = _resolve(cfg, dotted)
    if entry_type(obj, f.name) is not None:
        raise ConfigError(f"--{dotted} is a list of tables: write it in a TOML config as [[{dotted}]] entries")
    typ = _field_type(obj, f.name)
    setattr(obj, f.name, check_value(dotted, _parse_string(dotted, raw, typ), typ, f.metadata))
    mark_set(obj, f.name)


def _field_type(obj: Any, name: str) -> Any:
    return typing.get_type_hints(type(obj))[name]


def _base_type(typ: Any) -> tuple[type, bool]:
    """(the concrete type, whether None is allowed) of ``int | None`` style hints."""
    args = typing.get_args(typ)
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        return non_none[0], len(non_none) < len(args)
    return typ, False


def _parse_string(key: str, raw: str | None, typ: Any) -> Any:
    base, optional = _base_type(typ)
    if raw is None:
        if base is bool:
            return True
        raise ConfigError(f"--{key} needs a value (e.g. --{key}=VALUE)")
    if optional and raw.lower() in ("none", "null"):
        return None
    if base is bool:
        lowered = raw.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"--{key} expects true or false, got '{raw}'")
    if typing.get_origin(base) is list:
        return parse_list(key, raw)
    if base in (int, float):
        try:
            return base(raw) if base is float else int(raw, 0)
        except ValueError:
            raise ConfigError(f"--{key} expects {'an integer' if base is int else 'a number'}, got '{raw}'") from None
    return raw


def parse_list(key: str, raw: str) -> list[Any]:
    """A list option on the command line: a TOML array (``["a.jsonl", "b, c.jsonl"]``, as the file writes it: items
    may hold commas) when it starts with ``[``, else comma-separated items (``a.jsonl,b.jsonl``; empty: none)."""
    if not raw.lstrip().startswith("["):
        return [part.strip() for part in raw.split(",") if part.strip()]
    try:
        parsed = tomllib.loads(f"value = {raw}")
    except (tomllib.TOMLDecodeError, RecursionError) as e:
        raise ConfigError(f"--{key}: {raw!r:.80} is not a TOML array ({e}); write a list as {LIST_SPELLING}") from None
    if set(parsed) != {"value"}:  # a newline in the value began another key
        raise ConfigError(f"--{key}: {raw!r:.80} holds more than one TOML array; write a list as {LIST_SPELLING}")
    return parsed["value"]


def check_value(key: str, value: Any, typ: Any, meta: typing.Mapping[str, Any]) -> Any:
    """Check type, choices and range of one value; return it (ints widened to float where needed)."""
    base, optional = _base_type(typ)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key} cannot be unset")
    if typing.get_origin(base) is list:
        (item,) = typing.get_args(base)
        if not isinstance(value, list) or not all(isinstance(v, item) for v in value):
            raise ConfigError(f"{key} expects a list of {item.__name__}, got {value!r}")
        if meta.get("min") is not None or meta.get("max") is not None:  # the bounds of each item
            return [check_value(f"{key}[{i}]", v, item, meta) for i, v in enumerate(value)]
        return list(value)
    if typing.get_origin(base) is dict or base is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} expects a table {{key = value, ...}}, got {value!r}")
        return dict(value)
    if base is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, base) or (base is not bool and isinstance(value, bool)):
        raise ConfigError(f"{key} expects {base.__name__}, got {type(value).__name__} {value!r}")
    if base is float and not math.isfinite(value):
        # nan/inf parse as floats (and 1e999 overflows to inf); no option means anything by them.
        raise ConfigError(f"{key} must be a finite number, got {value}")
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        match = closest(str(value), [str(c) for c in choices])
        raise ConfigError(f"{key}: '{value}' is not one of {', '.join(map(str, choices))}"
                          + (f"; did you mean '{match}'?" if match else ""))
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and (value < lo or (meta.get("min_exclusive") and value == lo)):
        bound = f"> {lo}" if meta.get("min_exclusive") else f">= {lo}"
        raise ConfigError(f"{key} must be {bound}, got {value}")
    if hi is not None and (value > hi or (meta.get("max_exclusive") and value == hi)):
        raise ConfigError(f"{key} must be {'<' if meta.get('max_exclusive') else '<='} {hi}, got {value}")
    if meta.get("path") and isinstance(value, str):
        value = os.path.expanduser(value)  # a TOML file or an argument given quoted keeps "~" literally otherwise
    return value


def load_table(cls: type, where: str, prefix: str, table: typing.Mapping[str, Any],
               strings: typing.Mapping[str, str] = {}, *,  # noqa: B006 - read only
               choices: typing.Mapping[str, typing.Sequence[str]] = {},  # noqa: B006 - read only
               ignored: typing.Collection[str] = ()) -> Any:
    """A table of a file that is not a run config (a suite's ``[executor]``, ``[sweep]``...) as the dataclass
    ``cls``, whose fields are :func:`option`\\ s: every key known (else the closest one), every value checked as a
    config option's (type, choices, range). ``strings`` are ``--PREFIX.KEY VALUE`` from a command line, read by their
    field's type, on top of ``table``; ``choices`` give a registry-backed field its names; keys in ``ignored`` (and
    not of ``cls``) are allowed and dropped. Mistakes are one line, ``WHERE: PREFIX.KEY ...``."""
    known = _fields_of(cls)
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    try:
        given = [(key, value, False) for key, value in table.items()]
        for key, value, typed in given + [(key, text, True) for key, text in strings.items()]:
            dotted = f"{prefix}.{key}" if prefix else key
            if key not in known:
                if key in ignored:
                    continue
                check_keys(prefix, {key: value}, [*known, *sorted(set(ignored) - set(known))])
            if typed:
                value = _parse_string(dotted, value, hints[key])
            meta = {**known[key].metadata, **({"choices": tuple(choices[key])} if key in choices else {})}
            values[key] = check_value(dotted, value, hints[key], meta)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    return cls(**values)


def check_keys(where: str, table: typing.Mapping[str, Any], allowed: typing.Sequence[str]) -> None:
    """An unknown key of a table (named ``WHERE.KEY``, or ``KEY`` at a file's top) is one line with the closest
    allowed one."""
    for key in table:
        if key not in allowed:
            dotted = f"{where}.{key}" if where else key
            check_key_text(dotted)
            raise ConfigError(f"unknown key '{dotted}'{_suggest(key, list(allowed))}")


def _fields_of(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}
