"""One declaration per model field (issue 33.2): a block option declared once, in models/config.py's ``BlockOptions``,
reaches ``--help``, the resolved config, ModelArgs and its record, the Hugging Face wrapper's config and the
memory estimate, with nothing else edited. The test adds such a field to a scratch copy of the package and asks
each of them in a fresh process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO_ROOT

from torchnlq.config.job_config import JobConfig
from torchnlq.config.render import iter_options
from torchnlq.models.args import LATER_FIELDS, MODEL_FIELDS, ModelArgs
from torchnlq.models.config import BlockOptions, Model

NEW_FIELD = '''    attn_logit_cap: float = option(0.0, "A field added by tests/test_one_declaration.py.", min=0.0)
'''

PROBE = r'''
import json
from torchnlq.config.manager import load_job_config
from torchnlq.config.render import to_toml
from torchnlq.interop.hf_export import hf_config
from torchnlq.models.args import ModelArgs
from torchnlq.train.memory_estimate import estimate_memory
from torchnlq.train.preflight import check_job_config
import torch

cfg = load_job_config(["--model.attn_logit_cap=1.5", "--model.dim=32", "--model.n_heads=2", "--training.seq_len=32",
                       "--training.micro_batch_size=2", "--data.tokenizer=byte"])
args = check_job_config(cfg)
record = args.to_dict()
print(json.dumps({
    "toml": "attn_logit_cap = 1.5" in to_toml(cfg),
    "args": args.attn_logit_cap,
    "record": record.get("attn_logit_cap"),
    "round_trip": ModelArgs.from_dict(record).attn_logit_cap,
    "default_left_out": "attn_logit_cap" not in check_job_config(load_job_config([])).to_dict(),
    "hf_config": hf_config(args, {"name": "byte", "vocab_size": 257, "eot_id": 256}, torch.float32).get("attn_logit_cap"),
    "estimate": estimate_memory(cfg, args, 1, "cpu").total > 0,
}))
'''


@pytest.mark.integration  # a scratch copy of the package and two processes
def test_a_block_option_declared_once_reaches_every_consumer(tmp_path: Path) -> None:
    shutil.copytree(REPO_ROOT / "torchnlq", tmp_path / "torchnlq", ignore=shutil.ignore_patterns("__pycache__"))
    config = tmp_path / "torchnlq" / "models" / "config.py"
    text = config.read_text()
    anchor = '    norm_eps: float = option(1e-5, "Epsilon of every LayerNorm/RMSNorm.", min=0.0, min_exclusive=True)\n'
    assert text.count(anchor) == 1
    config.write_text(text.replace(anchor, anchor + NEW_FIELD))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    helped = subprocess.run([sys.executable, "-m", "torchnlq.train", "--help"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "--model.attn_logit_cap" in helped.stdout and "tests/test_one_declaration" in helped.stdout
    probed = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert probed.returncode == 0, probed.stderr[-2000:]
    seen = json.loads(probed.stdout.strip().splitlines()[-1])
    assert seen == {"toml": True, "args": 1.5, "record": 1.5, "round_trip": 1.5, "default_left_out": True,
                    "hf_config": 1.5, "estimate": True}


def test_the_lists_that_were_written_by_hand_derive_from_the_declarations() -> None:
    block = {f.name for f in BlockOptions.__dataclass_fields__.values()}
    # The config section holds each block option unset (the flavor's), with the declared default in its doc.
    for name in block:
        declared, section = BlockOptions.__dataclass_fields__[name], Model.__dataclass_fields__[name]
        assert section.default is None and section.metadata["declared"] == declared.default, name
        assert section.metadata["doc"].startswith(declared.metadata["doc"]), name
    assert block <= set(ModelArgs.__dataclass_fields__) and block <= set(Model.__dataclass_fields__)
    assert set(MODEL_FIELDS) == set(ModelArgs.__dataclass_fields__) - {"init", "query", "moe"}
    assert set(LATER_FIELDS) < block
    options = {name for name, _, _ in iter_options(JobConfig())}
    assert {f"model.{name}" for name in block} <= options
