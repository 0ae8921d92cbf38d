"""Config loading: TOML + overrides, types, ranges, did-you-mean, extends, round trip."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from torchnlq.config.job_config import JobConfig
from torchnlq.config.manager import load_job_config
from torchnlq.config.render import help_text, iter_options, markdown_reference, to_toml
from torchnlq.errors import ConfigError

from helpers import REPO_ROOT

CONFIGS = sorted((REPO_ROOT / "train_configs").glob("*.toml"))


def write(tmp_path: Path, text: str, name: str = "c.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_overrides_both_syntaxes_and_nested_sections() -> None:
    cfg = load_job_config([
        "--training.steps", "7", "--optimizer.lr=1e-3", "--model.query.type", "residual_mlp",
        "--model.query.half_scale=false", "--training.compile", "--model.n_kv_heads", "none",
    ])
    assert cfg.training.steps == 7
    assert cfg.optimizer.lr == 1e-3
    assert cfg.model.query.type == "residual_mlp"
    assert cfg.model.query.half_scale is False
    assert cfg.training.compile is True
    assert cfg.model.n_kv_heads is None


def test_file_then_overrides_in_order(tmp_path: Path) -> None:
    path = write(tmp_path, "[training]\nsteps = 3\nseq_len = 64\n[optimizer]\nlr = 1\n")
    cfg = load_job_config([path, "--training.steps=9"])
    assert (cfg.training.steps, cfg.training.seq_len) == (9, 64)
    assert cfg.optimizer.lr == 1.0 and isinstance(cfg.optimizer.lr, float)  # int widened


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--training.stpes=3"], "did you mean 'steps'"),
        (["--trainng.steps=3"], "did you mean 'training'"),
        (["--model.query.tpye=linear"], "did you mean 'type'"),
        (["--training.steps=abc"], "training.steps expects an integer"),
        (["--training.steps=0"], "training.steps must be >= 1"),
        (["--optimizer.lr=0"], "optimizer.lr must be > 0"),
        (["--optimizer.beta2=1.5"], "optimizer.beta2 must be < 1.0"),
        (["--training.mixed_precision=fp8"], "training.mixed_precision"),
        (["--training.compile=maybe"], "expects true or false"),
        (["--model.query=x"], "is a section"),
        (["--steps=3"], "--section.key"),
        (["--training.steps"], "needs a value"),
        (["does_not_exist.toml"], "not found"),
        (["a.toml", "b.toml"], "two config files given"),
    ],
)
def test_bad_overrides_are_one_line_errors(args: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_job_config(args)
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("[trainig]\nsteps = 3\n", "did you mean 'training'"),
        ("[training]\nsteps = \"ten\"\n", "training.steps expects int"),
        ("[training]\nsteps = 2.5\n", "training.steps expects int"),
        ("[training]\ncompile = 1\n", "training.compile expects bool"),
        ("[model.quer]\ntype = \"linear\"\n", "did you mean 'query'"),
        ("steps = 3\n", "outside any section"),
        ("[training\nsteps = 3\n", "not valid TOML"),
        ("[data]\ntokenizer = \"gpt3\"\n", "did you mean 'gpt2'"),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_job_config([write(tmp_path, text)])
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_extends_applies_base_first_and_detects_cycles(tmp_path: Path) -> None:
    write(tmp_path, "[training]\nsteps = 5\nseq_len = 32\n", "base.toml")
    child = write(tmp_path, 'extends = "base.toml"\n[training]\nsteps = 8\n', "child.toml")
    cfg = load_job_config([child])
    assert (cfg.training.steps, cfg.training.seq_len) == (8, 32)
    loop = write(tmp_path, 'extends = "loop.toml"\n', "loop.toml")
    with pytest.raises(ConfigError, match="extends itself"):
        load_job_config([loop])


def test_a_description_never_describes_another_run(tmp_path: Path) -> None:
    """Options changed after the file that wrote job.description (a child config, an override) are appended to it."""
    base = write(tmp_path, '[job]\ndescription = "linear query"\n[model.query]\ntype = "linear"\n', "base.toml")
    assert load_job_config([base, "--model.query.type=residual_mlp", "--optimizer.lr=0.01"]).job.description == (
        "linear query [changed: model.query.type=residual_mlp, optimizer.lr=0.01]")
    child = write(tmp_path, 'extends = "base.toml"\n[model.query]\ntype = "identity"\n', "child.toml")
    assert load_job_config([child]).job.description == "linear query [changed: model.query.type=identity]"
    # Where the run lives, what it logs, a value set again unchanged: the description still holds.
    same = [base, "--model.query.type=linear", "--job.name=x", "--metrics.log_interval=3", "--checkpoint.enabled"]
    assert load_job_config(same).job.description == "linear query"
    own = write(tmp_path, 'extends = "base.toml"\n[job]\ndescription = "identity"\n[model.query]\ntype = "identity"\n')
    assert load_job_config([own]).job.description == "identity"
    assert load_job_config([base, "--model.query.type=identity", "--job.description=mine"]).job.description == "mine"
    # The resolved config.toml of a run says what it ran, and reads back as the same run.
    flagged = load_job_config([base, "--model.query.type=identity"])
    assert load_job_config([write(tmp_path, to_toml(flagged), "resolved.toml")]) == flagged
    # Run again with another override, it keeps one list with each option's newest value (TOML spelling).
    again = load_job_config([write(tmp_path, to_toml(flagged), "resolved.toml"), "--model.query.type=residual",
                             "--debug.deterministic=true"])
    assert again.job.description == "linear query [changed: model.query.type=residual, debug.deterministic=true]"


def test_a_description_that_follows_the_options_is_no_resume_change() -> None:
    from torchnlq.train.preflight import resume_changes

    saved = load_job_config(["train_configs/shakespeare_tiny.toml", "--training.steps=30"])
    current = load_job_config(["train_configs/shakespeare_tiny.toml", "--training.steps=60"])
    assert saved.job.description != current.job.description
    assert [line.split(" changed")[0] for line in resume_changes(saved, current)] == ["training.steps"]


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = load_job_config(["--model.query.type=residual_mlp", "--lr_schedule.decay_steps=40", "--job.name=a \"b\""])
    text = to_toml(cfg)
    tomllib.loads(text)  # valid TOML
    assert load_job_config([write(tmp_path, text)]) == cfg


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load(path: Path) -> None:
    cfg = load_job_config([str(path)])
    assert cfg.job.name == path.stem


def test_paper_profile_of_gpt_small_configs() -> None:
    base = load_job_config([str(REPO_ROOT / "train_configs/gpt_small_baseline.toml")])
    best = load_job_config([str(REPO_ROOT / "train_configs/gpt_small_res_gelu.toml")])
    for cfg in (base, best):
        t = cfg.training
        assert (t.micro_batch_size, t.grad_accum_steps, t.seq_len, t.steps) == (12, 40, 1024, 60003)
        assert t.mixed_precision == "bf16" and t.compile
        assert t.micro_batch_size * t.grad_accum_steps * t.seq_len == 491_520
    assert (best.optimizer.lr, best.lr_schedule.min_lr, best.optimizer.weight_decay) == (3e-3, 3e-5, 2**-5)
    assert best.model.query.type == "residual_mlp"
    assert (base.optimizer.lr, base.lr_schedule.min_lr, base.optimizer.weight_decay) == (6e-4, 6e-5, 0.1)


def test_every_option_has_a_doc_and_appears_in_help_and_docs() -> None:
    from torchnlq.train.registries import registry_choices

    registries = registry_choices()
    text = help_text(registries=registries)
    table = markdown_reference(registries=registries)
    docs = (REPO_ROOT / "docs" / "configs.md").read_text()
    for name, field, _ in iter_options(JobConfig()):
        assert field.metadata.get("doc"), f"{name} has no doc"
        assert f"--{name}" in text
        assert f"`{name.rsplit('.', 1)[1]}`" in table
    assert table in docs, "docs/configs.md is stale: regenerate it with python scripts/gen_config_docs.py"


def test_the_docs_options_tables_show_each_doc_whole() -> None:
    """A ``|`` inside a doc (|f(X)|) is escaped: a Markdown parser reads each option's doc back whole."""
    markdown_it = pytest.importorskip("markdown_it")
    from torchnlq.train.registries import registry_choices

    table = markdown_reference(registries=registry_choices())
    tokens = markdown_it.MarkdownIt("commonmark").enable("table").parse(table)
    rows: list[list[str]] = []
    in_row = False
    for token in tokens:
        in_row = (in_row or token.type == "tr_open") and token.type != "tr_close"
        if token.type == "tr_open":
            rows.append([])
        elif token.type == "inline" and in_row:
            rows[-1].append(token.content)
    docs: dict[str, set[str]] = {}  # key -> its doc cells as a reader sees them (a key name may recur)
    for row in rows:
        docs.setdefault(row[0].strip("`"), set()).add(row[3])
    assert "|f(X)|" in next(iter(docs["query_diagnostics_interval"]))
    for name, field, _ in iter_options(JobConfig()):
        assert field.metadata["doc"] in docs[name.rsplit(".", 1)[1]], name


def test_registry_backed_options_list_the_registries_names() -> None:
    """The choice lists are written once, in the registries: help and docs show exactly those names."""
    from torchnlq.models.family import FAMILIES, FLAVORS
    from torchnlq.models.query import ACTIVATIONS, QUERY_NORMS, QUERY_TYPES
    from torchnlq.parallel.activation_checkpoint import MODES
    from torchnlq.train.lr_schedule import DECAY_SHAPES, SCHEDULES
    from torchnlq.train.optim import GROUP_OPTIMIZERS, KINDS, OPTIMIZERS
    from torchnlq.train.registries import registry_choices

    expected = {
        "model.flavor": FLAVORS, "model.family": FAMILIES, "model.query.type": QUERY_TYPES,
        "model.query.activation": ACTIVATIONS, "model.query.input_norm": QUERY_NORMS, "model.query.output_norm": QUERY_NORMS,
        "optimizer.name": OPTIMIZERS, "optimizer.groups.kind": KINDS, "optimizer.groups.optimizer": GROUP_OPTIMIZERS,
        "lr_schedule.name": SCHEDULES, "lr_schedule.decay_shape": DECAY_SHAPES, "activation_checkpoint.mode": MODES,
    }
    assert registry_choices() == {name: list(registry) for name, registry in expected.items()}
    text = help_text(registries=registry_choices())
    for name, registry in expected.items():
        if name.count(".") > 1 and not name.startswith("model.query."):  # a [[section.key]] entry's: in the docs
            continue
        assert f"--{name}\n      " in text
        assert "one of " + "|".join(registry) in text.split(f"--{name}\n", 1)[1].split("\n", 1)[0]


def test_job_config_file_is_the_positional_config(tmp_path: Path) -> None:
    path = write(tmp_path, '[job]\nname = "from_file"\n[training]\nsteps = 7\n')
    positional = load_job_config([path, "--training.steps=9"])
    assert load_job_config(["--job.config_file", path, "--training.steps=9"]) == positional
    assert load_job_config([f"--job.config_file={path}", "--training.steps=9"]) == positional
    assert (positional.job.name, positional.training.steps) == ("from_file", 9)
    with pytest.raises(ConfigError, match="two config files given"):
        load_job_config([path, "--job.config_file", path])
    with pytest.raises(ConfigError, match="--job.config_file needs a TOML file"):
        load_job_config(["--job.config_file"])


def test_help_with_a_config_shows_the_values_it_sets(tmp_path: Path) -> None:
    path = write(tmp_path, '[job]\nname = "mine"\n[optimizer]\nlr = 0.0123\n')
    cfg = load_job_config([path, "--training.steps=77"])
    text = help_text(cfg, source=path)

    def entry(name: str) -> str:  # the lines of one option, up to the next option
        return text.split(f"  --{name}\n", 1)[1].split("\n  --", 1)[0]

    assert 'this config: "mine"' in entry("job.name")
    assert "this config: 0.0123" in entry("optimizer.lr") and "[default: 0.0006" in entry("optimizer.lr")
    assert "this config: 77" in entry("training.steps")
    assert "this config" not in entry("training.seq_len")  # left at its default
    assert "this config" not in help_text()


@pytest.mark.integration
def test_run_train_print_config_and_help_write_nothing(tmp_path: Path) -> None:
    from helpers.train import run_train

    config = REPO_ROOT / "train_configs" / "gpt_small_res_gelu.toml"
    printed = run_train(tmp_path, config, "--training.steps", "40", "--print-config", timeout=120)
    assert printed.returncode == 0, printed.stderr
    # The printed TOML is the config the command line describes, and it loads back to the same thing.
    from torchnlq.train.preflight import check_job_config, resolved_config

    described = load_job_config([str(config), "--training.steps", "40"])
    expected = resolved_config(described, check_job_config(described))  # the flavor's options written out
    assert load_job_config([write(tmp_path, printed.stdout, "printed.toml")]) == expected
    assert expected.model.norm == "layer" and described.model.norm is None
    assert "warning: lr_schedule.warmup_steps=2000 is not shorter than training.steps=40" in printed.stderr
    helped = run_train(tmp_path, "--job.config_file", config, "--help", timeout=120)
    assert helped.returncode == 0 and 'this config: "gpt_small_res_gelu"' in helped.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["printed.toml"]  # no run folder, no cache
