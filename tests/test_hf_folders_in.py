"""Hugging Face folders as real models ship (issue 32.1): weights *and* tokenizer saved with ``save_pretrained``.

A random Llama (8 heads / 2 KV heads, head_dim 16, Llama 3 RoPE scaling, untied), a random Qwen3 and a random
GPT-2, each saved with a ``PreTrainedTokenizerFast`` (a byte-level BPE trained here, a BOS template, added special
tokens and a chat template), go through upcycle.py (plain and anchored), convert_checkpoint.py back to their own
format, generate.py, evaluate.py and an initial load that trains. The references are transformers' own models and
tokenizers on the source folder; the catalogue at the end holds the mistakes of these doors.
"""

from __future__ import annotations

import functools
import re
import shlex
import hashlib
import json
import shutil
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchnlq.cli import run_cli
from torchnlq.interop.load import load_model

from helpers.checkpoints import load_script
from helpers.train import scalars, tiny_config

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
ADDED = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
CHAT = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>{{ m['content'] }}<|eot_id|>"
        "{% endfor %}")
CORPUS = ["the thing in the king's house", "nothing is sung in the thing", "ünïcödé words", "a b c d e f g"]
VOCAB = 320  # the models' embedding rows: more than the tokenizer's ids, as real models pad
SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 16}
SHAPES = {
    "llama": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rope_theta=5e5, rope_scaling=SCALING,
                  tie_word_embeddings=False),
    "qwen3": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=64, tie_word_embeddings=True),
    "gpt2": dict(n_layer=2, n_embd=32, n_head=4, n_positions=64),
}
CLASSES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
           "gpt2": ("GPT2Config", "GPT2LMHeadModel")}


@functools.cache
def _trained_bpe() -> str:
    """A small byte-level BPE (tokenizers library) with Llama 3's BOS/EOS and a template that prepends BOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[BOS, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))])
    return tok.to_str()


def shipped_tokenizer(added: bool = True) -> Any:
    """The tokenizer a model ships with: PreTrainedTokenizerFast with BOS/EOS and (``added``) more special tokens and
    a chat template."""
    from tokenizers import Tokenizer

    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_trained_bpe()), bos_token=BOS,
                                                eos_token=EOS)
    if added:
        fast.add_special_tokens({"additional_special_tokens": ADDED})
        fast.chat_template = CHAT
    return fast


def save_shipped(folder: Path, kind: str, tokenizer: bool = True, **config: Any) -> Path:
    """A random ``kind`` model (every norm gain drawn away from 1) saved with its tokenizer, as models ship."""
    config_class, model_class = (getattr(transformers, name) for name in CLASSES[kind])
    tok = shipped_tokenizer()
    ids = {} if kind == "gpt2" else {"bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id}
    torch.manual_seed(0)
    model = model_class(config_class(vocab_size=VOCAB, **ids, **{**SHAPES[kind], **config})).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or ".ln_" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder)
    if tokenizer:
        tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shipped")
    return {kind: save_shipped(root / kind, kind) for kind in SHAPES}


def hf_model(folder: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def tokens(length: int = 20) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, length), generator=torch.Generator().manual_seed(3))


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def assert_same_tokenizer(out: Path, source: Path) -> None:
    """transformers reads the same tokenizer from both folders: ids (with and without the template), special tokens,
    BOS/EOS and the chat template; the tokenizer.json is the source's, byte for byte."""
    assert (out / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    ours, theirs = (transformers.AutoTokenizer.from_pretrained(f) for f in (out, source))
    text = f"the king's <|eot_id|> house {EOS} ünïcödé"
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    assert ours.encode(text, add_special_tokens=False) == theirs.encode(text, add_special_tokens=False)
    assert ours.all_special_tokens == theirs.all_special_tokens
    assert (ours.bos_token_id, ours.eos_token_id) == (theirs.bos_token_id, theirs.eos_token_id)
    chat = [{"role": "user", "content": "the thing"}, {"role": "assistant", "content": "is sung"}]
    assert ours.apply_chat_template(chat, tokenize=False) == theirs.apply_chat_template(chat, tokenize=False)


def main_of(script: str, argv: list[str]) -> int:
    return run_cli(load_script(script).main, [str(a) for a in argv])


# ---------------------------------------------------------------------------- upcycle.py and the export back


@pytest.mark.parametrize("query", [[], ["--query", "anchored", "--layers", "1"]], ids=["plain", "anchored"])
@pytest.mark.parametrize("kind", ["llama", "qwen3", "gpt2"])
def test_upcycle_carries_the_shipped_tokenizer(shipped: dict[str, Path], tmp_path: Path, kind: str,
                                               query: list[str]) -> None:
    source = shipped[kind]
    assert main_of("upcycle", [source, tmp_path / "out", *query]) == 0
    with torch.no_grad():
        assert relative_error(load_model(tmp_path / "out").model(tokens()), hf_model(source)(tokens()).logits) <= 1e-5
    assert_same_tokenizer(tmp_path / "out", source)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_an_upcycled_model_exports_back_to_its_own_architecture(shipped: dict[str, Path], tmp_path: Path,
                                                                kind: str) -> None:
    """HF folder -> upcycle.py -> convert_checkpoint.py --format hf-KIND: the source's class, logits, BOS/EOS ids,
    tokenizer and greedy generation; no remote code."""
    source, out = shipped[kind], tmp_path / "back"
    assert main_of("upcycle", [source, tmp_path / "up"]) == 0
    assert main_of("convert_checkpoint", [tmp_path / "up", out, "--format", f"hf-{kind}"]) == 0
    ours, theirs = hf_model(out), hf_model(source)
    assert type(ours) is type(theirs) and not any(p.suffix == ".py" for p in out.iterdir())
    config, original = (json.loads((f / "config.json").read_text()) for f in (out, source))
    assert (config["bos_token_id"], config["eos_token_id"]) == (original["bos_token_id"], original["eos_token_id"])
    with torch.no_grad():
        assert relative_error(ours(tokens()).logits, theirs(tokens()).logits) <= 1e-6
    assert_same_tokenizer(out, source)
    prompt = tokens(5)[:1]
    greedy = dict(max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(ours.generate(prompt, **greedy), theirs.generate(prompt, **greedy))


def test_a_folder_converts_directly(shipped: dict[str, Path], tmp_path: Path) -> None:
    """convert_checkpoint.py reads a Hugging Face folder as it reads a checkpoint: --format hf carries the BOS too."""
    assert main_of("convert_checkpoint", [shipped["llama"], tmp_path / "hf", "--format", "hf"]) == 0
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    tok = shipped_tokenizer()
    assert (generation["bos_token_id"], generation["eos_token_id"]) == (tok.bos_token_id, tok.eos_token_id)
    assert_same_tokenizer(tmp_path / "hf", shipped["llama"])


# ---------------------------------------------------------------------------- generate.py and evaluate.py


def eot_of(source: Path) -> str:
    return json.loads((source / "tokenizer_config.json").read_text())["eos_token"]


@pytest.mark.parametrize("kind", ["llama", "qwen3", "gpt2"])
def test_generate_opens_the_folder(shipped: dict[str, Path], kind: str, capsys: pytest.CaptureFixture) -> None:
    """generate.py SOURCE --temperature 0 prints transformers' greedy continuation of the prompt's ids (the
    tokenizer.json's ordinary encoding), decoded by the folder's tokenizer."""
    from tokenizers import Tokenizer

    source, prompt = shipped[kind], "the king's thing"
    assert main_of("generate", [source, "--prompt", prompt, "--max-new-tokens", "8", "--temperature", "0"]) == 0
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    ids = tok.encode(prompt, add_special_tokens=False).ids
    eot = tok.token_to_id(eot_of(source))
    generated = hf_model(source).generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=eot,
                                          pad_token_id=eot)[0, len(ids):].tolist()
    new = generated[:generated.index(eot)] if eot in generated else generated
    whole, head = tok.decode(ids + new, skip_special_tokens=False), tok.decode(ids, skip_special_tokens=False)
    assert capsys.readouterr().out == prompt + whole[len(head):] + "\n"


@pytest.fixture(scope="module")
def llama_data(shipped: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder prepared with the shipped Llama's tokenizer.json."""
    from torchnlq.data.prepare import prepare_dataset

    root = tmp_path_factory.mktemp("data")
    text = root / "text.txt"
    text.write_text("\n\n".join(f"{CORPUS[i % 4]} {CORPUS[(i * 7) % 4]} {i}" for i in range(120)) + "\n")
    prepare_dataset(root / "data", files=[str(text)], text_split="paragraph", tokenizer="hf",
                    tokenizer_file=str(shipped["llama"] / "tokenizer.json"), val_fraction=0.2)
    return root / "data"


def test_evaluate_opens_the_folder(shipped: dict[str, Path], llama_data: Path, capsys: pytest.CaptureFixture) -> None:
    """evaluate.py SOURCE --data: the loss is transformers' cross-entropy on the same validation windows."""
    from torchnlq.config.job_config import Data, Validation
    from torchnlq.data.batches import ValidationSet, open_token_files

    argv = [shipped["llama"], "--data", llama_data, "--sequences", "4", "--seq-len", "16", "--micro-batch-size", "2"]
    assert main_of("evaluate", argv) == 0
    printed = dict(line.split(": ") for line in capsys.readouterr().out.splitlines())
    _, val, _ = open_token_files(Data(path=str(llama_data), tokenizer="hf"), 16)
    model = hf_model(shipped["llama"])
    with torch.no_grad():
        losses = [F.cross_entropy(model(x).logits.flatten(0, 1), y.flatten()).item()
                  for x, y in ValidationSet(val, 16, 4, 2, Validation().seed)]
    assert float(printed["val_loss"]) == pytest.approx(float(np.mean(losses)), rel=1e-5)


# ---------------------------------------------------------------------------- initial load, training, export back


def run_from(tmp_path: Path, source: Path, data: Path, kind: str, steps: int = 2, **model: object) -> Any:
    """A run whose [model] is the shipped ``kind`` model's (dim 128, 8 heads; ``model`` overrides, e.g. another
    head_dim), trained on data of its tokenizer, starting from ``source``."""
    from torchnlq.train.trainer import Trainer

    block = dict(model__norm="rms", model__mlp_activation="swiglu", model__positions="rope", model__norm_eps=1e-6,
                 model__qk_norm=kind == "qwen3", model__tie_embeddings=kind == "qwen3")
    if kind == "llama":
        block |= dict(model__rope_theta=5e5, model__rope_scaling_factor=8.0, model__rope_original_max_seq_len=16)
    block = dict(model__dim=128, **block)
    cfg = tiny_config(
        tmp_path, "run", steps=steps, model__n_layers=2, model__n_heads=8, model__n_kv_heads=2,
        model__mlp_hidden=96, model__vocab_size=VOCAB, model__max_seq_len=64, model__init="depth",
        model__query__type="linear", checkpoint__initial_load_path=source, checkpoint__interval=steps,
        data__path=data, data__synthetic=False, data__tokenizer="hf", data__tokenizer_file=source / "tokenizer.json",
        training__seq_len=16, training__grad_accum_steps=1, validation__enabled=False, **{**block, **model})
    return Trainer(cfg)


@pytest.mark.integration  # trains
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_a_run_from_the_folder_trains_and_exports_back(tmp_path: Path, kind: str, llama_data: Path) -> None:
    """initial_load_path = the shipped folder: the first loss is transformers'; the checkpoint carries the
    tokenizer.json; its --format hf-KIND export has the checkpoint's logits and the source's ids; generate.py runs."""
    shape = {**SHAPES[kind], "hidden_size": 128}  # head_dim 16 = 128 / 8: a shape [model] can state
    source = save_shipped(tmp_path / kind, kind, **shape)
    trainer = run_from(tmp_path, source, llama_data, kind)
    x, y = next(iter(trainer.loader.micro_batches(0)))
    with torch.no_grad():
        expected = F.cross_entropy(hf_model(source)(x).logits.flatten(0, 1), y.flatten()).item()
    trainer.train()
    assert math.isclose(scalars(tmp_path / "outputs" / "run" / "tb")["loss/train"][1], expected, rel_tol=1e-5)
    ckpt = tmp_path / "outputs" / "run" / "checkpoints" / "step-2"
    assert (ckpt / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    assert main_of("convert_checkpoint", [ckpt, tmp_path / "back", "--format", f"hf-{kind}"]) == 0
    with torch.no_grad():
        assert relative_error(hf_model(tmp_path / "back")(tokens()).logits, load_model(ckpt).model(tokens())) <= 1e-5
    ours, theirs = (transformers.AutoTokenizer.from_pretrained(f) for f in (tmp_path / "back", source))
    assert ours.encode("the king's house", add_special_tokens=False) == theirs.encode("the king's house",
                                                                                      add_special_tokens=False)
    assert main_of("generate", [ckpt, "--prompt", "the", "--max-new-tokens", "3"]) == 0


@pytest.mark.integration  # trains
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_one_option_takes_the_model_from_the_folder(tmp_path: Path, kind: str, llama_data: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    """model.from_checkpoint: the folder's shapes, block and query, no [model] key copied by hand; the resolved
    config says what was taken; the first loss is transformers' on the same batch."""
    from torchnlq.config.manager import load_job_config
    from torchnlq.train.preflight import check_job_config, resolved_config
    from torchnlq.config.render import to_toml
    from torchnlq.train.trainer import Trainer

    source = save_shipped(tmp_path / kind, kind, **SHAPES[kind])
    argv = [f"--job.dump_folder={tmp_path / 'outputs'}", "--job.name=run", "--model.from_checkpoint=true",
            f"--checkpoint.initial_load_path={source}", f"--data.path={llama_data}", "--data.tokenizer=hf",
            f"--data.tokenizer_file={source / 'tokenizer.json'}", "--training.steps=2", "--training.seq_len=16",
            "--training.micro_batch_size=4", "--training.device=cpu", "--validation.enabled=false",
            "--lr_schedule.warmup_steps=1", "--checkpoint.enabled=true", "--checkpoint.interval=2",
            "--metrics.log_interval=1"]
    cfg = load_job_config(argv)
    args = check_job_config(cfg)
    config = json.loads((source / "config.json").read_text())
    assert (args.n_layers, args.dim, args.n_heads, args.n_kv_heads, args.head_dim, args.mlp_hidden, args.vocab_size) == (
        config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
        config["num_key_value_heads"], config["head_dim"], config["intermediate_size"], config["vocab_size"])
    assert (args.norm, args.mlp_activation, args.positions, args.qk_norm) == ("rms", "swiglu", "rope", kind == "qwen3")
    printed = to_toml(resolved_config(cfg, args))
    assert f"dim = {config['hidden_size']}" in printed and f"n_layers = {config['num_hidden_layers']}" in printed
    trainer = Trainer(cfg)
    x, y = next(iter(trainer.loader.micro_batches(0)))
    with torch.no_grad():
        expected = F.cross_entropy(hf_model(source)(x).logits.flatten(0, 1), y.flatten()).item()
    trainer.train()
    assert math.isclose(scalars(tmp_path / "outputs" / "run" / "tb")["loss/train"][1], expected, rel_tol=1e-5)
    header = (tmp_path / "outputs" / "run" / "train.log").read_text()  # the folder's model, not the default flavor's
    assert f"| model from {source} (" in header and f"| model {cfg.model.flavor} " not in header, header[:600]


@pytest.mark.integration  # trains
def test_a_run_from_the_folder_carries_its_special_tokens_and_chat_template(tmp_path: Path, llama_data: Path) -> None:
    source = save_shipped(tmp_path / "llama", "llama", **{**SHAPES["llama"], "hidden_size": 128})
    run_from(tmp_path, source, llama_data, "llama").train()
    ckpt = tmp_path / "outputs" / "run" / "checkpoints" / "step-2"
    assert main_of("convert_checkpoint", [ckpt, tmp_path / "back", "--format", "hf-llama"]) == 0
    assert_same_tokenizer(tmp_path / "back", source)


# ---------------------------------------------------------------------------- the catalogue of these doors


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` and its sha256 (what must not change when a command is refused)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def edit_config(**change: Any) -> Any:
    def edit(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **change}))
    return edit


def write(name: str, data: bytes) -> Any:
    return lambda folder: (folder / name).write_bytes(data)


def reshape_q_norm(folder: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.0.self_attn.q_norm.weight"] = torch.ones(8)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def anchored(folder: Path) -> None:
    """Replace the folder by an anchored upcycle of the shipped Qwen3 (a torchnlq export)."""
    import shutil

    source = folder.parent / "source"
    shutil.move(folder, source)
    assert main_of("upcycle", [source, folder, "--query", "anchored"]) == 0
    shutil.rmtree(source)


# (script, source kind, how the copy is spoiled, extra arguments, the fragment of the one error line)
CATALOGUE = {
    "hf-qwen3-of-a-llama": ("convert_checkpoint", "llama", None, ["{out}", "--format", "hf-qwen3"],
                            "model.qk_norm=False: Qwen3 has RoPE, RMSNorm, the SwiGLU MLP without biases and QK-norm "
                            "(model.qk_norm = true); this model is a standard Llama: export it with --format hf-llama"),
    "hf-llama-of-a-qwen3": ("convert_checkpoint", "qwen3", None, ["{out}", "--format", "hf-llama"],
                            "model.qk_norm=True: Llama has RoPE, RMSNorm, the SwiGLU MLP and no QK-norm; this model "
                            "is a standard Qwen3: export it with --format hf-qwen3"),
    "hf-qwen3-of-an-anchored-query": ("convert_checkpoint", "qwen3", anchored, ["{out}", "--format", "hf-qwen3"],
                                      "query type anchored has no Qwen3 equivalent (Qwen3's query is linear in X, this one is not); "
                                      "export with --format hf (any model)"),
    "qwen3-sliding-window": ("upcycle", "qwen3", edit_config(layer_types=["full_attention", "sliding_attention"]),
                             ["{out}"], "Qwen3 sliding-window attention (use_sliding_window, layer_types)"),
    "qwen3-sliding-window-4x": ("upcycle", "qwen3", edit_config(layer_types=None, use_sliding_window=True,
                                                               sliding_window=8, max_window_layers=1),
                                ["{out}"], "Qwen3 sliding-window attention"),
    "qwen3-attention-bias": ("upcycle", "qwen3", edit_config(attention_bias=True), ["{out}"],
                             "Qwen3 attention_bias = true: torchnlq's model.bias gives the MLP biases too"),
    "qwen3-yarn-rope": ("upcycle", "qwen3", edit_config(rope_parameters={"rope_type": "yarn", "factor": 4.0}),
                        ["{out}"], "Qwen3 RoPE type 'yarn': torchnlq computes the default and llama3 kinds only"),
    "qwen3-layer-types-not-a-list": ("upcycle", "qwen3", edit_config(layer_types="full_attention"), ["{out}"],
                                     "config.json': invalid layer_types: \"full_attention\" is a string, not a JSON "
                                     "list"),
    "qwen3-q-norm-of-another-shape": ("upcycle", "qwen3", reshape_q_norm, ["{out}"],
                                      "tensor 'model.layers.0.self_attn.q_norm.weight' has shape (8,) but config.json "
                                      "gives (16,)"),
    "unsupported-model-type": ("generate", "llama", edit_config(model_type="mistral"), ["--prompt", "a"],
                               "is not a torchnlq export, nor a Hugging Face folder torchnlq reads (its model_type "
                               "is \"mistral\"; torchnlq reads gpt2, llama, qwen3 and qwen3_moe)"),
    "pickled-weights-only": ("generate", "llama", lambda f: (f / "model.safetensors").rename(f / "pytorch_model.bin"),
                             ["--prompt", "a"], "pytorch_model.bin, which torchnlq does not unpickle"),
    "tokenizer-config-corrupt": ("generate", "llama", write("tokenizer_config.json", b"{not json"), ["--prompt", "a"],
                                 "tokenizer_config.json' is corrupt"),
    "chat-template-not-utf8": ("upcycle", "llama", write("chat_template.jinja", b"\xff\xfe{{ x }}"), ["{out}"],
                               "chat_template.jinja' is not UTF-8 text; repair or remove it"),
    "special-tokens-map-not-an-object": ("upcycle", "qwen3", write("special_tokens_map.json", b"[1, 2]"), ["{out}"],
                                         "special_tokens_map.json' is corrupt (not a JSON object)"),
    "evaluate-without-sequences": ("evaluate", "llama", None, ["--data", "{data}"],
                                   "records no validation settings; pass --sequences N"),
}


@pytest.mark.parametrize("name", list(CATALOGUE))
def test_catalogue(name: str, shipped: dict[str, Path], llama_data: Path, tmp_path: Path,
                   capsys: pytest.CaptureFixture) -> None:
    """Each mistake: exit 2, one ``error:`` line with the fragment, no file of the user changed, nothing written."""
    import shutil

    script, kind, spoil, extra, fragment = CATALOGUE[name]
    folder = tmp_path / "model"
    shutil.copytree(shipped[kind], folder)
    if spoil is not None:
        spoil(folder)
    before = snapshot(tmp_path)
    names = {"out": tmp_path / "out", "data": llama_data}
    argv = [str(folder), *(a.format(**{k: str(v) for k, v in names.items()}) for a in extra)]
    capsys.readouterr()
    assert main_of(script, argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert fragment in err, err
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()


@pytest.mark.integration  # trains
def test_a_qwen3_whose_heads_are_wider_than_dim_over_heads_starts_a_run_with_model_head_dim(
        tmp_path: Path, llama_data: Path) -> None:
    """Qwen3's head_dim is its own (Qwen3-0.6B: 128 at width 1024 with 16 heads): here 16 at width 64 with 8 heads."""
    source = save_shipped(tmp_path / "qwen3", "qwen3", **SHAPES["qwen3"])
    trainer = run_from(tmp_path, source, llama_data, "qwen3", model__dim=64, model__head_dim=16)
    x, y = next(iter(trainer.loader.micro_batches(0)))
    with torch.no_grad():
        expected = F.cross_entropy(hf_model(source)(x).logits.flatten(0, 1), y.flatten()).item()
    trainer.train()
    assert math.isclose(scalars(tmp_path / "outputs" / "run" / "tb")["loss/train"][1], expected, rel_tol=1e-5)


@pytest.mark.integration  # trains
@pytest.mark.parametrize("command", ["the-same-command", "the-runs-own-config"])
def test_a_run_from_a_folder_resumes_after_the_folder_is_moved(tmp_path: Path, llama_data: Path, command: str) -> None:
    """model.from_checkpoint records what it took (the resolved config.toml writes the model out, from_checkpoint =
    false; the checkpoints hold it): the same command, or the run's own config.toml, resumes with the folder gone
    (issue 47.3), and the resumed run's weights are the ones its checkpoint saved plus the new steps."""
    from torchnlq.config.manager import load_job_config
    from torchnlq.train.trainer import Trainer

    source = save_shipped(tmp_path / "llama", "llama", **SHAPES["llama"])
    tokenizer = tmp_path / "tokenizer.json"
    shutil.copy(source / "tokenizer.json", tokenizer)  # the data's tokenizer stays; the model's folder moves
    argv = [f"--job.dump_folder={tmp_path / 'outputs'}", "--job.name=run", "--model.from_checkpoint=true",
            f"--checkpoint.initial_load_path={source}", f"--data.path={llama_data}", "--data.tokenizer=hf",
            f"--data.tokenizer_file={tokenizer}", "--training.seq_len=16", "--training.micro_batch_size=4",
            "--training.device=cpu", "--validation.enabled=false", "--lr_schedule.warmup_steps=1",
            "--checkpoint.enabled=true", "--checkpoint.interval=2"]
    Trainer(load_job_config([*argv, "--training.steps=2"])).train()
    source.rename(tmp_path / "moved")
    run = tmp_path / "outputs" / "run"
    again = argv if command == "the-same-command" else [str(run / "config.toml")]
    trainer = Trainer(load_job_config([*again, "--training.steps=4"]))
    assert trainer.start.kind == "resume" and trainer.step == 2
    trainer.train()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2", "step-4"]
    assert "from_checkpoint = false" in (run / "config.toml").read_text()


def residual_query_reference(attn: Any, w1: torch.Tensor, w2: torch.Tensor, gain_in: torch.Tensor,
                             gain_out: torch.Tensor, eps: float) -> None:
    """Give transformers' attention ``attn`` the paper's query in place of its q_proj, written out here:
    Q(X) = (X + LN(GELU(RMSNorm(X)·W1ᵀ)·W2ᵀ)) / 2 (no biases; the norms' gains, eps as the model's)."""

    class Query(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gain_in
            h = F.gelu(h @ w1.T) @ w2.T
            h = (h - h.mean(-1, keepdim=True)) / torch.sqrt(h.var(-1, unbiased=False, keepdim=True) + eps) * gain_out
            return (x + h) / 2

    attn.q_proj = Query()


@pytest.mark.integration  # builds a trainer
def test_another_query_type_replaces_the_folders_and_every_other_weight_is_the_folders(
        tmp_path: Path, llama_data: Path, capsys: pytest.CaptureFixture) -> None:
    """--model.query.type=residual_mlp on a Llama folder (model.from_checkpoint): the run's logits at step 0 are
    transformers' Llama on the folder with its q_proj replaced by the paper's query, whose weights are the run's
    own init; the start line says what was left out."""
    from torchnlq.config.manager import load_job_config
    from torchnlq.train.trainer import Trainer

    source = save_shipped(tmp_path / "llama", "llama", **{**SHAPES["llama"], "head_dim": 8})  # 8 heads x 8 = dim
    argv = [f"--job.dump_folder={tmp_path / 'outputs'}", "--job.name=run", "--model.from_checkpoint=true",
            f"--checkpoint.initial_load_path={source}", f"--data.path={llama_data}", "--data.tokenizer=hf",
            f"--data.tokenizer_file={source / 'tokenizer.json'}", "--training.seq_len=16", "--training.device=cpu",
            "--validation.enabled=false", "--model.query.type=residual_mlp", "--training.steps=2"]
    trainer = Trainer(load_job_config(argv))
    assert trainer.start.line == (f"initialised from {source} (step 0; its linear query (2 tensors) is left out: "
                                  "this run's residual_mlp queries start from their init, every other tensor is the "
                                  "source's)")
    reference = hf_model(source)
    for block, layer in zip(trainer.model.layers, reference.model.layers):
        query = block.attn.query
        residual_query_reference(layer.self_attn, query.w1.weight.detach(), query.w2.weight.detach(),
                                 query.input_norm.weight.detach(), query.output_norm.weight.detach(),
                                 reference.config.rms_norm_eps)
    trainer.model.eval()
    with torch.no_grad():
        ours, theirs = trainer.model(tokens()), reference(tokens()).logits
    assert relative_error(ours, theirs) < 1e-5
    trainer.close()


@pytest.mark.integration  # prepares data and trains through run_train.sh
def test_the_docs_commands_for_a_run_from_a_folder_work_as_written(tmp_path: Path) -> None:
    """docs/checkpoints.md's two commands (prepare the data with the folder's tokenizer, train from the folder with
    the paper's query), run as written in a folder holding hf/llama and corpus.txt; only the run's length is
    added."""
    import subprocess
    import sys

    from helpers import REPO_ROOT
    from helpers.train import script_env
    from test_docs_commands import documented_commands

    save_shipped(tmp_path / "hf" / "llama", "llama",
                 **{**SHAPES["llama"], "head_dim": 8, "max_position_embeddings": 512})
    (tmp_path / "corpus.txt").write_text("\n\n".join(f"{CORPUS[i % 4]} {CORPUS[(i * 7) % 4]} {i}" for i in range(6000)))
    commands = [c for c in documented_commands(REPO_ROOT / "docs" / "checkpoints.md")
                if "data/mine" in c and ("prepare_data.py" in c or "from_hf_folder.toml" in c)]
    assert len(commands) == 2 and "--model.query.type=residual_mlp" in commands[1]
    for command, extra in zip(commands, ([], ["--training.steps=2"])):
        argv = shlex.split(command)
        argv = ([sys.executable, str(REPO_ROOT / argv[1]), *argv[2:]] if argv[0] == "python" else
                [str(REPO_ROOT / "run_train.sh"), str(REPO_ROOT / argv[1]), *argv[2:]])
        done = subprocess.run([*argv, *extra], cwd=tmp_path, env=script_env(tmp_path), capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    log = (tmp_path / "outputs" / "from_hf_folder" / "train.log").read_text()
    assert "its linear query (2 tensors) is left out: this run's residual_mlp queries start from their init" in log
    assert re.search(r"step\s+2/2\s+val_loss \d", log), log[-1500:]
