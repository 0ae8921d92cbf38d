"""--format hf: every torchnlq model as a Hugging Face transformers model (torchnlq/interop/).

The export ships torchnlq's model package and a thin wrapper; these tests hold it to independent
references: torchnlq's own ``Decoder`` (logits), ``torchnlq.inference.sampling.generate_tokens`` (greedy
decoding), a cross-entropy written here (the labels loss), and fresh processes for what only a
process shows (registration, loading with ``trust_remote_code`` where torchnlq cannot be imported,
a plugin's query type, the conversion script). Every registered query type is exported.

Tests that need transformers are marked ``integration`` (the project's rule for transformers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file

from torchnlq.interop.export import HF_EXPORT_FILE, HF_MODELING_FILE, export_safetensors
from torchnlq.config.job_config import Query
from torchnlq.errors import ConfigError, UserError
from torchnlq.inference.sampling import STOP_EOT, generate_tokens
from torchnlq.interop.hf_export import AUTO_MAP, export_hf, hf_config
from torchnlq.interop.load import LoadedModel, load_model
from torchnlq.interop.ship_code import PACKAGE_FILE, export_code
from torchnlq.models import Decoder, ModelArgs, build_model
from torchnlq.models.moe.config import MoE
from torchnlq.models.query import QUERY_TYPES

from helpers import REPO_ROOT, WITHOUT_TORCHNLQ
from helpers.checkpoints import BYTE_TOKENIZER, load_script, write_checkpoint

EOT = BYTE_TOKENIZER["eot_id"]
TOKENS = torch.randint(0, 257, (2, 20), generator=torch.Generator().manual_seed(1))
# Every registered query type at its defaults, then knobs, positions, GQA/MQA and untied heads; dim 32, 2 layers.
CONFIGS: dict[str, dict[str, Any]] = {
    **{f"type_{name}": dict(qtype=name) for name in QUERY_TYPES},
    "residual_mlp_paper": dict(qtype="residual_mlp"),  # GELU, RMSNorm in, LayerNorm out, r = d/2, half_scale
    "residual_mlp_knobs": dict(qtype="residual_mlp", query=dict(
        activation="relu2", input_norm="none", output_norm="rms", bottleneck_ratio=0.25, half_scale=False)),
    "residual_mlp_layer_in": dict(qtype="residual_mlp", query=dict(
        activation="silu", input_norm="layer", output_norm="none", bottleneck_ratio=0.75)),
    "linear": dict(qtype="linear"),
    "identity": dict(qtype="identity"),
    "residual": dict(qtype="residual", query=dict(half_scale=False)),
    "rope_gqa": dict(qtype="residual_mlp", positions="rope", n_kv_heads=2),
    "untied": dict(qtype="linear", tie_embeddings=False, mlp_hidden=40),
    "identity_mqa_rope_untied": dict(qtype="identity", n_kv_heads=1, positions="rope", tie_embeddings=False),
    # anchored (upcycling): X·W_Q + f(X) in the blocks `layers` names, a frozen anchor, q_dim != dim.
    "anchored_one_layer": dict(qtype="anchored", query=dict(
        layers="1", output_norm="rms", bottleneck_ratio=0.25, train_anchor=False)),
    "anchored_narrow_rope": dict(qtype="anchored", head_dim=4, positions="rope", n_kv_heads=2),
    # GPT-2's biases and tanh GELU (imported GPT-2 weights), with a linear and a nonlinear query.
    "bias_gelu_tanh": dict(qtype="linear", bias=True, mlp_activation="gelu_tanh"),
    "bias_residual_mlp": dict(qtype="residual_mlp", bias=True, tie_embeddings=False),
    # µP away from its base width: the multipliers and the attention scale travel in config.json.
    "mup_residual_mlp": dict(qtype="residual_mlp", dim=64, parametrization="mup", mup_base_width=32,
                             mup_input_multiplier=2.0, mup_output_multiplier=3.0),
    "mup_moe_untied": dict(qtype="anchored", dim=64, family="moe", moe=MoE(n_experts=4, top_k=2, expert_hidden=32),
                           tie_embeddings=False, parametrization="mup", mup_base_width=16),
}


def make_model(qtype: str = "linear", query: dict[str, Any] | None = None, seed: int = 0, **kw: Any) -> Decoder:
    """A tiny byte-vocabulary Decoder with norm gains away from 1 (a dropped gain shows in the logits)."""
    base: dict[str, Any] = dict(n_layers=2, dim=32, n_heads=4, vocab_size=320, max_seq_len=32, init_std=0.1)
    torch.manual_seed(seed)
    model = build_model(ModelArgs(**{**base, **kw}, query=Query(type=qtype, **(query or {}))))
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    return model.eval()


def loaded(model: Decoder, folder: Path) -> LoadedModel:
    return LoadedModel(model, model.args, dict(BYTE_TOKENIZER), {"step": 3}, folder, "test")


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Decoder, Path]]:
    """Every config of CONFIGS exported once for the module: name -> (torchnlq model, export folder)."""
    root = tmp_path_factory.mktemp("hf_exports")
    out = {}
    for name, kw in CONFIGS.items():
        model = make_model(**kw)
        out[name] = (model, export_hf(loaded(model, root), root / name))
    return out


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


def hf_model(transformers, folder: Path, **kw: Any):
    """The export as transformers loads it from the folder's own code (what a user without torchnlq runs)."""
    return transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, **kw).eval()


def max_relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.float() - expected.float()).abs().max() / expected.abs().max()).item()


def torchnlq_greedy(model: Decoder, prompt: list[int], n: int) -> list[int]:
    """torchnlq's greedy continuation as transformers writes it: prompt + new tokens (+ the end-of-text it stopped at)."""
    result = generate_tokens(model, prompt, n, temperature=0, eot_id=EOT)
    return prompt + result.new_tokens + ([EOT] if result.stop_reason == STOP_EOT else [])


def until_eot(ids: list[int], start: int) -> list[int]:
    """ids[start:] up to and including the first end-of-text (transformers pads a finished row after it)."""
    new = ids[start:]
    return new[: new.index(EOT) + 1] if EOT in new else new


# ---------------------------------------------------------------- without transformers


def test_the_export_ships_the_model_package_not_a_copy(tmp_path):
    """The files of torchnlq/models/ the model imports travel, flat, changed in their imports only; each import
    names a shipped file; and they are what transformers' save_pretrained copies again (its own closure of the
    wrapper's relative imports over every model file), so a re-saved folder holds the same files."""
    import re

    from transformers.dynamic_module_utils import get_relative_import_files

    code = export_code("residual_mlp")
    models = REPO_ROOT / "torchnlq" / "models"
    imports = re.compile(r"^\s*from \.+[\w.]* import", re.MULTILINE)
    everything = {}
    for path in models.rglob("*.py"):
        parts = path.relative_to(models).with_suffix("").parts
        flat = PACKAGE_FILE if parts == ("__init__",) else "_".join(p for p in parts if p != "__init__") + ".py"
        source = path.read_text(encoding="utf-8")
        everything[flat] = source
        if flat not in code:
            continue
        shipped = code[flat]
        assert imports.sub("", shipped) == imports.sub("", source), flat  # the code itself unchanged
        for module in re.findall(r"^\s*from \.(\w+) import", shipped, flags=re.MULTILINE):
            assert f"{module}.py" in code, (flat, module)  # a flat sibling transformers finds and copies
        assert not re.search(r"^\s*from \.\.", shipped, flags=re.MULTILINE) and "from torchnlq" not in shipped
    wrapper = code[HF_MODELING_FILE]
    assert "from .torchnlq_models import ModelArgs, build_model" in wrapper and "from torchnlq" not in wrapper
    for name, source in {**everything, HF_MODELING_FILE: wrapper}.items():  # every file, flattened as shipped
        (tmp_path / name).write_text(code.get(name, source), encoding="utf-8")
    copied = {Path(p).name for p in get_relative_import_files(str(tmp_path / HF_MODELING_FILE))}
    assert set(code) == copied | {HF_MODELING_FILE}


def test_export_folder(tmp_path):
    model = make_model("residual_mlp", tie_embeddings=False, positions="rope", n_kv_heads=2)
    write_checkpoint(tmp_path / "ckpt", model)
    out = export_hf(tmp_path / "ckpt", tmp_path / "hf")
    assert sorted(p.name for p in out.iterdir()) == sorted([
        "config.json", "generation_config.json", "merges.txt", "model.safetensors", "special_tokens_map.json",
        "tokenizer.json", "tokenizer_config.json", HF_EXPORT_FILE, "vocab.json", *export_code("residual_mlp")])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp folder left
    for name, source in export_code("residual_mlp").items():
        assert (out / name).read_text(encoding="utf-8") == source
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "torchnlq" and config["architectures"] == ["TorchnlqForCausalLM"]
    assert config["auto_map"] == AUTO_MAP and config["torch_dtype"] == "float32"
    assert config["bos_token_id"] == config["eos_token_id"] == EOT and config["use_cache"] is True
    assert (config["hidden_size"], config["num_key_value_heads"], config["tie_word_embeddings"]) == (32, 2, False)
    assert config["query"] == asdict(model.args.query) and config["positions"] == "rope"
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == EOT
    marker = json.loads((out / HF_EXPORT_FILE).read_text())
    assert marker["step"] == 7 and marker["model_args"] == model.args.to_dict() and marker["tokenizer"] == BYTE_TOKENIZER
    # The weights: torchnlq's names under "model.", nothing else.
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert names == {f"model.{k}" for k in model.state_dict()}
    # Overwriting: refused without --overwrite, a previous export is replaced with it.
    with pytest.raises(UserError, match="already exists"):
        export_hf(tmp_path / "ckpt", out)
    export_hf(tmp_path / "ckpt", out, dtype="bf16", overwrite=True)
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_eot_outside_the_vocabulary_is_left_out(tmp_path):
    model = make_model(vocab_size=256)  # the byte tokenizer's end-of-text is 256
    out = export_hf(loaded(model, tmp_path), tmp_path / "hf")
    config = json.loads((out / "config.json").read_text())
    assert config["bos_token_id"] is None and config["eos_token_id"] is None
    assert not (out / "generation_config.json").exists()


def test_convert_checkpoint_format_hf(tmp_path, capsys):
    script = load_script("convert_checkpoint")
    write_checkpoint(tmp_path / "ckpt", make_model("residual_mlp"))
    assert script.run_cli(script.main, [str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--format", "hf"]) == 0
    assert "(hf, fp32," in capsys.readouterr().out
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "torchnlq"
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    argv = [str(tmp_path / "ckpt"), str(tmp_path / "notes"), "--format", "hf", "--overwrite"]
    assert script.run_cli(script.main, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "is not a torchnlq export" in err
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    # A --format hf export is refused as a source of torchnlq's loader with the reason (it is transformers').
    with pytest.raises(UserError, match="not a torchnlq export"):
        load_model(tmp_path / "hf")


def test_importing_torchnlq_has_no_side_effects(tmp_path):
    """``import torchnlq`` leaves sys.meta_path as it was and imports neither torch nor transformers."""
    code = """
    import sys
    before = list(sys.meta_path)
    import torchnlq
    assert sys.meta_path == before, sys.meta_path
    assert "transformers" not in sys.modules and "torch" not in sys.modules
    print("OK")
    """
    result = run_python(code, tmp_path, env={"PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0 and result.stdout.strip() == "OK", result.stderr


# ---------------------------------------------------------------- with transformers


@pytest.mark.integration
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_equal_torchnlq(transformers, exports, name):
    model, folder = exports[name]
    hf = hf_model(transformers, folder)
    assert type(hf).__name__ == "TorchnlqForCausalLM" and hf.dtype == torch.float32
    assert (hf.get_output_embeddings() is None) == model.args.tie_embeddings
    assert sum(p.numel() for p in hf.parameters()) == model.num_params()
    with torch.no_grad():
        assert max_relative_error(hf(TOKENS).logits, model(TOKENS)) <= 1e-5
    hf(TOKENS).logits.square().mean().backward()  # fine-tuning: gradients reach all but a frozen anchor
    frozen = {f"model.{n}" for n, p in model.named_parameters() if not p.requires_grad}  # train_anchor = false
    assert {n for n, p in hf.named_parameters() if p.grad is None} == frozen


@pytest.mark.integration
@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_generate_equals_torchnlq_sampling(transformers, exports, name):
    model, folder = exports[name]
    hf = hf_model(transformers, folder)
    prompt = TOKENS[0, :5].tolist()
    expected = torchnlq_greedy(model, prompt, 12)
    for use_cache in (True, False):
        ids = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, use_cache=use_cache)
        assert ids[0].tolist() == expected, f"use_cache={use_cache}"


@pytest.mark.integration
@pytest.mark.parametrize("name", ["residual_mlp_paper", "rope_gqa"])
def test_left_padded_batch_generates_each_row_as_alone(transformers, exports, name):
    hf = hf_model(transformers, exports[name][1])
    rows = [TOKENS[0, :9].tolist(), TOKENS[1, :3].tolist()]
    width = max(map(len, rows))
    ids = torch.tensor([[EOT] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    batched = hf.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False)
    for i, row in enumerate(rows):
        alone = hf.generate(torch.tensor([row]), max_new_tokens=10, do_sample=False)[0].tolist()
        assert until_eot(batched[i].tolist(), width) == until_eot(alone, len(row)), f"row {i}"
        assert alone == torchnlq_greedy(exports[name][0], row, 10)


@pytest.mark.integration
@pytest.mark.parametrize("name", ["linear", "rope_gqa"])
def test_cache_continues_in_chunks(transformers, exports, name):
    """A prompt fed as 7, then 5, then 1 tokens through one DynamicCache gives the full forward's logits."""
    model, folder = exports[name]
    hf = hf_model(transformers, folder)
    cache = transformers.DynamicCache()
    tokens = TOKENS[:, :13]
    with torch.no_grad():
        parts = [hf(tokens[:, a:b], cache=cache, use_cache=True).logits for a, b in ((0, 7), (7, 12), (12, 13))]
        assert cache.get_seq_length() == 13
        assert max_relative_error(torch.cat(parts, dim=1), model(tokens)) <= 1e-5


@pytest.mark.integration
def test_labels_give_the_shifted_cross_entropy(transformers, exports):
    model, folder = exports["residual_mlp_paper"]
    hf = hf_model(transformers, folder)
    labels = TOKENS.clone()
    labels[0, :4] = -100  # ignored positions, as a padded or prompt-masked batch has them
    out = hf(TOKENS, labels=labels)
    with torch.no_grad():
        logits = model(TOKENS)
    expected = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss.detach(), expected, rtol=1e-5, atol=0)
    out.loss.backward()  # fine-tuning: every parameter gets a gradient
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in hf.parameters())


@pytest.mark.integration
def test_save_pretrained_keeps_the_model_code(transformers, exports, tmp_path):
    """A loaded (e.g. fine-tuned) model saved again still carries modeling_torchnlq.py and its auto_map."""
    model, folder = exports["rope_gqa"]
    hf_model(transformers, folder).save_pretrained(tmp_path / "saved")
    for name in export_code("residual_mlp"):
        assert (tmp_path / "saved" / name).read_bytes() == (folder / name).read_bytes(), name
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["auto_map"] == AUTO_MAP
    with torch.no_grad():
        assert max_relative_error(hf_model(transformers, tmp_path / "saved")(TOKENS).logits, model(TOKENS)) <= 1e-5


@pytest.mark.integration
def test_bf16_export(transformers, tmp_path):
    model = make_model("residual_mlp", positions="rope", n_kv_heads=2)
    out = export_hf(loaded(model, tmp_path), tmp_path / "hf", dtype="bf16")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in f.keys())
    # The reference: the same bf16 weights in torchnlq (its safetensors export, upcast on load).
    rounded = load_model(export_safetensors(loaded(model, tmp_path), tmp_path / "st", dtype="bf16")).model
    with torch.no_grad():
        fp32 = hf_model(transformers, out, dtype=torch.float32)
        assert max_relative_error(fp32(TOKENS).logits, rounded(TOKENS)) <= 1e-5
        bf16 = hf_model(transformers, out, dtype="auto")
        assert bf16.dtype == torch.bfloat16
        assert max_relative_error(bf16(TOKENS).logits, rounded(TOKENS)) <= 0.05


@pytest.mark.integration
def test_configs_it_cannot_compute_are_config_errors(transformers):
    """The wrapper's config is checked by torchnlq's own ModelArgs: one line, before any weight exists."""
    from torchnlq.interop.modeling_torchnlq import TorchnlqConfig

    with pytest.raises(ConfigError, match="model.query.type: unknown 'shiny'.*plugin"):
        TorchnlqConfig(query={"type": "shiny"})
    with pytest.raises(ConfigError, match="model_args.query has unknown keys anchor"):
        TorchnlqConfig(query={"type": "residual_mlp", "anchor": 1})
    with pytest.raises(ConfigError, match="model.query.activation: unknown 'tanh'"):
        TorchnlqConfig(query={"type": "residual_mlp", "activation": "tanh"})
    with pytest.raises(ConfigError, match="model.n_kv_heads=3"):
        TorchnlqConfig(num_key_value_heads=3)
    with pytest.raises(ConfigError, match="needs n_heads\\*head_dim == dim"):
        TorchnlqConfig(head_dim=8, query={"type": "identity"})


@pytest.mark.integration
def test_config_json_round_trips_every_model_field(transformers):
    """Every ModelArgs field but ``init`` survives config.json -> TorchnlqConfig -> ModelArgs, each set away
    from its default (a field added later travels with no change to the wrapper)."""
    from torchnlq.interop.modeling_torchnlq import TorchnlqConfig

    args = ModelArgs(n_layers=3, dim=48, n_heads=6, n_kv_heads=2, mlp_hidden=80, vocab_size=300, max_seq_len=40,
                     tie_embeddings=False, positions="rope", rope_theta=5e5, norm_eps=1e-6, init_std=0.03, bias=True,
                     mlp_activation="swiglu", norm="rms", qk_norm=True, rope_scaling_factor=8.0,
                     rope_low_freq_factor=2.0, rope_high_freq_factor=8.0, rope_original_max_seq_len=16, family="parallel",
                     parametrization="mup", mup_base_width=24, mup_input_multiplier=2.0, mup_output_multiplier=3.0,
                     query=Query(type="residual_mlp", activation="relu2", bottleneck_ratio=0.25, half_scale=False),
                     moe=MoE(n_experts=6, top_k=3, expert_hidden=24, n_shared_experts=1, router="softmax_normalized",
                             aux_loss_coef=0.02, bias_update_rate=1e-3, z_loss_coef=1e-3, every=2, first_dense=1))
    defaults = ModelArgs()
    same = [f.name for f in fields(ModelArgs) if f.name not in ("init", "head_dim")
            and getattr(args, f.name) == getattr(defaults, f.name)]
    assert same == [], f"set these fields away from their defaults in the test: {same}"
    config = json.loads(json.dumps(hf_config(args, {}, torch.float32)))
    assert TorchnlqConfig(**config).model_args() == args


# ---------------------------------------------------------------- in fresh processes


def run_python(code: str, tmp_path: Path, *args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -c code args...`` in tmp_path (outside the checkout), caches and temporary files in tmp_path."""
    full_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full_env.update(HF_HOME=str(tmp_path / "hf_home"), TMPDIR=str(tmp_path), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
                    **(env or {}))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], check=False, cwd=tmp_path,
                          env=full_env, capture_output=True, text=True, timeout=240)


@pytest.mark.integration
def test_import_torchnlq_hf_registers_the_auto_classes(transformers, exports, tmp_path):
    code = """
import sys
import torchnlq, transformers
from transformers import AutoModelForCausalLM
try:
    AutoModelForCausalLM.from_pretrained(sys.argv[1])
except ValueError as e:
    assert "trust_remote_code" in str(e), e  # nothing registered by importing torchnlq
import torchnlq.hf
from transformers import AutoConfig
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
assert type(model).__module__ == "torchnlq.interop.modeling_torchnlq", type(model)
assert type(AutoConfig.for_model("torchnlq")).__module__ == "torchnlq.interop.modeling_torchnlq"
print("OK")
"""
    result = run_python(code, tmp_path, exports["rope_gqa"][1], env={"PYTHONPATH": str(REPO_ROOT)})
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), result.stderr  # after transformers' prompt


@pytest.mark.integration
def test_import_torchnlq_hf_prints_nothing(transformers, tmp_path):
    """transformers imports torchao, which on a machine without its CUDA libraries logs "Failed to load ..." (and torch
    a pytree notice) on every import: registering through torchnlq silences them."""
    loud = run_python("import torchao", tmp_path)
    if "Failed to load" not in loud.stderr:
        pytest.skip("torchao is absent or loads its libraries here: nothing to silence")
    result = run_python("import torchnlq.hf", tmp_path)
    assert result.returncode == 0 and result.stdout == "" and result.stderr == "", result.stderr


@pytest.mark.integration
@pytest.mark.parametrize("init", [False, True], ids=["empty-folder", "package-folder"])
def test_a_local_torchnlq_folder_that_shadows_the_package_is_named(transformers, tmp_path, init):
    """Python imports a working directory's ``torchnlq`` folder before the installed package: registration must say
    so (not leave transformers asking for trust_remote_code)."""
    shadow = tmp_path / "torchnlq"
    shadow.mkdir()
    if init:
        (shadow / "__init__.py").write_text("")
    code = """
import torchnlq
shadowed = getattr(torchnlq, "__file__", None) != sys.argv[1]
try:
    import torchnlq.hf
except ModuleNotFoundError as e:  # the package is not reachable past the folder: none of its code runs
    print("unreachable |", e)
except ImportError as e:
    print("shadowed" if shadowed else "not shadowed", "|", e)
else:
    print("shadowed" if shadowed else "not shadowed", "| registered")
"""
    result = run_python("import sys\n" + code, tmp_path, REPO_ROOT / "torchnlq" / "__init__.py")
    assert result.returncode == 0, result.stderr
    said = result.stdout.strip().splitlines()[-1]
    if said.startswith("unreachable"):  # a path-entry install (not setuptools' editable finder): Python's own error
        pytest.skip(said)
    if said.startswith("shadowed"):  # how an installed (e.g. editable) torchnlq is found decides whether it is
        assert f"a local folder '{shadow.resolve()}' shadows the installed torchnlq package" in said, said
    else:
        assert said == "not shadowed | registered", said


@pytest.mark.integration
def test_trust_remote_code_loads_the_export_without_torchnlq(transformers, exports, tmp_path):
    model, folder = exports["residual_mlp_paper"]
    code = WITHOUT_TORCHNLQ + textwrap.dedent("""
    import json
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
    assert not any(m.split(".")[0] == "torchnlq" for m in sys.modules), "torchnlq was imported"
    tokens = torch.tensor(json.loads(sys.argv[2]))
    with torch.no_grad():
        logits = model(tokens).logits
    ids = model.generate(tokens[:1, :5], max_new_tokens=8, do_sample=False)
    save_file({"logits": logits.contiguous(), "ids": ids.contiguous()}, sys.argv[3])
    print(type(model).__module__)
    """)
    result = run_python(code, tmp_path, folder, json.dumps(TOKENS.tolist()), tmp_path / "out.safetensors")
    assert result.returncode == 0, result.stderr
    assert not result.stdout.startswith("torchnlq")  # transformers' copy of the folder's modeling_torchnlq.py
    out = load_file(str(tmp_path / "out.safetensors"))
    with torch.no_grad():
        assert max_relative_error(out["logits"], model(TOKENS)) <= 1e-5
    assert out["ids"][0].tolist() == torchnlq_greedy(model, TOKENS[0, :5].tolist(), 8)


@pytest.mark.integration
def test_convert_checkpoint_script_writes_a_loadable_hf_folder(transformers, tmp_path):
    model = make_model("residual_mlp", positions="rope", n_kv_heads=1, tie_embeddings=False)
    write_checkpoint(tmp_path / "ckpt", model)
    script = REPO_ROOT / "scripts" / "convert_checkpoint.py"
    result = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt"), str(tmp_path / "hf"), "--format", "hf"],
        check=False, cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("wrote ") and "(hf, fp32," in result.stdout
    hf = hf_model(transformers, tmp_path / "hf")
    with torch.no_grad():
        assert max_relative_error(hf(TOKENS).logits, model(TOKENS)) <= 1e-5
