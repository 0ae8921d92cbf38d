"""Issue 40.7 (h): runs of different tokenizers compared in bits per byte, each run's tokenizer named.

A loss per token does not compare across tokenizers; per byte of text it does: bits per byte = loss / ln 2 x
tokens / bytes of the run's validation split (meta.json's ``tokens`` and ``bytes``, which prepare_data.py records;
a byte folder's bytes are its tokens less its eot ids). Checked here against that formula written out, over drawn
losses and byte counts, for one folder and for a mixture, and the byte counts prepare_data.py records against the
documents' own UTF-8 lengths.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from helpers.data import SHAKESPEARE, SHARED_GPT2, needs_gpt2, split_docs, write_token_folder
from helpers.runs import make_run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchnlq.errors import UserError
from torchnlq.experiments.compare import compare_runs

SETTINGS = dict(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
EOT = 256


def byte_folder(folder: Path, text_bytes: int) -> Path:
    """A byte folder whose val split is one document of ``text_bytes`` bytes and its eot id."""
    val = np.r_[np.full(text_bytes, 97), EOT]
    return write_token_folder(folder, np.r_[np.full(2_000, 97), EOT], val)


def gpt2_folder(folder: Path, val_tokens: int, text_bytes: int | None) -> Path:
    """A gpt2 folder of ``val_tokens`` val tokens whose meta.json records ``text_bytes`` (None: no byte count)."""
    write_token_folder(folder, np.full(2_000, 5), np.full(val_tokens, 5), tokenizer="gpt2")
    meta = json.loads((folder / "meta.json").read_text())
    if text_bytes is not None:
        meta["bytes"] = {"train": 8_000, "val": text_bytes}
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def f32(x: float) -> float:  # TensorBoard keeps float32
    return float(np.float32(x))


def rows(out: Path) -> dict[str, dict[str, str]]:
    return {r["name"]: r for r in csv.DictReader(io.StringIO((out / "runs.csv").read_text()))}


@settings(max_examples=12, **SETTINGS)
@given(losses=st.tuples(st.floats(0.5, 8.0), st.floats(0.5, 8.0)), byte_count=st.integers(40, 3_000),
       gpt2_tokens=st.integers(40, 800), gpt2_bytes=st.integers(40, 6_000))
def test_runs_of_different_tokenizers_compare_in_bits_per_byte(tmp_path_factory, losses, byte_count, gpt2_tokens,
                                                                gpt2_bytes) -> None:
    root = tmp_path_factory.mktemp("bpb")
    data_b, data_g = byte_folder(root / "bytes", byte_count), gpt2_folder(root / "gpt2", gpt2_tokens, gpt2_bytes)
    run_b = make_run(root / "runs", "bytes", {100: losses[0]}, "--data.tokenizer=byte", f"--data.path={data_b}")
    run_g = make_run(root / "runs", "gpt2", {100: losses[1]}, "--data.tokenizer=gpt2", f"--data.path={data_g}",
                     batch_fp="bbbb", val_fp="wwww")
    with pytest.raises(UserError, match=r"different tokenizers \(bytes=byte, gpt2=gpt2\): their losses per token do "
                                        r"not compare; pass --allow-different-data to compare them anyway "
                                        r"\(compare_runs.py then compares them in bits per byte\)"):
        compare_runs([run_b, run_g], "bytes", root / "refused")
    out = root / "cmp"
    compare_runs([run_b, run_g], "bytes", out, allow_different_data=True)
    # Written out: bits = nats / ln 2; per byte = per token x tokens / bytes (the byte folder: its tokens less
    # its one eot id are its bytes).
    expected = {"bytes": f32(losses[0]) / math.log(2) * (byte_count + 1) / byte_count,
                "gpt2": f32(losses[1]) / math.log(2) * gpt2_tokens / gpt2_bytes}
    got = rows(out)
    for name, bpb in expected.items():
        assert float(got[name]["val_bits_per_byte"]) == pytest.approx(bpb, rel=1e-9)
        assert got[name]["tokenizer"] == name.replace("bytes", "byte")
    md = (out / "comparison.md").read_text()
    assert "bytes: byte, gpt2: gpt2" in md and "the relative improvement is of the validation bits per byte" in md
    table = {line.split("|")[1].strip(): line for line in md.splitlines() if line.startswith("| ")}
    gain = 100 * (expected["bytes"] - expected["gpt2"]) / expected["bytes"]
    assert "| gpt2 | " in table["gpt2"] and f"| {expected['gpt2']:.4f} | {gain:+.2f}% |" in table["gpt2"]
    summary = {r["name"]: r for r in csv.DictReader(io.StringIO((out / "comparison.csv").read_text()))}
    assert float(summary["gpt2"]["rel_improvement_pct"]) == pytest.approx(gain, rel=1e-9)


def test_a_mixtures_bits_per_byte_weights_its_sources_as_its_loss_does(tmp_path: Path) -> None:
    a, b = byte_folder(tmp_path / "books", 300), byte_folder(tmp_path / "code", 99)
    config = tmp_path / "mix.toml"
    config.write_text(f'[data]\ntokenizer = "byte"\n[[data.sources]]\npath = "{a}"\nweight = 0.7\n'
                      f'[[data.sources]]\npath = "{b}"\nweight = 0.3\nname = "py"\n')
    losses = {"books": 1.2, "py": 2.5}
    mix = make_run(tmp_path / "runs", "mix", {50: 0.7 * 1.2 + 0.3 * 2.5}, config=config,
                   scalars={f"loss/val/{k}": {50: v} for k, v in losses.items()})
    gpt2 = make_run(tmp_path / "runs", "gpt2", {50: 3.0}, "--data.tokenizer=gpt2",
                    f"--data.path={gpt2_folder(tmp_path / 'g', 200, 900)}")
    compare_runs([mix, gpt2], "mix", tmp_path / "cmp", allow_different_data=True)
    per_source = {"books": f32(1.2) / math.log(2) * 301 / 300, "py": f32(2.5) / math.log(2) * 100 / 99}
    expected = 0.7 * per_source["books"] + 0.3 * per_source["py"]
    assert float(rows(tmp_path / "cmp")["mix"]["val_bits_per_byte"]) == pytest.approx(expected, rel=1e-6)


def test_a_run_whose_data_records_no_byte_count_is_one_line_naming_the_folder(tmp_path: Path) -> None:
    data_b, data_g = byte_folder(tmp_path / "bytes", 100), gpt2_folder(tmp_path / "adopted", 100, None)
    run_b = make_run(tmp_path / "runs", "bytes", {10: 2.0}, "--data.tokenizer=byte", f"--data.path={data_b}")
    run_g = make_run(tmp_path / "runs", "gpt2", {10: 3.0}, "--data.tokenizer=gpt2", f"--data.path={data_g}")
    with pytest.raises(UserError, match=f"run 'gpt2' has no byte count of its validation text \\(data folder "
                                        f"'{data_g}'"):
        compare_runs([run_b, run_g], "bytes", tmp_path / "cmp", allow_different_data=True)
    assert not (tmp_path / "cmp").exists()


def test_runs_of_one_tokenizer_compare_per_token_as_before(tmp_path: Path) -> None:
    data = byte_folder(tmp_path / "bytes", 100)
    a = make_run(tmp_path / "runs", "a", {10: 2.0}, "--data.tokenizer=byte", f"--data.path={data}")
    b = make_run(tmp_path / "runs", "b", {10: 1.5}, "--data.tokenizer=byte", f"--data.path={data}",
                 "--optimizer.lr=0.001")
    compare_runs([a, b], "a", tmp_path / "cmp")
    got = rows(tmp_path / "cmp")
    assert got["b"]["val_bits_per_byte"] == "" and got["b"]["tokenizer"] == "byte"
    assert "bits/byte" not in (tmp_path / "cmp" / "comparison.md").read_text()


# ----- the byte counts prepare_data.py records ---------------------------------------------------------------

TEXT = "ünïcödé paragraph one.\n\nthe fox — 狐 — runs.\n\nplain ascii here\n\n" * 20


@pytest.mark.parametrize("tokenizer", ["byte", pytest.param("gpt2", marks=needs_gpt2)])
def test_prepare_records_the_utf8_bytes_of_each_splits_documents(tmp_path: Path, tokenizer: str) -> None:
    from torchnlq.data.prepare import prepare_dataset
    from torchnlq.data.tokenizer import build_tokenizer

    source = tmp_path / "in.txt"
    source.write_text(TEXT + (SHAKESPEARE.read_text()[:20_000] if SHAKESPEARE.is_file() else ""))
    tiktoken = str(SHARED_GPT2) if tokenizer == "gpt2" else None
    meta = prepare_dataset(tmp_path / "out", files=[str(source)], text_split="paragraph", tokenizer=tokenizer,
                           tiktoken_file=tiktoken, val_fraction=0.2)
    tok = build_tokenizer(tokenizer, tiktoken)
    for split in ("train", "val"):
        tokens = np.fromfile(tmp_path / "out" / f"{split}.bin", dtype="<u2")
        # Each document decoded back to text: its UTF-8 length, summed (the eot ids are not text).
        expected = sum(len(tok.decode(doc).encode("utf-8")) for doc in split_docs(tokens, tok.eot_id))
        assert meta["bytes"][split] == expected > 0
