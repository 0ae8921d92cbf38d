"""The moe family and Hugging Face: ``--format hf-qwen3-moe`` writes a standard ``Qwen3MoeForCausalLM`` folder,
a Qwen3-MoE folder built here with transformers comes in (weights and tokenizer), every query type exports with
``--format hf`` and loads without torchnlq, and an MoE checkpoint is upcycled with the anchored query.

The reference is transformers' own Qwen3MoeForCausalLM with random weights (norm gains away from 1), saved with
save_pretrained, dense first layers and every sparse-layer rule of Qwen3-MoE exercised.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchnlq.config.job_config import Query
from torchnlq.errors import UserError
from torchnlq.interop.export import export_hf_standard
from torchnlq.interop.hf_export import export_hf
from torchnlq.interop.load import LoadedModel, load_model
from torchnlq.interop.upcycle import upcycle
from torchnlq.models import Decoder, ModelArgs, build_model, num_params
from torchnlq.models.moe.config import MoE

from helpers import WITHOUT_TORCHNLQ
from helpers.checkpoints import BYTE_TOKENIZER

pytestmark = pytest.mark.integration  # transformers
transformers = pytest.importorskip("transformers")

VOCAB = 320
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, decoder_sparse_step=1,
           mlp_only_layers=[0])
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64, rms_norm_eps=1e-6, **MOE)


def tokens(batch: int = 2, length: int = 20) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(5))


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def hf_logits(folder: Path, x: torch.Tensor) -> torch.Tensor:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    with torch.no_grad():
        return model(x).logits


def moe_model(qtype: str = "linear", **moe: object) -> Decoder:
    args = ModelArgs(n_layers=3, dim=32, n_heads=4, n_kv_heads=2, mlp_hidden=48, vocab_size=VOCAB, max_seq_len=64,
                     positions="rope", norm="rms", mlp_activation="swiglu", qk_norm=True, tie_embeddings=False,
                     family="moe", query=Query(type=qtype),
                     moe=MoE(**{"n_experts": 4, "top_k": 2, "expert_hidden": 24, "first_dense": 1, **moe}))
    torch.manual_seed(1)
    model = build_model(args).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
            if name.endswith("router.gate.weight"):
                p.normal_(0, 1.0)  # confident routing: a swapped expert or weight shows
    return model


def loaded(model: Decoder, where: Path) -> LoadedModel:
    return LoadedModel(model, model.args, BYTE_TOKENIZER, {}, where, "test")


@pytest.mark.parametrize("router", ["softmax", "softmax_normalized"])
def test_a_linear_query_moe_exports_as_qwen3_moe_with_its_logits(tmp_path: Path, router: str) -> None:
    model = moe_model(router=router)
    out = export_hf_standard(loaded(model, tmp_path), tmp_path / "hf", "hf-qwen3-moe")
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["mlp_only_layers"], config["norm_topk_prob"]) == (
        "qwen3_moe", [0], router == "softmax_normalized")
    x = tokens()
    with torch.no_grad():
        ours = model(x)
    assert relative_error(hf_logits(out, x), ours) <= 1e-5


def test_a_qwen3_moe_folder_comes_in_with_its_weights_and_tokenizer(tmp_path: Path) -> None:
    from test_hf_folders_in import shipped_tokenizer

    torch.manual_seed(0)
    tok = shipped_tokenizer()
    config = transformers.Qwen3MoeConfig(**SHAPE, norm_topk_prob=True, bos_token_id=tok.bos_token_id,
                                         eos_token_id=tok.eos_token_id)
    hf = transformers.Qwen3MoeForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            if name.endswith("mlp.gate.weight"):
                p.normal_(0, 1.0)
    folder = tmp_path / "qwen3_moe"
    hf.save_pretrained(folder)
    tok.save_pretrained(folder)
    ours = load_model(folder)
    assert ours.args.family == "moe" and ours.args.moe.first_dense == 1 and ours.args.moe.router == "softmax_normalized"
    assert num_params(ours.args) == sum(p.numel() for p in hf.parameters())
    assert ours.tokenizer.get("name") == "hf"
    x = tokens()
    with torch.no_grad():
        theirs, mine = hf(x).logits, ours.model(x)
    assert relative_error(mine, theirs) <= 1e-5
    back = export_hf_standard(ours, tmp_path / "back", "hf-qwen3-moe")  # and out again, its tokenizer with it
    assert relative_error(hf_logits(back, x), theirs) <= 1e-5
    assert transformers.AutoTokenizer.from_pretrained(back)("hello there")["input_ids"] == tok("hello there")["input_ids"]


@pytest.mark.parametrize("kw, message", [
    (dict(qtype="residual_mlp"), "query type residual_mlp has no Qwen3-MoE equivalent"),
    (dict(n_shared_experts=1), "Qwen3-MoE has no shared experts"),
    (dict(bias_update_rate=0.001), "with no balancing bias"),
])
def test_what_qwen3_moe_cannot_hold_is_refused_in_one_line(tmp_path: Path, kw: dict, message: str) -> None:
    model = moe_model(**kw)
    with pytest.raises(UserError, match=message):
        export_hf_standard(loaded(model, tmp_path), tmp_path / "hf", "hf-qwen3-moe")
    assert not (tmp_path / "hf").exists()
    dense = build_model(ModelArgs(n_layers=2, dim=32, n_heads=4, vocab_size=VOCAB, positions="rope", norm="rms",
                                  mlp_activation="swiglu", qk_norm=True))
    with pytest.raises(UserError, match="model.family='dense': --format hf-qwen3-moe .* holds models of the moe"):
        export_hf_standard(loaded(dense, tmp_path), tmp_path / "hf", "hf-qwen3-moe")


LOAD_WITHOUT_TORCHNLQ = WITHOUT_TORCHNLQ + """
import json
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
with torch.no_grad():
    print(json.dumps(model(torch.tensor(json.loads(sys.argv[2]))).logits.tolist()))
"""


@pytest.mark.parametrize("qtype", ["residual_mlp", "anchored", "identity"])
def test_every_query_type_of_an_moe_exports_with_its_code_and_loads_without_torchnlq(tmp_path: Path,
                                                                                    qtype: str) -> None:
    model = moe_model(qtype, n_shared_experts=1, bias_update_rate=0.01)
    with torch.no_grad():
        for block in model.layers[1:]:
            block.mlp.router.expert_bias.uniform_(-0.2, 0.2)  # a trained bias travels in the weights
    out = export_hf(loaded(model, tmp_path), tmp_path / "hf")
    x = tokens(length=12)
    shown = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_TORCHNLQ, str(out), json.dumps(x.tolist())],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    with torch.no_grad():
        ours = model(x)
    assert relative_error(torch.tensor(json.loads(shown.stdout.strip().splitlines()[-1])), ours) <= 1e-5


def test_an_moe_is_upcycled_with_the_anchored_query(tmp_path: Path) -> None:
    """A Qwen3-MoE export taken up with the anchored query: its function at the start is the source's."""
    model = moe_model()
    source = export_hf_standard(loaded(model, tmp_path), tmp_path / "hf", "hf-qwen3-moe")
    anchored = upcycle(source, Query(type="anchored", layers="1-2"))
    assert anchored.args.family == "moe" and anchored.args.query.type == "anchored"
    x = tokens()
    with torch.no_grad():
        assert relative_error(anchored.model(x), model(x)) <= 1e-5


def torchnlq_aux_loss(model: Decoder, x: torch.Tensor) -> float:
    """The balancing loss torchnlq's routers add to the gradient for tokens ``x`` (their per-step sums), summed."""
    model.train()
    model(x)
    routers = [m for m in model.modules() if type(m).__name__ == "Router"]
    return sum(router.sums[3].item() for router in routers)


def transformers_aux_loss(folder: Path, x: torch.Tensor) -> float:
    """transformers' own balancing term of the folder's model for ``x``, times the folder's router_aux_loss_coef."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(x, output_router_logits=True).router_logits
    c = hf.config
    return c.router_aux_loss_coef * load_balancing_loss_func(logits, c.num_experts, c.num_experts_per_tok).item()


@pytest.mark.parametrize("top_k", [1, 2, 3, 4])
@pytest.mark.parametrize("coef", [0.01, 0.37])
def test_the_exported_balancing_coefficient_gives_torchnlqs_loss(tmp_path: Path, top_k: int, coef: float) -> None:
    """One MoE layer (transformers mixes several layers' counts before the product: docs/models.md): transformers'
    load_balancing_loss_func x the written router_aux_loss_coef is torchnlq's aux loss on the same tokens."""
    model = moe_model(top_k=top_k, aux_loss_coef=coef, first_dense=2)
    out = export_hf_standard(loaded(model, tmp_path), tmp_path / "hf", "hf-qwen3-moe")
    x = tokens()
    assert transformers_aux_loss(out, x) == pytest.approx(torchnlq_aux_loss(model, x), rel=1e-5)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_an_imported_qwen3_moe_keeps_transformers_balancing_loss(tmp_path: Path, top_k: int) -> None:
    """The import direction: a Qwen3-MoE folder's router_aux_loss_coef becomes the aux_loss_coef whose loss is
    transformers' term (load_balancing_loss_func x the coefficient) on the same tokens."""
    torch.manual_seed(0)
    shape = {**SHAPE, "num_experts_per_tok": top_k, "mlp_only_layers": [0, 1]}
    hf = transformers.Qwen3MoeForCausalLM(transformers.Qwen3MoeConfig(**shape, router_aux_loss_coef=0.02))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0, 1.0)
    hf.save_pretrained(tmp_path / "qwen3_moe")
    ours = load_model(tmp_path / "qwen3_moe")
    x = tokens()
    assert torchnlq_aux_loss(ours.model, x) == pytest.approx(transformers_aux_loss(tmp_path / "qwen3_moe", x), rel=1e-5)
