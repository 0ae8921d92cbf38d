"""docs/extending.md's block-family walk-through, run as written there, and the one constructor behind it.

The ```python block (``my_blocks.py``) is written into a fresh folder and its ```bash block runs from
there; the export is then loaded in transformers in a process where torchnlq cannot be imported, and its
logits are compared with torchnlq's own model of the checkpoint. The block is checked against its formula
written out here, and the library against the promise that it builds every model in one place.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from torchnlq.config.job_config import Query
from torchnlq.errors import UserError
from torchnlq.interop.hf_gpt2 import export_hf_gpt2
from torchnlq.interop.load import LoadedModel, load_model
from torchnlq.models import GPT, ModelArgs, build_model
from torchnlq.models.errors import ConfigError
from torchnlq.models.gpt import Block
from torchnlq.models.registry import BLOCKS, register_block

from helpers import REPO_ROOT, WITHOUT_TORCHNLQ
from test_extending_query import as_run_here, doc_blocks, run

SIZES = dict(n_layers=2, dim=32, n_heads=4, vocab_size=48, max_seq_len=64)


def plugin_source() -> str:
    (block,) = [b for b in doc_blocks("python") if b.startswith("# my_blocks.py")]
    return block


def commands() -> list[str]:
    (block,) = [b for b in doc_blocks("bash") if "--job.plugins my_blocks" in b]
    return [line for line in block.splitlines() if line.strip()]


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """my_blocks.py written from the docs into tmp_path and imported; the registry restored afterwards."""
    (tmp_path / "my_blocks.py").write_text(plugin_source(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = dict(BLOCKS)
    try:
        import my_blocks  # noqa: F401 - registers "parallel"
        yield tmp_path
    finally:
        BLOCKS.clear()
        BLOCKS.update(before)
        sys.modules.pop("my_blocks", None)


def tiny(block: str = "parallel", **kw) -> GPT:
    torch.manual_seed(0)
    model = build_model(ModelArgs(**SIZES, block=block, **kw))
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(torch.rand_like(p) + 0.5)  # gains away from 1: a lost gain shows
    return model.eval()


def layer_norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5) * gain


def causal_attention(block: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """Multi-head causal attention of a linear-query block, from its weights: softmax(QKᵀ/√d)V, then proj."""
    b, t, d = h.shape
    heads = block.attn.n_heads
    q = h @ block.attn.query.w_q.weight.T
    k, v = (h @ block.attn.kv.weight.T).split(d, -1)  # K rows first
    split = lambda z: z.view(b, t, heads, d // heads).transpose(1, 2)  # noqa: E731
    scores = split(q) @ split(k).transpose(-1, -2) / (d // heads) ** 0.5
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    out = (scores.softmax(-1) @ split(v)).transpose(1, 2).reshape(b, t, d)
    return out @ block.attn.proj.weight.T


def test_the_parallel_block_is_its_formula_and_counts_as_documented(plugin: Path) -> None:
    model = tiny(query=Query(type="linear"))
    block = model.layers[1]
    assert type(block).__name__ == "ParallelBlock" and model.num_params() == model.args.num_params()
    seen = {}
    block.register_forward_hook(lambda module, args, out: seen.update(x=args[0], y=out))
    with torch.no_grad():
        model(torch.randint(0, 48, (2, 16), generator=torch.Generator().manual_seed(1)))
        x = seen["x"]
        mlp = torch.nn.functional.gelu(layer_norm(x, block.ln_2.weight) @ block.mlp.fc.weight.T) @ block.mlp.proj.weight.T
        expected = x + causal_attention(block, layer_norm(x, block.ln_1.weight)) + mlp
    torch.testing.assert_close(seen["y"], expected, rtol=1e-5, atol=1e-5)


def test_the_library_builds_a_model_in_one_place() -> None:
    """grep for ``GPT(`` across torchnlq/: one call, in the registry's build_model."""
    calls = []
    for path in (REPO_ROOT / "torchnlq").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "GPT":
                calls.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert len(calls) == 1 and calls[0].startswith("torchnlq/models/registry.py"), calls


def test_the_families_rules_are_one_line_each(plugin: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="build this model with models.build_model"):
        GPT(ModelArgs(**SIZES, block="parallel"))
    with pytest.raises(ConfigError, match="model.block: unknown 'paralel'.*parallel.*plugin module"):
        build_model(ModelArgs(**SIZES, block="paralel"))
    with pytest.raises(ConfigError, match="model.init='paper'.*model.block='prenorm'"):
        ModelArgs(**SIZES, block="parallel", init="paper")
    with pytest.raises(ValueError, match="already registered by ParallelBlock"):
        register_block("parallel")(Block)

    @register_block("wider")
    class WiderBlock(Block):  # one extra gain: a count that ModelArgs does not know
        def __init__(self, args: ModelArgs, layer: int = 0) -> None:
            super().__init__(args, layer)
            self.extra = nn.Parameter(torch.ones(args.dim))

    prenorm = sum(p.numel() for p in GPT(ModelArgs(**SIZES)).parameters())
    wider = prenorm + SIZES["n_layers"] * SIZES["dim"]
    with pytest.raises(ConfigError, match=f"model.block='wider' builds {wider:,} parameters where the pre-norm "
                                          f"block has {prenorm:,}"):
        build_model(ModelArgs(**SIZES, block="wider"))
    model = tiny()
    loaded = LoadedModel(model, model.args, {"name": "byte", "eot_id": 47}, {}, tmp_path, "test")
    with pytest.raises(UserError, match="model.block='parallel' has no standard Hugging Face architecture"):
        export_hf_gpt2(loaded, tmp_path / "gpt2")
    assert not (tmp_path / "gpt2").exists()


BLOCKED = WITHOUT_TORCHNLQ + """
import json
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
assert not any(m.split(".")[0] in ("torchnlq", "my_blocks") for m in sys.modules)
with torch.no_grad():
    print(json.dumps(model(torch.tensor(json.loads(sys.argv[2]))).logits.tolist()))
"""


@pytest.mark.integration  # trains, converts and loads in transformers, as the docs say
def test_the_walk_through_trains_exports_and_loads_in_transformers(plugin: Path) -> None:
    pytest.importorskip("transformers")
    for line in commands():
        done = run(as_run_here(line), plugin)
        assert done.returncode == 0, (line, done.stderr[-3000:])
    loaded = load_model(plugin / "outputs/parallel/checkpoints/step-20")
    assert loaded.args.block == "parallel" and type(loaded.model.layers[0]).__name__ == "ParallelBlock"
    export = plugin / "exports/parallel"
    assert (export / "plugin_my_blocks.py").is_file()
    tokens = [[1, 5, 9, 2, 7, 3, 3, 8], [4, 4, 0, 6, 2, 9, 1, 5]]
    shown = subprocess.run([sys.executable, "-c", BLOCKED, str(export), json.dumps(tokens)], cwd=plugin,
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    with torch.no_grad():
        ours = loaded.model(torch.tensor(tokens))
    torch.testing.assert_close(torch.tensor(json.loads(shown.stdout.strip().splitlines()[-1])), ours,
                               rtol=1e-5, atol=1e-5)
