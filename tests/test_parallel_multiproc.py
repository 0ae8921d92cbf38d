"""Two-process tests of the FSDP2 primitives (torchrun, gloo, CPU).

One ``torch.distributed.run`` launch of tests/workers/fsdp_worker.py runs every
scenario (process start-up and imports are paid once); the tests check its JSON.
The trainer-level 1-vs-2-process test lives with the trainer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from helpers import REPO_ROOT

pytestmark = pytest.mark.integration  # subprocess / torchrun / end-to-end trainer runs: see pyproject.toml

WORKER = REPO_ROOT / "tests" / "workers" / "fsdp_worker.py"
TRAIN_SCENARIOS = ["eager", "compile", "ac_full", "hsdp"]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("multiproc")
    env = dict(os.environ)
    for name, sub in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TMPDIR", "tmp"), ("HF_HOME", "hf"),
                      ("TIKTOKEN_CACHE_DIR", "tiktoken")):
        (root / sub).mkdir()
        env[name] = str(root / sub)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    out = root / "results.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(WORKER), str(out), "init", *TRAIN_SCENARIOS]
    proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not out.exists():
        pytest.fail(f"worker failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(out.read_text())


def test_sharded_init_equals_single_device_init(results: dict) -> None:
    """Full state dict gathered from 2 shards == torch.manual_seed(s); Decoder(args), bitwise; RoPE tables too."""
    assert set(results["init"]) == {"tied_learned", "untied_rope_gqa", "odd_shapes"}
    for variant, checks in results["init"].items():
        assert checks == {"keys_equal": True, "bitwise_equal": True, "rope_ok": True}, variant


@pytest.mark.parametrize("scenario", TRAIN_SCENARIOS)
def test_two_process_training_matches_one_process(results: dict, scenario: str) -> None:
    """FSDP (or HSDP) over 2 ranks, each with half of every micro-batch, reduced on the last micro-step only:
    the same loss and clipped gradient norm at every step as one process with the whole batch."""
    run = results[scenario]
    assert len(run["fsdp"]["losses"]) == len(run["single"]["losses"]) >= 3
    assert run["fsdp"]["losses"] == pytest.approx(run["single"]["losses"], rel=1e-5)
    assert run["fsdp"]["norms"] == pytest.approx(run["single"]["norms"], rel=1e-5)
    assert all(run["fsdp"]["held_back"]), "gradients were reduced before the last micro-step"
