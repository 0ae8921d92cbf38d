"""docs/extending.md's model-family walk-through, run as written there, and the one constructor behind it.

The ```python block (``my_family.py``: a PaLM-style parallel block with one norm, so another parameter count
than the dense block's) is written into a fresh folder and its ```bash block runs from there: train, resume,
export. The resumed run's losses equal those of a run trained straight through; the export is loaded in
transformers in a process where torchnlq cannot be imported, and its logits are compared with torchnlq's own
model of the checkpoint. The block is checked against its formula written out here, the counts against a
hand-written sum, and the library against the promise that it builds every model in one place and runs one
forward.
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
from torchnlq.interop.export import export_hf_standard
from torchnlq.interop.load import LoadedModel, load_model
from torchnlq.models import FAMILIES, FLAVORS, Decoder, Family, ModelArgs, build_model, register_family
from torchnlq.models.counts import flops_per_token, num_params
from torchnlq.models.decoder import BlockBuilder
from torchnlq.models.errors import ConfigError

from helpers import REPO_ROOT, WITHOUT_TORCHNLQ
from helpers.train import scalars
from test_extending_query import as_run_here, doc_blocks, run

SIZES = dict(n_layers=2, dim=32, n_heads=4, vocab_size=48, max_seq_len=64)


def plugin_source() -> str:
    (block,) = [b for b in doc_blocks("python") if b.startswith("# my_family.py")]
    return block


def commands() -> list[str]:
    (block,) = [b for b in doc_blocks("bash") if "--job.plugins my_family" in b]
    return [line for line in block.splitlines() if line.strip()]


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """my_family.py written from the docs into tmp_path and imported; the registries restored afterwards."""
    (tmp_path / "my_family.py").write_text(plugin_source(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    families, flavors = dict(FAMILIES), dict(FLAVORS)
    try:
        import my_family  # noqa: F401 - registers "parallel" and "parallel_debug"
        yield tmp_path
    finally:
        FAMILIES.clear()
        FAMILIES.update(families)
        FLAVORS.clear()
        FLAVORS.update(flavors)
        sys.modules.pop("my_family", None)


def tiny(family: str = "parallel", **kw) -> Decoder:
    torch.manual_seed(0)
    model = build_model(ModelArgs(**SIZES, family=family, **kw))
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


def test_the_parallel_block_is_its_formula(plugin: Path) -> None:
    model = tiny(query=Query(type="linear"))
    block = model.layers[1]
    assert type(block).__name__ == "ParallelBlock"
    seen = {}
    block.register_forward_hook(lambda module, args, out: seen.update(x=args[0], y=out))
    with torch.no_grad():
        model(torch.randint(0, 48, (2, 16), generator=torch.Generator().manual_seed(1)))
        x = seen["x"]
        h = layer_norm(x, block.ln.weight)
        mlp = torch.nn.functional.gelu(h @ block.mlp.fc.weight.T) @ block.mlp.proj.weight.T
        expected = x + causal_attention(block, h) + mlp
    torch.testing.assert_close(seen["y"], expected, rtol=1e-5, atol=1e-5)


def test_a_family_with_another_parameter_count_is_counted_as_built(plugin: Path) -> None:
    """One norm per block fewer than the dense block: the counts, FLOPs and flavor follow the built model."""
    args = ModelArgs(**SIZES, family="parallel", query=Query(type="linear"))
    d, layers, vocab, hidden = 32, 2, 48, 4 * 32
    block = d + d * d + 2 * d * d + d * d + 2 * d * hidden  # one LayerNorm gain, W_Q, K,V, out-proj, MLP
    expected = vocab * d + SIZES["max_seq_len"] * d + layers * block + d  # tokens, positions, blocks, ln_f
    assert num_params(args) == expected == sum(p.numel() for p in tiny(query=Query(type="linear")).parameters())
    dense = ModelArgs(**SIZES, query=Query(type="linear"))
    assert num_params(dense) - num_params(args) == layers * d
    non_embedding = expected - vocab * d - SIZES["max_seq_len"] * d + vocab * d  # + the tied head's matmul
    assert flops_per_token(args, 16) == 6 * non_embedding + 12 * layers * 4 * 8 * 16
    from torchnlq.config.job_config import Model
    from torchnlq.models.family import build_model_args

    assert build_model_args(Model(flavor="parallel_debug"), 256).family == "parallel"


def test_the_library_builds_a_model_in_one_place_and_runs_one_forward() -> None:
    """``Decoder(`` is called once, by build_model; no loop over a model's blocks calls them outside models/."""
    calls, loops = [], []
    for path in (REPO_ROOT / "torchnlq").rglob("*.py"):
        where = str(path.relative_to(REPO_ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Decoder":
                calls.append(f"{where}:{node.lineno}")
            if isinstance(node, ast.For) and not where.startswith("torchnlq/models/"):
                names = {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
                called = [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                          and n.func.id in names]
                iterates_layers = any(isinstance(n, ast.Attribute) and n.attr == "layers" for n in ast.walk(node.iter))
                if called and iterates_layers:
                    loops.append(f"{where}:{node.lineno}")
    assert len(calls) == 1 and calls[0].startswith("torchnlq/models/family.py"), calls
    assert loops == [], f"a block loop outside torchnlq/models/: {loops}"


def test_the_families_rules_are_one_line_each(plugin: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model.family: unknown 'paralel'.*parallel.*plugin module"):
        build_model(ModelArgs(**SIZES, family="paralel"))
    with pytest.raises(ConfigError, match="model.init='paper'.*model.family='dense'"):
        ModelArgs(**SIZES, family="parallel", init="paper")
    with pytest.raises(ValueError, match="already registered"):
        register_family(Family(name="parallel", block=FAMILIES["parallel"].block))
    model = tiny()
    loaded = LoadedModel(model, model.args, {"name": "byte", "eot_id": 47}, {}, tmp_path, "test")
    with pytest.raises(UserError, match="model.family='parallel': --format hf-gpt2 .* holds models of the dense"):
        export_hf_standard(loaded, tmp_path / "gpt2", "hf-gpt2")
    assert not (tmp_path / "gpt2").exists()


BLOCKED = WITHOUT_TORCHNLQ + """
import json
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
assert not any(m.split(".")[0] in ("torchnlq", "my_family") for m in sys.modules)
with torch.no_grad():
    print(json.dumps(model(torch.tensor(json.loads(sys.argv[2]))).logits.tolist()))
"""


@pytest.mark.integration  # trains, resumes, converts and loads in transformers, as the docs say
def test_the_walk_through_trains_resumes_exports_and_loads_in_transformers(plugin: Path) -> None:
    pytest.importorskip("transformers")
    train, resume, export_line = commands()
    for line in (train, resume, export_line):
        done = run(as_run_here(line), plugin)
        assert done.returncode == 0, (line, done.stderr[-3000:])
    # The same run trained straight to step 30, beside it: its losses are the resumed run's, bit for bit.
    straight = resume.replace("--job.name parallel", "--job.name straight")
    done = run(as_run_here(straight), plugin)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed, whole = (scalars(plugin / "outputs" / name / "tb")["loss/train"] for name in ("parallel", "straight"))
    assert sorted(resumed) == sorted(whole) == [10, 20, 30] and resumed == whole  # logged every 10 steps
    loaded = load_model(plugin / "outputs/parallel/checkpoints/step-30")
    straight_model = load_model(plugin / "outputs/straight/checkpoints/step-30").model
    assert all(torch.equal(a, b) for a, b in zip(loaded.model.state_dict().values(),
                                                 straight_model.state_dict().values()))  # the weights, bit for bit
    assert loaded.args.family == "parallel" and type(loaded.model.layers[0]).__name__ == "ParallelBlock"
    export = plugin / "exports/parallel"
    assert (export / "plugin_my_family.py").is_file()
    tokens = [[1, 5, 9, 2, 7, 3, 3, 8], [4, 4, 0, 6, 2, 9, 1, 5]]
    shown = subprocess.run([sys.executable, "-c", BLOCKED, str(export), json.dumps(tokens)], cwd=plugin,
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    with torch.no_grad():
        ours = loaded.model(torch.tensor(tokens))
    torch.testing.assert_close(torch.tensor(json.loads(shown.stdout.strip().splitlines()[-1])), ours,
                               rtol=1e-5, atol=1e-5)


def test_block_builder_is_what_a_family_names() -> None:
    """The dense family's spec builds its blocks: the table the trainer, the tools and the wrapper read."""
    builder: BlockBuilder = FAMILIES["dense"].block
    model = build_model(ModelArgs(**SIZES))
    assert all(type(block) is builder for block in model.layers)
