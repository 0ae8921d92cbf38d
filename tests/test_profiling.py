"""[profiling] and [debug] (issue 23): profiler traces of the steps asked for, memory snapshots, determinism.

The traces are read back as Chrome trace JSON (what ``torch.profiler``'s ``export_chrome_trace`` writes and
Perfetto, chrome://tracing and TensorBoard's profiler plugin open); a step is in a trace when torch's
``ProfilerStep#N`` marker for it is. The schedule the steps are checked against is written out here.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from torchnlq.train.trainer import Trainer

from helpers.train import scalars, tiny_config

pytestmark = pytest.mark.integration  # each test runs the trainer for a few steps


def read_trace(path: Path) -> list[dict]:
    """The events of a Chrome trace file (JSON object format: {"traceEvents": [...]})."""
    return json.loads(path.read_text(encoding="utf-8"))["traceEvents"]


def profiled_steps(events: list[dict]) -> list[int]:
    """The training steps a trace holds, from torch's ProfilerStep#N markers."""
    return sorted(int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#"))


def recorded(steps: range, wait: int, warmup: int, active: int, repeat: int) -> list[list[int]]:
    """The windows torch.profiler.schedule records, steps numbered from 1: written out, not asked of torch."""
    cycle, windows = wait + warmup + active, []
    for step in steps:
        n, position = divmod(step - 1, cycle)
        if position >= wait + warmup and (repeat == 0 or n < repeat):
            if position == wait + warmup or not windows or windows[-1][-1] != step - 1:
                windows.append([])
            windows[-1].append(step)
    return windows


def profiling(wait: int, warmup: int, active: int, repeat: int) -> dict[str, object]:
    return {"profiling__enabled": True, "profiling__wait": wait, "profiling__warmup": warmup,
            "profiling__active": active, "profiling__repeat": repeat}


def test_a_run_writes_a_readable_trace_of_each_window_it_asked_for(tmp_path: Path) -> None:
    schedule = {"wait": 1, "warmup": 1, "active": 2, "repeat": 2}
    Trainer(tiny_config(tmp_path, "prof", steps=9, **profiling(**schedule))).train()
    run = tmp_path / "outputs" / "prof"
    windows = recorded(range(1, 10), **schedule)
    assert windows == [[3, 4], [7, 8]]  # the reference itself, on a case worked by hand
    folders = sorted(p.name for p in (run / "profiler").iterdir())
    assert folders == [f"steps-{w[0]}-{w[-1]}" for w in windows]
    log = (run / "train.log").read_text()
    for window in windows:
        trace = run / "profiler" / f"steps-{window[0]}-{window[-1]}" / "rank0.pt.trace.json"
        events = read_trace(trace)
        assert profiled_steps(events) == window
        names = {e.get("name") for e in events}
        assert {"aten::mm", "aten::scaled_dot_product_attention"} <= names, sorted(names)[:50]
        assert str(trace) in log  # the log line that says where it went


def test_a_run_ending_inside_a_window_saves_the_steps_it_ran(tmp_path: Path) -> None:
    # Steps 2-4 would be recorded; the run stops after 3: the trace has steps 2 and 3, and no step 4.
    Trainer(tiny_config(tmp_path, "short", steps=3, **profiling(wait=0, warmup=1, active=3, repeat=1))).train()
    (trace,) = (tmp_path / "outputs" / "short" / "profiler").glob("*/rank0.pt.trace.json")
    assert trace.parent.name == "steps-2-3"
    assert profiled_steps(read_trace(trace)) == [2, 3]


def test_a_resumed_run_counts_steps_as_the_run_does(tmp_path: Path) -> None:
    """Steps are the run's, across resumes: a resume at step 4 records steps 6-7 when asked for 6-7."""
    schedule = {"wait": 4, "warmup": 1, "active": 2, "repeat": 1}
    Trainer(tiny_config(tmp_path, "res", steps=4, checkpoint__interval=4, validation__enabled=False)).train()
    Trainer(tiny_config(tmp_path, "res", steps=8, checkpoint__interval=4, validation__enabled=False,
                        **profiling(**schedule))).train()
    (window,) = recorded(range(5, 9), **schedule)
    trace = tmp_path / "outputs" / "res" / "profiler" / f"steps-{window[0]}-{window[-1]}" / "rank0.pt.trace.json"
    assert profiled_steps(read_trace(trace)) == window == [6, 7]


@pytest.fixture
def restore_determinism() -> Iterator[None]:
    """debug.deterministic is process-wide: put back what the other tests run with."""
    import torch._inductor.config as inductor_config

    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              inductor_config.deterministic)
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic, inductor_config.deterministic = before[1], before[2]


def test_debug_deterministic_runs_with_deterministic_kernels_and_repeats_its_losses(
        tmp_path: Path, restore_determinism: None) -> None:
    assert not torch.are_deterministic_algorithms_enabled()
    losses, flags = [], []
    for name in ("a", "b"):
        trainer = Trainer(tiny_config(tmp_path, name, steps=4, debug__deterministic=True, checkpoint__enabled=False))
        real = trainer.micro_batch_loss

        def watched(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            flags.append(torch.are_deterministic_algorithms_enabled())  # in the step itself
            return real(x, y)

        trainer.micro_batch_loss = watched
        trainer.train()
        losses.append(scalars(tmp_path / "outputs" / name / "tb")["loss/train"])
    assert flags and all(flags)
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert losses[0] == losses[1] and len(losses[0]) == 4  # bit for bit, every step


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")
def test_cuda_memory_snapshots_with_the_trace_and_on_out_of_memory(tmp_path: Path) -> None:
    import torch.cuda._memory_viz as memory_viz  # the viewer's own reader of a snapshot

    cfg = tiny_config(tmp_path, "mem", steps=6, training__device="cuda", profiling__memory_snapshot=True,
                      **profiling(wait=1, warmup=1, active=2, repeat=1))
    trainer = Trainer(cfg)
    real = trainer.train_step

    def runs_out_at_step_5() -> tuple[float, float]:
        if trainer.step == 4:
            torch.empty(2**50, dtype=torch.uint8, device="cuda")  # a real CUDA out-of-memory error
        return real()

    trainer.train_step = runs_out_at_step_5
    with pytest.raises(torch.OutOfMemoryError):
        trainer.train()
    profiler = tmp_path / "outputs" / "mem" / "profiler"
    events = read_trace(profiler / "steps-3-4" / "rank0.pt.trace.json")
    assert profiled_steps(events) == [3, 4]
    assert any(e.get("cat") == "kernel" for e in events)  # CUDA kernels, not only the CPU side
    for folder in ("steps-3-4", "oom-after-step-4"):
        snapshot = profiler / folder / "rank0.memory.pickle"
        with open(snapshot, "rb") as f:  # written by this test's own run
            snap = pickle.load(f)
        assert any(event["action"] == "alloc" for trace in snap["device_traces"] for event in trace)  # a history
        memory_viz.trace_plot(snap)  # the viewer's own reader takes it
