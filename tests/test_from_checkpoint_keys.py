"""model.from_checkpoint and the keys a user sets (issue 47.3): the run's config wins for every [model] key it sets,
key by key, a value equal to the default included, however it is set (a flag, the file, a file it extends); a key
left alone, or unset again (``unset = [...]``), takes the folder's. A query type other than the folder's brings
none of the folder's query knobs (they describe the folder's type)."""

from __future__ import annotations

import dataclasses
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
    "a-knob-only": ({}, ["--model.query.bottleneck_ratio=0.5"], "residual_mlp"),
    "the-folders-type-and-a-knob": ({}, ["--model.query.type=residual_mlp", "--model.query.half_scale=false"],
                                    "residual_mlp"),
}
#: The query keys each way sets, with the values it sets them to (the rest: the folder's, or a new type's defaults).
SET = {"a-knob-only": {"bottleneck_ratio": 0.5}, "the-folders-type-and-a-knob": {"half_scale": False}}


@pytest.mark.parametrize("way", list(WAYS))
def test_the_query_a_config_sets_wins_over_the_folders(tmp_path: Path, way: str) -> None:
    files, flags, expected = WAYS[way]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    argv = [*([str(tmp_path / "run.toml")] if "run.toml" in files else []), *flags]
    taken = with_folder_model(load_job_config(argv).model, FOLDER)
    assert taken.query.type == expected
    if expected == "residual_mlp":  # the folder's query, but for the knobs the config sets
        assert taken.query == dataclasses.replace(FOLDER.query, **SET.get(way, {}))
    else:  # another type: its own defaults, none of the folder's knobs
        assert taken.query == Query(type=expected)
    assert (taken.n_layers, taken.dim, taken.n_heads) == (2, 32, 2)  # sizes the config leaves unset: the folder's


@pytest.mark.parametrize("flags,top_k,n_experts", [([], 1, 4), (["--model.moe.top_k=2"], 2, 4),
                                                  (["--model.moe.n_experts=6"], 1, 6)],
                         ids=["nothing", "equal-to-the-default", "another-key"])
def test_a_family_sections_keys_the_config_sets_win_a_value_equal_to_the_default_too(flags: list[str], top_k: int,
                                                                                      n_experts: int) -> None:
    from torchnlq.models.moe.config import MoE

    default = MoE()
    folder = ModelArgs(family="moe", n_layers=2, dim=32, n_heads=2, vocab_size=64, max_seq_len=32,
                       moe=MoE(n_experts=4, top_k=1, expert_hidden=16))
    assert default.top_k == 2 != folder.moe.top_k  # the flag's value is the default, not the folder's
    taken = with_folder_model(load_job_config(["--model.family=moe", *flags]).model, folder)
    assert (taken.moe.top_k, taken.moe.n_experts) == (top_k, n_experts)
    assert taken.moe.expert_hidden == 16  # a key left alone: the folder's
