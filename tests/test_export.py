"""Loading checkpoints, safetensors export, load_pretrained, Hugging Face GPT-2 export, convert_checkpoint.py."""

from __future__ import annotations

import json
import re
import os

import pytest
import torch
from safetensors import safe_open

import torchnlq
from torchnlq.config.job_config import Query
from torchnlq.errors import ConfigError, UserError
from torchnlq.models import ModelArgs
from torchnlq.interop.export import export_safetensors
from torchnlq.interop.load import LoadedModel, load_model
from torchnlq.interop.export import export_hf_standard

from helpers.checkpoints import BYTE_TOKENIZER, SEQ_LEN, VALIDATION, load_script, tiny_args, tiny_model, write_checkpoint

TOKENS = torch.randint(0, 257, (2, 20), generator=torch.Generator().manual_seed(1))
CONFIGS = {
    "linear_tied": dict(qtype="linear"),
    "linear_untied": dict(qtype="linear", tie_embeddings=False),
    "residual_mlp_rope_gqa": dict(qtype="residual_mlp", positions="rope", n_kv_heads=2),
    "identity_mqa": dict(qtype="identity", n_kv_heads=1, tie_embeddings=False),
}


def logits(model, tokens=TOKENS):
    with torch.no_grad():
        return model(tokens)


# ---------------------------------------------------------------- ModelArgs round trip

@pytest.mark.parametrize("qtype", ["linear", "identity", "residual", "residual_mlp"])
def test_model_args_round_trip(qtype):
    args = ModelArgs(n_kv_heads=2, positions="rope", tie_embeddings=False, mlp_hidden=100,
                     query=Query(type=qtype, activation="relu2", bottleneck_ratio=0.25, half_scale=False))
    d = json.loads(json.dumps(args.to_dict()))
    assert d["query"]["type"] == qtype and d["n_kv_heads"] == 2
    assert ModelArgs.from_dict(d) == args


def test_model_args_unknown_keys_are_errors():
    d = ModelArgs().to_dict()
    with pytest.raises(ConfigError, match="model_args has unknown keys moe_experts"):
        ModelArgs.from_dict({**d, "moe_experts": 8})
    with pytest.raises(ConfigError, match=r"model_args.query has unknown keys anchor"):
        ModelArgs.from_dict({**d, "query": {**d["query"], "anchor": True}})


# ---------------------------------------------------------------- checkpoint loading

@pytest.mark.parametrize("name", list(CONFIGS))
def test_checkpoint_loads_only_the_model(tmp_path, name):
    model = tiny_model(**CONFIGS[name])
    write_checkpoint(tmp_path / "step-7", model)
    loaded = load_model(tmp_path / "step-7")
    assert loaded.kind == "checkpoint" and not loaded.model.training
    assert loaded.args == model.args
    assert loaded.tokenizer == BYTE_TOKENIZER
    assert loaded.meta["seq_len"] == SEQ_LEN and loaded.meta["validation"] == VALIDATION
    torch.testing.assert_close(logits(loaded.model), logits(model), rtol=0, atol=0)


def test_loading_leaves_the_global_rng_alone(tmp_path):
    write_checkpoint(tmp_path / "ckpt", tiny_model())
    state = torch.get_rng_state()
    load_model(tmp_path / "ckpt")
    assert torch.equal(state, torch.get_rng_state())


# ---------------------------------------------------------------- safetensors export

@pytest.mark.parametrize("name", list(CONFIGS))
def test_safetensors_round_trip_is_exact(tmp_path, name):
    model = tiny_model(**CONFIGS[name])
    write_checkpoint(tmp_path / "ckpt", model)
    out = export_safetensors(tmp_path / "ckpt", tmp_path / "export")
    assert sorted(os.listdir(out)) == ["config.json", "merges.txt", "model.safetensors", "special_tokens_map.json",
                                       "tokenizer.json", "tokenizer_config.json", "vocab.json"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left
    config = json.loads((out / "config.json").read_text())
    assert config["format"] == "torchnlq-safetensors" and config["torchnlq_version"] == torchnlq.__version__
    assert config["seq_len"] == SEQ_LEN and config["validation"] == VALIDATION and config["step"] == 7
    assert config["tokenizer"] == BYTE_TOKENIZER  # the description; tokenizer_config.json is Hugging Face's
    hf_config = json.loads((out / "tokenizer_config.json").read_text())
    assert hf_config["tokenizer_class"] == "GPT2Tokenizer" and hf_config["model_max_length"] == model.args.max_seq_len
    rebuilt = torchnlq.load_pretrained(out)
    assert rebuilt.args == model.args and not rebuilt.training
    torch.testing.assert_close(logits(rebuilt), logits(model), rtol=0, atol=0)
    # An export loads like a checkpoint, with the same metadata keys.
    again = load_model(out)
    assert again.kind == "export" and again.meta["validation"] == VALIDATION and again.tokenizer == BYTE_TOKENIZER


@pytest.mark.parametrize("tie", [True, False])
def test_tied_weights_stored_once_and_stay_tied(tmp_path, tie):
    model = tiny_model(tie_embeddings=tie)
    out = export_safetensors(LoadedModel(model, model.args, BYTE_TOKENIZER, {}, tmp_path, "test"), tmp_path / "e")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert ("lm_head.weight" in f.keys()) == (not tie)
    rebuilt = torchnlq.load_pretrained(out)
    assert (rebuilt.lm_head is None) == tie
    assert rebuilt.num_params() == model.num_params()


@pytest.mark.parametrize("dtype,atol", [("bf16", 0.05), ("fp16", 0.005)])
def test_half_precision_export(tmp_path, dtype, atol):
    model = tiny_model("residual_mlp")
    write_checkpoint(tmp_path / "ckpt", model)
    out = export_safetensors(tmp_path / "ckpt", tmp_path / "e", dtype=dtype)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("tok_emb.weight").dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    rebuilt = torchnlq.load_pretrained(out)
    assert rebuilt.tok_emb.weight.dtype == torch.float32  # upcast on load
    torch.testing.assert_close(logits(rebuilt), logits(model), rtol=0, atol=atol)


def test_export_refuses_existing_folder_unless_overwrite(tmp_path):
    write_checkpoint(tmp_path / "ckpt", tiny_model())
    (tmp_path / "e").mkdir()
    with pytest.raises(UserError, match="already exists"):
        export_safetensors(tmp_path / "ckpt", tmp_path / "e")
    export_safetensors(tmp_path / "ckpt", tmp_path / "e", overwrite=True)
    assert (tmp_path / "e" / "model.safetensors").is_file()
    with pytest.raises(UserError, match="unknown dtype 'fp8'"):
        export_safetensors(tmp_path / "ckpt", tmp_path / "f", dtype="fp8")


def old_format_export(export, description=BYTE_TOKENIZER, in_config=True):
    """Turn a new export into one written before the tokenizer files: tokenizer_config.json = the description."""
    for name in ("vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer.json"):
        (export / name).unlink()
    (export / "tokenizer_config.json").write_text(json.dumps(description))
    if not in_config:  # the oldest exports: the description only in tokenizer_config.json
        config = json.loads((export / "config.json").read_text())
        del config["tokenizer"]
        (export / "config.json").write_text(json.dumps(config))
    return export


@pytest.mark.parametrize("in_config", [True, False])
def test_an_export_of_the_old_format_still_loads(tmp_path, in_config):
    model = tiny_model()
    write_checkpoint(tmp_path / "ckpt", model)
    old = old_format_export(export_safetensors(tmp_path / "ckpt", tmp_path / "old"), in_config=in_config)
    loaded = load_model(old)
    assert loaded.tokenizer == BYTE_TOKENIZER
    torch.testing.assert_close(logits(loaded.model), logits(model), rtol=0, atol=0)
    # Converted again, it gets the tokenizer files; the old folder may be replaced (only export files).
    again = export_safetensors(old, tmp_path / "new")
    assert (again / "vocab.json").is_file() and load_model(again).tokenizer == BYTE_TOKENIZER
    export_safetensors(tmp_path / "ckpt", old, overwrite=True)
    assert (old / "vocab.json").is_file()


def test_export_without_a_recorded_tokenizer_reads_its_tokenizer_files(tmp_path):
    write_checkpoint(tmp_path / "ckpt", tiny_model())
    out = export_safetensors(tmp_path / "ckpt", tmp_path / "e")
    config = json.loads((out / "config.json").read_text())
    del config["tokenizer"]
    (out / "config.json").write_text(json.dumps(config))
    assert load_model(out).tokenizer == BYTE_TOKENIZER  # from vocab.json: the 256 bytes and end-of-text


# ---------------------------------------------------------------- errors

def test_missing_path(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_model(tmp_path / "nope")


def test_not_a_checkpoint(tmp_path):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(UserError, match="neither a torchnlq checkpoint.*looks like a run folder"):
        load_model(tmp_path / "run")


def test_corrupt_meta(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", tiny_model())
    (ckpt / "torchnlq.json").write_text("{not json")
    with pytest.raises(UserError, match="corrupt"):
        load_model(ckpt)
    (ckpt / "torchnlq.json").write_text(json.dumps({"step": 3}))
    with pytest.raises(UserError, match="no model_args"):
        load_model(ckpt)
    (ckpt / "torchnlq.json").write_text(json.dumps({"model_args": {"dim": "wide"}}))
    with pytest.raises(UserError, match="invalid model_args"):
        load_model(ckpt)


def test_incomplete_checkpoint(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", tiny_model())
    (ckpt / ".metadata").unlink()
    with pytest.raises(UserError, match="incomplete"):
        load_model(ckpt)


def test_shape_mismatch_names_the_tensor(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", tiny_model(), model_args=tiny_args(mlp_hidden=64).to_dict())
    with pytest.raises(UserError, match=r"tensor 'layers.0.mlp.fc.weight' has shape \(128, 32\).*\(64, 32\)"):
        load_model(ckpt)
    ckpt2 = write_checkpoint(tmp_path / "ckpt2", tiny_model(), model_args=tiny_args(tie_embeddings=False).to_dict())
    with pytest.raises(UserError, match="lacks tensor 'lm_head.weight'"):
        load_model(ckpt2)


@pytest.mark.integration  # loads transformers (the optional dev extra): seconds
def test_a_hugging_face_gpt2_export_loads_back_as_the_same_model(tmp_path):
    """load_model opens a Hugging Face folder too (generate.py, evaluate.py): the same logits as the source."""
    pytest.importorskip("transformers")
    model = tiny_model()
    export_hf_standard(LoadedModel(model, model.args, BYTE_TOKENIZER, {}, tmp_path, "test"), tmp_path / "hf", "hf-gpt2")
    loaded = load_model(tmp_path / "hf")
    x = torch.randint(0, model.args.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x), model(x), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- Hugging Face GPT-2

@pytest.mark.integration  # runs transformers' GPT2LMHeadModel on the export
@pytest.mark.parametrize(
    "qtype,tie,mlp_hidden",
    [
        ("linear", True, None), ("linear", False, None), ("linear", True, 40),
        ("identity", False, 72), ("residual", True, 40),
    ],
)
def test_hf_gpt2_logits_match(tmp_path, qtype, tie, mlp_hidden):
    transformers = pytest.importorskip("transformers")
    model = tiny_model(qtype, tie_embeddings=tie, mlp_hidden=mlp_hidden)
    write_checkpoint(tmp_path / "ckpt", model)
    out = export_hf_standard(tmp_path / "ckpt", tmp_path / "hf", "hf-gpt2")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(out)).eval()
    assert hf.config.activation_function == "gelu" and hf.config.n_inner == model.args.mlp_hidden
    assert (hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()) == tie
    with torch.no_grad():
        torch.testing.assert_close(hf(TOKENS).logits, logits(model), rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(qtype="residual_mlp"),
         "query type residual_mlp has no GPT-2 equivalent (GPT-2's query is linear in X, this one is not); export "
         "with --format hf (any model) or --format safetensors"),
        (dict(positions="rope"), "positions='rope'"),
        (dict(n_kv_heads=2), "GQA/MQA"),
        (dict(head_dim=4), "head_dim = dim / n_heads"),
    ],
)
def test_hf_gpt2_refuses_what_it_cannot_represent(tmp_path, kw, message):
    model = tiny_model(**kw)
    with pytest.raises(UserError, match=re.escape(message)):
        export_hf_standard(LoadedModel(model, model.args, BYTE_TOKENIZER, {}, tmp_path, "test"), tmp_path / "hf", "hf-gpt2")
    assert not (tmp_path / "hf").exists()


@pytest.fixture
def restore_query_types():
    from torchnlq.models.query import QUERY_TYPES

    before = dict(QUERY_TYPES)
    yield
    QUERY_TYPES.clear()
    QUERY_TYPES.update(before)


@pytest.mark.integration  # runs transformers' GPT2LMHeadModel on the export
def test_hf_gpt2_asks_the_query_class_not_its_name(tmp_path, restore_query_types):
    """A new linear type with a scale, Q = (X + X·W_Q)/2, exports as W = (I + W_Q)/2; a subclass of
    ``linear`` whose forward is nonlinear does not inherit ``linear_in_x`` and is refused."""
    transformers = pytest.importorskip("transformers")
    from torchnlq.models.query import LinearQuery, ResidualQuery, register_query

    @register_query("half_residual_test")
    class HalfResidual(ResidualQuery):
        linear_in_x = True

        def forward(self, x):
            return (x + self.w_q(x)) / 2

        def linear_weight(self):
            return (torch.eye(self.dim) + self.w_q.weight.detach()) / 2

    @register_query("tanh_linear_test")
    class TanhLinear(LinearQuery):
        def forward(self, x):
            return torch.tanh(self.w_q(x))

    model = tiny_model("half_residual_test")
    export_hf_standard(LoadedModel(model, model.args, BYTE_TOKENIZER, {}, tmp_path, "test"), tmp_path / "hf", "hf-gpt2")
    hf = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(TOKENS).logits, logits(model), rtol=0, atol=1e-4)
    nonlinear = tiny_model("tanh_linear_test")
    with pytest.raises(UserError, match="query type tanh_linear_test has no GPT-2 equivalent"):
        export_hf_standard(LoadedModel(nonlinear, nonlinear.args, BYTE_TOKENIZER, {}, tmp_path, "test"), tmp_path / "hf2", "hf-gpt2")


# ---------------------------------------------------------------- scripts/convert_checkpoint.py

def test_convert_checkpoint_script(tmp_path, capsys):
    script = load_script("convert_checkpoint")
    model = tiny_model()
    write_checkpoint(tmp_path / "ckpt", model)
    assert script.run_cli(script.main, [str(tmp_path / "ckpt"), str(tmp_path / "out"), "--dtype", "bf16"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"  # torch's name, as HF
    assert script.run_cli(script.main, [str(tmp_path / "missing"), str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    residual_mlp = write_checkpoint(tmp_path / "ckpt2", tiny_model("residual_mlp"))
    assert script.run_cli(script.main, [str(residual_mlp), str(tmp_path / "o3"), "--format", "hf-gpt2"]) == 2
    assert "no GPT-2 equivalent" in capsys.readouterr().err
