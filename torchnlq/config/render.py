"""Render a JobConfig as TOML, as ``--help`` text and as docs/configs.md, from the same dataclass fields.

Registry-backed names are passed in by the caller: this module sits below the model code.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from torchnlq.config.job_config import JobConfig, entry_type


#: How a list option is written on the command line (--help, docs/configs.md and the errors say it).
LIST_SPELLING = 'a TOML array \'["a", "b"]\' (quoted for the shell) or comma-separated a,b'


def iter_options(section: Any, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """Yield ``(dotted_name, field, value)`` for every option, depth first."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):
            yield from iter_options(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, value


def section_doc(cfg: Any, dotted: str) -> str:
    """The first line of the docstring of the section ``dotted`` (``model.query``) of ``cfg``."""
    doc = type(functools.reduce(getattr, dotted.split("."), cfg)).__doc__ or ""
    return doc.strip().split("\n", 1)[0]


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def to_toml(cfg: JobConfig) -> str:
    """The resolved config as TOML; unset (None) options are written as comments."""
    lines: list[str] = []
    tables: list[tuple[Any, str]] = []

    def emit(section: Any, name: str) -> None:
        lines.append(f"[{name}]")
        nested = []
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            if dataclasses.is_dataclass(value):
                nested.append((value, f"{name}.{f.name}"))
            elif entry_type(section, f.name) is not None:
                tables.extend((entry, f"{name}.{f.name}") for entry in value)
            elif value is None:
                lines.append(f"# {f.name} = (unset)")
            else:
                lines.append(f"{f.name} = {_toml_value(value)}")
        lines.append("")
        for entry, array in tables:  # [[section.key]]: one table per entry, after the section's keys
            lines.append(f"[[{array}]]")
            lines.extend(f"{f.name} = {_toml_value(getattr(entry, f.name))}" for f in dataclasses.fields(entry)
                         if getattr(entry, f.name) is not None)
            lines.append("")
        tables.clear()
        for value, sub in nested:
            emit(value, sub)

    for f in dataclasses.fields(cfg):
        emit(getattr(cfg, f.name), f.name)
    return "\n".join(lines)


Choices = Mapping[str, Sequence[str]]
_NOT_GIVEN = object()  # help_text without a config: no "this config" values


def _choices(name: str, f: dataclasses.Field, registries: Choices | None) -> Sequence[Any] | None:
    """The allowed values of option ``name``: its own ``choices``, else its registry's names when given."""
    if f.metadata.get("choices"):
        return f.metadata["choices"]
    return (registries or {}).get(name)


def _list_rule(section: Any, name: str) -> str | None:
    """How a list option is written: ``[[tables]]`` in the file only, or a TOML array / comma-separated items."""
    if not isinstance(getattr(section, name), list):
        return None
    if entry_type(section, name) is not None:
        return "a list of tables: [[...]] entries in the TOML file, not on the command line"
    return f"a list: on the command line {LIST_SPELLING}"


def _describe(f: dataclasses.Field, value: Any, choices: Sequence[Any] | None, given: Any = _NOT_GIVEN,
              list_rule: str | None = None) -> str:
    """The option's doc, its built-in default and rules, and the value the given config sets when it differs."""
    meta = f.metadata
    extra = [list_rule] if list_rule else []
    if choices:
        extra.append("one of " + "|".join(map(str, choices)))
    if meta.get("min") is not None:
        extra.append(f"{'>' if meta.get('min_exclusive') else '>='} {meta['min']}")
    if meta.get("max") is not None:
        extra.append(f"{'<' if meta.get('max_exclusive') else '<='} {meta['max']}")
    default = "unset" if value is None else _toml_value(value)
    rules = f"; {', '.join(extra)}" if extra else ""
    text = f"{meta.get('doc', '')} [default: {default}{rules}]"
    if given is not _NOT_GIVEN and given != value:
        text += f"\n      this config: {'unset' if given is None else _toml_value(given)}"
    return text


def help_text(cfg: JobConfig | None = None, registries: Choices | None = None, source: str | None = None) -> str:
    """The ``--help`` text: usage, then every option with its doc, default, allowed values and ``cfg``'s value."""
    defaults = JobConfig()
    given = dict((name, value) for name, _, value in iter_options(cfg)) if cfg is not None else {}
    out = [
        "usage: ./run_train.sh [CONFIG.toml] [--section.key VALUE | --section.key=VALUE ...]",
        "       ./run_train.sh --job.config_file CONFIG.toml [...]   (the same, as torchtitan spells it)",
        "       ./run_train.sh [CONFIG.toml] [...] --print-config      (print the resolved TOML and exit)",
        "",
        f"A list option is written as {LIST_SPELLING}",
        "A config file's top-level unset = [\"data.path\", ...] returns options it inherits (extends) to their "
        "built-in defaults",
        "",
        "Without CONFIG, runs train_configs/debug_model.toml. Options (built-in defaults; "
        + (f"'this config' is what {source} sets):" if cfg is not None else "pass a CONFIG to see its values):"),
    ]
    section = None
    for name, f, value in iter_options(defaults):
        head = name.rsplit(".", 1)[0]
        if head != section:
            section = head
            out.append(f"\n[{head}]  {section_doc(defaults, head)}")
        choices = _choices(name, f, registries)
        rule = _list_rule(functools.reduce(getattr, head.split("."), defaults), f.name)
        out.append(f"  --{name}\n      {_describe(f, value, choices, given.get(name, _NOT_GIVEN), rule)}")
    return "\n".join(out)


def markdown_reference(cfg: JobConfig | None = None, registries: Choices | None = None) -> str:
    """The options table of docs/configs.md (one table per section); ``registries`` as in :func:`help_text`."""
    cfg = cfg or JobConfig()
    out: list[str] = []
    section = None
    for name, f, value in iter_options(cfg):
        head, key = name.rsplit(".", 1)
        if head != section:
            section = head
            out += ["", f"### [{head}]", "", section_doc(cfg, head), "", "| key | default | allowed | meaning |",
                    "| --- | --- | --- | --- |"]
        section_obj = functools.reduce(getattr, head.split("."), cfg)
        is_list = entry_type(section_obj, key) is None and isinstance(value, list)
        default = "unset" if value is None else f"`{_toml_value(value)}`"
        out.append(_row(f"`{key}`", default, _allowed(f, _choices(name, f, registries), is_list),
                        f.metadata.get("doc", "")))
        item = entry_type(section_obj, key)
        if item is not None:  # the keys of one [[head.key]] entry, as a table of their own
            section = None
            out.append(markdown_reference_entry(item(), f"{head}.{key}", registries))
    return "\n".join(out).lstrip() + "\n"


def _allowed(f: dataclasses.Field, choices: Sequence[Any] | None, is_list: bool) -> str:
    """The allowed column of a reference table: the choices, the bounds, how a list is written."""
    meta = f.metadata
    allowed = [", ".join(f"`{c}`" for c in choices)] if choices else []
    if meta.get("min") is not None:
        allowed.append(f"{'>' if meta.get('min_exclusive') else '≥'} {meta['min']}")
    if meta.get("max") is not None:
        allowed.append(f"{'<' if meta.get('max_exclusive') else '≤'} {meta['max']}")
    if is_list:
        allowed.append("a list: `[\"a\", \"b\"]`; on the command line the same array, quoted, or `a,b`")
    return "; ".join(allowed)


def markdown_table(cls: type, title: str, registries: Choices | None = None, prefix: str = "",
                   skip: Sequence[str] = ()) -> str:
    """The reference table of a table that is not a run config's (a suite's keys, [executor], [sweep]...): the
    dataclass ``cls``'s keys (but ``skip``), as docs/configs.md shows a section's; ``registries`` keyed by
    ``PREFIX.KEY``."""
    doc = " ".join((cls.__doc__ or "").strip().split("\n\n", 1)[0].split()).replace("``", "`")
    rows = ["", f"### {title}", "", doc, "",
            "| key | default | allowed | meaning |", "| --- | --- | --- | --- |"]
    for f in (f for f in dataclasses.fields(cls) if f.name not in skip):
        value = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        choices = _choices(f"{prefix}.{f.name}" if prefix else f.name, f, registries)
        rows.append(_row(f"`{f.name}`", "unset" if value is None else f"`{_toml_value(value)}`",
                         _allowed(f, choices, isinstance(value, list)), f.metadata.get("doc", "")))
    return "\n".join(rows)


def markdown_reference_entry(entry: Any, array: str, registries: Choices | None) -> str:
    """The table of one ``[[array]]`` entry's keys (docs/configs.md)."""
    rows = ["", f"### [[{array}]] (one table per entry)", "", "| key | default | allowed | meaning |",
            "| --- | --- | --- | --- |"]
    for f in dataclasses.fields(entry):
        value = getattr(entry, f.name)
        choices = _choices(f"{array}.{f.name}", f, registries)
        allowed = ", ".join(f"`{c}`" for c in choices) if choices else ""
        rows.append(_row(f"`{f.name}`", "unset" if value is None else f"`{_toml_value(value)}`", allowed,
                         f.metadata.get("doc", "")))
    return "\n".join(rows)


def _row(*cells: str) -> str:
    """A Markdown table row; a ``|`` inside a cell (|f(X)|) is escaped, or it would end the cell."""
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def table_help(cls: type, prefix: str, registries: Choices | None = None, skip: Sequence[str] = ()) -> list[str]:
    """The ``--help`` lines of a table that is not a run config's (a suite's ``[executor]``, ``[sweep]``): each key
    of the dataclass ``cls`` (but those in ``skip``) with its doc, default and rules; ``registries`` keyed by
    ``PREFIX.KEY``."""
    lines = []
    for f in (f for f in dataclasses.fields(cls) if f.name not in skip):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc]
        choices = _choices(f"{prefix}.{f.name}", f, registries)
        lines.append(f"  --{prefix}.{f.name}\n      {_describe(f, default, choices)}")
    return lines
