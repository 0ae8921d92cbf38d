"""The flavor walk-through of docs/extending.md ("A new flavor"), performed as written there.

The section's ```python block is the line a user adds inside the ``FLAVORS`` dict of
torchnlq/models/registry.py. It is taken from the markdown, executed inside a dict display
(where it sits in registry.py) and its entry added to the real ``FLAVORS`` (restored
afterwards). Then each consequence the section lists is checked: the config accepts the name
and resolves the flavor's sizes, ``--help`` and docs/configs.md's generated table list it, and
the model summary (scripts/model_summary.py) counts its parameters as a formula written out
here by hand does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from helpers import REPO_ROOT
from torchnlq.config.manager import load_job_config
from torchnlq.train.registries import registry_choices
from torchnlq.config.render import help_text, markdown_reference
from torchnlq.data.tokenizer import padded_vocab_size
from torchnlq.errors import ConfigError
from torchnlq.train import summary
from torchnlq.models.family import FLAVORS, Flavor
from torchnlq.train.preflight import check_job_config

DOC = REPO_ROOT / "docs" / "extending.md"


def doc_section(title: str) -> str:
    """The text of the ``## {title}...`` section of docs/extending.md, up to the next ``## ``."""
    match = re.search(rf"^## {re.escape(title)}.*?(?=^## |\Z)", DOC.read_text(), flags=re.MULTILINE | re.DOTALL)
    assert match, f"docs/extending.md has no section '## {title}'"
    return match.group(0)


def flavor_block() -> str:
    blocks = re.findall(r"```python\n(.*?)```", doc_section("A new flavor"), flags=re.DOTALL)
    assert len(blocks) == 1, "the flavor section of docs/extending.md should have one python block"
    return blocks[0]


@pytest.fixture
def doc_flavor() -> Iterator[SimpleNamespace]:
    """The docs' flavor, added to FLAVORS by its line as written; FLAVORS restored afterwards."""
    before = dict(FLAVORS)
    namespace: dict = {"Flavor": Flavor}
    # The line goes inside the FLAVORS = {...} display of registry.py: execute it in one.
    exec(f"entries = {{\n{flavor_block()}}}\n", namespace)
    entries = namespace["entries"]
    assert len(entries) == 1, "the walk-through adds one flavor"
    (name, flavor), = entries.items()
    assert name not in FLAVORS, f"the docs' example flavor {name!r} already exists: pick a new one"
    assert isinstance(flavor, Flavor)
    try:
        FLAVORS.update(entries)
        yield SimpleNamespace(name=name, flavor=flavor)
    finally:
        FLAVORS.clear()
        FLAVORS.update(before)


def hand_count(flavor: Flavor, vocab: int, query: str) -> int:
    """Parameters of a flavor with the default [model] options, written out by hand.

    Tied embeddings (the LM head is tok_emb), learned positions, bias-free LayerNorms, no
    biases, MLP 4·dim. A block: ln_1 (d) + query + K,V (d·2d) + out-projection (d·d) + ln_2 (d)
    + MLP (d·4d + 4d·d). Query: linear d·d; residual_mlp W1 (d·r) + W2 (r·d) + its two norm
    gains (2d), r = d/2.
    """
    d = flavor.dim
    hidden = round(flavor.mlp_ratio * d)
    query_params = {"linear": d * d, "residual_mlp": 2 * d * round(d / 2) + 2 * d}[query]
    block = d + query_params + 2 * d * d + d * d + d + 2 * d * hidden
    return vocab * d + flavor.max_seq_len * d + flavor.n_layers * block + d


def summary_values(lines: list[str]) -> dict[str, str]:
    """model_summary's ``name: value`` lines, thousands separators dropped."""
    return {name: value.replace(",", "") for name, value in (line.split(": ", 1) for line in lines)}


def test_unknown_before_the_line_is_added():
    """Without the line the name is refused: the walk-through is what makes it exist."""
    name = re.search(r'"(\w+)"\s*:', flavor_block()).group(1)
    assert name not in registry_choices()["model.flavor"]
    with pytest.raises(ConfigError, match="model.flavor"):
        check_job_config(load_job_config(["--model.flavor", name]))


def test_flavor_is_a_registry_choice(doc_flavor):
    assert doc_flavor.name in registry_choices()["model.flavor"]


def test_flavor_is_listed_in_help_and_configs_reference(doc_flavor):
    """What ./run_train.sh --help prints and what scripts/gen_config_docs.py writes into docs/configs.md."""
    choices = registry_choices()
    help_lines = help_text(registries=choices).splitlines()
    described = help_lines[help_lines.index("  --model.flavor") + 1]
    assert doc_flavor.name in described.split("one of ", 1)[1]
    row = next(line for line in markdown_reference(registries=choices).splitlines() if line.startswith("| `flavor` |"))
    assert f"`{doc_flavor.name}`" in row


def test_config_resolves_the_flavor_sizes(doc_flavor):
    flavor = doc_flavor.flavor
    args = check_job_config(load_job_config(["--model.flavor", doc_flavor.name]))
    assert (args.n_layers, args.dim, args.n_heads, args.max_seq_len) == (
        flavor.n_layers, flavor.dim, flavor.n_heads, flavor.max_seq_len)
    assert args.head_dim == flavor.dim // flavor.n_heads
    assert args.mlp_hidden == round(flavor.mlp_ratio * flavor.dim)
    assert args.vocab_size == padded_vocab_size("gpt2", 64) == 50304
    # A set [model] field still overrides the flavor, and the MLP follows the final dim.
    args = check_job_config(load_job_config(["--model.flavor", doc_flavor.name, "--model.n_layers", "2",
                                             "--model.dim", str(2 * flavor.dim)]))
    assert (args.n_layers, args.dim, args.mlp_hidden) == (2, 2 * flavor.dim, round(flavor.mlp_ratio * 2 * flavor.dim))


@pytest.mark.parametrize("query", ["linear", "residual_mlp"])
def test_summary_counts_the_flavor(doc_flavor, query):
    """summarize(cfg) is what scripts/model_summary.py prints; its count equals the hand formula."""
    cfg = load_job_config(["--model.flavor", doc_flavor.name, "--model.query.type", query,
                           "--data.tokenizer", "gpt2", "--model.tie_embeddings", "true",
                           "--model.positions", "learned"])
    values = summary_values(summary.summarize(cfg))
    flavor = doc_flavor.flavor
    assert values["flavor"] == doc_flavor.name
    assert (int(values["n_layers"]), int(values["dim"]), int(values["n_heads"])) == (
        flavor.n_layers, flavor.dim, flavor.n_heads)
    assert int(values["total_params"]) == hand_count(flavor, 50304, query)


@pytest.mark.integration  # the entry point's memory estimate: a training step of GPT-2 small on fake tensors
def test_model_summary_entry_point_prints_the_count(doc_flavor, capsys):
    """The docs' command, ``scripts/model_summary.py --model.flavor NAME`` (its main, in process)."""
    assert summary.main(["--model.flavor", doc_flavor.name]) == 0
    values = summary_values(capsys.readouterr().out.splitlines())
    assert int(values["total_params"]) == hand_count(doc_flavor.flavor, 50304, "linear")
    # The figure the section quotes for its example is the same count.
    quoted = re.search(r"`total_params: ([\d,]+)`", doc_section("A new flavor")).group(1)
    assert int(quoted.replace(",", "")) == int(values["total_params"])
