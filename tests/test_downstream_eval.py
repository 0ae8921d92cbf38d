"""Downstream evaluation: evaluate.py --multiple-choice (HellaSwag format) and the lm-eval adapter.

Every number is checked against log-likelihoods this file computes itself from the model: one
forward per (context, ending) pair, ``log_softmax``, and the ending's token log-probabilities
summed in a Python loop. The lm-eval tests write a tiny local task (JSON-lines data and a task
YAML in tmp_path) and need neither the network nor the hub; they skip without ``lm_eval``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchnlq.interop.export import export_safetensors
from torchnlq.data.tokenizer import build_tokenizer
from torchnlq.errors import UserError
from torchnlq.inference.multiple_choice import (
    ChoiceRow,
    ContinuationScore,
    encode_row,
    evaluate_multiple_choice,
    pick,
    read_rows,
    score_continuations,
)
from torchnlq.inference.sampling import generate_tokens
from torchnlq.models.decoder import Decoder

from helpers import REPO_ROOT
from helpers.checkpoints import load_script, tiny_model, write_checkpoint
from helpers.data import write_toy_tiktoken

QUERY_TYPES = ("linear", "identity", "residual", "residual_mlp")
EOT = 256  # the byte tokenizer's end-of-text

# Contexts of 10..60 bytes: with max_seq_len = 32 the longer ones are cut from the left.
QUESTIONS = [
    ("The cat sat on", ["the mat.", "a dog", "xyz", "the moon and the stars tonight"]),
    ("A man is playing a guitar on a stage in front of a big crowd, then he", ["bows.", "sings", "eats a sandwich"]),
    ("She opened the door and", ["walked in", "closed it", "screamed", "left"]),
    ("Numbers: 1 2 3", [" 4 5 6", "a b c", "4"]),
    ("Water boils at one hundred degrees", ["celsius", "fahrenheit", "kelvin", "rankine", "newtons"]),
    ("Hi", ["there", "x"]),
]


# ---------------------------------------------------------------- the direct computation

def direct_logprob(model: Decoder, context: list[int], ending: list[int]) -> float:
    """Sum of log P(ending token | everything before it), the context cut from the left to fit."""
    max_len = model.args.max_seq_len
    seq = (context + ending)[-(max_len + 1):]
    with torch.no_grad():
        logits = model(torch.tensor([seq[:-1]]))[0]
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    total = 0.0
    first = len(seq) - len(ending)  # seq[first + k] is ending[k], predicted at position first + k - 1
    for k, token in enumerate(ending):
        total += float(logprobs[first + k - 1, token])
    return total


def direct_byte_scores(model: Decoder, context: str, endings: list[str]) -> list[tuple[float, int]]:
    """(sum of log-probabilities, token count) of each ending: bytes of the context, bytes of " " + ending."""
    ctx = list(context.encode("utf-8"))
    out = []
    for ending in endings:
        ids = list((" " + ending).encode("utf-8"))
        out.append((direct_logprob(model, ctx, ids), len(ids)))
    return out


def argmax_first(values: list[float]) -> int:
    best = 0
    for i, v in enumerate(values):
        if v > values[best]:
            best = i
    return best


def write_questions(path: Path, model: Decoder) -> tuple[float, float, list[list[tuple[float, int]]]]:
    """The questions as a HellaSwag file, with labels that make the expected accuracy 1/2 (raw).

    Even rows get the ending the direct computation ranks first, odd rows another one, so a
    disagreement with the direct computation on any row changes the accuracy. Returns the expected
    acc, acc_norm and the direct scores.
    """
    lines, expected, expected_norm, scores = [], 0, 0, []
    for i, (context, endings) in enumerate(QUESTIONS):
        direct = direct_byte_scores(model, context, endings)
        best = argmax_first([s for s, _ in direct])
        best_norm = argmax_first([s / n for s, n in direct])
        label = best if i % 2 == 0 else (best + 1) % len(endings)
        expected += label == best
        expected_norm += label == best_norm
        scores.append(direct)
        if i == 1:  # HellaSwag's split context, and the string label of the Hugging Face copy
            a, b = context.split(", then ")
            lines.append(json.dumps({"ctx_a": a + ",", "ctx_b": "then " + b, "endings": endings, "label": str(label)}))
        else:
            lines.append(json.dumps({"ind": i, "ctx": context, "endings": endings, "label": label, "split": "val"}))
    path.write_text("\n".join(lines) + "\n\n")  # a blank line at the end is no row
    return expected / len(QUESTIONS), expected_norm / len(QUESTIONS), scores


@pytest.fixture(scope="module")
def mc_model() -> Decoder:
    return tiny_model("residual_mlp", init_std=0.3)


@pytest.fixture(scope="module")
def mc_files(tmp_path_factory: pytest.TempPathFactory, mc_model: Decoder) -> dict[str, Path]:
    """A checkpoint and an export of the residual_mlp model, and the questions file."""
    tmp = tmp_path_factory.mktemp("mc")
    write_checkpoint(tmp / "ckpt", mc_model)
    export_safetensors(tmp / "ckpt", tmp / "export")
    write_questions(tmp / "questions.jsonl", mc_model)
    return {"ckpt": tmp / "ckpt", "export": tmp / "export", "questions": tmp / "questions.jsonl", "root": tmp}


# ---------------------------------------------------------------- evaluate.py --multiple-choice

@pytest.mark.parametrize("which", ["ckpt", "export"])
def test_multiple_choice_accuracy_equals_the_direct_computation(mc_files, mc_model, which):
    acc, acc_norm, direct = write_questions(mc_files["root"] / "check.jsonl", mc_model)
    assert 0 < acc < 1  # the labels make a wrong pick visible
    result = evaluate_multiple_choice(mc_files[which], mc_files["root"] / "check.jsonl")
    assert (result.acc, result.acc_norm) == (acc, acc_norm)
    assert result.rows == len(QUESTIONS) and result.endings == sum(len(e) for _, e in QUESTIONS)
    for got, want in zip(result.scores, direct):
        assert [s.tokens for s in got] == [n for _, n in want]
        assert [s.logprob for s in got] == pytest.approx([s for s, _ in want], abs=1e-4)
    too_long = [any(len(c) + 1 + len(e) > 33 for e in endings) for c, endings in QUESTIONS]  # 32 positions + 1
    assert result.truncated == sum(too_long) and 0 < sum(too_long) < len(QUESTIONS)


def test_evaluate_script_prints_the_accuracies(mc_files, mc_model, capsys):
    acc, acc_norm, direct = write_questions(mc_files["root"] / "check.jsonl", mc_model)
    script = load_script("evaluate")
    before = sorted(p.name for p in mc_files["root"].rglob("*"))
    argv = [str(mc_files["export"]), "--multiple-choice", str(mc_files["root"] / "check.jsonl"), "--batch-size", "3"]
    assert script.run_cli(script.main, argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [f"acc: {acc:.6f}", f"acc_norm: {acc_norm:.6f}", f"rows: {len(QUESTIONS)}"]
    assert lines[3] == f"endings: {sum(len(e) for _, e in QUESTIONS)}"
    assert lines[4] == f"tokens: {sum(n for row in direct for _, n in row)}"
    assert lines[5] == f"truncated: {sum(any(len(c) + 1 + len(e) > 33 for e in ends) for c, ends in QUESTIONS)}"
    assert script.run_cli(script.main, [*argv, "--limit", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[2] == "rows: 2"
    assert sorted(p.name for p in mc_files["root"].rglob("*")) == before  # nothing written


def test_batching_and_order_do_not_change_the_scores(mc_model):
    rng = torch.Generator().manual_seed(0)
    requests = [
        (torch.randint(0, 256, (int(n),), generator=rng).tolist(), torch.randint(0, 256, (int(m),), generator=rng).tolist())
        for n, m in torch.randint(1, 40, (12, 2), generator=rng).clamp(max=32)  # a continuation fits 32 positions
    ]
    one = score_continuations(mc_model, requests, batch_size=1)
    many = score_continuations(mc_model, requests, batch_size=5)
    assert [s.logprob for s in many] == pytest.approx([s.logprob for s in one], abs=1e-4)
    assert [s.logprob for s in one] == pytest.approx([direct_logprob(mc_model, c, e) for c, e in requests], abs=1e-4)
    assert [s.truncated for s in one] == [len(c) + len(e) > 33 for c, e in requests]
    # greedy: a continuation made of the model's own argmax tokens is greedy, and no other is.
    context = [72, 105]
    greedy = generate_tokens(mc_model, context, 5, temperature=0.0, vocab_limit=257).new_tokens
    scores = score_continuations(mc_model, [(context, greedy), (context, greedy[:-1] + [(greedy[-1] + 1) % 256])])
    assert [s.greedy for s in scores] == [True, False]


def test_ties_go_to_the_first_ending():
    tied = [ContinuationScore(-4.0, 2, False), ContinuationScore(-2.0, 1, False), ContinuationScore(-4.0, 2, False)]
    assert pick(tied, normalise=False) == 1
    assert pick(tied, normalise=True) == 0  # -2 per token, all three


def test_a_continuation_longer_than_the_context_window_is_refused(mc_model):
    with pytest.raises(UserError, match="does not fit the model's context"):
        score_continuations(mc_model, [([1], [2] * 33)])


def test_gpt2_toy_ranks_tokenize_the_ending_after_a_space(tmp_path):
    """A gpt2 checkpoint carrying toy ranks: " the" is one merged token, and the scores match."""
    ranks = write_toy_tiktoken(tmp_path / "toy.tiktoken")
    sha = hashlib.sha256(ranks.read_bytes()).hexdigest()
    model = tiny_model("residual_mlp", n_layers=1, dim=8, n_heads=2, vocab_size=50304, max_seq_len=16, init_std=0.3)
    ckpt = write_checkpoint(tmp_path / "ckpt", model,
                            tokenizer={"name": "gpt2", "vocab_size": 50257, "eot_id": 50256, "tiktoken_sha256": sha})
    (ckpt / "tokenizer.tiktoken").write_bytes(ranks.read_bytes())  # as the trainer's checkpoints carry them
    tok = build_tokenizer("gpt2", str(ranks), expected_hash=None)
    context, endings = "in the thing", ["the king", "thing", "the the"]
    assert tok.encode(" the") == [258]  # the toy merge " the"
    assert encode_row(tok, ChoiceRow(context, endings, 0, 1))[1][0][0] == 258
    direct = [direct_logprob(model, tok.encode(context), tok.encode(" " + e)) for e in endings]
    best = argmax_first(direct)
    (tmp_path / "q.jsonl").write_text(json.dumps({"ctx": context, "endings": endings, "label": best}) + "\n")
    result = evaluate_multiple_choice(ckpt, tmp_path / "q.jsonl")
    assert result.acc == 1.0
    assert [s.logprob for s in result.scores[0]] == pytest.approx(direct, abs=1e-4)


def test_limit_reads_only_the_rows_it_needs(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"ctx": "a", "endings": ["b", "c"], "label": 1}\n\n{"ctx": "d", "endings": ["e", "f"], "label": 0}\n{oops\n')
    rows = read_rows(path, limit=2)
    assert [(r.context, r.label, r.line) for r in rows] == [("a", 1, 1), ("d", 0, 3)]
    with pytest.raises(UserError, match="line 4: not valid JSON"):
        read_rows(path)


# ---------------------------------------------------------------- bad inputs: one error line, exit 2, nothing written

ROW = {"ctx": "a b", "endings": ["c", "d", "e"], "label": 2}
BAD_FILES = {
    "missing-file": (None, "does not exist"),
    "folder": ("<dir>", "is not a file"),
    "empty-file": ("\n\n", "holds no rows"),
    "malformed-json-line-3": (f"{json.dumps(ROW)}\n{json.dumps(ROW)}\n{{\"ctx\": \"x\",\n", "line 3: not valid JSON"),
    "not-an-object": ("[1, 2]\n", "line 1: expected a JSON object, got list"),
    "no-context": ('{"endings": ["a", "b"], "label": 0}\n', "line 1: no context"),
    "one-ending": ('{"ctx": "x", "endings": ["a"], "label": 0}\n', "'endings' must be a list of at least two strings"),
    "ending-not-a-string": ('{"ctx": "x", "endings": ["a", 3], "label": 0}\n', "'endings' must be a list"),
    "label-out-of-range-line-2": (f"{json.dumps(ROW)}\n{json.dumps({**ROW, 'label': 3})}\n",
                                  "line 2: 'label' is 3 but the row has 3 endings (0..2)"),
    "negative-label": (json.dumps({**ROW, "label": -1}) + "\n", "'label' is -1"),
    "label-a-bool": (json.dumps({**ROW, "label": True}) + "\n", "'label' must be an integer"),
    "label-missing": ('{"ctx": "x", "endings": ["a", "b"]}\n', "no 'label'"),
    "not-utf8-line-2": (json.dumps(ROW).encode() + b"\n\xff\xfe\n", "line 2: not UTF-8 text"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_multiple_choice_files(mc_files, tmp_path, capsys, case):
    content, fragment = BAD_FILES[case]
    path = tmp_path / "q.jsonl"
    if content == "<dir>":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    _expect_one_error(capsys, tmp_path, [str(mc_files["export"]), "--multiple-choice", str(path)], fragment)


BAD_ARGV = {
    "limit-0": (["--multiple-choice", "{q}", "--limit", "0"], "--limit=0 must be at least 1"),
    "batch-size-0": (["--multiple-choice", "{q}", "--batch-size", "0"], "--batch-size=0 must be at least 1"),
    "neither-mode": ([], "one of the arguments --data --multiple-choice is required"),
    "both-modes": (["--multiple-choice", "{q}", "--data", "{tmp}"], "not allowed with argument"),
    "sequences-with-multiple-choice": (["--multiple-choice", "{q}", "--sequences", "4"],
                                       "--sequences does not apply to --multiple-choice"),
    "limit-with-data": (["--data", "{tmp}", "--limit", "4"], "--limit does not apply to --data"),
    "missing-model": (["--multiple-choice", "{q}", "@nowhere"], "does not exist"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGV))
def test_bad_multiple_choice_arguments(mc_files, tmp_path, capsys, case):
    argv, fragment = BAD_ARGV[case]
    (tmp_path / "q.jsonl").write_text(json.dumps(ROW) + "\n")
    source = str(mc_files["export"])
    if "@nowhere" in argv:
        argv, source = [a for a in argv if a != "@nowhere"], str(tmp_path / "nowhere")
    argv = [a.replace("{q}", str(tmp_path / "q.jsonl")).replace("{tmp}", str(tmp_path)) for a in argv]
    _expect_one_error(capsys, tmp_path, [source, *argv], fragment)


def _expect_one_error(capsys: pytest.CaptureFixture, folder: Path, argv: list[str], fragment: str) -> None:
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}
    script = load_script("evaluate")
    assert script.run_cli(script.main, argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and fragment in err, err
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*")} == before


# ---------------------------------------------------------------- the lm-eval adapter

def _lm_eval():
    """lm_eval, or a skip (not at module level: that would skip the multiple-choice tests too)."""
    return pytest.importorskip("lm_eval", reason="lm-eval is not installed (pip install -e '.[eval]')")


def _instances(request_type: str, args: list[tuple]) -> list:
    from lm_eval.api.instance import Instance

    return [Instance(request_type, {}, a, i) for i, a in enumerate(args)]


@pytest.fixture(scope="module")
def query_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Decoder, Path]]:
    tmp = tmp_path_factory.mktemp("queries")
    out = {}
    for qtype in QUERY_TYPES:
        model = tiny_model(qtype, init_std=0.3, positions="rope" if qtype == "identity" else "learned")
        out[qtype] = (model, write_checkpoint(tmp / qtype, model))
    return out


@pytest.mark.parametrize("qtype", QUERY_TYPES)
def test_every_query_type_loads_through_the_adapter(query_checkpoints, qtype):
    _lm_eval()
    from torchnlq.inference.lm_eval_adapter import TorchnlqLM

    model, ckpt = query_checkpoints[qtype]
    lm = TorchnlqLM(path=str(ckpt), batch_size=3)
    assert lm.get_model_info()["torchnlq_query"] == qtype
    # Trailing spaces of the context move to the continuation; an empty context is end-of-text.
    requests = [("The cat", " sat"), ("The cat ", "sat"), ("", "Hello"), ("x" * 50, " long context, cut")]
    got = lm.loglikelihood(_instances("loglikelihood", requests))
    expected = [
        direct_logprob(model, list(b"The cat"), list(b" sat")),
        direct_logprob(model, list(b"The cat"), list(b" sat")),
        direct_logprob(model, [EOT], list(b"Hello")),
        direct_logprob(model, list(b"x" * 50), list(b" long context, cut")),
    ]
    assert [ll for ll, _ in got] == pytest.approx(expected, abs=1e-4)
    # Rolling: 44 bytes with 32 positions: [eot] + t[:31] predicts t[:32]; t[11:43] predicts the last 12.
    text = "A rolling window over more than one context."
    t = list(text.encode())
    assert len(t) == 44
    rolling = lm.loglikelihood_rolling(_instances("loglikelihood_rolling", [(text,), ("",)]))
    direct = direct_logprob(model, [EOT], t[:32]) + direct_logprob(model, t[:32], t[32:])
    assert rolling == pytest.approx([direct, 0.0], abs=1e-4)


def test_generate_until_is_greedy_decoding_cut_at_the_stop_string(query_checkpoints):
    _lm_eval()
    from torchnlq.inference.lm_eval_adapter import TorchnlqLM

    model, ckpt = query_checkpoints["residual_mlp"]
    lm = TorchnlqLM(path=str(ckpt))
    prompt = [72, 101, 108]
    greedy = generate_tokens(model, prompt, 12, temperature=0.0, eot_id=EOT, vocab_limit=257).new_tokens
    text = bytes(greedy).decode("utf-8", errors="replace")
    stop = text[5:7]  # a stop string the greedy text contains
    out = lm.generate_until(_instances("generate_until", [
        ("Hel", {"until": [], "max_gen_toks": 12}),
        ("Hel", {"until": [stop], "max_gen_toks": 12}),
        ("Hel", {"until": "\x00never", "max_gen_toks": 4, "do_sample": False}),
    ]))
    assert out == [text, text[: text.find(stop)], bytes(greedy[:4]).decode("utf-8", errors="replace")]


def test_adapter_mistakes_are_user_errors(query_checkpoints, tmp_path):
    _lm_eval()
    from torchnlq.inference.lm_eval_adapter import TorchnlqLM

    ckpt = str(query_checkpoints["linear"][1])
    with pytest.raises(UserError, match="does not exist"):
        TorchnlqLM(path=str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match="needs a checkpoint or export: --model_args path="):
        TorchnlqLM()
    with pytest.raises(UserError, match=r"unknown model argument\(s\) pth"):
        TorchnlqLM(path=ckpt, pth="x")
    with pytest.raises(UserError, match="batch_size=0 must be at least 1"):
        TorchnlqLM(path=ckpt, batch_size="0")
    assert TorchnlqLM(path=ckpt, batch_size="auto", trust_remote_code=True).batch_size == 16


def test_the_command_line_says_how_to_install_lm_eval(monkeypatch, capsys):
    from torchnlq.cli import run_cli
    from torchnlq.inference.lm_eval_adapter.__main__ import main

    monkeypatch.setitem(sys.modules, "lm_eval.__main__", None)  # as if lm-eval were not installed
    assert run_cli(main, ["--model", "torchnlq", "--model_args", "path=x", "--tasks", "t"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: lm-eval is not installed") and "pip install" in err and err.count("\n") == 1


def test_the_name_torchnlq_is_registered():
    _lm_eval()
    from lm_eval.api.registry import get_model

    from torchnlq.inference.lm_eval_adapter import TorchnlqLM

    assert get_model("torchnlq") is TorchnlqLM
    assert get_model("dummy").__name__ == "DummyLM"  # lm-eval's own models stay known


def write_task(folder: Path, data: Path, texts: Path) -> Path:
    """A multiple-choice task and a perplexity task on local JSON-lines files (no hub, no network)."""
    folder.mkdir()
    (folder / "tiny_mc.yaml").write_text(
        "task: tiny_mc\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {json.dumps(str(data))}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{ctx}}"\n'
        'doc_to_choice: "{{endings}}"\n'
        'doc_to_target: "{{label}}"\n'
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    (folder / "tiny_ppl.yaml").write_text(
        "task: tiny_ppl\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {json.dumps(str(texts))}\n"
        "test_split: test\n"
        "output_type: loglikelihood_rolling\n"
        'doc_to_text: ""\n'
        'doc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
    )
    return folder


TEXTS = ["A rolling window over more than one context.", "short"]


@pytest.fixture
def harness_task(tmp_path, monkeypatch, mc_model):
    """The task files, the expected numbers, and an offline HF cache in tmp_path."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lines, expected_acc, expected_norm, lls = [], 0, 0, []
    for i, (context, endings) in enumerate(QUESTIONS):
        direct = [s for s, _ in direct_byte_scores(mc_model, context, endings)]
        best = argmax_first(direct)
        label = best if i % 2 == 0 else (best + 1) % len(endings)
        expected_acc += label == best
        # lm-eval's acc_norm divides by the ending's characters (the delimiter's space not counted).
        expected_norm += label == argmax_first([s / len(e) for s, e in zip(direct, endings)])
        lls.append(direct)
        lines.append(json.dumps({"ctx": context, "endings": endings, "label": label}))
    (tmp_path / "mc.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    rolling = []
    for text in TEXTS:
        t = list(text.encode())
        rolling.append(direct_logprob(mc_model, [EOT], t[:32]) + (direct_logprob(mc_model, t[:32], t[32:]) if len(t) > 32 else 0))
    tasks = write_task(tmp_path / "tasks", tmp_path / "mc.jsonl", tmp_path / "texts.jsonl")
    n = len(QUESTIONS)
    return {"tasks": tasks, "acc": expected_acc / n, "acc_norm": expected_norm / n, "lls": lls, "rolling": rolling}


def check_harness_numbers(results: dict, samples: dict, expected: dict) -> None:
    """The harness's accuracies and every request's log-likelihood against the direct computation."""
    assert results["tiny_mc"]["acc,none"] == pytest.approx(expected["acc"])
    assert results["tiny_mc"]["acc_norm,none"] == pytest.approx(expected["acc_norm"])
    mc = sorted(samples["tiny_mc"], key=lambda s: s["doc_id"])
    assert len(mc) == len(QUESTIONS)
    for sample, want in zip(mc, expected["lls"]):
        got = [float(r[0][0]) for r in sample["resps"]]
        assert got == pytest.approx(want, abs=1e-4)
    ppl = sorted(samples["tiny_ppl"], key=lambda s: s["doc_id"])
    assert [float(s["resps"][0][0]) for s in ppl] == pytest.approx(expected["rolling"], abs=1e-4)
    total_bytes = sum(len(t.encode()) for t in TEXTS)
    bits = -sum(expected["rolling"]) / total_bytes / torch.log(torch.tensor(2.0)).item()
    assert results["tiny_ppl"]["bits_per_byte,none"] == pytest.approx(bits, rel=1e-5)


@pytest.mark.integration  # lm-evaluation-harness's whole evaluator
def test_simple_evaluate_matches_the_direct_computation(mc_files, harness_task):
    lm_eval = _lm_eval()
    from lm_eval.tasks import TaskManager

    from torchnlq.inference.lm_eval_adapter import TorchnlqLM

    manager = TaskManager(include_path=str(harness_task["tasks"]), include_defaults=False)
    out = lm_eval.simple_evaluate(model=TorchnlqLM(path=str(mc_files["export"]), batch_size=4),
                                  tasks=["tiny_mc", "tiny_ppl"], task_manager=manager, log_samples=True,
                                  bootstrap_iters=0)
    check_harness_numbers(out["results"], out["samples"], harness_task)
    # By name, as lm-eval's CLI does it: the import above registered "torchnlq".
    named = lm_eval.simple_evaluate(model="torchnlq", model_args=f"path={mc_files['ckpt']}", tasks=["tiny_mc"],
                                    task_manager=manager, log_samples=True, bootstrap_iters=0)
    assert named["results"]["tiny_mc"]["acc,none"] == pytest.approx(harness_task["acc"])


@pytest.mark.integration
def test_lm_eval_command_line_matches_the_direct_computation(mc_files, harness_task, tmp_path):
    _lm_eval()
    out_dir = tmp_path / "results"
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    argv = [sys.executable, "-m", "torchnlq.inference.lm_eval_adapter", "--model", "torchnlq",
            "--model_args", f"path={mc_files['export']}", "--tasks", "tiny_mc", "tiny_ppl",
            "--include_path", str(harness_task["tasks"]), "--device", "cpu", "--batch_size", "4",
            "--output_path", str(out_dir), "--log_samples"]
    done = subprocess.run(argv, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tiny_mc" in done.stdout and "acc_norm" in done.stdout
    (results_file,) = out_dir.rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]
    samples = {task: [json.loads(line) for line in next(out_dir.rglob(f"samples_{task}_*.jsonl")).read_text().splitlines()]
               for task in ("tiny_mc", "tiny_ppl")}
    check_harness_numbers(results, samples, harness_task)
    # A torchnlq mistake is one error line and exit 2, after lm-eval's own log lines.
    bad = [*argv[:6], f"path={tmp_path / 'nowhere'}", *argv[7:]]
    done = subprocess.run(bad, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: ") and "does not exist" in done.stderr


def test_the_docs_task_example_loads_without_lm_evals_warnings(tmp_path, monkeypatch, caplog):
    """docs/checkpoints.md's task YAML, with a real data file, loads in lm-eval with no filled-in defaults warned."""
    import logging
    import re

    _lm_eval()
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    docs = (REPO_ROOT / "docs" / "checkpoints.md").read_text()
    (yaml_text,) = [block for block in re.findall(r"```yaml\n(.*?)```", docs, flags=re.DOTALL) if "task: my_task" in block]
    data = tmp_path / "my_task.jsonl"
    data.write_text("".join(json.dumps({"ctx": c, "endings": e, "label": 0}) + "\n" for c, e in QUESTIONS))
    assert "/data/my_task.jsonl" in yaml_text
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "my_task.yaml").write_text(yaml_text.replace("/data/my_task.jsonl", str(data)))
    with caplog.at_level(logging.WARNING):
        tasks = TaskManager(include_path=str(tmp_path / "tasks"), include_defaults=False).load(["my_task"])["tasks"]
    assert len(list(tasks["my_task"].test_docs())) == len(QUESTIONS)  # the example really loaded
    filled = [r.getMessage() for r in caplog.records if "is defined, but" in r.getMessage()]
    assert filled == []
