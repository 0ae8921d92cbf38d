"""The catalogue's rows of ``python scripts/generate.py``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations

import json

import pytest

from catalogue.rows import (
    HF_MODEL_META, both, checkpoint, copy_of, edit_json, gpt2_checkpoint, overwrite, row,
    set_key, tokenizer_json, write,
)
from catalogue.runner import mistake_tests, valid_command_test


def byte_vocab() -> dict[str, int]:
    """A GPT-2-style vocab.json's single bytes (its printable characters -> the byte's id)."""
    from torchnlq.interop.tokenizer_files import byte_to_char

    return {char: byte for byte, char in byte_to_char().items()}

IN_PROCESS = [
    row("generate.py", "tiktoken-file-of-other-ranks-for-a-model-without-a-tokenizer",
        ["{tmp}/notok", "--tiktoken-file", "{tmp}/o.tiktoken"], "not the GPT-2 (r50k_base) ranks",
        setup=both(checkpoint("notok", meta={"tokenizer": {}}), write({"o.tiktoken": "IQ== 0\n"}))),
    row("generate.py", "checkpoint-not-given", [], "CKPT_OR_EXPORT"),
    row("generate.py", "gpt2-checkpoint-whose-carried-ranks-are-damaged", ["{tmp}/gpt2"],
        "tokenizer.tiktoken' is corrupt (sha256",
        setup=both(gpt2_checkpoint(), write({"gpt2/tokenizer.tiktoken": "damaged"}))),
    row("generate.py", "export-whose-vocab-json-is-corrupt", ["{tmp}/export"], "vocab.json' is corrupt",
        setup=copy_of("{export}", "export", lambda f: (
            edit_json("config.json", set_key("tokenizer", {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}))(f),
            overwrite("vocab.json", "{not json")(f)))),
    # A plugin's query type, without --plugins: the model is sound, the module that registers its type is missing.
    row("generate.py", "plugin-checkpoint-without-its-plugin", ["{tmp}/plugged"],
        "holds a model of query type 'anchored_mlp', which no imported module registers: import the plugin module "
        "that registered it for training, with --plugins MODULE",
        setup=copy_of("{ckpt}", "plugged",
                      edit_json("torchnlq.json", set_key("model_args.query.type", "anchored_mlp")))),
    row("generate.py", "plugin-export-without-its-plugin", ["{tmp}/plugged_export"],
        "holds a model of query type 'anchored_mlp', which no imported module registers",
        setup=copy_of("{export}", "plugged_export",
                      edit_json("config.json", set_key("model_args.query.type", "anchored_mlp")))),
    row("generate.py", "max-new-tokens-not-a-number", ["{ckpt}", "--max-new-tokens", "ten"], "ten"),
    row("generate.py", "checkpoint-missing", ["{tmp}/nowhere"], "'{tmp}/nowhere' does not exist"),
    row("generate.py", "run-folder-for-a-checkpoint", ["{run}"], "it looks like a run folder"),
    row("generate.py", "negative-max-new-tokens", ["{ckpt}", "--max-new-tokens", "-1"], "--max-new-tokens=-1 must be at least 0"),
    row("generate.py", "negative-temperature", ["{ckpt}", "--temperature", "-0.5"],
        "--temperature=-0.5 must be a finite number >= 0"),
    row("generate.py", "nan-temperature", ["{ckpt}", "--temperature", "nan"], "--temperature=nan must be a finite number"),
    row("generate.py", "infinite-temperature", ["{ckpt}", "--temperature", "inf"], "--temperature=inf must be a finite number"),
    row("generate.py", "zero-top-k", ["{ckpt}", "--top-k", "0"], "--top-k=0 must be at least 1"),
    row("generate.py", "negative-seed", ["{ckpt}", "--seed", "-1"], "--seed=-1 must be in 0.."),
    row("generate.py", "seed-above-2**64-1", ["{ckpt}", "--seed", str(2**64)], f"--seed={2**64} must be in 0.."),
    row("generate.py", "cuda-without-a-gpu", ["{ckpt}", "--device", "cuda"], "no CUDA device is visible; use --device cpu",
        needs_no_cuda=True),
    row("generate.py", "unknown-device", ["{ckpt}", "--device", "tpu"], "unknown device 'tpu'"),
    row("generate.py", "device-this-torch-lacks", ["{ckpt}", "--device", "mps"], "mps"),
    row("generate.py", "device-index-the-cpu-lacks", ["{ckpt}", "--device", "cpu:2"],
        "device 'cpu:2' does not exist: the CPU is one device"),
    row("generate.py", "export-whose-vocab-json-gives-an-id-past-2**32", ["{tmp}/huge-id"],
        "vocab.json' gives a token the id 18,446,744,073,709,551,616; torchnlq reads token ids 0 to 16,777,215",
        setup=copy_of("{export}", "huge-id", lambda f: (
            edit_json("config.json", set_key("tokenizer", {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}))(f),
            overwrite("vocab.json", json.dumps(byte_vocab() | {"\u0120\u0120": 2**64}))(f)))),
    row("generate.py", "prompt-longer-than-the-context", ["{ckpt}", "--prompt", "x" * 300],
        "the prompt has 300 tokens but the model's context is max_seq_len=256"),
    row("generate.py", "gpt2-model-without-its-tiktoken-file", ["{tmp}/gpt2", "--tiktoken-file", "{tmp}/gpt2.tiktoken"],
        "tiktoken file '{tmp}/gpt2.tiktoken' does not exist",
        setup=checkpoint("gpt2", meta={"tokenizer": {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}},
                         n_layers=1, dim=8, n_heads=2, vocab_size=50304, max_seq_len=16)),
    row("generate.py", "model-without-a-tokenizer", ["{tmp}/notok"], "the model records no tokenizer",
        setup=checkpoint("notok", meta={"tokenizer": {}})),
    row("generate.py", "tokenizer-larger-than-the-model", ["{tmp}/small"], "tokenizer byte has 257 tokens but the model only 200",
        setup=checkpoint("small", vocab_size=200)),
    row("generate.py", "hf-model-without-its-tokenizer-json", ["{tmp}/hftok"], "that '{tmp}/hftok' does not carry",
        setup=checkpoint("hftok", meta=HF_MODEL_META, vocab_size=64)),
    row("generate.py", "hf-model-whose-tokenizer-json-changed", ["{tmp}/edited"],
        "not the tokenizer.json the model was trained with",
        setup=both(checkpoint("edited", meta=HF_MODEL_META, vocab_size=64), tokenizer_json("edited/tokenizer.json"))),
]

SUBPROCESS = [
    # After the checkpoint is loaded: torch's DCP must not add a warning line of its own.
    row("generate.py", "prompt-longer-than-the-context-in-a-process", ["{ckpt}", "--prompt", "y" * 257],
        "the prompt has 257 tokens"),
]

CONTROLS = [
    pytest.param("generate.py", ["{ckpt}", "--max-new-tokens", "2", "--prompt", "ab"], None, id="generate"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)


test_the_valid_command_works = valid_command_test(CONTROLS)
