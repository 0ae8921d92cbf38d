"""model_summary.py says on its first line which config it describes (issue 49.2): the file it was given, or that
it took the built-in defaults, which are not the model ./run_train.sh trains without a config."""

from __future__ import annotations

import pytest

from helpers import REPO_ROOT

from torchnlq.config.manager import load_job_config
from torchnlq.models import num_params
from torchnlq.train.preflight import check_job_config

TRAINER_DEFAULT = str(REPO_ROOT / "train_configs" / "debug_model.toml")  # run_train.sh's CONFIG_FILE default


def summary_lines(argv: list[str], capsys: pytest.CaptureFixture) -> list[str]:
    from torchnlq.train.summary import main

    assert main(argv) == 0
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("given", ["none", "positional", "config-file-option", "config-file-option-spaced"])
@pytest.mark.parametrize("flavor", ["debug", "moe_debug"])
def test_the_first_line_names_the_config_the_summary_describes(given: str, flavor: str,
                                                               capsys: pytest.CaptureFixture) -> None:
    config = {"none": [], "positional": [TRAINER_DEFAULT],
              "config-file-option": [f"--job.config_file={TRAINER_DEFAULT}"],
              "config-file-option-spaced": ["--job.config_file", TRAINER_DEFAULT]}[given]
    argv = [*config, "--model.flavor", flavor]
    lines = summary_lines(argv, capsys)
    if given == "none":
        assert lines[0].startswith("config: none, the built-in defaults")
        assert "train_configs/debug_model.toml" in lines[0]
    else:
        assert lines[0] == f"config: {TRAINER_DEFAULT}"
    # The model it then describes is the one the trainer builds from the same command (run_train.sh adds its
    # default file when none is given: the summary says it did not).
    trainer = check_job_config(load_job_config(argv if config else [TRAINER_DEFAULT, *argv]))
    total = int(next(line for line in lines if line.startswith("total_params:")).split()[1].replace(",", ""))
    assert (total == num_params(trainer)) == bool(config)
