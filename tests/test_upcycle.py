"""Starting from a pretrained GPT-2 (issue 13.1, 13.2): import, the anchored query, training from the import.

The reference is transformers' own GPT2LMHeadModel, built here with random weights (biases and
LayerNorm parameters included, so a mistake in any of them shows), saved with save_pretrained:
never a download.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from torchnlq.interop.load import load_model
from torchnlq.interop.hf_folder import read_hf_model
from torchnlq.interop.upcycle import upcycle
from torchnlq.cli import run_cli
from torchnlq.config.job_config import Query
from torchnlq.errors import UserError
from torchnlq.models.counts import num_params
from torchnlq.models import build_model

from helpers import SHARED_DATA
from helpers.checkpoints import BYTE_TOKENIZER, load_script
from helpers.train import tiny_config

transformers = pytest.importorskip("transformers")

SHAPE = dict(n_layer=3, n_embd=32, n_head=4, vocab_size=320, n_positions=64)


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random GPT-2 saved by transformers; every parameter (biases and LN too) drawn away from its init."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SHAPE)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    folder = tmp_path_factory.mktemp("hf") / "gpt2"
    model.save_pretrained(folder)
    return folder


def with_a_byte_tokenizer(folder: Path, copy: Path) -> Path:
    """A copy of a Hugging Face folder with the byte tokenizer's files (what an import needs to carry one)."""
    from torchnlq.interop.tokenizer_files import write_hf_tokenizer_files

    shutil.copytree(folder, copy)
    write_hf_tokenizer_files(BYTE_TOKENIZER, copy, 64)
    return copy


def hf_logits(folder: Path, tokens: torch.Tensor) -> torch.Tensor:
    model = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    with torch.no_grad():
        return model(tokens).logits


def tokens(batch: int = 2, length: int = 24) -> torch.Tensor:
    return torch.randint(0, SHAPE["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(1))


def assert_close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> None:
    assert a.shape == b.shape
    assert ((a - b).norm() / b.norm()).item() <= rel


def test_an_imported_gpt2_gives_transformers_logits(gpt2_folder: Path) -> None:
    args, state, _ = read_hf_model(gpt2_folder)
    assert (args.bias, args.mlp_activation, args.vocab_size, args.max_seq_len) == (True, "gelu_tanh", 320, 64)
    loaded = upcycle(gpt2_folder)
    assert loaded.model.num_params() == num_params(args) == sum(
        p.numel() for p in transformers.GPT2LMHeadModel.from_pretrained(gpt2_folder).parameters()
    )
    x = tokens()
    with torch.no_grad():
        assert_close(loaded.model(x), hf_logits(gpt2_folder, x))


@pytest.mark.parametrize("layers", ["all", "1-2", "0"])
def test_the_anchored_query_starts_as_the_pretrained_function(gpt2_folder: Path, layers: str) -> None:
    query = Query(type="anchored", layers=layers, bottleneck_ratio=0.25)
    loaded = upcycle(gpt2_folder, query, seed=3)
    model = loaded.model
    with_f = [i for i, block in enumerate(model.layers) if block.attn.query.has_branch]
    assert with_f == {"all": [0, 1, 2], "1-2": [1, 2], "0": [0]}[layers]
    # f adds W1 (d x r) + W2 (r x d) + two norm gains per block that has it.
    d, r = 32, 8
    assert model.num_params() == upcycle(gpt2_folder).model.num_params() + len(with_f) * (2 * d * r + 2 * d)
    assert model.num_params() == num_params(loaded.args)
    x = tokens()
    with torch.no_grad():
        assert_close(model(x), hf_logits(gpt2_folder, x))
    # f is zero, not dead: one backward reaches W1, W2 and the gains of every block that has it.
    model.train()
    F.cross_entropy(model(x).flatten(0, 1), x.flatten()).backward()
    for i in with_f:
        q = model.layers[i].attn.query
        assert q.output_norm.weight.grad.abs().sum() > 0 and q.w_q.weight.grad.abs().sum() > 0


def test_a_frozen_anchor_has_no_gradient(gpt2_folder: Path) -> None:
    model = upcycle(gpt2_folder, Query(type="anchored", train_anchor=False)).model
    assert all(not block.attn.query.w_q.weight.requires_grad for block in model.layers)
    from torchnlq.config.job_config import Optimizer
    from torchnlq.train.optim import build_optimizer

    trained = {id(p) for group in build_optimizer(Optimizer(), model, "cpu").param_groups for p in group["params"]}
    assert all(id(block.attn.query.w_q.weight) not in trained for block in model.layers)


def test_an_imported_gpt2_exports_back_to_transformers(gpt2_folder: Path, tmp_path: Path) -> None:
    """GPT-2 -> torchnlq -> --format hf-gpt2 -> GPT2LMHeadModel: the biases and the tanh GELU survive."""
    from torchnlq.interop.export import export_hf_standard

    out = export_hf_standard(upcycle(gpt2_folder), tmp_path / "back", "hf-gpt2")
    x = tokens()
    assert_close(hf_logits(out, x), hf_logits(gpt2_folder, x))
    with pytest.raises(UserError, match="query type anchored has no GPT-2 equivalent"):
        export_hf_standard(upcycle(gpt2_folder, Query(type="anchored")), tmp_path / "anchored", "hf-gpt2")


def test_upcycle_refuses_what_it_cannot_anchor(gpt2_folder: Path, tmp_path: Path) -> None:
    with pytest.raises(UserError, match="nor a Hugging Face folder of transformers. GPT2LMHeadModel"):
        upcycle(tmp_path)
    with pytest.raises(UserError, match="names blocks outside 0..2"):
        upcycle(gpt2_folder, Query(type="anchored", layers="2-3"))
    with pytest.raises(UserError, match="'residual_mlp' cannot start from it: only 'anchored' can"):
        upcycle(gpt2_folder, Query(type="residual_mlp"))
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((gpt2_folder / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(UserError, match="pytorch_model.bin, which torchnlq does not unpickle"):
        read_hf_model(pickled)
    # A sharded folder whose index names a file outside it: refused, the file never opened.
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text((gpt2_folder / "config.json").read_text())
    (sharded / "model.safetensors.index.json").write_text('{"weight_map": {"wte.weight": "../elsewhere.safetensors"}}')
    with pytest.raises(UserError, match="must name .safetensors files of this folder"):
        read_hf_model(sharded)


def run_config(tmp_path: Path, name: str, initial: Path, **query: object):
    """A tiny run whose [model] settings are the GPT-2 fixture's, starting from ``initial``."""
    return tiny_config(
        tmp_path, name, steps=2, model__n_layers=3, model__dim=32, model__n_heads=4, model__vocab_size=320,
        model__max_seq_len=64, model__bias=True, model__mlp_activation="gelu_tanh",
        checkpoint__initial_load_path=initial, training__grad_accum_steps=1, validation__enabled=False,
        **{f"model__query__{k}": v for k, v in query.items()},
    )


def first_loss_is_the_pretrained_models(cfg, gpt2_folder: Path) -> None:
    """The run's first training loss equals transformers' loss of the pretrained GPT-2 on the same batch."""
    from torchnlq.train.trainer import Trainer

    trainer = Trainer(cfg)
    x, y = next(iter(trainer.loader.micro_batches(0)))
    hf = transformers.GPT2LMHeadModel.from_pretrained(gpt2_folder).eval()
    with torch.no_grad():
        expected = F.cross_entropy(hf(x).logits.flatten(0, 1), y.flatten()).item()
    loss, _ = trainer.train_step()
    assert math.isclose(loss, expected, rel_tol=1e-5)


@pytest.mark.integration
def test_the_script_writes_an_export_that_a_run_continues_from(gpt2_folder: Path, tmp_path: Path) -> None:
    from torchnlq.train.trainer import Trainer

    script = load_script("upcycle")
    out = tmp_path / "exports" / "anchored"
    source = with_a_byte_tokenizer(gpt2_folder, tmp_path / "gpt2")
    argv = [str(source), str(out), "--query", "anchored", "--layers", "1-2", "--bottleneck-ratio", "0.25"]
    assert run_cli(script.main, argv) == 0
    exported = load_model(out)
    x = tokens()
    with torch.no_grad():
        assert_close(exported.model(x), hf_logits(gpt2_folder, x))
    first_loss_is_the_pretrained_models(
        run_config(tmp_path, "continue", out, type="anchored", layers="1-2", bottleneck_ratio=0.25), gpt2_folder)
    # Another shape is refused with the field that differs.
    with pytest.raises(UserError, match="bottleneck_ratio"):
        Trainer(run_config(tmp_path, "other", out, type="anchored", layers="1-2"))


@pytest.mark.integration
@pytest.mark.parametrize("query", [{"type": "linear"}, {"type": "anchored"}, {"type": "anchored", "layers": "2"}])
def test_a_run_starts_from_a_hugging_face_folder_directly(gpt2_folder: Path, tmp_path: Path, query: dict) -> None:
    """--checkpoint.initial_load_path HF_FOLDER: as pretrained (linear), or upcycled on the fly (anchored)."""
    first_loss_is_the_pretrained_models(run_config(tmp_path, "direct", gpt2_folder, **query), gpt2_folder)


@pytest.mark.integration
def test_upcycling_needs_the_same_shapes(gpt2_folder: Path, tmp_path: Path) -> None:
    from torchnlq.train.trainer import Trainer

    cfg = run_config(tmp_path, "wide", gpt2_folder, type="anchored")
    cfg.model.mlp_activation = "gelu"
    with pytest.raises(UserError, match="mlp_activation"):
        Trainer(cfg)


# ----- the model options upcycling needs -----------------------------------------------------------

@pytest.mark.parametrize("query", [Query(type="linear"), Query(type="residual_mlp"), Query(type="identity"),
                                   Query(type="anchored", layers="0,2", bottleneck_ratio=0.25),
                                   Query(type="anchored", output_norm="none", train_anchor=False)])
@pytest.mark.parametrize("bias", [False, True])
def test_the_analytic_count_is_the_built_models(query: Query, bias: bool) -> None:
    from torchnlq.models.args import ModelArgs

    args = ModelArgs(n_layers=3, dim=32, n_heads=4, vocab_size=96, max_seq_len=16, bias=bias, query=query)
    with torch.device("meta"):
        model = build_model(args)
    assert num_params(args) == sum(p.numel() for p in model.parameters())
    biases = [n for n, _ in model.named_parameters() if n.endswith("bias")]
    assert bool(biases) == bias


def test_later_fields_at_their_defaults_leave_the_recorded_model_as_it_was() -> None:
    """Checkpoints written before bias, mlp_activation, layers and train_anchor existed still resume."""
    from torchnlq.models.args import ModelArgs

    old = ModelArgs(query=Query(type="residual_mlp")).to_dict()
    assert not {"bias", "mlp_activation"} & set(old) and not {"layers", "train_anchor"} & set(old["query"])
    new = ModelArgs(bias=True, mlp_activation="gelu_tanh", query=Query(type="anchored", layers="1", train_anchor=False))
    assert ModelArgs.from_dict(new.to_dict()) == new


def test_an_anchored_query_is_zero_branch_at_init_and_gelu_tanh_is_gpt2s() -> None:
    from torchnlq.models.args import ModelArgs

    torch.manual_seed(0)
    args = ModelArgs(n_layers=2, dim=32, n_heads=4, vocab_size=64, max_seq_len=16, query=Query(type="anchored"))
    model = build_model(args)
    x = torch.randn(2, 5, 32)
    for block in model.layers:
        q = block.attn.query
        assert torch.equal(q(x), q.w_q(x)) and q.branch(x).abs().max() == 0
    tanh_args = ModelArgs(n_layers=1, dim=32, n_heads=4, vocab_size=64, max_seq_len=16, mlp_activation="gelu_tanh")
    mlp = build_model(tanh_args).layers[0].mlp
    h = mlp.fc(x)
    gelu_new = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))  # GPT-2's, written out
    assert torch.allclose(mlp(x), mlp.proj(gelu_new), atol=1e-6)


def test_options_that_cannot_work_together_are_one_line() -> None:
    from torchnlq.errors import ConfigError
    from torchnlq.models.args import ModelArgs

    with pytest.raises(ConfigError, match="is not 'all' nor block indices"):
        ModelArgs(query=Query(type="anchored", layers="first"))


# ----- a folder saved without its tokenizer (GPT2LMHeadModel.save_pretrained alone) ---------------------------

SHARED_GPT2 = SHARED_DATA / "gpt2.tiktoken"
TEXT = "Hello world! It's 2024: the café's naïve façade, 東京 🙂\n  indented  line"


@pytest.fixture(scope="module")
def bare_gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 with GPT-2's vocabulary, saved without tokenizer files."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("bare") / "gpt2"
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, n_positions=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "generation_config.json", "model.safetensors"]
    return folder


def run_script(capsys: pytest.CaptureFixture[str], name: str, *argv: object) -> tuple[int, str, str]:
    script = load_script(name)
    rc = run_cli(script.main, [str(a) for a in argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.mark.integration  # transformers, and two exports
@pytest.mark.skipif(not SHARED_GPT2.is_file(), reason="../shared/data/gpt2.tiktoken not present")
def test_a_gpt2_saved_without_its_tokenizer_exports_gpt2s(bare_gpt2: Path, tmp_path: Path, capsys,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The export carries GPT-2's tokenizer from --tiktoken-file or $TORCHNLQ_TIKTOKEN_FILE; without either, one line
    names the flag and nothing is written. generate.py then needs no flag; ids are tiktoken's own."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from transformers import AutoTokenizer

    monkeypatch.delenv("TORCHNLQ_TIKTOKEN_FILE", raising=False)
    rc, _, err = run_script(capsys, "upcycle", bare_gpt2, tmp_path / "none")
    assert rc == 2 and err.count("\n") == 1 and "--tiktoken-file" in err and not (tmp_path / "none").exists()
    # tiktoken's own GPT-2 (r50k_base: its pattern, the shared ranks file) is the reference.
    ranks = load_tiktoken_bpe(str(SHARED_GPT2))
    pattern = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    reference = tiktoken.Encoding("gpt2", pat_str=pattern,
                                  mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256})
    flagged, from_env = tmp_path / "flagged", tmp_path / "env"
    assert run_script(capsys, "upcycle", bare_gpt2, flagged, "--tiktoken-file", SHARED_GPT2)[0] == 0
    monkeypatch.setenv("TORCHNLQ_TIKTOKEN_FILE", str(SHARED_GPT2))
    assert run_script(capsys, "upcycle", bare_gpt2, from_env)[0] == 0
    monkeypatch.delenv("TORCHNLQ_TIKTOKEN_FILE")
    assert (flagged / "vocab.json").read_bytes() == (from_env / "vocab.json").read_bytes()
    for out in (flagged, from_env):
        rc, text, err = run_script(capsys, "generate", out, "--prompt", TEXT, "--max-new-tokens", "0")
        assert rc == 0 and text == TEXT + "\n", err
        assert AutoTokenizer.from_pretrained(out)(TEXT)["input_ids"] == reference.encode_ordinary(TEXT)
    from torchnlq.inference.sampling import generate_text

    assert generate_text(flagged, TEXT, 0)[1].prompt_tokens == reference.encode_ordinary(TEXT)


@pytest.mark.skipif(not SHARED_GPT2.is_file(), reason="../shared/data/gpt2.tiktoken not present")
def test_generate_flags_give_an_export_without_a_tokenizer_gpt2s(bare_gpt2: Path, tmp_path: Path, capsys,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An export made before imports carried a tokenizer (it records none): --tiktoken-file and
    $TORCHNLQ_TIKTOKEN_FILE make generate.py use GPT-2's."""
    from torchnlq.interop.export import export_safetensors

    loaded = upcycle(bare_gpt2)
    loaded.tokenizer = {}
    old = export_safetensors(loaded, tmp_path / "old")
    assert not (old / "vocab.json").exists()
    monkeypatch.delenv("TORCHNLQ_TIKTOKEN_FILE", raising=False)
    rc, _, err = run_script(capsys, "generate", old, "--prompt", "Hello world", "--max-new-tokens", "0")
    assert rc == 2 and "records no tokenizer" in err and "--tiktoken-file" in err
    rc, text, err = run_script(capsys, "generate", old, "--prompt", "Hello world", "--max-new-tokens", "0",
                               "--tiktoken-file", SHARED_GPT2)
    assert rc == 0 and text == "Hello world\n", err
    monkeypatch.setenv("TORCHNLQ_TIKTOKEN_FILE", str(SHARED_GPT2))
    from torchnlq.inference.sampling import generate_text

    assert generate_text(old, "Hello world", 0)[1].prompt_tokens == [15496, 995]  # GPT-2's ids, as HF's docs show


def test_an_import_of_another_vocabulary_without_a_tokenizer_is_refused(gpt2_folder: Path, tmp_path: Path,
                                                                         capsys) -> None:
    rc, _, err = run_script(capsys, "upcycle", gpt2_folder, tmp_path / "out")
    assert rc == 2 and err.count("\n") == 1 and not (tmp_path / "out").exists()
    assert "carries no tokenizer" in err and "(320 ids) is not GPT-2's" in err
    rc, _, err = run_script(capsys, "upcycle", gpt2_folder, tmp_path / "out", "--tiktoken-file", "gpt2.tiktoken")
    assert rc == 2 and "so --tiktoken-file cannot supply one" in err
    # With its tokenizer saved beside it, the same folder imports, and the export carries that tokenizer.
    source = with_a_byte_tokenizer(gpt2_folder, tmp_path / "with")
    assert run_script(capsys, "upcycle", source, tmp_path / "out")[0] == 0
    assert load_model(tmp_path / "out").tokenizer["name"] == "byte"


@pytest.mark.parametrize("kind", ["byte", "gpt2", "hf"])
def test_a_checkpoint_of_any_tokenizer_upcycles_with_the_tokenizer_it_carries(kind: str, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """upcycle.py CKPT OUT --query anchored, offline and without --tiktoken-file: the export carries the tokenizer
    the checkpoint carries (a gpt2 run's ranks, an hf run's tokenizer.json), and encodes as it does."""
    from helpers.checkpoints import tiny_model, write_checkpoint
    from helpers.data import write_toy_tiktoken
    from torchnlq.data.tokenizer import HFTokenizer, build_tokenizer
    from torchnlq.interop.tokenizer_files import TOKENIZER_RANKS_FILE, tokenizer_from_folder

    from test_hf_folders_in import shipped_tokenizer

    monkeypatch.delenv("TORCHNLQ_TIKTOKEN_FILE", raising=False)
    ckpt, carried = tmp_path / "ckpt", None
    if kind == "gpt2":
        ranks = write_toy_tiktoken(tmp_path / "toy.tiktoken")
        carried, name = build_tokenizer("gpt2", str(ranks), expected_hash=None), TOKENIZER_RANKS_FILE
        data = ranks.read_bytes()
    elif kind == "hf":
        shipped_tokenizer().save_pretrained(tmp_path / "tok")
        data = (tmp_path / "tok" / "tokenizer.json").read_bytes()
        carried, name = HFTokenizer(data, tmp_path / "tok" / "tokenizer.json"), "tokenizer.json"
    description = carried.describe() if carried is not None else dict(BYTE_TOKENIZER)
    write_checkpoint(ckpt, tiny_model(vocab_size=max(320, description["vocab_size"])), tokenizer=description)
    if carried is not None:
        (ckpt / name).write_bytes(data)  # what the trainer's checkpoints carry
    assert run_cli(load_script("upcycle").main, [str(ckpt), str(tmp_path / "out"), "--query", "anchored"]) == 0
    text = "the thing in the king's house"
    expected = (carried or build_tokenizer("byte")).encode(text)
    assert tokenizer_from_folder(tmp_path / "out").encode(text) == expected
    auto = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    assert auto.encode(text, add_special_tokens=False) == expected
