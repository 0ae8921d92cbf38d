"""Runs of different tokenizers, compared in bits per byte (compare_runs.py --allow-different-data).

A loss per token is not comparable across tokenizers: one tokenizer's token is more text than another's. Per byte
of text it is: bits per byte = loss / ln 2 x tokens / bytes, with the tokens and UTF-8 bytes of the validation split
that the data folder records (meta.json's ``tokens`` and ``bytes``; a byte folder's bytes are its tokens less its
eot ids). The validation windows are a uniform sample of that split, so its ratio is theirs in expectation. A
mixture's figure is the sources' bits per byte weighted as its ``loss/val`` weights their losses.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from torchnlq.data import token_format as fmt
from torchnlq.errors import UserError

LN2 = math.log(2)


def tokenizer_label(config: dict[str, Any], info: dict[str, Any]) -> str:
    """A run's tokenizer: its name, and for a file-backed one (an hf tokenizer.json) which file (its sha256)."""
    name = str(config.get("data", {}).get("tokenizer"))
    sha = info.get("tokenizer_sha256")
    return f"{name} {sha[:12]}" if name == "hf" and isinstance(sha, str) else name


def bytes_per_token(folder: str | Path) -> float | None:
    """UTF-8 bytes per token of a data folder's validation split (None: the folder or its byte count is unknown)."""
    try:
        meta = fmt.read_meta(Path(folder).expanduser())
    except (UserError, OSError):
        return None
    tokens, size = (meta.get("tokens") or {}).get("val"), fmt.text_bytes(meta, "val")
    return size / tokens if isinstance(tokens, int) and tokens > 0 and size else None


def bits_per_byte(name: str, config: dict[str, Any], val: dict[int, float], per_source: dict[str, dict[int, float]]
                  ) -> dict[int, float]:
    """step -> validation bits per byte of a run (``val``: its loss/val, ``per_source``: a mixture's loss/val/<name>);
    a UserError naming the data folder that records no byte count."""
    from torchnlq.data.mixture import source_name  # imports torch: only for a mixture's run

    data = config.get("data", {})
    sources = data.get("sources") or []
    parts = [(1.0, data.get("path"), val)] if not sources else [
        (float(s.get("weight", 1.0)), s.get("path"),
         per_source.get(source_name(s.get("name"), str(s.get("path", "")), i), {})) for i, s in enumerate(sources)]
    ratios = []
    for _, folder, _ in parts:
        ratio = bytes_per_token(folder) if isinstance(folder, str) else None
        if ratio is None:
            raise UserError(f"runs of different tokenizers compare in bits per byte, but run '{name}' has no byte "
                            f"count of its validation text (data folder '{folder}': missing, moved, or prepared before "
                            "meta.json recorded bytes, e.g. an adopted GPT-2 folder): prepare it again with "
                            "scripts/prepare_data.py, or compare runs of one tokenizer")
        ratios.append(ratio)
    steps = set.intersection(*(set(series) for _, _, series in parts))
    total = sum(weight for weight, _, _ in parts)
    return {step: sum(weight * series[step] / LN2 / ratio for (weight, _, series), ratio in zip(parts, ratios)) / total
            for step in sorted(steps)}
