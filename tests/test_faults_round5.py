"""Issue 40.7: a stranger's files and faults, round five. Each class is fixed by its mechanism; the cases here are
generated over the class (Hypothesis, fixed seed), not its single example, and assert the invariant of every entry
point: the promised result, or one ``error:`` line (a UserError of one line), never another exception, and nothing
left behind. Bits per byte of runs of different tokenizers (the eighth class) are tests/test_compare_bytes.py's.
"""

from __future__ import annotations

import base64
import importlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.checkpoints import BYTE_TOKENIZER, load_script, tiny_model, write_checkpoint
from helpers.data import write_token_folder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchnlq.cli import run_cli
from torchnlq.config.job_config import Data, DataSource, Training, Validation
from torchnlq.data import budget
from torchnlq.data.loader import build_data
from torchnlq.data.token_file import DataFileChanged, TokenFile, read_batch
from torchnlq.data.tokenizer import MAX_TOKEN_ID, build_tokenizer, parse_ranks
from torchnlq.errors import UserError
from torchnlq.files import os_error_line

SETTINGS = dict(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def script_main(name: str):  # noqa: ANN201 - a main(argv)
    """A scripts/NAME.py's main, as the catalogue calls it (in this process, through run_cli)."""
    return load_script(name).main


def one_error_line(capsys: pytest.CaptureFixture[str], code: int) -> str:
    """The run's stderr must be exactly one ``error:`` line, with exit code 2; returns it."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def one_line(error: UserError) -> str:
    text = str(error)
    assert text and "\n" not in text and "Traceback" not in text
    return text


# ----- (a) sizes that pass each option's check but not together --------------------------------------------------

@pytest.fixture(scope="module")
def small_folders(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root, rng = tmp_path_factory.mktemp("budget"), np.random.default_rng(0)
    return [write_token_folder(root / name, rng.integers(0, 256, 3_000), rng.integers(0, 256, 900))
            for name in ("a", "b")]


BUDGET = 64 * 2**20  # the RAM the test pretends the machine has: what it lets through is small enough to run


@settings(max_examples=60, **SETTINGS)
@given(steps=st.integers(1, 10**15), micro=st.integers(1, 10**9), accum=st.integers(1, 10**4),
       seq_len=st.integers(1, 64), sequences=st.integers(1, 10**13), world=st.integers(1, 8),
       paper=st.booleans(), mixture=st.booleans())
def test_what_the_data_would_allocate_is_bounded_before_it_is_drawn(small_folders, monkeypatch, steps, micro, accum,
                                                                    seq_len, sequences, world, paper, mixture) -> None:
    monkeypatch.setattr(budget, "machine_ram_bytes", lambda: BUDGET)
    training = Training(steps=steps, micro_batch_size=micro, grad_accum_steps=accum, seq_len=seq_len)
    validation = Validation(sequences=sequences, protocol="paper" if paper and not mixture else "fixed")
    data = (Data(tokenizer="byte", sources=[DataSource(path=str(p)) for p in small_folders]) if mixture
            else Data(path=str(small_folders[0]), tokenizer="byte"))
    # Written out here, what cannot be avoided: 8 bytes an offset of every sequence of every step, 16 bytes a token
    # of the validation batches kept (x and y, int64) of each source, or the paper's two tables of 600 rows.
    sources = 2 if mixture else 1
    schedule = steps * micro * accum * world * 8
    kept = (2 * 600 * sequences * 8) if validation.protocol == "paper" else sequences * seq_len * 16 * sources
    micro_batch = micro * (seq_len + 1) * 8 * 3  # its int64 windows, and x and y
    try:
        run = build_data(data, training, validation, 0, world)
    except UserError as e:
        line = one_line(e)
        if "memory" in line:  # the budget's refusal: what is too large, and the option to change instead
            assert "more than this machine's" in line and ("training." in line or "validation." in line)
            assert 4 * (schedule + kept + micro_batch) + 2**24 > BUDGET  # never refused far below the budget
        return
    assert max(schedule, kept, micro_batch) <= BUDGET  # what could not be allocated was refused, not drawn
    assert run.schedule.offsets.shape == (steps, micro * accum * world)


# ----- (b) a stranger's tokenizer files with ids out of any sane range --------------------------------------------

IDS = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from([MAX_TOKEN_ID - 1, MAX_TOKEN_ID, 2**31, 2**32 - 1, 2**32,
                                                              2**63, 2**64, 10**30, 256, 257, 50_000, 50_256]))


def byte_level_vocab() -> dict[str, int]:
    from torchnlq.interop.tokenizer_files import byte_to_char

    return {char: byte for byte, char in byte_to_char().items()}


@settings(max_examples=60, **SETTINGS)
@given(rank=IDS, replace=st.booleans(), form=st.sampled_from(["vocab.json", ".tiktoken", "tokenizer.json"]))
def test_a_tokenizer_file_with_an_id_out_of_range_is_one_line(tmp_path_factory, rank, replace, form) -> None:
    """A GPT-2 vocab.json (what a Hugging Face GPT-2 folder or an export carries), a .tiktoken ranks file and a
    tokenizer.json whose one token has the drawn id: a working tokenizer (every id it gives below the bound), or
    one line naming the file."""
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, pre_tokenizers

    from torchnlq.interop.tokenizer_files import tokenizer_from_folder

    folder = tmp_path_factory.mktemp("tok")
    vocab = byte_level_vocab()
    key = "\u0120t" if not replace else "a"  # a merged token added, or a single byte's id replaced
    vocab[key] = rank
    try:
        if form == "vocab.json":
            (folder / "vocab.json").write_text(json.dumps(vocab))
            tokenizer = tokenizer_from_folder(folder)
        elif form == ".tiktoken":
            from torchnlq.interop.tokenizer_files import char_to_byte

            table = char_to_byte()
            lines = [base64.b64encode(bytes(table[c] for c in text)) + b" %d" % r for text, r in vocab.items()]
            (folder / "r.tiktoken").write_bytes(b"\n".join(lines) + b"\n")
            tokenizer = build_tokenizer("gpt2", str(folder / "r.tiktoken"), expected_hash=None)
        else:
            rust = RustTokenizer(models.BPE({**byte_level_vocab(), "<|endoftext|>": 256, "\u0120t": 257}, []))
            rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
            text = json.loads(rust.to_str())
            text["model"]["vocab"][key] = rank
            (folder / "tokenizer.json").write_text(json.dumps(text))
            tokenizer = build_tokenizer("hf", tokenizer_file=str(folder / "tokenizer.json"))
    except UserError as e:
        assert str(folder) in one_line(e)
        return
    assert 0 <= rank < MAX_TOKEN_ID  # an id out of range is never taken
    ids = tokenizer.encode("hello the world")
    assert ids and all(0 <= i < MAX_TOKEN_ID for i in ids) and tokenizer.vocab_size <= MAX_TOKEN_ID


def test_parse_ranks_refuses_a_rank_past_the_bound_before_tiktoken_sees_it(tmp_path: Path) -> None:
    ranks = b"".join(base64.b64encode(bytes([b])) + b" %d\n" % b for b in range(256))
    with pytest.raises(UserError, match="gives a token the id 4,294,967,296; torchnlq reads token ids 0 to"):
        parse_ranks(ranks + base64.b64encode(b"ab") + b" 4294967296\n", tmp_path / "x.tiktoken")


# ----- (c) ids past the model's vocabulary, at every entry point that feeds ids to a model ------------------------

@pytest.fixture(scope="module")
def mc_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mc") / "q.jsonl"
    path.write_text('{"ctx": "the fox", "endings": ["runs", "is red"], "label": 1}\n')
    return path


@settings(max_examples=20, **SETTINGS)
@given(vocab=st.integers(2, 400), token=st.integers(0, 256), records_tokenizer=st.booleans(),
       entry=st.sampled_from(["evaluate --data", "evaluate --multiple-choice", "generate"]))
def test_ids_past_the_models_vocabulary_are_one_line_at_every_entry(tmp_path_factory, capsys, mc_file, vocab, token,
                                                                    records_tokenizer, entry) -> None:
    """A model of ``vocab`` embedding rows (recording the byte tokenizer, or none) fed byte data whose ids are all
    ``token``, a multiple-choice file, or a prompt: the result when every id fits, else one line."""
    root = tmp_path_factory.mktemp("vocab")
    ckpt = write_checkpoint(root / "ckpt", tiny_model(vocab_size=vocab),
                            tokenizer=BYTE_TOKENIZER if records_tokenizer else {})
    data = write_token_folder(root / "data", np.full(400, token), np.full(400, token))
    argv = {"evaluate --data": ["evaluate", str(ckpt), "--data", str(data)],
            "evaluate --multiple-choice": ["evaluate", str(ckpt), "--multiple-choice", str(mc_file)],
            "generate": ["generate", str(ckpt), "--prompt", "ab", "--max-new-tokens", "2"]}[entry]
    capsys.readouterr()
    code = run_cli(script_main(argv[0]), argv[1:])
    fits = {"evaluate --data": token < vocab}.get(entry, 257 <= vocab)  # a tokenizer's ids: all 257 byte ids
    if not records_tokenizer and entry != "evaluate --data":
        fits = False  # nothing says how to encode text for it: refused (its own line)
    if fits:
        assert code == 0, capsys.readouterr().err
        return
    line = one_error_line(capsys, code)
    if records_tokenizer or entry == "evaluate --data":
        assert "token ids" in line or "tokens but the model only" in line


# ----- (d) multiple-choice rows as the format defines them --------------------------------------------------------

LABELS = st.one_of(st.integers(-3, 6), st.booleans(), st.floats(-1, 5), st.none(),
                   st.text(alphabet=st.sampled_from("0123456789 \t²³¹١٢٣०१۲௧"), max_size=4),
                   st.lists(st.integers(0, 2), max_size=2))
ENDINGS = st.lists(st.one_of(st.text(max_size=6), st.sampled_from(["", " ", "\t", "\n", "\u3000", "b"])),
                   min_size=0, max_size=4)


@settings(max_examples=300, **SETTINGS)
@given(label=LABELS, endings=ENDINGS)
def test_multiple_choice_rows_are_read_as_the_format_defines_them(label, endings) -> None:
    """The format (docs/checkpoints.md): at least two endings, each holding text; a label that is a JSON integer or
    a string of ASCII digits, an index of the endings. Anything else is one line naming the line, never a traceback
    and never a row scored wrongly."""
    from torchnlq.train.downstream import parse_row

    row = {"ctx": "a context", "endings": endings, "label": label}
    ascii_digits = isinstance(label, str) and label.strip(" \t") != "" and all(c in "0123456789"
                                                                            for c in label.strip(" \t"))
    index = label if type(label) is int else int(label.strip(" \t")) if ascii_digits else None
    valid = (len(endings) >= 2 and all(e.strip() for e in endings) and index is not None
             and 0 <= index < len(endings))
    try:
        parsed = parse_row(json.loads(json.dumps(row)), Path("q.jsonl"), 7)
    except UserError as e:
        assert not valid and one_line(e).startswith("'q.jsonl' line 7: ")
        return
    assert valid and parsed.label == index and parsed.endings == endings


# ----- (e) a device that does not exist is named as the device problem --------------------------------------------

@settings(max_examples=40, **SETTINGS)
@given(name=st.sampled_from(["cpu", "cpu:0", "cpu:1", "cpu:7", "cuda", "cuda:0", "cuda:1", "cuda:3", "auto"]),
       gpus=st.integers(0, 3))
def test_a_device_the_machine_lacks_is_said_to_be_the_device(monkeypatch, name, gpus) -> None:
    from torchnlq.interop.load import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    kind, _, index = name.partition(":")
    exists = (kind in ("cpu", "auto") and index in ("", "0")) or (kind == "cuda" and gpus > int(index or 0))
    try:
        device = resolve_device(name)
    except UserError as e:
        assert not exists and f"device '{name}'" in one_line(e) and "model" not in str(e)
        return
    assert exists and device.type in ("cpu", "cuda")


@pytest.mark.parametrize("entry", ["evaluate", "generate"])
def test_a_device_index_the_cpu_lacks_is_one_line_before_the_model_file_is_read(tmp_path, capsys, entry) -> None:
    ckpt = write_checkpoint(tmp_path / "ckpt", tiny_model(), tokenizer=BYTE_TOKENIZER)
    data = write_token_folder(tmp_path / "data", np.full(400, 65), np.full(400, 65))
    argv = [str(ckpt), "--data", str(data)] if entry == "evaluate" else [str(ckpt)]
    line = one_error_line(capsys, run_cli(script_main(entry), [*argv, "--device", "cpu:1"]))
    assert "device 'cpu:1' does not exist" in line and "export the model again" not in line


# ----- (f) a data file changed under a running reader ----------------------------------------------------------

@settings(max_examples=40, **SETTINGS)
@given(change=st.sampled_from(["truncate", "rewrite in place", "append", "replace by rename"]),
       keep=st.floats(0.0, 0.99), window=st.integers(1, 64), batch=st.integers(1, 8))
def test_a_token_file_changed_under_a_reader_is_one_line_never_sigbus(tmp_path_factory, change, keep, window,
                                                                       batch) -> None:
    """Reads after another program changed the file: the windows the run opened (a file replaced by a rename
    leaves the opened one as it was), or DataFileChanged naming the file, never a crash."""
    folder = tmp_path_factory.mktemp("changed")
    original = np.random.default_rng(1).integers(0, 50_000, 20_000).astype("<u2")
    path = folder / "train.bin"
    original.tofile(path)
    tokens = TokenFile(path)
    offsets = torch.arange(batch) * 700
    read_batch(tokens, offsets, window)  # a first read: pages in the cache, as in a run
    if change == "truncate":
        os.truncate(path, int(keep * path.stat().st_size) // 2 * 2)
    elif change == "rewrite in place":
        with open(path, "r+b") as f:
            f.write(np.zeros(len(original), "<u2").tobytes())
        os.utime(path, ns=(1, 1))  # a tool that keeps the size: its mtime differs from the opened file's
    elif change == "append":
        with open(path, "ab") as f:
            f.write(b"\0\0")
    else:
        replacement = folder / "new.bin"
        np.zeros(len(original), "<u2").tofile(replacement)
        os.replace(replacement, path)
    try:
        x, y = read_batch(tokens, offsets, window)
    except DataFileChanged as e:
        assert change != "replace by rename" and str(path) in one_line(e)
        return
    assert change == "replace by rename"  # the opened file itself did not change: its windows, as they were
    expected = np.stack([original[o : o + window + 1] for o in offsets.tolist()]).astype(np.int64)
    assert torch.equal(x, torch.from_numpy(expected[:, :-1])) and torch.equal(y, torch.from_numpy(expected[:, 1:]))


@pytest.mark.integration  # trains: a run whose train.bin is truncated by another process, then resumed
def test_a_run_whose_data_is_truncated_stops_with_one_line_saves_and_resumes(tmp_path: Path) -> None:
    from helpers.train import run_train, scalars, tiny_args

    data = write_token_folder(tmp_path / "data", np.random.default_rng(2).integers(0, 256, 8_000),
                              np.random.default_rng(3).integers(0, 256, 2_000))
    kept = (data / "train.bin").read_bytes()
    common = ["--data.synthetic=false", f"--data.path={data}", "--checkpoint.interval=100"]
    straight = run_train(tmp_path, *tiny_args(tmp_path, "straight", 6), *common)
    assert straight.returncode == 0, straight.stderr
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    proc = run_train(tmp_path, *tiny_args(tmp_path, "cut", 6), *common, wait=False,
                     env={"TORCHNLQ_PAUSE_AT": "step:3", "TORCHNLQ_PAUSE_DIR": str(pauses),
                          "TORCHNLQ_PAUSE_SECONDS": "5"})
    for _ in range(600):  # another program truncates the file while the trainer is held after step 3
        if any(pauses.iterdir()):
            break
        proc.poll()
        assert proc.returncode is None, proc.stdout.read()
        __import__("time").sleep(0.1)
    os.truncate(data / "train.bin", 1000)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"'{data / 'train.bin'}' changed while the run was reading it" in errors[0], out
    assert "training stopped at step 3" in errors[0] and "step-3, is the resume point" in errors[0]
    assert "Traceback" not in out
    assert (tmp_path / "outputs/cut/checkpoints/step-3").is_dir()  # what could be saved, was
    with open(data / "train.bin", "r+b") as f:  # the file put back as it was: the same command resumes
        f.write(kept)
    resumed = run_train(tmp_path, *tiny_args(tmp_path, "cut", 6), *common)
    assert resumed.returncode == 0, resumed.stderr
    a, b = scalars(tmp_path / "outputs/straight/tb"), scalars(tmp_path / "outputs/cut/tb")
    assert a["loss/train"] == b["loss/train"]  # bit for bit: the stop lost nothing


# ----- (g) a refusal creates nothing ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def refused_sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    huge = tiny_model()
    with torch.no_grad():
        huge.tok_emb.weight[0, 0] = 1e6  # beyond float16's range: the writer refuses an fp16 export of it
    anchored = tiny_model("anchored")
    return {"huge": write_checkpoint(root / "huge", huge, tokenizer=BYTE_TOKENIZER),
            "anchored": write_checkpoint(root / "anchored", anchored, tokenizer=BYTE_TOKENIZER),
            "export": _export(root)}


def _export(root: Path) -> Path:
    from torchnlq.interop.export import export_safetensors

    model = tiny_model()
    with torch.no_grad():
        model.tok_emb.weight[0, 0] = 1e6
    return export_safetensors(write_checkpoint(root / "for_export", model, tokenizer=BYTE_TOKENIZER), root / "exp")


REFUSALS = {  # entry point, its arguments (OUT last or named), the refusal's fragment
    "convert fp16": ("convert_checkpoint", ["{huge}", "{out}", "--dtype", "fp16"], "beyond float16's range"),
    "convert hf fp16": ("convert_checkpoint", ["{huge}", "{out}", "--dtype", "fp16", "--format", "hf"],
                        "beyond float16's range"),
    "convert hf-llama anchored": ("convert_checkpoint", ["{anchored}", "{out}", "--format", "hf-llama"],
                                  "has no Llama equivalent"),
    "upcycle fp16": ("upcycle", ["{export}", "{out}", "--dtype", "fp16"], "beyond float16's range"),
    "compare another data": ("compare_runs", ["{run_a}", "{run_b}", "--baseline", "a", "--out", "{out}"],
                             "different training batches"),
    "prepare a number field": ("prepare_data", ["--out", "{out}", "--files", "{numbers}", "--tokenizer", "byte"],
                               "holds a number"),
}


@settings(max_examples=24, **SETTINGS)
@given(case=st.sampled_from(sorted(REFUSALS)), depth=st.integers(1, 3), existing=st.integers(0, 1))
def test_a_refusal_leaves_no_folder_behind(tmp_path_factory, capsys, refused_sources, case, depth, existing) -> None:
    """Every entry point that writes an output folder, refused after it could have created OUT's parents: one
    line, and the tree as it was (no new folder, empty or not)."""
    from helpers.runs import make_run

    root = tmp_path_factory.mktemp("refusal")
    (root / "numbers.jsonl").write_text('{"text": "a b"}\n{"text": 42}\n')
    runs = root / "runs"
    places = {"{huge}": refused_sources["huge"], "{anchored}": refused_sources["anchored"],
              "{export}": refused_sources["export"], "{numbers}": root / "numbers.jsonl",
              "{run_a}": make_run(runs, "a", {10: 3.0}), "{run_b}": make_run(runs, "b", {10: 3.1}, batch_fp="bbbb")}
    base = root / "existing" if existing else root
    base.mkdir(exist_ok=True)
    places["{out}"] = base.joinpath(*[f"new{i}" for i in range(depth)])
    before = sorted(p for p in root.rglob("*"))
    entry, argv, fragment = REFUSALS[case]
    main = script_main(entry) if entry not in ("compare_runs",) else importlib.import_module(
        "torchnlq.experiments.compare").main
    capsys.readouterr()
    line = one_error_line(capsys, run_cli(main, [str(places.get(a, a)) for a in argv]))
    assert fragment in line
    assert sorted(p for p in root.rglob("*")) == before


# ----- (i) a full disk's message names where ---------------------------------------------------------------------

def _write_text(path: Path) -> None:
    path.write_text("x" * 100_000)


def _file_write(path: Path) -> None:
    with open(path, "wb") as f:
        f.write(b"x" * 100_000)


def _json_dump(path: Path) -> None:
    with open(path, "w") as f:
        json.dump(["x" * 100_000], f)


def _fd_write(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, b"x" * 100_000)
    finally:
        os.close(fd)


def _numpy_save(path: Path) -> None:
    with open(path, "wb") as f:
        np.save(f, np.zeros(100_000))


def _print_to(path: Path) -> None:
    with open(path, "w") as f:
        print("x" * 100_000, file=f, flush=True)


WRITERS = {f.__name__: f for f in (_write_text, _file_write, _json_dump, _fd_write, _numpy_save, _print_to)}


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (every write to it is ENOSPC)")
@settings(max_examples=12, **SETTINGS)
@given(writer=st.sampled_from(sorted(WRITERS)), name=st.sampled_from(["out.bin", "run_info.json", "x y"]))
def test_a_full_disk_is_one_line_that_names_the_path(tmp_path_factory, capsys, writer, name) -> None:
    """A write that fails for lack of space, by any writer (most give no file name with the error): the entry
    point's one line names the file written, never "a file"."""
    folder = tmp_path_factory.mktemp("full")
    target = folder / name
    target.symlink_to("/dev/full")  # every write to it fails with ENOSPC, as on a full disk

    def main(argv: list[str]) -> int:
        WRITERS[writer](target)
        return 0

    line = one_error_line(capsys, run_cli(main, []))
    assert "the disk is full" in line and (str(target) in line or str(folder) in line), line


def test_os_error_line_keeps_the_name_the_error_gives() -> None:
    error = OSError(28, "No space left on device", "/data/out/x.bin")
    assert os_error_line(error) == ("'/data/out/x.bin': the disk is full: free space there or write elsewhere "
                                    "(No space left on device)")
