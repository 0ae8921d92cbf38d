"""The catalogue's rows of ``python scripts/upcycle.py``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import HF_PICKLED, both, checkpoint, gpt2_checkpoint, row, write
from catalogue.runner import mistake_tests

IN_PROCESS = [
    row("upcycle.py", "source-missing", ["{tmp}/nowhere", "{tmp}/out"], "'{tmp}/nowhere' does not exist or is not a folder"),
    row("upcycle.py", "data-folder-for-a-model", ["{data}", "{tmp}/out"],
        "nor a Hugging Face folder of transformers' GPT2LMHeadModel"),
    row("upcycle.py", "layers-outside-the-model", ["{ckpt}", "{tmp}/out", "--query", "anchored", "--layers", "1-3"],
        "names blocks outside 0..0"),
    row("upcycle.py", "layers-not-indices", ["{ckpt}", "{tmp}/out", "--query", "anchored", "--layers", "first"],
        "is not 'all' nor block indices"),
    row("upcycle.py", "bottleneck-ratio-zero", ["{ckpt}", "{tmp}/out", "--query", "anchored", "--bottleneck-ratio", "0"],
        "--bottleneck-ratio must be positive"),
    row("upcycle.py", "unknown-activation", ["{ckpt}", "{tmp}/out", "--query", "anchored", "--activation", "tanh"],
        "model.query.activation: unknown 'tanh'"),
    row("upcycle.py", "query-type-that-is-not-an-upcycle", ["{ckpt}", "{tmp}/out", "--query", "residual_mlp"],
        "invalid choice: 'residual_mlp'"),
    row("upcycle.py", "anchor-a-nonlinear-query", ["{tmp}/mlp", "{tmp}/out", "--query", "anchored"],
        "has a 'residual_mlp' query and 'anchored' cannot start from it", setup=checkpoint("mlp", qtype="residual_mlp")),
    row("upcycle.py", "output-inside-the-source", ["{ckpt}", "{ckpt}/out"], "lies inside the source"),
    row("upcycle.py", "negative-seed", ["{ckpt}", "{tmp}/out", "--seed", "-1"], "--seed must be in 0..2^63-1"),
    row("upcycle.py", "hugging-face-folder-with-a-pickle", ["{tmp}/hf", "{tmp}/out"],
        "pytorch_model.bin, which torchnlq does not unpickle", setup=HF_PICKLED),
    row("upcycle.py", "hugging-face-config-without-shapes", ["{tmp}/hf2", "{tmp}/out"], "lacks or mangles 'n_embd'",
        setup=write({"hf2/config.json": '{"model_type": "gpt2"}', "hf2/model.safetensors": "x"})),
    row("upcycle.py", "hugging-face-activation-torchnlq-lacks", ["{tmp}/hf3", "{tmp}/out"],
        "activation_function 'swish' is not one torchnlq has",
        setup=write({"hf3/config.json": '{"model_type": "gpt2", "activation_function": "swish"}'})),
    row("upcycle.py", "source-without-a-tokenizer", ["{tmp}/notok", "{tmp}/out"],
        "'{tmp}/notok' carries no tokenizer (no tokenizer.json or vocab.json) and its vocabulary (320 ids) is not "
        "GPT-2's (50,257), so --tiktoken-file cannot supply one", setup=checkpoint("notok", meta={"tokenizer": {}})),
    row("upcycle.py", "gpt2-source-without-ranks-offline", ["{tmp}/gpt2", "{tmp}/out"],
        "were not found offline; set TORCHNLQ_TIKTOKEN_FILE (or pass --tiktoken-file)", setup=gpt2_checkpoint()),
    row("upcycle.py", "tiktoken-file-missing", ["{tmp}/gpt2", "{tmp}/out", "--tiktoken-file", "{tmp}/no.tiktoken"],
        "tiktoken file '{tmp}/no.tiktoken' is unreadable", setup=gpt2_checkpoint()),
    row("upcycle.py", "tiktoken-file-of-other-ranks", ["{tmp}/gpt2", "{tmp}/out", "--tiktoken-file", "{tmp}/o.tiktoken"],
        "tiktoken file '{tmp}/o.tiktoken' has sha256", setup=both(gpt2_checkpoint(), write({"o.tiktoken": "IQ== 0\n"}))),
    row("upcycle.py", "tiktoken-file-for-a-byte-model", ["{ckpt}", "{tmp}/out", "--tiktoken-file", "{tmp}/o.tiktoken"],
        "--tiktoken-file gives GPT-2 ranks, but this model's tokenizer is 'byte'; drop the flag"),
]

SUBPROCESS = [
    row("upcycle.py", "source-is-a-file", ["{tmp}/notes.txt", "{tmp}/out"], "does not exist or is not a folder",
        setup=write({"notes.txt": "mine"})),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
