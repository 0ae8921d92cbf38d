"""Loss regression: the debug run's per-step losses, for the main query types, against stored files.

Each case of tests/helpers/loss_baselines.py (residual_mlp, the paper's query; linear; identity; residual;
a Llama-style block) trains 30 steps again, in-process on one CPU thread, and every training loss and
validation loss must match tests/data/loss_baselines/<case>.json within TOLERANCE, or the test fails with
the per-step table. A deliberate change of the numerics is re-blessed with
``python tests/helpers/loss_baselines.py [CASE]``.

TOLERANCE is relative, |new - stored| / |stored| per step: 1e-5. Measured on this machine (2-core CPU, the
same torch wheel, float32; docs/training.md, "Loss regression"): the same run twice, or in-process against
./run_train.sh, is bitwise equal; two threads instead of one sum in another order and move the losses by up
to 4e-7 within 30 steps; a CPU with other vector instructions (AVX-512 against AVX2) may differ in the last
bits in the same way, and is why the tolerance is not 0. A code change of the numerics moves them by far
more: an init std changed by 1% by 2e-3 (test_a_changed_init_fails below), by 0.01% still by 3e-5.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.loss_baselines import CASES, FOLDER, train_case

from torchnlq.experiments.loss_compare import Losses, difference_table, read_loss_file
from torchnlq.models.layers import MLP

TOLERANCE = 1e-5


def beyond_tolerance(stored: Losses, new: Losses) -> list[str]:
    """Every step missing from the new run, or whose loss moved by more than TOLERANCE relative to the stored one."""
    bad = []
    for kind in ("train", "val"):
        for step, old in stored[kind].items():
            if step not in new[kind] or not abs(new[kind][step] - old) <= TOLERANCE * abs(old):
                bad.append(f"{kind} step {step}")
        bad += [f"{kind} step {step} is new" for step in new[kind].keys() - stored[kind].keys()]
    return bad


# The paper's query stays in the fast tier as the sentinel of the numerics; the other cases train in integration.
@pytest.mark.parametrize("case", [case if case == "residual_mlp" else pytest.param(case, marks=pytest.mark.integration)
                                  for case in CASES])
def test_losses_match_the_stored_ones(case: str, tmp_path: Path) -> None:
    stored = read_loss_file(FOLDER / f"{case}.json")
    new = train_case(case, tmp_path)
    assert len(stored["train"]) == 30 and len(stored["val"]) == 3  # every step's loss, validation at 10, 20, 30
    if bad := beyond_tolerance(stored, new):
        table, _ = difference_table(stored, new, TOLERANCE)
        pytest.fail(f"the losses of case {case} moved beyond the relative tolerance {TOLERANCE:g} at {len(bad)} "
                    f"steps ({', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}).\n"
                    f"A = stored ({FOLDER / case}.json), B = this run:\n{table}\nIf the change of the numerics is "
                    f"deliberate, re-bless: python tests/helpers/loss_baselines.py {case}")


@pytest.mark.integration  # trains
def test_a_changed_init_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The check the issue asks for: with the MLP's down-projection drawn at a 1% larger std, the test above fails,
    loudly: every step beyond the tolerance, each marked in the table, and the command that re-blesses."""
    drawn = MLP.init_weights
    monkeypatch.setattr(MLP, "init_weights",
                        lambda self, init_std, residual_std: drawn(self, init_std, residual_std * 1.01))
    with pytest.raises(pytest.fail.Exception) as failed:
        test_losses_match_the_stored_ones("residual_mlp", tmp_path)
    message = str(failed.value)
    assert "beyond the relative tolerance 1e-05 at 33 steps (train step 1, train step 2, train step 3 ...)" in message
    assert message.count(" *\n") == 33  # all 30 training steps and the 3 validations, marked in the table
    assert message.endswith("re-bless: python tests/helpers/loss_baselines.py residual_mlp")
