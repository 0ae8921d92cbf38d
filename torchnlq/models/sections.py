"""The ``[model.<name>]`` sub-sections a model family declares: added to the config section and to ModelArgs when
the family is registered, so that a plugin family's own options are read, checked, recorded and exported like the
built-in ones, with nothing of torchnlq edited.

A family declares a section as a dataclass of :func:`~torchnlq.models.config.option` fields (the moe family's
:class:`~torchnlq.models.moe.config.MoE`). Registering it (:func:`add_section`) gives

- ``ModelArgs.<name>``: the resolved values (every field set: the config's, the flavor's, or the declared default);
- ``Model.<name>``: the config's, every field unset (None) by default, so the flavor's value shows through.

Both are real dataclass fields (``dataclasses.fields``, ``asdict``, ``replace``, ``deepcopy``, the config reader,
``--help`` and docs/configs.md walk them), added after the classes were made: the class's ``__init__`` takes
them as keywords (``ModelArgs(..., moe=MoE(top_k=1))``), :func:`fill_sections` (each class's
``__post_init__``) gives a new object the sections it was not given, and :func:`same_fields` compares objects
over every field, the late ones too.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Any

#: The registered sections: name -> (the declared dataclass, its config-side class with every field unset).
SECTIONS: dict[str, tuple[type, type]] = {}
#: The sections each family reads, by family name.
_READ_BY: dict[str, tuple[str, ...]] = {}
#: The classes that carry the sections: (the class, which of the pair above its field holds).
_OWNERS: list[tuple[type, int]] = []


def carries_sections(config_side: bool) -> Callable[[type], type]:
    """Mark a dataclass as one that gets every registered section (the config's unset form when ``config_side``)."""

    def mark(cls: type) -> type:
        _OWNERS.append((cls, 1 if config_side else 0))
        generated = cls.__init__

        @functools.wraps(generated)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            for name in [key for key in kwargs if key in SECTIONS]:  # set first: __post_init__ keeps them
                object.__setattr__(self, name, kwargs.pop(name))
            generated(self, *args, **kwargs)

        cls.__init__ = __init__
        for name in SECTIONS:
            _add_field(cls, name, SECTIONS[name][1 if config_side else 0])
        return cls

    return mark


def unset_by_default(declared: type) -> Callable[[type], type]:
    """Give a config section every option of ``declared`` unset (None) by default: an option the config does not set
    takes the flavor's value, else the declared default (the doc says which). Applied before ``@dataclass``, which
    keeps each field's place and its metadata."""

    def decorate(cls: type) -> type:
        for f in fields(declared):
            doc = f"{f.metadata['doc']} Unset: the flavor's, else {f.default!r}."
            setattr(cls, f.name, field(default=None, metadata={**f.metadata, "doc": doc, "declared": f.default}))
            kind = declared.__annotations__[f.name]  # a string under `from __future__ import annotations`
            cls.__annotations__[f.name] = f"{kind} | None" if isinstance(kind, str) else kind | None
        return cls

    return decorate


def config_side(declared: type) -> type:
    """The config's form of section ``declared``: the same options, each unset (None) by default."""
    namespace = {"__doc__": declared.__doc__, "__module__": declared.__module__, "__annotations__": {}}
    return dataclass(unset_by_default(declared)(type(f"{declared.__name__}Options", (declared,), namespace)))


def declare_sections(family: str, sections: Mapping[str, type]) -> None:
    """Family ``family`` reads ``sections`` (``{"moe": MoE}``): each a dataclass of option() fields, added to every
    class that carries sections unless another family declared it already (then it must be the same class)."""
    for name, declared in sections.items():
        if name in SECTIONS and SECTIONS[name][0] is not declared:
            raise ValueError(f"[model.{name}] is already declared, as {SECTIONS[name][0].__name__}, by another family")
        if not dataclasses.is_dataclass(declared) or not all("doc" in f.metadata for f in fields(declared)):
            raise TypeError(f"[model.{name}] must be a dataclass whose fields are declared with option(default, doc)")
    for name, declared in sections.items():
        if name not in SECTIONS:
            SECTIONS[name] = (declared, config_side(declared))
            for owner, side in _OWNERS:
                _add_field(owner, name, SECTIONS[name][side])
    _READ_BY[family] = tuple(sections)


def forget_sections(family: str) -> None:
    """Undo :func:`declare_sections` (a plugin family unregistered: tests); a section no family reads goes."""
    _READ_BY.pop(family, None)
    for name in [n for n in SECTIONS if not readers_of(n)]:
        del SECTIONS[name]
        for owner, _ in _OWNERS:
            owner.__dataclass_fields__.pop(name, None)
            owner.__annotations__.pop(name, None)


def sections_read_by(family: str) -> tuple[str, ...]:
    """The sections family ``family`` reads (none for an unknown family)."""
    return _READ_BY.get(family, ())


def readers_of(name: str) -> list[str]:
    """The families that read section ``name``."""
    return [family for family, names in _READ_BY.items() if name in names]


def _add_field(owner: type, name: str, kind: type) -> None:
    if name in owner.__dataclass_fields__:
        raise ValueError(f"[model.{name}] would replace {owner.__name__}.{name}, which is not a section")
    # A complete Field object, as @dataclass makes one (its name, type and kind set), without its private setters.
    made = make_dataclass("_Section", [(name, kind, field(default_factory=kind))])
    owner.__dataclass_fields__[name] = made.__dataclass_fields__[name]
    owner.__annotations__[name] = kind


def fill_sections(obj: Any) -> None:
    """Give ``obj`` (a new object of a class that carries sections) each registered section it lacks."""
    for name in SECTIONS:
        if name not in obj.__dict__:
            object.__setattr__(obj, name, obj.__dataclass_fields__[name].default_factory())


def same_fields(a: Any, b: Any) -> bool:
    """``a == b`` over every field, the sections added after the class was made too."""
    return type(a) is type(b) and all(getattr(a, f.name) == getattr(b, f.name) for f in fields(a))
