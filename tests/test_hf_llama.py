"""Hugging Face Llama both ways (issue 21.3): a Llama-style torchnlq model exports as a standard
``LlamaForCausalLM`` folder, and a Llama folder is read, continued and upcycled.

The reference is transformers' own LlamaForCausalLM, built here with random weights (every norm
gain and bias drawn away from its init, so a mistake in any of them shows), saved with
save_pretrained: never a download.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from torchnlq.config.job_config import Query
from torchnlq.errors import UserError
from torchnlq.interop.export import export_hf_standard
from torchnlq.interop.load import LoadedModel, load_model
from torchnlq.interop.hf_folder import read_hf_model
from torchnlq.interop.upcycle import upcycle
from torchnlq.models import Decoder, ModelArgs
from torchnlq.models.counts import num_params
from torchnlq.models import build_model

from helpers.train import tiny_config

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.integration  # transformers' models

BYTE_TOKENIZER = {"name": "byte", "vocab_size": 257, "eot_id": 256}
SHAPE = dict(vocab_size=320, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6)
SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16}


def tokens(batch: int = 2, length: int = 24) -> torch.Tensor:
    return torch.randint(0, 320, (batch, length), generator=torch.Generator().manual_seed(7))


def max_relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def hf_logits(folder: Path, x: torch.Tensor) -> torch.Tensor:
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(x).logits


def save_random_llama(folder: Path, **config: object) -> Path:
    """A LlamaForCausalLM with random weights (norm gains and biases too), saved with save_pretrained."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**SHAPE, **config})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0, 0.1)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama as real ones ship: its tokenizer saved beside the weights (tests/test_hf_folders_in.py has more)."""
    from test_hf_folders_in import shipped_tokenizer

    folder = save_random_llama(tmp_path_factory.mktemp("llama") / "hf", rope_scaling=SCALING, rope_theta=5e5,
                               tie_word_embeddings=False)
    shipped_tokenizer().save_pretrained(folder)
    return folder


def llama_style(qtype: str = "linear", **kw: object) -> Decoder:
    base = dict(n_layers=2, dim=32, n_heads=4, n_kv_heads=2, mlp_hidden=48, vocab_size=320, max_seq_len=64,
                positions="rope", norm="rms", mlp_activation="swiglu")
    args = ModelArgs(**{**base, **kw}, query=Query(type=qtype))
    torch.manual_seed(1)
    model = build_model(args).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    return model


EXPORT_CASES = {
    "tied": {},
    "untied-llama3-rope": {"tie_embeddings": False, "rope_theta": 5e5, "rope_scaling_factor": 8.0,
                           "rope_original_max_seq_len": 16},
    "bias-mqa-head-dim": {"bias": True, "n_kv_heads": 1, "head_dim": 16},
}


@pytest.mark.parametrize("qtype, kw", [
    pytest.param(q, kw, id=f"{q}-{name}") for q in ("linear", "identity", "residual")
    for name, kw in EXPORT_CASES.items() if q == "linear" or "head_dim" not in kw  # X itself needs q_dim = dim
])
def test_a_llama_style_model_exports_as_transformers_llama(tmp_path: Path, kw: dict, qtype: str) -> None:
    model = llama_style(qtype, **kw)
    out = export_hf_standard(LoadedModel(model, model.args, BYTE_TOKENIZER, {}, tmp_path, "test"), tmp_path / "hf", "hf-llama")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and "auto_map" not in config  # no remote code
    assert not any(p.suffix == ".py" for p in out.iterdir())
    x = tokens()
    with torch.no_grad():
        ours = model(x)
    assert max_relative_error(hf_logits(out, x), ours) <= 1e-5


def test_greedy_generation_of_the_export_is_torchnlqs(tmp_path: Path) -> None:
    model = llama_style(tie_embeddings=False, rope_scaling_factor=8.0, rope_original_max_seq_len=16)
    out = export_hf_standard(LoadedModel(model, model.args, BYTE_TOKENIZER, {}, tmp_path, "test"), tmp_path / "hf", "hf-llama")
    hf = transformers.LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    prompt = tokens(1, 5)
    generated = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    ids = prompt
    with torch.no_grad():
        for _ in range(12):
            ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(generated, ids)


@pytest.mark.parametrize("what, kw", [
    ("query type residual_mlp has no Llama equivalent", {"qtype": "residual_mlp"}),
    ("model.qk_norm=True", {"qk_norm": True}),
    ("model.norm='layer'", {"norm": "layer"}),
])
def test_what_llama_cannot_compute_is_one_line(tmp_path: Path, what: str, kw: dict) -> None:
    qtype = kw.pop("qtype", "linear")
    model = llama_style(qtype, **kw)
    with pytest.raises(UserError, match=what) as info:
        export_hf_standard(LoadedModel(model, model.args, BYTE_TOKENIZER, {}, tmp_path, "test"), tmp_path / "hf", "hf-llama")
    assert "--format hf" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "hf").exists()


def test_an_imported_llama_gives_transformers_logits(llama_folder: Path) -> None:
    args, _, _ = read_hf_model(llama_folder)
    assert (args.norm, args.mlp_activation, args.positions, args.n_kv_heads, args.rope_scaling_factor) == (
        "rms", "swiglu", "rope", 2, 8.0)
    loaded = upcycle(llama_folder)
    hf = transformers.LlamaForCausalLM.from_pretrained(llama_folder)
    assert loaded.model.num_params() == num_params(args) == sum(p.numel() for p in hf.parameters())
    x = tokens()
    with torch.no_grad():
        assert max_relative_error(loaded.model(x), hf_logits(llama_folder, x)) <= 1e-5


def test_a_llama_with_biases_and_tied_head_is_read_exactly(tmp_path: Path) -> None:
    folder = save_random_llama(tmp_path / "hf", attention_bias=True, mlp_bias=True, tie_word_embeddings=True)
    loaded = upcycle(folder)
    assert loaded.args.bias and loaded.args.tie_embeddings
    x = tokens()
    with torch.no_grad():
        assert max_relative_error(loaded.model(x), hf_logits(folder, x)) <= 1e-5


@pytest.mark.parametrize("layers", ["all", "1-2"])
def test_the_anchored_query_starts_as_the_pretrained_llama(llama_folder: Path, layers: str) -> None:
    loaded = upcycle(llama_folder, Query(type="anchored", layers=layers, bottleneck_ratio=0.25), seed=3)
    x = tokens()
    with torch.no_grad():
        assert max_relative_error(loaded.model(x), hf_logits(llama_folder, x)) <= 1e-5


def test_an_imported_llama_exports_back(llama_folder: Path, tmp_path: Path) -> None:
    out = export_hf_standard(upcycle(llama_folder), tmp_path / "back", "hf-llama")
    x = tokens()
    assert max_relative_error(hf_logits(out, x), hf_logits(llama_folder, x)) <= 1e-6
    assert (out / "tokenizer.json").read_bytes() == (llama_folder / "tokenizer.json").read_bytes()


def test_reading_refuses_what_torchnlq_cannot_compute(tmp_path: Path) -> None:
    folder = save_random_llama(tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    for change, message in ((dict(hidden_act="gelu"), "hidden_act 'gelu'"),
                            (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "RoPE type 'yarn'"),
                            (dict(attention_bias=True, mlp_bias=False), "attention_bias != mlp_bias")):
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(UserError, match=message):
            upcycle(folder)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").unlink()
    with pytest.raises(UserError, match="has no model.safetensors"):
        upcycle(folder)


def run_config(tmp_path: Path, name: str, initial: Path, **query: object):
    """A tiny run whose [model] settings are the Llama fixture's, starting from ``initial``."""
    return tiny_config(
        tmp_path, name, steps=2, model__n_layers=3, model__dim=32, model__n_heads=4, model__n_kv_heads=2,
        model__mlp_hidden=48, model__vocab_size=320, model__max_seq_len=64, model__norm="rms",
        model__mlp_activation="swiglu", model__positions="rope", model__rope_theta=5e5, model__norm_eps=1e-6,
        model__rope_scaling_factor=8.0, model__rope_original_max_seq_len=16, model__tie_embeddings=False,
        model__init="depth", checkpoint__initial_load_path=initial, training__grad_accum_steps=1,
        validation__enabled=False, **{f"model__query__{k}": v for k, v in query.items()},
    )


@pytest.mark.parametrize("query", [{"type": "linear"}, {"type": "anchored", "layers": "1-2"}])
def test_a_run_continues_or_upcycles_a_llama_folder(llama_folder: Path, tmp_path: Path, query: dict) -> None:
    """--checkpoint.initial_load_path LLAMA_FOLDER: the first training loss is transformers' on the same batch."""
    from torchnlq.train.trainer import Trainer

    trainer = Trainer(run_config(tmp_path, "run", llama_folder, **query))
    x, y = next(iter(trainer.loader.micro_batches(0)))
    hf = transformers.LlamaForCausalLM.from_pretrained(llama_folder, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = F.cross_entropy(hf(x).logits.flatten(0, 1), y.flatten()).item()
    loss, _ = trainer.train_step()
    assert math.isclose(loss, expected, rel_tol=1e-5)


def test_the_script_exports_a_trained_llama_checkpoint(tmp_path: Path) -> None:
    """convert_checkpoint.py --format hf-llama on a torchnlq checkpoint, loaded by transformers."""
    from helpers.checkpoints import load_script, write_checkpoint
    from torchnlq.cli import run_cli

    model = llama_style(tie_embeddings=False)
    ckpt = write_checkpoint(tmp_path / "ckpt", model)
    assert run_cli(load_script("convert_checkpoint").main, [str(ckpt), str(tmp_path / "hf"), "--format", "hf-llama"]) == 0
    x = tokens()
    with torch.no_grad():
        assert max_relative_error(hf_logits(tmp_path / "hf", x), load_model(ckpt).model(x)) <= 1e-5
