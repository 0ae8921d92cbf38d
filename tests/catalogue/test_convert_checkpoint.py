"""The catalogue's rows of ``python scripts/convert_checkpoint.py`` (every ``--format``).

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations


import pytest

from torchnlq.models.moe.config import MoE

from catalogue.rows import (
    HF_MODEL_META, both, checkpoint, copy_of, edit_json, folders, gpt2_checkpoint,
    overwrite, row, set_key, truncate_shard, write,
)
from catalogue.runner import mistake_tests, valid_command_test


def beyond_fp16(tmp, inputs) -> None:  # noqa: ANN001 - a Setup
    """A checkpoint with one weight beyond float16's range: refused by the writer, after OUT's parents exist."""
    import torch
    from helpers.checkpoints import BYTE_TOKENIZER, tiny_model, write_checkpoint

    model = tiny_model()
    with torch.no_grad():
        model.tok_emb.weight[0, 0] = 1e6
    write_checkpoint(tmp / "huge", model, tokenizer=BYTE_TOKENIZER)


IN_PROCESS = [
    row("convert_checkpoint.py", "output-folder-not-given", ["{ckpt}"], "OUT"),
    # Issue 40.7: a refusal of the writer leaves no empty parents of OUT behind.
    row("convert_checkpoint.py", "fp16-of-a-weight-beyond-its-range-into-new-folders",
        ["{tmp}/huge", "{tmp}/new/deeper/out", "--dtype", "fp16"], "beyond float16's range", setup=beyond_fp16),
    row("convert_checkpoint.py", "plugin-module-missing", ["{ckpt}", "{tmp}/out", "--plugins", "no_such_plugin_module"],
        "--plugins: cannot import 'no_such_plugin_module'"),
    row("convert_checkpoint.py", "unknown-dtype", ["{ckpt}", "{tmp}/out", "--dtype", "int8"], "int8"),
    row("convert_checkpoint.py", "checkpoint-missing", ["{tmp}/nowhere", "{tmp}/out"], "'{tmp}/nowhere' does not exist"),
    row("convert_checkpoint.py", "hf-model-without-its-tokenizer-json", ["{tmp}/hftok", "{tmp}/out"],
        "but '{tmp}/hftok' carries none; copy that file into '{tmp}/hftok' as tokenizer.json",
        setup=checkpoint("hftok", meta=HF_MODEL_META, vocab_size=64)),
    row("convert_checkpoint.py", "run-folder-for-a-checkpoint", ["{run}", "{tmp}/out"],
        "(it looks like a run folder: pass one of {run}/checkpoints/step-N)"),
    row("convert_checkpoint.py", "data-folder-for-a-checkpoint", ["{data}", "{tmp}/out"],
        "'{data}' is neither a torchnlq checkpoint"),
    row("convert_checkpoint.py", "output-exists", ["{ckpt}", "{tmp}/out"], "'{tmp}/out' already exists",
        setup=copy_of("{export}", "out")),
    row("convert_checkpoint.py", "output-is-the-checkpoint", ["{ckpt}", "{ckpt}", "--overwrite"], "is the source"),
    row("convert_checkpoint.py", "output-inside-the-checkpoint", ["{ckpt}", "{ckpt}/export"], "lies inside the source"),
    row("convert_checkpoint.py", "output-is-the-run-folder", ["{ckpt}", "{run}", "--overwrite"], "contains the source"),
    row("convert_checkpoint.py", "output-inside-the-checkpoints-folder", ["{ckpt}", "{run}/checkpoints/export"],
        "lies inside the run's checkpoints folder"),
    row("convert_checkpoint.py", "output-is-the-working-directory", ["{ckpt}", ".", "--overwrite"],
        "output folder '.' is the current directory"),
    row("convert_checkpoint.py", "output-is-the-home-folder", ["{ckpt}", "~", "--overwrite"],
        "output folder '~' is the current directory, the home folder", setup=folders("home"), env={"HOME": "{tmp}/home"}),
    row("convert_checkpoint.py", "overwrite-a-folder-that-is-not-an-export", ["{ckpt}", "{tmp}/notes", "--overwrite"],
        "is not a torchnlq export (it holds 'thesis.tex')", setup=write({"notes/thesis.tex": "years of work"})),
    row("convert_checkpoint.py", "overwrite-a-file", ["{ckpt}", "{tmp}/notes.txt", "--overwrite"],
        "'{tmp}/notes.txt' exists and is not a folder", setup=write({"notes.txt": "mine"})),
    row("convert_checkpoint.py", "overwrite-a-symbolic-link", ["{ckpt}", "{tmp}/link", "--overwrite"],
        "'{tmp}/link' is a symbolic link", setup=lambda tmp, inputs: (tmp / "link").symlink_to(inputs.export)),
    row("convert_checkpoint.py", "hf-gpt2-of-a-nonlinear-query", ["{tmp}/mlp", "{tmp}/hf", "--format", "hf-gpt2"],
        "query type residual_mlp has no GPT-2 equivalent", setup=checkpoint("mlp", qtype="residual_mlp")),
    row("convert_checkpoint.py", "hf-gpt2-of-a-rope-model", ["{tmp}/rope", "{tmp}/hf", "--format", "hf-gpt2"],
        "positions='rope': GPT-2 has learned absolute positions only", setup=checkpoint("rope", positions="rope")),
    row("convert_checkpoint.py", "hf-gpt2-of-a-gqa-model", ["{tmp}/gqa", "{tmp}/hf", "--format", "hf-gpt2"],
        "n_kv_heads=2 != n_heads=4 (GQA/MQA)", setup=checkpoint("gqa", n_kv_heads=2)),
    row("convert_checkpoint.py", "hf-qwen3-moe-of-a-dense-model", ["{ckpt}", "{tmp}/hf", "--format", "hf-qwen3-moe"],
        "--format hf-qwen3-moe (Qwen3MoeForCausalLM) holds models of the moe family"),
    row("convert_checkpoint.py", "hf-qwen3-of-a-moe-model", ["{tmp}/moe", "{tmp}/hf", "--format", "hf-qwen3"],
        "model.family='moe': --format hf-qwen3 (Qwen3ForCausalLM) holds models of the dense family",
        setup=checkpoint("moe", family="moe", norm="rms", positions="rope", mlp_activation="swiglu",
                         moe=MoE(n_experts=2, top_k=1, expert_hidden=8))),
    row("convert_checkpoint.py", "checkpoint-metadata-corrupt", ["{tmp}/corrupt", "{tmp}/out"], "torchnlq.json' is corrupt",
        setup=copy_of("{ckpt}", "corrupt", overwrite("torchnlq.json", "{not json"))),
    row("convert_checkpoint.py", "checkpoint-shard-truncated", ["{tmp}/truncated", "{tmp}/out"], "is truncated (100 of",
        setup=copy_of("{ckpt}", "truncated", truncate_shard)),
    row("convert_checkpoint.py", "checkpoint-metadata-of-another-model", ["{tmp}/other", "{tmp}/out"],
        "but the model_args give", setup=copy_of("{ckpt}", "other", edit_json("torchnlq.json", set_key("model_args.dim", 64)))),
    row("convert_checkpoint.py", "export-from-a-newer-torchnlq", ["{tmp}/export", "{tmp}/out"],
        "has format_version 99, newer than this torchnlq reads",
        setup=copy_of("{export}", "export", edit_json("config.json", set_key("format_version", 99)))),
    row("convert_checkpoint.py", "hugging-face-gpt2-config-without-its-keys", ["{tmp}/hf", "{tmp}/out"],
        "config.json lacks or mangles 'n_embd'; it is not a GPT2LMHeadModel config",
        setup=write({"hf/config.json": '{"model_type": "gpt2"}', "hf/model.safetensors": "x"})),
    row("convert_checkpoint.py", "hugging-face-folder-of-another-architecture", ["{tmp}/mistral", "{tmp}/out"],
        "is not a torchnlq export, nor a Hugging Face folder torchnlq reads (its model_type is \"mistral\"",
        setup=write({"mistral/config.json": '{"model_type": "mistral"}', "mistral/model.safetensors": "x"})),
    row("convert_checkpoint.py", "unknown-format", ["{ckpt}", "{tmp}/out", "--format", "hf2"], "invalid choice: 'hf2'"),
    row("convert_checkpoint.py", "hf-output-inside-the-checkpoint", ["{ckpt}", "{ckpt}/hf", "--format", "hf"],
        "lies inside the source"),
    row("convert_checkpoint.py", "hf-overwrite-a-folder-that-is-not-an-export",
        ["{ckpt}", "{tmp}/notes", "--format", "hf", "--overwrite"], "is not a torchnlq export",
        setup=write({"notes/mine.txt": "mine"})),
    row("convert_checkpoint.py", "hf-of-a-gpt2-checkpoint-without-ranks-offline", ["{tmp}/gpt2", "{tmp}/hf", "--format", "hf"],
        "the gpt2 tokenizer needs its BPE ranks", setup=gpt2_checkpoint()),
    row("convert_checkpoint.py", "gpt2-checkpoint-whose-carried-ranks-are-damaged", ["{tmp}/damaged", "{tmp}/out"],
        "tokenizer.tiktoken' is corrupt (sha256",
        setup=both(gpt2_checkpoint("damaged"), write({"damaged/tokenizer.tiktoken": "damaged"}))),
    row("convert_checkpoint.py", "gpt2-checkpoint-without-ranks-offline", ["{tmp}/gpt2", "{tmp}/out"],
        "the gpt2 tokenizer needs its BPE ranks: '{tmp}/gpt2' carries none and they were not found offline",
        setup=gpt2_checkpoint()),
    row("convert_checkpoint.py", "tiktoken-file-for-a-byte-model", ["{ckpt}", "{tmp}/out", "--tiktoken-file", "x"],
        "--tiktoken-file gives GPT-2 ranks, but this model's tokenizer is 'byte'; drop the flag"),
    row("convert_checkpoint.py", "tiktoken-file-of-other-ranks", ["{tmp}/gpt2", "{tmp}/out", "--tiktoken-file",
        "{tmp}/o.tiktoken"], "tiktoken file '{tmp}/o.tiktoken' has sha256",
        setup=both(gpt2_checkpoint(), write({"o.tiktoken": "IQ== 0\n"}))),
]

SUBPROCESS = [
    row("convert_checkpoint.py", "output-is-a-parent-of-the-working-directory", ["{ckpt}", "..", "--overwrite"],
        "output folder '..' is the current directory"),
]

CONTROLS = [
    pytest.param("convert_checkpoint.py", ["{ckpt}", "{tmp}/export"], None, id="convert"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)


test_the_valid_command_works = valid_command_test(CONTROLS)
