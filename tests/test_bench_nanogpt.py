"""``python -m benchmarks.versus_nanogpt --mode profile`` end to end on the CPU, at the debug shape.

nanoGPT itself is not in this repository: a stand-in train.py written here plays its part the way the
benchmark uses it (``--key=value`` flags read as configurator.py reads them, ``data/<dataset>/train.bin`` as
uint16 and ``meta.pkl``, one ``iter N: loss L, time T ms, mfu M%`` line per iteration) and records what it
was given and each time it printed. The test checks the benchmark against those records and against
TensorBoard's own reading of a torchnlq run: the shape both programs ran at, the step times it read, and the
figures it derived from them (tokens/s as the median after the warm-up steps, the ratio, MFU).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from helpers import REPO_ROOT
from torchnlq.models.counts import num_params

#: What nanoGPT's train.py does that the benchmark relies on, and no more (a tiny model, not GPT-2's).
STAND_IN = r'''
import ast, json, os, pickle, sys, time
import numpy as np
import torch

config = {"dataset": "openwebtext", "batch_size": 12, "block_size": 1024, "max_iters": 600000, "out_dir": "out"}
for arg in sys.argv[1:]:  # configurator.py: --key=value, the value a Python literal or a string
    key, value = arg[2:].split("=", 1)
    try:
        config[key] = ast.literal_eval(value)
    except (SyntaxError, ValueError):
        config[key] = value
data = np.memmap(os.path.join("data", config["dataset"], "train.bin"), dtype=np.uint16, mode="r")
with open(os.path.join("data", config["dataset"], "meta.pkl"), "rb") as f:
    vocab = pickle.load(f)["vocab_size"]
model = torch.nn.Sequential(torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, vocab))
times = []
for it in range(config["max_iters"] + 1):
    t0 = time.time()
    ix = torch.randint(len(data) - config["block_size"], (config["batch_size"],))
    x = torch.stack([torch.from_numpy(data[i:i + config["block_size"]].astype(np.int64)) for i in ix])
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), x.flatten())
    loss.backward()
    dt = time.time() - t0
    times.append(round(dt * 1000, 2))
    print(f"iter {it}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms, mfu -100.00%")
record = {"config": config, "vocab": vocab, "max_token": int(data.max()), "times_ms": times, "cwd": os.getcwd()}
with open(os.environ["STAND_IN_RECORD"], "w") as f:
    json.dump(record, f)
'''


@pytest.fixture()
def stand_in(tmp_path: Path) -> Path:
    folder = tmp_path / "nanogpt"
    folder.mkdir()
    (folder / "train.py").write_text(STAND_IN)
    (folder / "model.py").write_text("")
    (folder / "configurator.py").write_text("")
    return folder


@pytest.mark.integration  # two whole programs
def test_profile_mode_runs_both_programs_at_one_shape_and_reads_their_own_step_times(
        stand_in: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from benchmarks import versus_nanogpt
    from torchnlq.config.manager import load_job_config
    from torchnlq.train.preflight import check_job_config

    record, out = tmp_path / "record.json", tmp_path / "figures.json"
    monkeypatch.setenv("STAND_IN_RECORD", str(record))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)  # the config is given relative to the working directory
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "debug.toml").write_text((REPO_ROOT / "train_configs" / "debug_model.toml").read_text())
    kept_runs = tmp_path / "kept"
    # Keep torchnlq's run folder: TensorBoard's own reading of it is the reference for the row.
    monkeypatch.setattr(versus_nanogpt.tempfile, "TemporaryDirectory", lambda prefix: _Kept(kept_runs))
    overrides = ["--model.query.type=linear", "--training.micro_batch_size=4", "--training.grad_accum_steps=2",
                 "--metrics.peak_tflops=0.001"]
    code = versus_nanogpt.main(["--nanogpt", str(stand_in), "--mode", "profile", "--device", "cpu",
                                "configs/debug.toml", *overrides, "--steps", "5", "--json", str(out)])
    assert code == 0
    table = capsys.readouterr().out
    seen = json.loads(record.read_text())
    figures = json.loads(out.read_text())
    cfg = load_job_config(["configs/debug.toml", *overrides, "--training.device=cpu"])
    args = check_job_config(cfg)

    # nanoGPT ran the config's shape on the same corpus, in a scratch copy, never in the checkout.
    shape = seen["config"]
    assert (shape["n_layer"], shape["n_head"], shape["n_embd"]) == (args.n_layers, args.n_heads, args.dim)
    assert (shape["batch_size"], shape["block_size"], shape["gradient_accumulation_steps"]) == (4, 128, 2)
    assert (shape["device"], shape["dtype"], shape["compile"], shape["bias"], shape["dropout"]) == (
        "cpu", "float32", False, False, 0.0)
    assert seen["vocab"] == args.vocab_size and seen["max_token"] < 257  # byte ids, the model's padded head rows
    assert shape["max_iters"] + 1 == 5 and not Path(seen["cwd"]).is_relative_to(stand_in)
    assert sorted(p.name for p in stand_in.iterdir()) == ["configurator.py", "model.py", "train.py"]

    nano, ours = figures["programs"]
    tokens_per_step = 4 * 128 * 2
    assert nano["step_seconds"] == pytest.approx([t / 1000 for t in seen["times_ms"]])
    assert nano["tokens_per_s"] == pytest.approx(tokens_per_step / statistics.median(nano["step_seconds"][2:]))

    acc = EventAccumulator(str(kept_runs / "runs" / "r0" / "tb"))
    acc.Reload()
    logged = [e.value for e in sorted(acc.Scalars("throughput/tokens_per_s"), key=lambda e: e.step)]
    assert len(logged) == 5
    assert ours["tokens_per_s"] == pytest.approx(statistics.median(logged[2:]), rel=1e-6)
    assert ours["vs_nanogpt"] == pytest.approx(ours["tokens_per_s"] / nano["tokens_per_s"])
    # MFU: 6 FLOPs per parameter of the blocks and head, 12·L·H·hd·T for attention, against the given peak.
    non_embedding = num_params(args, non_embedding=True) + (args.vocab_size * args.dim if args.tie_embeddings else 0)
    flops = 6 * non_embedding + 12 * args.n_layers * args.n_heads * args.head_dim * 128
    assert ours["mfu"] == pytest.approx(flops * ours["tokens_per_s"] / 1e9, rel=1e-6)
    assert 0 < ours["first_step_s"] < 120 and 0 < nano["first_step_s"] < 120
    assert ours["peak_memory_bytes"] is None  # the CPU has no allocator peak to compare
    assert "| nanoGPT train.py |" in table and "| torchnlq configs/debug.toml (linear) |" in table


class _Kept:
    """A TemporaryDirectory stand-in that leaves its folder behind for the test to read."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> str:
        self.path.mkdir()
        return str(self.path)

    def __exit__(self, *exc: object) -> None:
        return None
