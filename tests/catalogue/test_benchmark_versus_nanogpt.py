"""The catalogue's rows of ``python -m benchmarks.versus_nanogpt``.

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations



from catalogue.rows import row, write
from catalogue.runner import mistake_tests

ENTRY = "benchmarks.versus_nanogpt"  # python -m benchmarks.versus_nanogpt, from the repository root

#: A folder that passes the benchmark's nanoGPT checkout check, and its two modes on the CPU.
NANOGPT = {"ng/train.py": "", "ng/model.py": "", "ng/configurator.py": ""}
NANO_CPU = ("--nanogpt", "{tmp}/ng", "--mode", "cpu-seconds")
NANO_PROFILE = ("--nanogpt", "{tmp}/ng", "--mode", "profile", "--device", "cpu")  # a nanoGPT folder: uint16 zeros, no meta.json

IN_PROCESS = [
    row(ENTRY, "no-nanogpt-checkout", [], "the following arguments are required: --nanogpt"),
    row(ENTRY, "nanogpt-folder-without-train-py", ["--nanogpt", "{tmp}"],
        "lacks train.py, model.py or configurator.py"),
    row(ENTRY, "steps-not-a-pair", [*NANO_CPU, "--steps", "60"],
        "--steps '60': expected LONG,SHORT such as 60,10", setup=write(NANOGPT)),
    row(ENTRY, "short-not-below-long", [*NANO_CPU, "--steps", "10,60"],
        "need 1 <= SHORT < LONG", setup=write(NANOGPT)),
    row(ENTRY, "cpu-seconds-with-a-config", [*NANO_CPU, "{config}"],
        "--mode cpu-seconds runs its own toy shape; it takes no config", setup=write(NANOGPT)),
    row(ENTRY, "profile-of-a-llama-block", [*NANO_PROFILE, "{config}", "--model.norm=rms"],
        "nanoGPT's model is GPT-2's block", setup=write(NANOGPT)),
    row(ENTRY, "profile-steps-all-warm-up", [*NANO_PROFILE, "{config}", "--steps", "2"],
        "--steps must be more than the 2 warm-up steps, got 2", setup=write(NANOGPT)),
    row(ENTRY, "profile-steps-a-pair", [*NANO_PROFILE, "{config}", "--steps", "60,10"],
        "--mode profile takes one number of steps", setup=write(NANOGPT)),
    row(ENTRY, "profile-configs-of-two-shapes", [*NANO_PROFILE, "{config}", "{tmp}/short.toml"],
        "training.seq_len = 16, but {config} (nanoGPT's shape) has 32",
        setup=write({**NANOGPT, "short.toml": 'extends = "{config}"\n[training]\nseq_len = 16\n'})),
    row(ENTRY, "profile-json-in-a-missing-folder", [*NANO_PROFILE, "{config}", "--json", "{tmp}/no/x.json"],
        "folder '{tmp}/no' does not exist", setup=write(NANOGPT)),
    row(ENTRY, "profile-stray-word", [*NANO_PROFILE, "{config}", "-x"], "unrecognized argument '-x'",
        setup=write(NANOGPT)),
]

SUBPROCESS = [
    row(ENTRY, "nanogpt-folder-missing", ["--nanogpt", "{tmp}/nowhere"],
        "lacks train.py, model.py or configurator.py"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)
