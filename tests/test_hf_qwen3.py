"""QK-norm models as standard Qwen3 both ways (issue 32.2): ``--format hf-qwen3`` writes a ``Qwen3ForCausalLM`` folder
(no remote code), and a Qwen3 folder is read, upcycled and continued.

Qwen3 is the Llama block with a per-head RMSNorm (head_dim gains, the blocks' epsilon) on queries and keys after
their projections and before RoPE: torchnlq's model.qk_norm as it is. The reference is transformers' own
Qwen3ForCausalLM with random weights (every norm gain drawn away from 1), saved with save_pretrained.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchnlq.config.job_config import Query
from torchnlq.errors import UserError
from torchnlq.interop.export import export_hf_standard
from torchnlq.models.dense.hf import qwen3_model_args
from torchnlq.interop.load import LoadedModel, load_model
from torchnlq.interop.hf_folder import read_hf_model
from torchnlq.interop.upcycle import upcycle
from torchnlq.models import Decoder, ModelArgs
from torchnlq.models.counts import num_params
from torchnlq.models import build_model

from helpers.checkpoints import BYTE_TOKENIZER, load_script, write_checkpoint

transformers = pytest.importorskip("transformers")

SHAPE = dict(vocab_size=320, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6)


def tokens(batch: int = 2, length: int = 24) -> torch.Tensor:
    return torch.randint(0, 320, (batch, length), generator=torch.Generator().manual_seed(7))


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def hf_logits(folder: Path, x: torch.Tensor) -> torch.Tensor:
    model = transformers.Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(x).logits


def save_random_qwen3(folder: Path, **config: object) -> Path:
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{**SHAPE, **config})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def qwen3_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_random_qwen3(tmp_path_factory.mktemp("qwen3") / "hf", rope_theta=1e6)


def qk_norm_model(qtype: str = "linear", **kw: object) -> Decoder:
    base = dict(n_layers=2, dim=32, n_heads=4, n_kv_heads=2, mlp_hidden=48, vocab_size=320, max_seq_len=64,
                positions="rope", norm="rms", mlp_activation="swiglu", qk_norm=True)
    torch.manual_seed(1)
    model = build_model(ModelArgs(**{**base, **kw}, query=Query(type=qtype))).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)  # the QK-norm gains too: a dropped or misplaced one shows
    return model


def export(model: Decoder, out: Path) -> Path:
    return export_hf_standard(LoadedModel(model, model.args, BYTE_TOKENIZER, {}, out.parent, "test"), out, "hf-qwen3")


EXPORT_CASES = {
    "tied": {},
    "untied-llama3-rope": {"tie_embeddings": False, "rope_theta": 5e5, "rope_scaling_factor": 8.0,
                           "rope_original_max_seq_len": 16},
    "mqa-head-dim-eps": {"n_kv_heads": 1, "head_dim": 16, "norm_eps": 1e-5},
}


@pytest.mark.parametrize("qtype, kw", [
    pytest.param(q, kw, id=f"{q}-{name}") for q in ("linear", "identity", "residual")
    for name, kw in EXPORT_CASES.items() if q == "linear" or "head_dim" not in kw  # X itself needs q_dim = dim
])
def test_a_qk_norm_model_exports_as_transformers_qwen3(tmp_path: Path, qtype: str, kw: dict) -> None:
    model = qk_norm_model(qtype, **kw)
    out = export(model, tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3" and "auto_map" not in config
    assert not any(p.suffix == ".py" for p in out.iterdir())
    x = tokens()
    with torch.no_grad():
        assert relative_error(hf_logits(out, x), model(x)) <= 1e-5


def test_greedy_generation_of_the_export_is_torchnlqs(tmp_path: Path) -> None:
    model = qk_norm_model(tie_embeddings=False)
    hf = transformers.Qwen3ForCausalLM.from_pretrained(export(model, tmp_path / "hf"), dtype=torch.float32).eval()
    prompt = tokens(1, 5)
    generated = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0, eos_token_id=None)
    ids = prompt
    with torch.no_grad():
        for _ in range(12):
            ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(generated, ids)


@pytest.mark.parametrize("what, qtype, kw", [
    ("query type residual_mlp has no Qwen3 equivalent", "residual_mlp", {}),
    ("model.bias=True: Qwen3 has RoPE, RMSNorm, the SwiGLU MLP without biases", "linear", {"bias": True}),
    ("model.norm='layer'", "linear", {"norm": "layer"}),
    ("this model is a standard Llama: export it with --format hf-llama", "linear", {"qk_norm": False}),
])
def test_what_qwen3_cannot_compute_is_one_line(tmp_path: Path, what: str, qtype: str, kw: dict) -> None:
    with pytest.raises(UserError, match=what) as info:
        export(qk_norm_model(qtype, **kw), tmp_path / "hf")
    assert "--format hf" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "hf").exists()


def test_an_imported_qwen3_gives_transformers_logits(qwen3_folder: Path) -> None:
    args, _, _ = read_hf_model(qwen3_folder)
    assert (args.qk_norm, args.head_dim, args.n_kv_heads, args.bias, args.tie_embeddings) == (True, 16, 2, False, False)
    loaded = load_model(qwen3_folder)
    hf = transformers.Qwen3ForCausalLM.from_pretrained(qwen3_folder)
    assert loaded.model.num_params() == num_params(args) == sum(p.numel() for p in hf.parameters())
    x = tokens()
    with torch.no_grad():
        assert relative_error(loaded.model(x), hf_logits(qwen3_folder, x)) <= 1e-5


@pytest.mark.parametrize("layers", ["all", "1-2"])
def test_the_anchored_query_starts_as_the_pretrained_qwen3(qwen3_folder: Path, layers: str) -> None:
    loaded = upcycle(qwen3_folder, Query(type="anchored", layers=layers, bottleneck_ratio=0.25), seed=3)
    assert loaded.args.qk_norm and loaded.args.query.type == "anchored"
    x = tokens()
    with torch.no_grad():
        assert relative_error(loaded.model(x), hf_logits(qwen3_folder, x)) <= 1e-5


def test_an_imported_qwen3_exports_back(qwen3_folder: Path, tmp_path: Path) -> None:
    out = export_hf_standard(upcycle(qwen3_folder), tmp_path / "back", "hf-qwen3")
    config = json.loads((out / "config.json").read_text())
    assert config["layer_types"] == ["full_attention"] * 3 and config["use_sliding_window"] is False
    x = tokens()
    assert relative_error(hf_logits(out, x), hf_logits(qwen3_folder, x)) <= 1e-6


def test_a_transformers_4_config_without_layer_types_reads(qwen3_folder: Path) -> None:
    """4.x names: rope_theta at the top, no layer_types; a window that is off (or covers no layer) is full attention."""
    config = json.loads((qwen3_folder / "config.json").read_text())
    old = {k: v for k, v in config.items() if k not in ("layer_types", "rope_parameters")} | {
        "rope_theta": 1e6, "rope_scaling": None, "use_sliding_window": False, "sliding_window": 4096,
        "max_window_layers": 28}
    assert qwen3_model_args(old) == read_hf_model(qwen3_folder)[0]
    with pytest.raises(UserError, match="Qwen3 sliding-window attention"):
        qwen3_model_args(old | {"use_sliding_window": True, "max_window_layers": 2})


def test_a_config_of_the_wrong_type_names_its_key(tmp_path: Path) -> None:
    folder = save_random_qwen3(tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "head_dim": "16"}))
    with pytest.raises(UserError, match=r"config.json': invalid head_dim: \"16\" is a string, not an integer"):
        load_model(folder)


def test_the_script_exports_a_trained_qk_norm_checkpoint(tmp_path: Path) -> None:
    """convert_checkpoint.py --format hf-qwen3 on a torchnlq checkpoint, loaded by transformers."""
    from torchnlq.cli import run_cli

    ckpt = write_checkpoint(tmp_path / "ckpt", qk_norm_model(tie_embeddings=False))
    argv = [str(ckpt), str(tmp_path / "hf"), "--format", "hf-qwen3"]
    assert run_cli(load_script("convert_checkpoint").main, argv) == 0
    x = tokens()
    with torch.no_grad():
        assert relative_error(hf_logits(tmp_path / "hf", x), load_model(ckpt).model(x)) <= 1e-5
