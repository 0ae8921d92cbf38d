"""docs/extending.md's query-type walk-through, run as written there: a plugin module outside torchnlq.

The ```python block (``my_queries.py``) is written into a fresh folder and the ```bash block's
commands run from it, as a user would (only the checkout's path is put in front of
``./run_train.sh`` and ``scripts/``). Then the export is loaded in transformers in a process
where torchnlq cannot be imported, and its logits are compared with torchnlq's own model of the
same checkpoint; the type is also checked against its formula written out here, and compiled
whole (``fullgraph``: no graph break).
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from torchnlq.config.job_config import Query
from torchnlq.errors import UserError
from torchnlq.interop.hf_export import export_hf
from torchnlq.interop.load import LoadedModel, load_model
from torchnlq.models import Decoder, ModelArgs
from torchnlq.models.query import QUERY_TYPES
from torchnlq.models.counts import num_params
from torchnlq.models import build_model

from helpers import REPO_ROOT, WITHOUT_TORCHNLQ

DOC = REPO_ROOT / "docs" / "extending.md"
EPS = 1e-5


def doc_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)


def plugin_source() -> str:
    (block,) = [b for b in doc_blocks("python") if b.startswith("# my_queries.py")]
    return block


def commands() -> list[str]:
    (block,) = [b for b in doc_blocks("bash") if "--job.plugins my_queries" in b]
    return [line for line in block.splitlines() if line.strip()]


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """my_queries.py written from the docs into tmp_path and importable; the registry restored afterwards."""
    (tmp_path / "my_queries.py").write_text(plugin_source(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = dict(QUERY_TYPES)
    try:
        yield tmp_path
    finally:
        QUERY_TYPES.clear()
        QUERY_TYPES.update(before)
        sys.modules.pop("my_queries", None)


def tiny(query_type: str) -> Decoder:
    torch.manual_seed(0)
    model = build_model(ModelArgs(n_layers=2, dim=32, n_heads=4, vocab_size=48, max_seq_len=64, query=Query(type=query_type)))
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.copy_(torch.rand_like(p) + 0.5)  # gains away from 1: a lost gain shows
    return model


def ref_anchored(query: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """(X·W_Qᵀ + LN(GELU(RMSNorm(X)·W1ᵀ)·W2ᵀ)) / 2, exact-erf GELU, norms with gains and no bias."""
    g_in, g_out = query.input_norm.weight, query.output_norm.weight
    h = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * g_in @ query.w1.weight.T
    h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2))) @ query.w2.weight.T
    f = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + EPS) * g_out
    return (x @ query.w_q.weight.T + f) / 2


def test_the_plugin_type_matches_its_formula_and_counts(plugin: Path) -> None:
    import my_queries

    model = tiny("anchored_mlp")
    query = model.layers[0].attn.query
    assert isinstance(query, my_queries.AnchoredMLPQuery)
    assert num_params(model.args) == model.num_params()  # the docs' analytic count is what is allocated
    seen = {}
    query.register_forward_hook(lambda module, args, out: seen.update(x=args[0], q=out))
    with torch.no_grad():
        model(torch.randint(0, 48, (2, 16), generator=torch.Generator().manual_seed(1)))
        torch.testing.assert_close(seen["q"], ref_anchored(query, seen["x"]), rtol=1e-5, atol=1e-5)


def test_a_plugin_that_imports_other_packages_is_refused_before_writing(tmp_path: Path, plugin: Path) -> None:
    (plugin / "heavy_queries.py").write_text(
        plugin_source().replace("import torch.nn as nn", "import numpy\nimport torch.nn as nn").replace(
            '"anchored_mlp"', '"heavy_mlp"'), encoding="utf-8")
    import heavy_queries  # noqa: F401 - registers heavy_mlp

    try:
        model = tiny("heavy_mlp")
        loaded = LoadedModel(model, model.args, {"name": "byte", "eot_id": 47}, {}, tmp_path, "test")
        with pytest.raises(UserError, match="imports numpy: an export carries a plugin only when"):
            export_hf(loaded, tmp_path / "hf")
        assert not (tmp_path / "hf").exists()
    finally:
        sys.modules.pop("heavy_queries", None)


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full_env.update(OMP_NUM_THREADS="1", HF_HOME=str(cwd / "hf_home"), **(env or {}))
    return subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=600, check=False)


def as_run_here(line: str) -> list[str]:
    """A documented command, with the checkout's path in front of ./run_train.sh and scripts/."""
    words = shlex.split(line)
    if words[0] == "./run_train.sh":
        return ["bash", str(REPO_ROOT / "run_train.sh"), *words[1:]]
    assert words[0] == "python", line
    if words[1].startswith("scripts/"):
        return [sys.executable, str(REPO_ROOT / words[1]), *words[2:]]
    return [sys.executable, *words[1:]]


BLOCKED = WITHOUT_TORCHNLQ + """
import json
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
assert not any(m.split(".")[0] in ("torchnlq", "my_queries") for m in sys.modules)
with torch.no_grad():
    print(json.dumps(model(torch.tensor(json.loads(sys.argv[2]))).logits.tolist()))
"""


@pytest.mark.integration
def test_the_walk_through_runs_as_written(plugin: Path) -> None:
    """Train with the plugin, export with --format hf, load in transformers without torchnlq: same logits."""
    for line in commands():
        result = run(as_run_here(line), plugin)
        assert result.returncode == 0, f"{line}\n{result.stderr[-3000:]}"
    export = plugin / "exports" / "anchored_mlp"
    assert (export / "plugin_my_queries.py").is_file()
    help_text = run(["bash", str(REPO_ROOT / "run_train.sh"), "--job.plugins", "my_queries", "--help"], plugin)
    assert re.search(r"--model\.query\.type\n.*one of [^\n]*anchored_mlp", help_text.stdout), help_text.stdout[:2000]
    # The checkpoint sampled without --plugins: one line that says to import the plugin, not that the file is damaged.
    forgot = run([sys.executable, str(REPO_ROOT / "scripts" / "generate.py"),
                  "outputs/anchored_mlp/checkpoints/step-20", "--max-new-tokens", "4"], plugin)
    assert forgot.returncode == 2 and forgot.stderr.count("\n") == 1, forgot.stderr[-2000:]
    assert "query type 'anchored_mlp', which no imported module registers" in forgot.stderr
    assert "--plugins MODULE" in forgot.stderr and "damaged" not in forgot.stderr

    import my_queries  # noqa: F401 - what --plugins does for the tools

    model = load_model(plugin / "outputs" / "anchored_mlp" / "checkpoints" / "step-20").model
    tokens = torch.randint(0, model.args.vocab_size, (2, 24), generator=torch.Generator().manual_seed(3))
    (other_folder := plugin / "elsewhere").mkdir()  # not the folder holding my_queries.py
    result = run([sys.executable, "-c", BLOCKED, str(export), json.dumps(tokens.tolist())],
                 other_folder)
    assert result.returncode == 0, result.stderr[-3000:]
    hf_logits = torch.tensor(json.loads(result.stdout.strip().splitlines()[-1]))
    with torch.no_grad():
        expected = model(tokens)
        assert ((hf_logits - expected).abs().max() / expected.abs().max()).item() <= 1e-5
        compiled = torch.compile(model, fullgraph=True)  # fullgraph: a graph break is an error
        torch.testing.assert_close(compiled(tokens), expected, rtol=1e-4, atol=1e-4)


def _constructors() -> dict[str, str]:
    """__init__ signatures a plugin might write, each with the body that builds under it."""
    return {
        "(self, cfg, shape)": "super().__init__(cfg, shape)",
        "(self, cfg, shape, extra=1)": "super().__init__(cfg, shape)",
        "(self, *args, **kwargs)": "super().__init__(*args, **kwargs)",
        "(self, cfg, dim, n_heads, head_dim, norm_eps)": "super().__init__(cfg, dim)",
        "(self, cfg, dim, n_heads, head_dim, norm_eps=1e-5)": "super().__init__(cfg, dim)",
        "(self, cfg, shape, extra)": "super().__init__(cfg, shape)",
        "(self, cfg)": "super().__init__(cfg, None)",
    }


@pytest.mark.parametrize("signature", list(_constructors()))
def test_a_query_constructor_off_the_contract_is_refused_at_registration(signature: str) -> None:
    """register_query refuses (one ConfigError naming (cfg, shape) and docs/extending.md) exactly the classes that
    cannot be built as cls(cfg, shape): the build itself is the reference (issue 47.7)."""
    from torchnlq.errors import ConfigError
    from torchnlq.models import register_query
    from torchnlq.models.query import QueryProjection, QueryShape

    namespace: dict = {"QueryProjection": QueryProjection}
    exec(f"class Plugin(QueryProjection):\n    def __init__{signature}:\n        {_constructors()[signature]}\n"
         "    def forward(self, x):\n        return x\n", namespace)
    cls = namespace["Plugin"]
    try:
        cls(Query(), QueryShape(8, 2, 4, 1e-5, 0, 1))
        builds = True
    except TypeError:
        builds = False
    try:
        register_query("plugin_signature_probe")(cls)
        registered = True
    except ConfigError as e:
        registered = False
        assert "(cfg, shape)" in str(e) and "docs/extending.md" in str(e) and "\n" not in str(e), e
    finally:
        QUERY_TYPES.pop("plugin_signature_probe", None)
    assert registered == builds, (signature, registered, builds)
