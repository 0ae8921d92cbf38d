"""model.from_checkpoint and the keys a user sets (issue 47.3): the run's config wins for every [model.query] key it
sets, a type equal to the default included, however it is set (a flag, the file, a file it extends); a key left
alone, or unset again (``unset = [...]``), takes the folder's."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchnlq.config.job_config import Query
from torchnlq.config.manager import load_job_config
from torchnlq.models import ModelArgs
from torchnlq.models.family import with_folder_model

#: The folder's model: a nonlinear query, so a run's linear (the default) shows whether it won.
FOLDER = ModelArgs(n_layers=2, dim=32, n_heads=2, vocab_size=64, max_seq_len=32,
                   query=Query(type="residual_mlp", bottleneck_ratio=0.25))

#: How a config may say something about the query: (files, flags) -> the query type the run must take.
WAYS = {
    "nothing": ({}, [], "residual_mlp"),
    "flag-equal-to-the-default": ({}, ["--model.query.type=linear"], "linear"),
    "flag-other-type": ({}, ["--model.query.type=identity"], "identity"),
    "file-equal-to-the-default": ({"run.toml": '[model.query]\ntype = "linear"\n'}, [], "linear"),
    "extended-file-equal-to-the-default": (
        {"base.toml": '[model.query]\ntype = "linear"\n', "run.toml": 'extends = "base.toml"\n'}, [], "linear"),
    "unset-again": ({"base.toml": '[model.query]\ntype = "linear"\n',
                     "run.toml": 'extends = "base.toml"\nunset = ["model.query.type"]\n'}, [], "residual_mlp"),
    "a-knob-only": ({}, ["--model.query.bottleneck_ratio=0.5"], "linear"),
}


@pytest.mark.parametrize("way", list(WAYS))
def test_the_query_a_config_sets_wins_over_the_folders(tmp_path: Path, way: str) -> None:
    files, flags, expected = WAYS[way]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    argv = [*([str(tmp_path / "run.toml")] if "run.toml" in files else []), *flags]
    taken = with_folder_model(load_job_config(argv).model, FOLDER)
    assert taken.query.type == expected
    if expected == "residual_mlp":  # the folder's whole query, its knobs too
        assert taken.query == FOLDER.query
    assert (taken.n_layers, taken.dim, taken.n_heads) == (2, 32, 2)  # sizes the config leaves unset: the folder's
