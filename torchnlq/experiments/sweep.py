"""``[sweep]``: a search over config keys with Optuna, one study per arm of the suite (docs/experiments.md, "Sweeps").

The suite's runs (its ``[[runs]]`` entries crossed with its ``[grid]``, or its one config) are the arms; each gets
a study of ``trials`` trials in one storage (SQLite in the suite's folder unless ``storage`` says otherwise).
A trial is an ordinary run folder, ``<dump>/<arm>/trial-<number>``, trained by run_train.sh on the same batches
as every other trial; experiments/sweep_worker.py runs them, experiments/tuned.py turns the studies' best trials
into configs and reruns. Optuna is imported only here and below (``pip install -e '.[sweep]'``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchnlq.config.job_config import option
from torchnlq.config.manager import check_keys, load_job_config, load_table
from torchnlq.errors import UserError
from torchnlq.experiments.suite import Suite, SuiteRun, format_value, override_keys
from torchnlq.train.preflight import check_registry_names

if TYPE_CHECKING:
    import optuna

SAMPLERS = ("tpe", "random", "grid", "cmaes")
PRUNERS = ("none", "median", "successive_halving", "hyperband")
RANGE_KEYS = ("low", "high", "log", "step")
#: The default storage, in the suite's dump folder.
DEFAULT_DB = "sweep.db"


@dataclass(frozen=True)
class Param:
    """One searched config key: a float or integer range (``log``, ``step``) or a list of choices."""

    key: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] | None = None

    @property
    def is_int(self) -> bool:
        return self.choices is None and all(isinstance(v, int) for v in (self.low, self.high, self.step or 1))

    def suggest(self, trial: optuna.Trial) -> Any:
        """This parameter's value for ``trial``, drawn by the study's sampler."""
        if self.choices is not None:
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.is_int:
            return trial.suggest_int(self.key, int(self.low), int(self.high), step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.key, float(self.low), float(self.high), step=self.step, log=self.log)

    def grid_values(self) -> list[Any] | None:
        """The values a grid search visits (None for a float range without a step)."""
        if self.choices is not None:
            return list(self.choices)
        if self.is_int:
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        if self.step is not None:
            count = int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
            return [self.low + i * self.step for i in range(count)]
        return None


@dataclass(frozen=True)
class SweepSpec:
    """The ``[sweep]`` table, checked (its ``[sweep.params]``: :class:`Param`\\ s)."""

    params: tuple[Param, ...] = option((), "The config keys searched ([sweep.params]): a list of choices, or a range "
                                       "{low, high, log, step}.")
    trials: int | None = option(None, "Trials of each arm's study (its budget); a grid: its size by default.", min=1)
    sampler: str = option("tpe", "Optuna's sampler.", choices=SAMPLERS)
    sampler_options: dict[str, Any] | None = option(None, "Keyword arguments of the sampler, e.g. "
                                                    "{n_startup_trials = 3}.")
    seed: int = option(0, "The sampler's seed (trial N asks with seed + N).")
    pruner: str = option("median", "Optuna's pruner (none: every trial to its end).", choices=PRUNERS)
    pruner_options: dict[str, Any] | None = option(None, "Keyword arguments of the pruner.")
    objective_tokens: int | None = option(None, "The objective: the validation loss after this many training tokens "
                                          "(unset: at the run's end).", min=1)
    storage: str | None = option(None, "Optuna's storage: an SQLAlchemy URL or a journal file path (unset: "
                                 "sweep.db in the suite's folder).")
    study: str | None = option(None, "The studies' name prefix (unset: the suite's name).")
    rerun_seeds: list[int] = option([], "Seeds each arm's best config is rerun at, then compared.")
    rerun_overrides: list[str] = option(
        [], "Overrides of those reruns, e.g. [\"--model.dim=768\"]: train another width with the values tuned here "
        "(µP's transfer: docs/mup.md); the searched keys and job.* are not allowed.")
    poll_seconds: float = option(5.0, "Seconds between a worker's looks at its run's validations.", min=0,
                                 min_exclusive=True)
    heartbeat_seconds: int = option(60, "Database storage: seconds between a running trial's heartbeats; a trial "
                                    "with none for twice that has lost its worker and is taken over.", min=1)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_drawn_value(where: str, key: str, value: Any) -> None:
    try:
        check_registry_names(load_job_config([f"--{key}={format_value(value)}"]))
    except UserError as e:
        raise UserError(f"{where}: '{key}' = {value!r}: {e}") from None


def parse_param(where: str, key: str, spec: Any) -> Param:
    """``[1, 2]`` (choices) or ``{low, high, log, step}`` (a range; integers when low, high and step are)."""
    if key.startswith("job."):
        raise UserError(f"{where}: '{key}' names the run, not a setting; search over training settings")
    if isinstance(spec, list):
        if not spec or not all(isinstance(v, (str, int, float, bool)) for v in spec):
            raise UserError(f"{where}: '{key}' needs a non-empty list of values (strings, numbers, booleans)")
        if len(set(map(repr, spec))) != len(spec):
            raise UserError(f"{where}: '{key}' lists a value twice; list each choice once")
        for value in spec:
            _check_drawn_value(where, key, value)
        return Param(key, choices=tuple(spec))
    if not isinstance(spec, dict):
        raise UserError(f"{where}: '{key}' must be a list of choices or a range {{low = ..., high = ...}}, "
                        f"got {spec!r}")
    try:
        check_keys("range", spec, RANGE_KEYS)
    except UserError as e:
        raise UserError(f"{where}: '{key}': {e}") from None
    low, high, log, step = spec.get("low"), spec.get("high"), spec.get("log", False), spec.get("step")
    if not (_number(low) and _number(high)) or low >= high:
        raise UserError(f"{where}: '{key}' needs numbers low < high, got low = {low!r}, high = {high!r}")
    if not isinstance(log, bool):
        raise UserError(f"{where}: '{key}': log must be true or false, got {log!r}")
    if log and low <= 0:
        raise UserError(f"{where}: '{key}': a log range needs low > 0, got {low!r}")
    if step is not None and (not _number(step) or step <= 0 or log):
        raise UserError(f"{where}: '{key}': step must be a positive number, and not with log = true (got {step!r})")
    param = Param(key, low, high, log, step)
    for value in (low, high):
        _check_drawn_value(where, key, int(value) if param.is_int else float(value))
    return param


def parse_sweep(suite: Suite, options: dict[str, str]) -> SweepSpec:
    """The suite's ``[sweep]`` with ``--sweep.KEY VALUE`` on top, checked against the suite's runs (its arms)."""
    where = f"{suite.path}: [sweep]"
    if suite.sweep is None:
        if options:
            raise UserError(f"--sweep.{next(iter(options))}: {suite.path} has no [sweep] table to change")
        raise UserError(f"{suite.path} has no [sweep] table")
    table = {k: v for k, v in suite.sweep.items() if k != "params"}
    spec = load_table(SweepSpec, str(suite.path), "sweep", table, {k: v for k, v in options.items() if k != "params"})
    if spec.storage is not None:
        check_storage(where, spec.storage)
    raw = suite.sweep.get("params")
    if not isinstance(raw, dict) or not raw or "params" in options:
        raise UserError(f"{where} needs [sweep.params]: the config keys to search, e.g. "
                        "\"optimizer.lr\" = {low = 1e-4, high = 1e-2, log = true}")
    params = tuple(parse_param(f"{where}.params", key, spec) for key, spec in raw.items())
    for run in suite.runs:
        own = override_keys(run.overrides) & set(raw)
        if own:
            raise UserError(f"{where}: '{sorted(own)[0]}' is searched, and run '{run.name}' sets it too; remove it "
                            "from the run (the search would override it) or from [sweep.params]")
    if len(set(spec.rerun_seeds)) != len(spec.rerun_seeds):
        raise UserError(f"{where}: rerun_seeds must be a list of distinct integer seeds, got {spec.rerun_seeds!r}")
    if spec.rerun_seeds and "training.seed" in raw:
        raise UserError(f"{where}: training.seed is searched, so reruns at rerun_seeds would change the setting "
                        "found; search other keys, or drop rerun_seeds")
    for override in spec.rerun_overrides:
        key = override.removeprefix("--").split("=", 1)[0]
        if not override.startswith("--") or "=" not in override or key.startswith("job.") or key in raw:
            raise UserError(f"{where}: rerun_overrides entry {override!r} must be --key=value of a setting that is "
                            "neither searched nor job.* (e.g. \"--model.dim=768\")")
        try:
            load_job_config([override])
        except UserError as e:
            raise UserError(f"{where}: rerun_overrides: {e}") from None
    if spec.rerun_overrides and not spec.rerun_seeds:
        raise UserError(f"{where}: rerun_overrides change the reruns, but rerun_seeds is empty: give the seeds")
    _check_objective(where, suite, spec, set(raw))
    trials = spec.trials
    if spec.sampler == "grid":
        size = 1
        for param in params:
            grid = param.grid_values()
            if grid is None:
                raise UserError(f"{where}: sampler = 'grid' needs values to visit: '{param.key}' is a float range "
                                "without a step (give a step, or a list of choices)")
            size *= len(grid)
        trials = size if trials is None else trials
        if trials > size:
            raise UserError(f"{where}: trials = {trials} but the grid has {size} points; a grid visits each once")
    if trials is None:
        raise UserError(f"{where} needs trials: how many trials each arm's study runs (its budget)")
    try:
        import optuna  # noqa: F401 - only whether it is there
    except ImportError:
        raise UserError(f"{suite.path} has a [sweep], which needs Optuna: pip install -e '.[sweep]'") from None
    spec = replace(spec, params=params, trials=trials)
    build_sampler(spec, spec.seed)  # their options are checked now, before anything runs
    build_pruner(spec)
    return spec


# ----- the studies ---------------------------------------------------------------------------------------


class Sweep:
    """A suite with its ``[sweep]``: the arms, their studies in one storage, and where each trial runs."""

    def __init__(self, suite: Suite, spec: SweepSpec) -> None:
        self.suite, self.spec = suite, spec
        self.dump = suite.dump_folder
        #: The suite's runs, each searched as one study; an arm's trials' folders are ``<dump>/<arm>/trial-N``.
        self.arms: list[SuiteRun] = list(suite.runs)
        self._storage: Any = None

    @property
    def storage_url(self) -> str:
        """The storage as given, or the SQLite file in the dump folder (absolute: workers may start elsewhere)."""
        return self.spec.storage or f"sqlite:///{(self.dump / DEFAULT_DB).resolve()}"

    def study_name(self, arm: SuiteRun) -> str:
        return f"{self.spec.study or self.suite.name}/{arm.name}"

    def storage(self) -> Any:
        """Optuna's storage object (opened once; SQLite waits up to a minute for another worker's write)."""
        if self._storage is None:
            self._storage = open_storage(self.storage_url, self.dump, self.spec.heartbeat_seconds)
        return self._storage

    @property
    def journal(self) -> bool:
        """Whether the storage is a journal file (no heartbeats there: workers claim their trials by flock)."""
        return "://" not in self.storage_url

    def stored(self) -> bool:
        """Whether the storage may hold studies already (the default SQLite file exists; any other: yes)."""
        return self.spec.storage is not None or (self.dump / DEFAULT_DB).is_file()

    def study(self, arm: SuiteRun, sampler_seed: int | None = None, create: bool = True) -> optuna.Study | None:
        """The arm's study with this sweep's sampler (seeded by ``sampler_seed``) and pruner; made if missing, or
        with ``create=False`` None (nothing is written: --status)."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if not create and not self.stored():
            return None
        sampler, pruner = build_sampler(self.spec, sampler_seed), build_pruner(self.spec)
        try:
            if not create:
                return optuna.load_study(storage=self.storage(), study_name=self.study_name(arm), sampler=sampler,
                                         pruner=pruner)
            return optuna.create_study(storage=self.storage(), study_name=self.study_name(arm), direction="minimize",
                                       load_if_exists=True, sampler=sampler, pruner=pruner)
        except KeyError:  # load_study: no such study yet
            return None
        except optuna.exceptions.OptunaError as e:
            raise UserError(f"sweep storage {self.storage_url}: {e}") from None

    def arm_config(self, arm: SuiteRun) -> dict[str, Any]:
        """What the arm's trials train, apart from the searched keys: its resolved options (not where the run lives
        or what it logs), recorded in its study so that an edited suite does not merge into old trials."""
        from torchnlq.config.render import iter_options

        searched = {p.key for p in self.spec.params}
        cfg = load_job_config(arm.argv())
        return {name: value for name, _, value in iter_options(cfg) if name not in searched
                and not name.startswith(("job.", "metrics.", "checkpoint.")) and isinstance(value, (str, int, float,
                                                                                                    bool, type(None)))}

    def check_studies(self) -> None:
        """Make every arm's study and refuse one that an earlier, different [sweep] left (another search space), or
        whose trials trained another configuration than the suite's arm now gives (its recorded arm_config)."""
        wanted = {p.key for p in self.spec.params}
        for arm in self.arms:
            study = self.study(arm)
            config, recorded = self.arm_config(arm), study.user_attrs.get("arm_config")
            if recorded is None:
                study.set_user_attr("arm_config", config)
            elif recorded != config:
                key = next(k for k in sorted(set(config) | set(recorded)) if config.get(k) != recorded.get(k))
                raise UserError(
                    f"study '{self.study_name(arm)}' in {self.storage_url}: its trials trained {key} = "
                    f"{recorded.get(key)!r}, and the suite's arm '{arm.name}' now gives {config.get(key)!r}; use a new "
                    "study name (study = ...) or storage, or move the old one away, rather than mix the two")
            for trial in study.get_trials(deepcopy=False):
                if trial.distributions and set(trial.distributions) != wanted:
                    raise UserError(
                        f"study '{self.study_name(arm)}' in {self.storage_url} searched "
                        f"{', '.join(sorted(trial.distributions))}, and this [sweep] searches "
                        f"{', '.join(sorted(wanted))}; "
                        "use a new study name (study = ...) or storage, or move the old one away")

    def trial_dir(self, arm: SuiteRun, number: int) -> Path:
        """The run folder of the trial numbered ``number`` (a retry's is its original's: see run_number)."""
        return self.dump / arm.name / f"trial-{number}"

    def trial_run(self, arm: SuiteRun, number: int, params: dict[str, Any]) -> SuiteRun:
        """The run of one trial: the arm's command with the trial's values, in its own folder."""
        values = tuple(f"--{key}={format_value(value)}" for key, value in params.items())
        fixed = (f"--job.name=trial-{number}", f"--job.dump_folder={self.dump / arm.name}")
        # The arm's own name and folder (load_suite's last two overrides) give way to the trial's.
        own = tuple(o for o in arm.overrides if not o.startswith(("--job.name=", "--job.dump_folder=")))
        return SuiteRun(f"trial-{number}", arm.name, arm.config, (*own, *values, *fixed), arm.steps)

    def counts(self, create: bool = True) -> dict[str, dict[str, int]]:
        """Per arm: its trials by state (COMPLETE, PRUNED, FAIL, RUNNING, WAITING), as Optuna's storage holds them;
        a trial retried after its worker was lost counts once, as its latest attempt (counted_trials)."""
        counts = {}
        for arm in self.arms:
            study = self.study(arm, create=create)
            states = [t.state.name for t in counted_trials(study)] if study is not None else []
            counts[arm.name] = {s: states.count(s) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")}
        return counts

    def done(self, create: bool = True) -> bool:
        """Every study has used its budget and no trial is still running (each arm's best is known)."""
        return all(sum(c.values()) >= self.spec.trials and not c["RUNNING"] and not c["WAITING"]
                   for c in self.counts(create).values())


@contextmanager
def quiet_experimental() -> Iterator[None]:
    """Optuna's ExperimentalWarning not shown (its heartbeat and retry API carry one, on every call)."""
    import warnings

    import optuna

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def retry_callback() -> Any:
    """Optuna's retry of a trial whose worker was lost: a WAITING copy (same values, user attrs and reported
    validation losses) that the next ``study.ask`` takes; unlimited retries, as a lost worker is no fault of the
    trial's."""
    import optuna

    with quiet_experimental():
        return optuna.storages.RetryHeartbeatStaleTrialCallback(inherit_intermediate_values=True)


def run_number(trial: Any) -> int:
    """The number whose folder a trial runs in: its own, or for a retry the original trial's (so a taken-over
    trial resumes its run folder from its checkpoint)."""
    import optuna

    with quiet_experimental():
        original = optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(trial)
    return trial.number if original is None else original


def counted_trials(study: Any) -> list[Any]:
    """A study's trials, each once: a FAIL attempt that was retried (its worker lost) is left out for its retry,
    so the trials counted against the budget are the trials started, whatever their workers' fates."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    with quiet_experimental():
        retried = {n for t in trials for n in optuna.storages.RetryHeartbeatStaleTrialCallback.retry_history(t)}
    return [t for t in trials if t.number not in retried]


#: A path that begins like a URL scheme ("sqlite:", "postgresql:") but has no "//": a mistyped URL, not a file name.
_SCHEME_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:(?!//)")


def check_storage(where: str, url: str) -> None:
    """The ``[sweep] storage`` a worker on another process (or machine) can open, checked before anything exists:
    an SQLAlchemy URL that parses and is not SQLite in memory (each process would get its own), or a journal file
    path in a folder that exists. UserError otherwise."""
    fix = "give an SQLAlchemy URL such as sqlite:///path/sweep.db, or a journal file path"
    if "://" not in url:
        if _SCHEME_LIKE.match(url):
            raise UserError(f"{where}: storage '{url}' looks like a URL without '//'; {fix}")
        folder = Path(url).expanduser().parent
        if not folder.is_dir():
            raise UserError(f"{where}: storage '{url}': the folder {folder} does not exist; make it, or {fix}")
        return
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as e:  # ValueError: a port that is not a number
        raise UserError(f"{where}: storage '{url}' is not an SQLAlchemy URL ({e}); {fix}") from None
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:") or parsed.database.startswith("file::memory:"):
            raise UserError(f"{where}: storage '{url}' is an in-memory SQLite database, which every worker would "
                            f"have on its own; {fix}")
        folder = Path(parsed.database).expanduser().parent
        if not folder.is_dir():
            raise UserError(f"{where}: storage '{url}': the folder {folder} does not exist; make it, or {fix}")


def open_storage(url: str, dump: Path, heartbeat_seconds: int = 60) -> Any:
    """An RDB URL (``sqlite:///…``, ``postgresql://…``) or a journal file path (many machines on a shared file
    system); a storage that cannot be opened is one line. A database storage gets Optuna's heartbeat: a RUNNING
    trial whose worker has not beaten for twice ``heartbeat_seconds`` is failed and retried (retry_callback)."""
    import optuna
    import sqlalchemy.exc

    from torchnlq.files import make_folder

    try:
        if "://" not in url:
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(url))
        kwargs: dict[str, Any] = {"heartbeat_interval": heartbeat_seconds,
                                  "heartbeat_stale_trial_callback": retry_callback()}
        if url.startswith("sqlite:///"):
            if url == f"sqlite:///{(dump / DEFAULT_DB).resolve()}":
                make_folder(dump)
            kwargs["engine_kwargs"] = {"connect_args": {"timeout": 60}}
        with quiet_experimental():
            return optuna.storages.RDBStorage(url, **kwargs)
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, ValueError, OSError) as e:
        reason = str(getattr(e, "orig", None) or e).splitlines()[0]
        raise UserError(f"sweep storage '{url}' cannot be opened ({reason}); give an SQLAlchemy URL such as "
                        "sqlite:///path/sweep.db, or a journal file path") from None


def _with_options(where: str, cls: Any, options: dict[str, Any] | None, **fixed: Any) -> Any:
    import inspect

    allowed = [p for p in inspect.signature(cls).parameters if p not in fixed]
    kwargs = dict(options or {})
    try:
        check_keys(where, kwargs, allowed)
        return cls(**fixed, **kwargs)
    except (TypeError, ValueError) as e:
        raise UserError(f"{where} of {cls.__name__}: {e}") from None


def build_sampler(spec: SweepSpec, seed: int | None) -> Any:
    """Optuna's sampler for ``spec.sampler``, seeded (each trial asks with its own seed: see sweep_worker)."""
    import optuna

    where = "sweep.sampler_options"
    if spec.sampler == "grid":
        space = {p.key: p.grid_values() for p in spec.params}
        return _with_options(where, optuna.samplers.GridSampler, spec.sampler_options, search_space=space, seed=seed)
    cls = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
           "cmaes": optuna.samplers.CmaEsSampler}[spec.sampler]
    if spec.sampler == "cmaes":
        try:
            import cmaes  # noqa: F401 - Optuna's CMA-ES sampler needs it
        except ImportError:
            raise UserError("sampler = 'cmaes' needs the cmaes package: pip install -e '.[sweep]'") from None
    return _with_options(where, cls, spec.sampler_options, seed=seed)


def build_pruner(spec: SweepSpec) -> Any:
    """Optuna's pruner for ``spec.pruner`` ("none": Optuna's NopPruner); it sees a trial's validation losses at
    the training tokens seen (its ``step`` counts tokens)."""
    import optuna

    cls = {"none": optuna.pruners.NopPruner, "median": optuna.pruners.MedianPruner,
           "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
           "hyperband": optuna.pruners.HyperbandPruner}[spec.pruner]
    return _with_options("sweep.pruner_options", cls, spec.pruner_options)


def objective_step(spec: SweepSpec, cfg: Any, world_size: int) -> int:
    """The step whose validation loss is a trial's objective: its last, or where it has seen objective_tokens
    tokens (a validation step: one line naming what to change when it is not)."""
    steps = cfg.training.steps
    if spec.objective_tokens is None:
        return steps
    per_step = cfg.training.tokens_per_step(world_size)
    step, rest = divmod(spec.objective_tokens, per_step)
    if rest or not 0 < step <= steps:
        raise UserError(f"objective_tokens = {spec.objective_tokens:,} is not a whole step of this run "
                        f"({per_step:,} tokens per step, {steps} steps): give a multiple of {per_step:,} up to "
                        f"{steps * per_step:,}")
    interval = cfg.validation.interval
    if not cfg.validation.enabled or (step != steps and step % interval):
        raise UserError(f"objective_tokens = {spec.objective_tokens:,} is step {step}, where the run does not "
                        f"validate (validation.interval = {interval}): make the interval divide {step}")
    return step


#: The keys a run's tokens per step come from: searched, they make objective_tokens a question for each trial.
_BATCH_KEYS = ("training.micro_batch_size", "training.grad_accum_steps", "training.seq_len")


def _check_objective(where: str, suite: Suite, spec: SweepSpec, searched: set[str]) -> None:
    """objective_tokens a whole number of every arm's steps on one process (then on any number), checked before
    any trial starts: a trial that fails on it would still count against the budget."""
    if spec.objective_tokens is None or searched & set(_BATCH_KEYS):
        return
    for run in suite.runs:
        per_step = load_job_config(run.argv()).training.tokens_per_step()
        if spec.objective_tokens % per_step:
            raise UserError(f"{where}: objective_tokens = {spec.objective_tokens:,} is not a whole step of run "
                            f"'{run.name}' ({per_step:,} tokens per step on one process): give a multiple of "
                            f"{per_step:,}")


def describe(params: dict[str, Any]) -> str:
    """``optimizer.lr=0.003, model.query.type=linear``: a trial's values, floats to 4 significant digits."""
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())


def sweep_plan(sweep: Sweep) -> str:
    """What a sweep will do, for the dry run: the search, each arm's study and one trial's command."""
    from torchnlq.experiments.suite import launcher_command

    spec = sweep.spec
    objective = (f"validation loss at {spec.objective_tokens:,} training tokens" if spec.objective_tokens
                 else "validation loss at the end")
    lines = [f"# sweep {sweep.suite.name}: {len(sweep.arms)} arm(s) x {spec.trials} trials, {spec.sampler} sampler "
             f"(seed {spec.seed}), {spec.pruner} pruner, objective: {objective}", f"# storage: {sweep.storage_url}"]
    for p in spec.params:
        space = (f"one of {list(p.choices)}" if p.choices is not None else
                 f"in [{p.low}, {p.high}]" + (" (log)" if p.log else "") + (f" step {p.step}" if p.step else ""))
        lines.append(f"#   {p.key} {space}")
    for arm in sweep.arms:
        example = {p.key: "<trial>" for p in spec.params}
        lines.append(f"# arm {arm.name}: study '{sweep.study_name(arm)}', trials in {sweep.dump / arm.name}/trial-N")
        command = launcher_command(sweep.trial_run(arm, 0, example))
        lines.append(" ".join(command).replace("trial-0", "trial-N"))
    if spec.rerun_seeds:
        changed = f" with {' '.join(spec.rerun_overrides)}" if spec.rerun_overrides else ""
        lines.append(f"# then each arm's best config (best_<arm>.toml){changed} at seeds {list(spec.rerun_seeds)}, "
                     f"compared with {sweep.suite.baseline}'s as the baseline")
    return "\n".join(lines)
