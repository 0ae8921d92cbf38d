"""Data helpers: token folders, toy tiktoken files, the shared gpt2.tiktoken skip marker."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from torchnlq.data import token_format as fmt

from helpers import SHARED_DATA

SHARED_GPT2 = SHARED_DATA / "gpt2.tiktoken"
SHAKESPEARE = SHARED_DATA / "tinyshakespeare.txt"
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
needs_gpt2 = pytest.mark.skipif(not SHARED_GPT2.is_file(), reason="../shared/data/gpt2.tiktoken not present")


def isolate_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point HF_HOME and TIKTOKEN_CACHE_DIR into tmp_path so a test litters nothing.

    TMPDIR stays as run_tests.sh set it (a scratch folder it removes): pointing it deeper, into
    tmp_path, makes the Unix-socket paths of datasets' worker processes exceed the 108-byte limit.
    """
    for var, sub in (("HF_HOME", "hf_home"), ("TIKTOKEN_CACHE_DIR", "tiktoken")):
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.delenv("TORCHNLQ_TIKTOKEN_FILE", raising=False)


def write_toy_tiktoken(path: Path) -> Path:
    """A tiny .tiktoken ranks file: the 256 single bytes plus five merges."""
    ranks = {bytes([b]): b for b in range(256)}
    for i, tok in enumerate([b"th", b"the", b" the", b"in", b"ing"]):
        ranks[tok] = 256 + i
    path.write_bytes(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks.items()))
    return path


def write_token_folder(folder: Path, train: np.ndarray, val: np.ndarray, tokenizer: str = "byte") -> Path:
    """A data folder in the prepare format, holding the given token arrays."""
    folder.mkdir(parents=True, exist_ok=True)
    fmt.split_file(folder, "train").write_bytes(np.asarray(train, dtype=fmt.DTYPE).tobytes())
    fmt.split_file(folder, "val").write_bytes(np.asarray(val, dtype=fmt.DTYPE).tobytes())
    tok = {"name": tokenizer, "vocab_size": 257, "eot_id": 256}
    meta = fmt.make_meta(tok, {"train": len(train), "val": len(val)}, {"train": 1, "val": 1}, {"kind": "test"})
    (folder / fmt.META_NAME).write_text(json.dumps(meta))
    return folder


def split_docs(tokens: np.ndarray, eot: int) -> list[list[int]]:
    """Token file contents -> documents (the file must end with eot)."""
    assert len(tokens) and tokens[-1] == eot
    ends = np.flatnonzero(tokens == eot)
    return [tokens[s + 1 : e].tolist() for s, e in zip(np.r_[-1, ends[:-1]], ends)]
