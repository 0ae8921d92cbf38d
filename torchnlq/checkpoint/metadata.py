"""What a torchnlq checkpoint folder holds besides the DCP shards: the model under :data:`MODEL_KEY` and
:data:`META_FILE`, the JSON that rebuilds the model without the run's config. Importing it imports no torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchnlq.errors import UserError
from torchnlq.files import read_json

META_FILE = "torchnlq.json"
MODEL_KEY = "model"

# An export folder (torchnlq.interop.export): safetensors weights + config.json (+ tokenizer).
EXPORT_FORMAT = "torchnlq-safetensors"
FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# Hugging Face's tokenizer config; exports before the tokenizer files held torchnlq's description here.
TOKENIZER_FILE = "tokenizer_config.json"
# Keys of config.json that describe the file itself, not the run it came from.
FORMAT_KEYS = ("format", "format_version", "torchnlq_version", "dtype", "source")


def write_meta(ckpt_dir: str | Path, meta: dict[str, Any]) -> None:
    """Write the checkpoint's metadata JSON (called before the folder is renamed into place)."""
    Path(ckpt_dir, META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))


def read_meta(ckpt_dir: str | Path) -> dict[str, Any]:
    """Read the metadata of a checkpoint folder, checked against its schema (:meth:`RunRecord.from_meta`) before
    any reader uses it; a folder without it, or a value of another type or size, is one UserError line."""
    from torchnlq.checkpoint.record import RunRecord

    path = Path(ckpt_dir, META_FILE)
    if not Path(ckpt_dir).is_dir():
        raise UserError(f"checkpoint '{ckpt_dir}' does not exist; pass a <run>/checkpoints/step-N folder")
    if not path.is_file():
        raise UserError(f"'{ckpt_dir}' is not a torchnlq checkpoint (no {META_FILE}); "
                        "pass a <run>/checkpoints/step-N folder")
    meta = read_json(path, "a checkpoint's record", "use another checkpoint")  # JSON, never unpickled
    if not isinstance(meta, dict):
        raise UserError(f"'{path}' is corrupt (not a JSON object); use another checkpoint")
    RunRecord.from_meta(meta, path)
    return meta
