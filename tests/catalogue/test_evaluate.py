"""The catalogue's rows of ``python scripts/evaluate.py`` (also ``--multiple-choice``).

The rule every row must meet, and how to add one: tests/catalogue/__init__.py.
"""

from __future__ import annotations


import numpy as np
import pytest

from catalogue.rows import checkpoint, copy_of, drop_key, edit_json, row, token_folder, write
from catalogue.runner import mistake_tests, valid_command_test

IN_PROCESS = [
    row("evaluate.py", "multiple-choice-file-missing", ["{ckpt}", "--multiple-choice", "{tmp}/nowhere.jsonl"],
        "multiple-choice file '{tmp}/nowhere.jsonl' does not exist"),
    row("evaluate.py", "multiple-choice-file-is-a-folder", ["{ckpt}", "--multiple-choice", "{tmp}"],
        "is not a file (give a .jsonl file)"),
    row("evaluate.py", "multiple-choice-empty-file", ["{ckpt}", "--multiple-choice", "{tmp}/q.jsonl"], "holds no rows",
        setup=write({"q.jsonl": "\n\n"})),
    row("evaluate.py", "multiple-choice-malformed-row", ["{ckpt}", "--multiple-choice", "{tmp}/q2.jsonl"],
        "line 3: not valid JSON", setup=write({"q2.jsonl": '{"ctx": "a", "endings": ["b", "c"], "label": 0}\n' '{"ctx": "a", "endings": ["b", "c"], "label": 1}\n{"ctx": \n'})),
    row("evaluate.py", "multiple-choice-label-out-of-range", ["{ckpt}", "--multiple-choice", "{tmp}/q3.jsonl"],
        "line 1: 'label' is 2 but the row has 2 endings (0..1)",
        setup=write({"q3.jsonl": '{"ctx": "a", "endings": ["b", "c"], "label": 2}\n'})),
    row("evaluate.py", "multiple-choice-label-a-bool", ["{ckpt}", "--multiple-choice", "{tmp}/q4.jsonl"],
        "'label' must be an integer, got true", setup=write({"q4.jsonl": '{"ctx": "a", "endings": ["b", "c"], "label": true}\n'})),
    row("evaluate.py", "multiple-choice-one-ending", ["{ckpt}", "--multiple-choice", "{tmp}/q5.jsonl"],
        "'endings' must be a list of at least two strings", setup=write({"q5.jsonl": '{"ctx": "a", "endings": ["b"], "label": 0}\n'})),
    row("evaluate.py", "multiple-choice-no-context", ["{ckpt}", "--multiple-choice", "{tmp}/q6.jsonl"],
        "line 1: no context: give 'ctx'", setup=write({"q6.jsonl": '{"endings": ["b", "c"], "label": 0}\n'})),
    row("evaluate.py", "multiple-choice-not-an-object", ["{ckpt}", "--multiple-choice", "{tmp}/q7.jsonl"],
        "line 1: expected a JSON object, got list", setup=write({"q7.jsonl": "[1, 2]\n"})),
    row("evaluate.py", "multiple-choice-not-utf8", ["{ckpt}", "--multiple-choice", "{tmp}/q8.jsonl"],
        "line 1: not UTF-8 text", setup=write({"q8.jsonl": b"\xff\xfe\n"})),
    row("evaluate.py", "multiple-choice-limit-0", ["{ckpt}", "--multiple-choice", "{tmp}/q.jsonl", "--limit", "0"],
        "--limit=0 must be at least 1", setup=write({"q.jsonl": '{"ctx": "a", "endings": ["b", "c"], "label": 0}\n'})),
    row("evaluate.py", "multiple-choice-batch-size-0",
        ["{ckpt}", "--multiple-choice", "{tmp}/q.jsonl", "--batch-size", "0"], "--batch-size=0 must be at least 1",
        setup=write({"q.jsonl": '{"ctx": "a", "endings": ["b", "c"], "label": 0}\n'})),
    row("evaluate.py", "data-and-multiple-choice", ["{ckpt}", "--data", "{data}", "--multiple-choice", "{tmp}/q.jsonl"],
        "not allowed with argument"),
    row("evaluate.py", "limit-with-data", ["{ckpt}", "--data", "{data}", "--limit", "5"], "--limit does not apply to --data"),
    row("evaluate.py", "sequences-with-multiple-choice",
        ["{ckpt}", "--multiple-choice", "{tmp}/q.jsonl", "--sequences", "3"], "--sequences does not apply to --multiple-choice",
        setup=write({"q.jsonl": '{"ctx": "a", "endings": ["b", "c"], "label": 0}\n'})),
    row("evaluate.py", "data-not-given", ["{ckpt}"], "--data"),
    row("evaluate.py", "data-folder-missing", ["{ckpt}", "--data", "{tmp}/nowhere"], "data.path '{tmp}/nowhere' does not exist"),
    row("evaluate.py", "checkpoint-for-the-data", ["{ckpt}", "--data", "{ckpt}"], "lacks meta.json, train.bin, val.bin"),
    row("evaluate.py", "zero-sequences", ["{ckpt}", "--data", "{data}", "--sequences", "0"], "--sequences=0 must be at least 1"),
    row("evaluate.py", "zero-micro-batch", ["{ckpt}", "--data", "{data}", "--micro-batch-size", "0"],
        "--micro-batch-size=0 must be at least 1"),
    row("evaluate.py", "zero-seq-len", ["{ckpt}", "--data", "{data}", "--seq-len", "0"], "--seq-len=0 must be at least 1"),
    row("evaluate.py", "seq-len-above-the-positions", ["{ckpt}", "--data", "{data}", "--seq-len", "512"],
        "--seq-len=512 exceeds the model's max_seq_len=256"),
    row("evaluate.py", "seed-above-2**64-1", ["{ckpt}", "--data", "{data}", "--seed", str(2**64)], f"--seed={2**64} must be in"),
    row("evaluate.py", "data-of-another-tokenizer", ["{tmp}/gpt2", "--data", "{data}"],
        "was tokenized with 'byte' (meta.json) but the model uses the 'gpt2' tokenizer",
        setup=checkpoint("gpt2", meta={"tokenizer": {"name": "gpt2", "vocab_size": 50257, "eot_id": 50256}})),
    row("evaluate.py", "gpt2-data-for-a-byte-model", ["{ckpt}", "--data", "{tmp}/gpt2data"],  # names no data.tokenizer
        "was tokenized with 'gpt2' (meta.json) but the model uses the 'byte' tokenizer; evaluate on a data folder "
        "prepared with 'byte' (scripts/prepare_data.py --tokenizer byte)",
        setup=token_folder("gpt2data", meta=lambda m: m.update(tokenizer="gpt2"))),
    row("evaluate.py", "export-without-validation-settings", ["{tmp}/export", "--data", "{data}"],
        "records no validation settings; pass --sequences N",
        setup=copy_of("{export}", "export", edit_json("config.json", drop_key("validation")))),
    row("evaluate.py", "val-split-shorter-than-seq-len", ["{ckpt}", "--data", "{tmp}/short"],
        "val.bin has 10 tokens, fewer than one sequence of seq_len+1=33",
        setup=token_folder("short", val=np.full(10, 65, dtype=np.uint16))),
    row("evaluate.py", "device-this-torch-lacks", ["{ckpt}", "--data", "{data}", "--device", "meta"], "meta",
        ),
    # Issue 40.7: a device index the machine lacks, data of another vocabulary, rows outside the format.
    row("evaluate.py", "device-index-the-cpu-lacks", ["{ckpt}", "--data", "{data}", "--device", "cpu:1"],
        "device 'cpu:1' does not exist: the CPU is one device"),
    row("evaluate.py", "data-ids-beyond-the-models-vocabulary", ["{tmp}/small", "--data", "{data}"],
        "but the model '{tmp}/small' has 64 token ids (0 to 63)", setup=checkpoint("small", meta={"tokenizer": {}},
                                                                                   vocab_size=64)),
    row("evaluate.py", "multiple-choice-label-a-superscript-digit", ["{ckpt}", "--multiple-choice", "{tmp}/q9.jsonl"],
        "line 1: 'label' must be an integer, got", setup=write({"q9.jsonl": '{"ctx": "a", "endings": ["b", "c"], '
                                                                         '"label": "\u00b2"}\n'})),
    row("evaluate.py", "multiple-choice-empty-ending", ["{ckpt}", "--multiple-choice", "{tmp}/q10.jsonl"],
        "line 1: ending 1 is empty; every ending must hold text",
        setup=write({"q10.jsonl": '{"ctx": "a", "endings": ["b", ""], "label": 0}\n'})),
]

SUBPROCESS = [
    row("evaluate.py", "negative-micro-batch", ["{ckpt}", "--data", "{data}", "--micro-batch-size", "-2"],
        "--micro-batch-size=-2 must be at least 1"),
]

CONTROLS = [
    pytest.param("evaluate.py", ["{ckpt}", "--data", "{data}"], None, id="evaluate"),
]


test_mistake, test_mistake_in_a_subprocess = mistake_tests(IN_PROCESS, SUBPROCESS)


test_the_valid_command_works = valid_command_test(CONTROLS)
