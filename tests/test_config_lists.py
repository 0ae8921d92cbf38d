"""List options on the command line, and a variant config dropping a key it inherits (issue 40.4).

A list option takes, on the command line, the TOML array a file would hold (items may then hold commas) or
comma-separated items; whatever else is typed is one ConfigError line. The reference is the list drawn here:
the array's text is written out by this test (JSON's string escapes are TOML's; DEL, which JSON leaves raw, is
escaped by hand), and the same text in a TOML file must give the same config. ``--help`` says how a list is
written, and what it shows works when a shell splits it. ``unset = [...]`` at the top of a config returns
inherited options to their defaults: the mixture warning about an inherited data.path names it, and following
its advice silences the warning.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchnlq.config.job_config import Data, JobConfig, entry_type
from torchnlq.config.manager import apply_mapping, load_job_config, set_from_string
from torchnlq.config.render import help_text, iter_options
from torchnlq.errors import ConfigError


def value_of(cfg: JobConfig, name: str) -> object:
    return functools.reduce(getattr, name.split("."), cfg)


def _list_options() -> list[str]:
    """Every list option a command line can set (not the [[...]] tables), read from the schema."""
    cfg = JobConfig()
    return [name for name, f, value in iter_options(cfg)
            if isinstance(value, list) and entry_type(value_of(cfg, name.rsplit(".", 1)[0]), f.name) is None]


LIST_OPTIONS = _list_options()


def test_the_schema_has_list_options_to_check() -> None:
    assert {"job.plugins", "downstream.tasks"} <= set(LIST_OPTIONS)


def toml_string(text: str) -> str:
    """A TOML basic string of ``text``: JSON's escapes are TOML's, but JSON leaves DEL (U+007F) raw, TOML does not."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def parsed(name: str, raw: str) -> list[str]:
    """The option's value after ``--name raw`` on the command line."""
    cfg = JobConfig()
    set_from_string(cfg, name, raw)
    return value_of(cfg, name)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(LIST_OPTIONS), items=st.lists(st.text(max_size=12), max_size=4),
       spaces=st.sampled_from(["", " "]))
def test_a_toml_array_on_the_command_line_is_the_list_a_file_holds(name: str, items: list[str], spaces: str) -> None:
    literal = "[" + f",{spaces}".join(toml_string(item) for item in items) + "]"
    assert parsed(name, literal) == items
    section, key = name.rsplit(".", 1)
    cfg = JobConfig()
    apply_mapping(cfg, tomllib.loads(f"[{section}]\n{key} = {literal}\n"))  # what a file's text gives
    assert value_of(cfg, name) == items


plain_item = st.text(st.characters(blacklist_characters=",", blacklist_categories=("Cs",)), min_size=1,
                     max_size=12).map(str.strip).filter(lambda s: s and not s.startswith("["))


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(LIST_OPTIONS), items=st.lists(plain_item, max_size=4))
def test_comma_separated_items_are_the_list(name: str, items: list[str]) -> None:
    assert parsed(name, ",".join(items)) == items
    assert parsed(name, " , ".join(items)) == items  # spaces around the commas are not part of an item


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(LIST_OPTIONS),
       raw=st.one_of(st.text(max_size=30), st.text(alphabet='[]",\' 1a\n\\{}=#', max_size=30).map(lambda s: "[" + s)))
def test_any_text_is_a_list_of_strings_or_one_error_line(name: str, raw: str) -> None:
    try:
        value = parsed(name, raw)
    except ConfigError as e:
        assert "\n" not in str(e), str(e)
        assert str(e).startswith((f"--{name}", name)), str(e)
        return
    assert isinstance(value, list) and all(isinstance(item, str) for item in value)


def test_a_newline_cannot_smuggle_a_second_key_into_the_array() -> None:
    with pytest.raises(ConfigError, match="holds more than one TOML array"):
        parsed("downstream.tasks", '["a.jsonl"]\nother = 1')


def test_the_help_says_how_a_list_is_written_and_its_examples_parse() -> None:
    text = help_text()
    for name in LIST_OPTIONS:
        block = text.split(f"  --{name}\n", 1)[1].split("\n  --", 1)[0]
        assert "a list: on the command line" in block, block
    # What the help shows, typed into a shell: the quoted array and the comma form give the same two items.
    array, commas = re.search(r"a TOML array ('[^']*') \(quoted for the shell\) or comma-separated (\S+)",
                              text).groups()
    for typed in (array, commas):
        (argument,) = shlex.split(typed)
        assert parsed("downstream.tasks", argument) == ["a", "b"], typed
    # A file name holding a comma survives only as an array item.
    assert parsed("downstream.tasks", '["tasks, v2.jsonl"]') == ["tasks, v2.jsonl"]


# ----- unset: a variant config drops a key its base sets ------------------------------------------------------

def write(folder: Path, name: str, text: str) -> str:
    (folder / name).write_text(text)
    return str(folder / name)


BASE = '[data]\npath = "data/openwebtext"\ntokenizer = "byte"\n[training]\nseed = 7\n'
MIXTURE = '[[data.sources]]\npath = "data/a"\nweight = 1.0\n[[data.sources]]\npath = "data/b"\nweight = 2.0\n'


def test_unset_returns_inherited_options_to_their_defaults_and_the_mixture_warning_names_it(tmp_path: Path) -> None:
    from torchnlq.train.preflight import config_warnings

    write(tmp_path, "base.toml", BASE)
    inherited = load_job_config([write(tmp_path, "mix.toml", 'extends = "base.toml"\n' + MIXTURE)])
    (warning,) = [w for w in config_warnings(inherited) if w.startswith("data.path")]
    assert "data.path = 'data/openwebtext' is not read" in warning
    advice = re.search(r"write (unset = \[.*?\]) at the top of this config", warning).group(1)
    # The advice, followed as written: the warning goes, data.path is the built-in default, the rest is kept.
    fixed = load_job_config([write(tmp_path, "fixed.toml", f'extends = "base.toml"\n{advice}\n' + MIXTURE)])
    assert not [w for w in config_warnings(fixed) if w.startswith("data.path")]
    assert fixed.data.path == Data().path and fixed.data.tokenizer == "byte" and fixed.training.seed == 7
    assert [s.path for s in fixed.data.sources] == ["data/a", "data/b"]
    # Several options, a nested one, and a list of tables go back to the defaults too; a later override still applies.
    several = load_job_config([write(tmp_path, "several.toml", 'extends = "mix.toml"\nunset = ["training.seed", '
                                     '"data.sources", "model.query.type"]\n'), "--training.steps=9"])
    defaults = JobConfig()
    assert (several.training.seed, several.data.sources, several.model.query.type, several.training.steps) == (
        defaults.training.seed, [], defaults.model.query.type, 9)


@pytest.mark.parametrize("text, fragment", [
    ('unset = "data.path"\n', 'unset is a list of option names, e.g. unset = ["data.path"]'),
    ('unset = ["data.pth"]\n', "unset: unknown key 'data.pth' in data; did you mean 'path'?"),
    ('unset = ["data"]\n', "unset: option '--data' must be --section.key"),
    ('unset = ["model.query"]\n', "unset: 'model.query' is a section, not a key"),
    ('unset = ["data.path"]\n[data]\npath = "x"\n', "unset names data.path and the file also sets it: keep one"),
])
def test_unset_mistakes_are_one_line(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_job_config([write(tmp_path, "c.toml", text)])
    assert fragment in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
