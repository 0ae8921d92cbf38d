"""``python -m benchmarks.inference_speed``: prefill and KV-cache decoding per query type (issue 13.4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import inference_speed
from torchnlq.cli import run_cli

TINY = ["--layers", "2", "--dim", "32", "--heads", "4", "--vocab", "128", "--prompt", "8", "--decode", "3",
        "--rounds", "2", "--warmup", "1", "--device", "cpu"]


@pytest.mark.integration  # the benchmark's every variant, timed
def test_the_table_and_json_describe_every_variant(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "inference.json"
    assert run_cli(inference_speed.main, [*TINY, "--batch", "2", "--json", str(out)]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in table[1:]] == list(inference_speed.VARIANTS)
    results = {r["label"]: r for r in json.loads(out.read_text())["results"]}
    for r in results.values():
        # rates are the work divided by the measured times
        assert r["prefill_tokens_per_s"] == pytest.approx(2 * 8 / (r["prefill_ms"] / 1000), rel=1e-9)
        assert r["decode_tokens_per_s"] == pytest.approx(2 / (r["decode_ms_per_step"] / 1000), rel=1e-9)
    # The KV cache: keys and values of every layer, batch 2, 8 + 3 positions, kv_heads x head_dim floats.
    head_dim = 32 // 4
    for label, kv_heads in (("linear", 4), ("linear GQA", 1), ("residual_mlp GQA", 1)):
        expected = 2 * 2 * 2 * (8 + 3) * kv_heads * head_dim * 4
        assert results[label]["kv_cache_mib"] * 2**20 == pytest.approx(expected)
    assert results["residual_mlp"]["params"] > results["linear"]["params"] > results["identity"]["params"]


def test_a_subset_of_variants_and_bf16_weights(capsys: pytest.CaptureFixture) -> None:
    assert run_cli(inference_speed.main, [*TINY, "--variants", "linear", "residual_mlp", "--autocast", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "bf16 weights" in out
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")][1:]
    assert rows == ["linear", "residual_mlp"]


@pytest.mark.parametrize("argv,fragment", [
    (["--batch", "0"], "--batch must be at least 1"),
    (["--heads", "5"], "--heads 5 must divide --dim 32"),
    (["--kv-heads", "3"], "--kv-heads 3 must divide --heads 4"),
    (["--variants", "quadratic"], "invalid choice: 'quadratic'"),
    (["--warmup", "-1"], "--warmup must be at least 0"),
])
def test_bad_input_is_one_line(argv: list[str], fragment: str, capsys: pytest.CaptureFixture) -> None:
    assert run_cli(inference_speed.main, [*TINY, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and fragment in err[0]
