"""docs/extending.md's model-family walk-through, run as written there, and the one constructor behind it.

The ```python block (``my_family.py``: a PaLM-style parallel block with one norm, so another parameter count
than the dense block's, an option section of its own and a step hook that logs a statistic) is written into a
fresh folder and its ```bash block runs from there: train, resume, export, summarise. The resumed run's losses
equal those of a run trained straight through; the export is loaded in transformers in a process where torchnlq
cannot be imported, and its logits are compared with torchnlq's own model of the checkpoint; the family on 2
gloo processes gives one process's losses and statistic. The block is checked against its formula written out
here, the counts against a hand-written sum, and the library against the promise that it builds every model in
one place and runs one forward.
"""

from __future__ import annotations

import ast
import dataclasses
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
from torchnlq.models import FAMILIES, FLAVORS, Decoder, Family, ModelArgs, build_model, register_family, unregister_family
from torchnlq.models.counts import flops_per_token, num_params
from torchnlq.models.decoder import BlockBuilder
from torchnlq.models.config import option
from torchnlq.models.errors import ConfigError

from helpers import REPO_ROOT, WITHOUT_TORCHNLQ
from helpers.train import run_train, scalars
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
    flavors = dict(FLAVORS)
    try:
        import my_family  # noqa: F401 - registers "parallel" (and its [model.parallel]) and "parallel_debug"
        yield tmp_path
    finally:
        unregister_family("parallel")
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
    from my_family import Parallel

    model = tiny(query=Query(type="linear"), parallel=Parallel(branch_scale=0.5))
    block = model.layers[1]
    assert type(block).__name__ == "ParallelBlock"
    seen = {}
    block.register_forward_hook(lambda module, args, out: seen.update(x=args[0], y=out))
    with torch.no_grad():
        model(torch.randint(0, 48, (2, 16), generator=torch.Generator().manual_seed(1)))
        x = seen["x"]
        h = layer_norm(x, block.ln.weight)
        mlp = torch.nn.functional.gelu(h @ block.mlp.fc.weight.T) @ block.mlp.proj.weight.T
        expected = x + 0.5 * (causal_attention(block, h) + mlp)
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


def test_the_plugin_section_is_read_checked_and_recorded_like_a_built_in_one(plugin: Path, tmp_path: Path) -> None:
    """[model.parallel] in a file that names the plugin in [job] (read before the section), on the command line,
    in records; its mistakes are one line each; another family's model refuses it."""
    from torchnlq.config.manager import load_job_config
    from torchnlq.config.render import help_text, to_toml
    from torchnlq.models.family import build_model_args
    from torchnlq.models.sections import SECTIONS

    config = tmp_path / "run.toml"
    config.write_text('[job]\nplugins = ["my_family"]\n[model]\nflavor = "parallel_debug"\n'
                      '[model.parallel]\nbranch_scale = 0.25\n', encoding="utf-8")
    cfg = load_job_config([str(config)])
    args = build_model_args(cfg.model, 256)
    assert args.parallel.branch_scale == 0.25 and build_model(args).layers[0].scale == 0.25
    assert ModelArgs.from_dict(args.to_dict()) == args and args.to_dict()["parallel"] == {"branch_scale": 0.25}
    assert "[model.parallel]" in to_toml(cfg) and "--model.parallel.branch_scale" in help_text()
    assert "parallel" not in ModelArgs(**SIZES).to_dict()  # a dense model's record leaves it out
    with pytest.raises(ConfigError, match="model.parallel.branch_scale must be >= 0.0"):
        load_job_config([str(config), "--model.parallel.branch_scale=-1"])
    with pytest.raises(ConfigError, match="unknown key 'model.parallel.branch_scal'.*did you mean 'branch_scale'"):
        load_job_config([str(config), "--model.parallel.branch_scal=1"])
    dense = load_job_config(["--job.plugins=my_family", "--model.parallel.branch_scale=2"])
    with pytest.raises(ConfigError, match="model.parallel.branch_scale is set, but model.family = 'dense'.*'parallel'"):
        build_model_args(dense.model, 256)

    @dataclasses.dataclass
    class Other:
        """Another section under the same name."""

        width: int = option(1, "A width.")

    with pytest.raises(ValueError, match=r"\[model.parallel\] is already declared"):
        register_family(Family(name="other", block=FAMILIES["parallel"].block, sections={"parallel": Other}))
    assert "other" not in FAMILIES and SECTIONS["parallel"][0].__name__ == "Parallel"


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
    train, resume, export_line, summary_line = commands()
    for line in (train, resume, export_line):
        done = run(as_run_here(line), plugin)
        assert done.returncode == 0, (line, done.stderr[-3000:])
    summary = run(as_run_here(summary_line.replace("train_configs/", f"{REPO_ROOT}/train_configs/")), plugin)
    assert summary.returncode == 0, summary.stderr[-3000:]
    d, vocab, hidden = 128, 320, 4 * 128  # parallel_debug at the debug run's byte vocabulary (padded to 64s)
    expected = {"embeddings": vocab * d + 256 * d, "attention_query": 2 * (d * d // 2 + d // 2 * d + 2 * d),
                "norms": 2 * d + d, "attention_kv_out": 2 * 3 * d * d, "mlp": 2 * 2 * d * hidden, "head": 0}
    lines = dict(line.split(": ", 1) for line in summary.stdout.splitlines() if line.startswith("params_"))
    for component, count in expected.items():  # the paper's query: W1 d x d/2, W2 d/2 x d, its two norms
        assert lines[f"params_{component}"].split()[0] == f"{count:,}", (component, lines)
    assert "memory_estimate_gib" in summary.stdout
    stats = scalars(plugin / "outputs/parallel/tb")
    assert {"parallel/layer0/attn_share", "parallel/layer1/attn_share", "parallel/mean/attn_share"} <= set(stats)
    assert all(0 < value < 1 for value in stats["parallel/mean/attn_share"].values())
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


@pytest.mark.integration  # torchrun, 2 gloo processes
def test_the_family_on_two_processes_gives_one_process_losses_and_statistic(plugin: Path) -> None:
    """FSDP2 over 2 processes (1 micro-batch each) against 1 process with 2 accumulation steps: the same losses,
    and the family's statistic summed over the processes by its finish_step."""
    common = ["--job.plugins=my_family", "--model.flavor=parallel_debug", "--model.dim=32", "--model.n_heads=2",
              "--model.parallel.branch_scale=0.5", "--training.steps=6", "--training.seq_len=32",
              "--training.micro_batch_size=4", "--training.device=cpu", "--lr_schedule.warmup_steps=2",
              f"--data.path={plugin / 'data'}", "--data.tokenizer=byte", "--data.synthetic=true",
              "--metrics.log_interval=1", "--validation.interval=3", "--validation.sequences=8"]
    one = run_train(plugin, *common, "--job.name=one", "--training.grad_accum_steps=2")
    assert one.returncode == 0, one.stderr[-3000:]
    two = run_train(plugin, *common, "--job.name=two", "--training.grad_accum_steps=1", ngpu=2, timeout=600)
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = (scalars(plugin / "outputs" / name / "tb") for name in ("one", "two"))
    for tag in ("loss/train", "parallel/layer0/attn_share", "parallel/mean/attn_share"):
        assert a[tag].keys() == b[tag].keys() == set(range(1, 7)), tag
        for step in a[tag]:
            assert abs(a[tag][step] - b[tag][step]) <= 1e-5 * abs(a[tag][step]), (tag, step, a[tag][step], b[tag][step])


def test_block_builder_is_what_a_family_names() -> None:
    """The dense family's spec builds its blocks: the table the trainer, the tools and the wrapper read."""
    builder: BlockBuilder = FAMILIES["dense"].block
    model = build_model(ModelArgs(**SIZES))
    assert all(type(block) is builder for block in model.layers)
