"""The job contract: what a user's training code gives trainstack, and what it gets back.

A job is a directory with a manifest, ``trainstack.toml``, and the user's Python code::

    [job]
    entry = "model"          # a module of this directory: model.py or model/__init__.py
    # requirements = "requirements.txt"   # extra packages (docs/jobs.md, "Packages")
    # data = "data/train.parquet"           # the data set (docs/jobs.md, "Data"); "none":
                             # a full-mode job that reads its own data (no data stage)
    # task = "regression"    # or "classification"; default: inferred from the label column
    # label = "target"       # the label column (default "label")
    # metric = "val_mae"     # the metric the summary and the curves show first
    # experiment = "digits"  # the MLflow experiment of its runs (default: the stack's name)

    [params]                 # defaults; the stack's trainstack:jobParams override them
    learning_rate = 0.001

The entry module offers one of two modes (docs/jobs.md):

- **simple**: ``build_model(ctx)`` returns a compiled Keras model, built inside the strategy's
  scope; an optional ``datasets(ctx)`` returns ``((x, y), (x_val, y_val))`` NumPy arrays made
  from ``ctx``'s shard (a reshape, a feature transform). trainstack runs ``fit`` with the
  backup/resume, per-epoch metrics, the chief-only save, the curves and the time split.
- **full**: ``train(ctx)`` trains itself, saves with ``ctx.save_model(model)`` and returns a
  dict of final metrics. ``ctx.callbacks()`` gives trainstack's Keras callbacks (backup and
  resume, the epoch log, the pushed progress); a loop without Keras calls ``ctx.report``.

Nothing here imports TensorFlow: the host checks a job directory (``load_spec``) before
anything is launched, by reading the manifest and the entry module's syntax tree (the user's
imports are not run on the host, which may lack their packages).
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import sys
import time
import tomllib
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from trainstack_training.config import (
    AUTO_TASK,
    CLASSIFICATION,
    DIGITS,
    OWN_DATA,
    TASKS,
    TrainConfig,
)

MANIFEST = "trainstack.toml"
ERROR_FILE = ".job-error.json"  # in the run directory: the user's error, for retries and driver
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_JOB_KEYS = (
    "entry", "framework", "strategy", "requirements", "progress_timeout", "data", "task",
    "label", "metric", "experiment",
)  # fmt: skip
# The frameworks a job may name (`framework = "torch"`); TensorFlow is the default.
TENSORFLOW, TORCH = "tensorflow", "torch"
FRAMEWORKS = (TENSORFLOW, TORCH)
# How a torch job's simple mode distributes the model (`strategy = "fsdp"`): DDP replicates
# it on every rank; FSDP shards its parameters, gradients and optimizer state across them.
DDP, FSDP = "ddp", "fsdp"
TORCH_STRATEGIES = (DDP, FSDP)
# Data locations the cluster reads itself: a URL of these schemes or an absolute path.
DATA_SCHEMES = ("http://", "https://", "file://", "hdfs://", "s3a://", "s3://")
# A rank with no finished batch, epoch or ctx.report for this long fails (watchdog.py).
DEFAULT_PROGRESS_TIMEOUT = 600.0
_TOP_KEYS = ("job", "params")
SIMPLE_FUNCTIONS = ("build_model", "datasets")
FULL_FUNCTION = "train"


class JobError(ValueError):
    """The job directory cannot be run; the message names the file, the value and the fix."""


class UserCodeError(RuntimeError):
    """The user's code raised; the message is their error and their frames only."""


class NoDataError(AttributeError):
    """A job that reads its own data (`data = "none"`) touched ctx.x, ctx.y, ctx.x_val or
    ctx.y_val: no data stage ran, so there is no shard. An AttributeError, so `hasattr(ctx,
    "x")` is False for such a job."""


@dataclass(frozen=True)
class JobSpec:
    """A checked job directory."""

    directory: str
    entry: str  # module name, importable with `directory` on sys.path
    entry_file: str  # path of the entry module, relative to `directory`
    mode: str  # "simple" or "full"
    has_datasets: bool
    params: dict[str, Any] = field(default_factory=dict)
    requirements: str = ""
    progress_timeout: float = DEFAULT_PROGRESS_TIMEOUT  # seconds; 0 = off
    # The manifest's data set: "" (none named), "digits", an absolute path or URL the cluster
    # reads, a path inside the job directory (shipped with the code; see data_location), or
    # "none": a full-mode job that reads its own data (no data stage runs).
    data: str = ""
    # What the job trains: "classification", "regression", or "" (inferred from the labels).
    task: str = ""
    label: str = ""  # the label column; "" = the run's (label_col, "label" by default)
    metric: str = ""  # the metric shown first; "" = val_loss, else the first one logged
    experiment: str = ""  # the MLflow experiment of its runs; "" = the stack's name (tracking)
    framework: str = TENSORFLOW  # which backend trains it (trainstack_training.frameworks)
    strategy: str = ""  # a torch job's: "ddp" (when "") or "fsdp"

    @property
    def reads_own_data(self) -> bool:
        """The manifest says `data = "none"`: the job reads its own data, no data stage runs
        and ctx has no shard."""
        return self.data == OWN_DATA


def _fail(directory: Path, what: str) -> JobError:
    return JobError(f"job directory {str(directory)!r}: {what}")


def _entry_file(directory: Path, entry: str) -> Path | None:
    base = directory.joinpath(*entry.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _top_functions(path: Path, directory: Path) -> set[str]:
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as exc:
        raise _fail(
            directory,
            f"{path.relative_to(directory)}:{exc.lineno}: syntax error: {exc.msg}",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(directory, f"cannot read {path.relative_to(directory)}: {exc}") from None
    return {
        node.name for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def _check_params(directory: Path, params: Any, where: str) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise _fail(directory, f"{where} must be a table of name = value, not {params!r}")
    try:
        json.dumps(params)
    except (TypeError, ValueError) as exc:
        raise _fail(
            directory, f"{where}: values must be numbers, strings, lists or tables: {exc}"
        ) from None
    return params


def _read_manifest(directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The manifest's values and its [job] table, checked for unknown tables and keys."""
    if not directory.is_dir():
        raise JobError(f"job directory {str(directory)!r} does not exist or is not a directory")
    manifest = directory / MANIFEST
    if not manifest.is_file():
        raise _fail(directory, f"no {MANIFEST} in it (a job directory needs one: docs/jobs.md)")
    try:
        values = tomllib.loads(manifest.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise _fail(directory, f"{MANIFEST} is not valid TOML: {exc}") from None
    unknown = sorted(set(values) - set(_TOP_KEYS))
    if unknown:
        raise _fail(
            directory, f"{MANIFEST}: unknown tables/keys {unknown}; allowed: [job], [params]"
        )
    job = values.get("job")
    if not isinstance(job, dict):
        raise _fail(directory, f'{MANIFEST} needs a [job] table with entry = "<module>"')
    unknown = sorted(set(job) - set(_JOB_KEYS))
    if unknown:
        raise _fail(
            directory, f"{MANIFEST}: unknown [job] keys {unknown}; allowed: {list(_JOB_KEYS)}"
        )
    return values, job


def _check_entry(directory: Path, entry: Any) -> tuple[str, str, set[str]]:
    """The manifest's entry module, checked: its name, its file (relative to the directory)
    and its top-level functions, one of build_model (simple mode) or train (full mode)."""
    if isinstance(entry, str) and entry.endswith(".py"):
        raise _fail(
            directory,
            f"{MANIFEST}: [job] entry = {entry!r}: write the module's name without .py "
            f"(entry = {entry[:-3]!r})",
        )
    if not isinstance(entry, str) or not _MODULE.match(entry):
        raise _fail(
            directory,
            f'{MANIFEST}: [job] entry = {entry!r} must be a module name such as "model" '
            'or "mypkg.train"',
        )
    entry_path = _entry_file(directory, entry)
    if entry_path is None:
        dotted = entry.replace(".", "/")
        raise _fail(
            directory, f"entry module {entry!r} not found: no {dotted}.py or {dotted}/__init__.py"
        )
    functions = _top_functions(entry_path, directory)
    rel = str(entry_path.relative_to(directory))
    has_full, has_simple = FULL_FUNCTION in functions, "build_model" in functions
    if has_full and has_simple:
        raise _fail(
            directory,
            f"{rel} defines both train(ctx) and build_model(ctx); define one: train for full "
            "mode, build_model (and optionally datasets) for simple mode",
        )
    if not (has_full or has_simple):
        raise _fail(
            directory,
            f"{rel} defines neither build_model(ctx) (simple mode) nor train(ctx) (full mode) "
            "at module level",
        )
    return entry, rel, functions


def load_spec(directory: str | Path, params: dict[str, Any] | None = None) -> JobSpec:
    """Check a job directory and return its spec; ``params`` override the manifest's.

    Raises JobError, one sentence naming the file and the value, for: a missing directory or
    manifest, bad TOML, unknown keys, a bad or missing entry module, a syntax error in it, an
    entry module with neither or both of ``build_model`` and ``train``, and requirements.
    """
    directory = Path(directory)
    values, job = _read_manifest(directory)
    entry, rel, functions = _check_entry(directory, job.get("entry"))
    timeout = job.get("progress_timeout", DEFAULT_PROGRESS_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0:
        raise _fail(
            directory,
            f"{MANIFEST}: progress_timeout = {timeout!r}: give seconds, a number >= 0 "
            "(0 turns the no-progress timeout off)",
        )
    requirements = job.get("requirements", "")
    if requirements and not (directory / str(requirements)).is_file():
        raise _fail(directory, f"{MANIFEST}: requirements = {requirements!r} does not exist")
    data = _check_data(directory, job.get("data", ""))
    if data == OWN_DATA and FULL_FUNCTION not in functions:
        raise _fail(
            directory,
            f'{MANIFEST}: [job] data = "none" (the job reads its own data) is for full mode, '
            f"but {rel} defines build_model(ctx): simple mode trains on the data stage's shard; "
            'define train(ctx) instead, or name a data set (data = "digits", a path in the job '
            "directory, or an absolute path or URL)",
        )
    task, label, metric, experiment = _check_task(directory, job)
    framework, strategy = _check_framework(directory, job, str(requirements or ""))
    merged = {
        **_check_params(directory, values.get("params", {}), "[params]"),
        **_check_params(directory, params or {}, "the stack's job parameters"),
    }
    return JobSpec(
        directory=str(directory),
        entry=entry,
        entry_file=rel,
        mode="full" if FULL_FUNCTION in functions else "simple",
        has_datasets="datasets" in functions,
        params=merged,
        requirements=str(requirements or ""),
        progress_timeout=float(timeout),
        data=data,
        task=task,
        label=label,
        metric=metric,
        experiment=experiment,
        framework=framework,
        strategy=strategy,
    )


def _check_framework(directory: Path, job: dict[str, Any], requirements: str) -> tuple[str, str]:
    """The manifest's framework and strategy, checked: a torch job lists torch in its
    requirements; `strategy` is a torch job's."""
    framework = job.get("framework", TENSORFLOW)
    if framework not in FRAMEWORKS:
        raise _fail(
            directory,
            f"{MANIFEST}: [job] framework = {framework!r}: allowed are "
            f"{', '.join(repr(f) for f in FRAMEWORKS)} (TensorFlow when left out)",
        )
    if framework == TORCH:
        _check_torch_listed(directory, requirements)
    strategy = job.get("strategy", "")
    if strategy != "" and (framework != TORCH or strategy not in TORCH_STRATEGIES):
        allowed = ", ".join(repr(s) for s in TORCH_STRATEGIES)
        raise _fail(
            directory,
            f"{MANIFEST}: [job] strategy = {strategy!r}: "
            + (
                f"allowed are {allowed} (a torch job's; DDP when left out)"
                if framework == TORCH
                else "a TensorFlow job's strategy is the stack's trainstack:trainStrategy; "
                f'[job] strategy ({allowed}) is for framework = "torch"'
            ),
        )
    return str(framework), str(strategy)


def _check_torch_listed(directory: Path, requirements: str) -> None:
    """A torch job brings torch in its requirements file: the nodes' image has none (it is
    installed once per lock into the packages overlay, docs/jobs.md)."""
    names = set()
    if requirements:
        for line in (directory / requirements).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                names.add(re.split(r"[\s\[<>=!~;@]", line, maxsplit=1)[0].lower())
    if "torch" not in names:
        where = f"{requirements} does not list torch" if requirements else "it has no requirements"
        raise _fail(
            directory,
            f'{MANIFEST}: [job] framework = "torch", but {where}; the nodes install torch from '
            "the job's packages: add torch==2.15.0 to a requirements file and name it "
            '(requirements = "requirements.txt")',
        )


def _check_task(directory: Path, job: dict[str, Any]) -> tuple[str, str, str, str]:
    """The manifest's task, label, metric and experiment, checked ("" for each one not
    given)."""
    task = job.get("task", "")
    if task != "" and task not in TASKS:
        raise _fail(
            directory,
            f"{MANIFEST}: [job] task = {task!r}: allowed are "
            f"{', '.join(repr(t) for t in TASKS)} (or leave it out: the data stage infers it "
            "from the label column)",
        )
    names = []
    for key, example in (("label", "target"), ("metric", "val_mae"), ("experiment", "digits")):
        value = job.get(key, "")
        if not isinstance(value, str) or (key in job and not value.strip()):
            raise _fail(
                directory,
                f"{MANIFEST}: [job] {key} = {value!r}: give a {key}'s name as a non-empty "
                f'string, e.g. {key} = "{example}"',
            )
        names.append(value.strip())
    return str(task), names[0], names[1], names[2]


def _check_data(directory: Path, data: Any) -> str:
    """The manifest's `data`, checked: what the cluster reads as it is, or a path inside the
    job directory that exists (it is shipped with the code)."""
    if data == "":
        return ""
    if not isinstance(data, str) or not data.strip():
        raise _fail(
            directory,
            f'{MANIFEST}: [job] data = {data!r}: give "digits", a path inside the job '
            'directory, an absolute path or URL the cluster reads, or "none" (a full-mode '
            "job that reads its own data)",
        )
    if data == OWN_DATA:
        return data
    if read_where_it_is(data):
        return data
    if "://" in data:
        raise _fail(
            directory,
            f"{MANIFEST}: [job] data = {data!r}: allowed URL schemes are "
            f"{', '.join(s[:-3] for s in DATA_SCHEMES)}",
        )
    inside = (directory / data).resolve()
    if not inside.is_relative_to(directory.resolve()):
        raise _fail(
            directory,
            f"{MANIFEST}: [job] data = {data!r} leaves the job directory; give a path inside it, "
            "or an absolute path on the cluster's storage",
        )
    if not inside.exists():
        raise _fail(directory, f"{MANIFEST}: [job] data = {data!r} does not exist in the directory")
    return data


def apply_manifest(cfg: TrainConfig, spec: JobSpec) -> None:
    """The manifest's framework, label, task and `data = "none"` over the run's settings: its
    `framework` is the run's (the warm runner's executors preload it), its `label` names the
    label column, its `task` is the task (a run's own --task or --framework that contradicts
    it is refused); a job that reads its own data runs with data "none" (a run's own data
    set other than the default digits is refused, and "none" is refused for a job whose
    manifest does not say it)."""
    if spec.reads_own_data:
        if cfg.data not in (DIGITS, OWN_DATA):  # the digits: trainstack-train's default
            raise JobError(
                f"the run's data={cfg.data!r} contradicts the job's manifest "
                f'({spec.directory}/{MANIFEST} says data = "none": the job reads its own data '
                "and no data stage runs); leave --data out"
            )
        cfg.data = OWN_DATA
    elif cfg.data == OWN_DATA:
        raise JobError(
            f'the run\'s data="none" is for a job that reads its own data, but '
            f'{spec.directory}/{MANIFEST} does not say so; add data = "none" to its [job] '
            "table (full mode only), or give a data set"
        )
    if cfg.framework != spec.framework and cfg.framework != TENSORFLOW:
        raise JobError(
            f"the run's framework={cfg.framework!r} contradicts the job's manifest "
            f"({spec.directory}/{MANIFEST} says framework = {spec.framework!r}); leave "
            "--framework out"
        )
    cfg.framework = spec.framework
    if spec.label:
        cfg.label_col = spec.label
    if spec.task:
        if cfg.task not in (AUTO_TASK, spec.task):
            raise JobError(
                f"the run's task={cfg.task!r} contradicts the job's manifest "
                f"({spec.directory}/{MANIFEST} says task = {spec.task!r}); leave --task out "
                "or make them agree"
            )
        cfg.task = spec.task


def read_where_it_is(data: str) -> bool:
    """`data` names what the cluster reads as it is: the digits, an absolute path or a URL."""
    return data == DIGITS or data.startswith(("/", *DATA_SCHEMES))


def data_location(spec: JobSpec, cluster_job_dir: str) -> str:
    """Where the cluster reads the manifest's data set ("" when it names none; "none" for a
    job that reads its own data): a path inside the job directory becomes that path under the
    code's copy on the shared storage."""
    if not spec.data or spec.reads_own_data or read_where_it_is(spec.data):
        return spec.data
    return f"{cluster_job_dir.rstrip('/')}/{Path(spec.data).as_posix()}"


def chosen_data(spec: JobSpec, cluster_job_dir: str, given: str = "", given_by: str = "") -> str:
    """The run's data set: `given` (a setting closer to the run than the manifest, named
    `given_by`: `--data`, `trainstack:trainData`) when set, else the manifest's (its
    `data_location`; "" when it names none). A job that reads its own data (`data = "none"`)
    takes no data set: one given with it is refused."""
    if spec.reads_own_data:
        if given:
            raise JobError(
                f"{given_by} {given!r}: the job's manifest ({spec.directory}/{MANIFEST}) says "
                'data = "none": it reads its own data and no data stage runs; leave '
                f"{given_by} out, or name the data set in the manifest's data instead"
            )
        return OWN_DATA
    return given or data_location(spec, cluster_job_dir)


def listed_requirements(spec: JobSpec) -> list[str]:
    """The requirement lines of the job's requirements file (comments and blanks dropped)."""
    if not spec.requirements:
        return []
    text = (Path(spec.directory) / spec.requirements).read_text()
    lines = (ln.split(" #", 1)[0].strip() for ln in text.splitlines())
    return [ln for ln in lines if ln and not ln.startswith("#")]


def import_entry(spec: JobSpec, env_site: str = "") -> ModuleType:
    """Import the entry module with the job directory first on sys.path, and its packages'
    overlay (`env_site`, infra/jobs/envs.py) next (in a fresh process: Spark starts one per
    task). An import error is the user's error, with their frames."""
    directory = str(Path(spec.directory).resolve())
    for path in (env_site, directory):  # the directory ends up first
        if path and path not in sys.path:
            sys.path.insert(0, path)
    importlib.invalidate_caches()
    return call_user(spec, importlib.import_module, spec.entry)


def user_frames(exc: BaseException, directory: str) -> str:
    """The traceback of ``exc`` trimmed to the frames in the user's files (all frames when
    none is theirs), ending with the exception line."""
    root = str(Path(directory).resolve())
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if str(Path(f.filename).resolve()).startswith(root + "/")]
    for f in mine:
        f.filename = str(Path(f.filename).resolve().relative_to(root))
    lines = traceback.format_list(mine or frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "Traceback (your code, most recent call last):\n" + "".join(lines).rstrip()


def where(exc: BaseException, directory: str) -> str:
    """``file:line`` of the innermost frame of the user's code, or ""."""
    root = str(Path(directory).resolve())
    for f in reversed(traceback.extract_tb(exc.__traceback__)):
        path = str(Path(f.filename).resolve())
        if path.startswith(root + "/"):
            return f"{Path(path).relative_to(root)}:{f.lineno}"
    if isinstance(exc, SyntaxError) and exc.filename:
        path = str(Path(exc.filename).resolve())
        if path.startswith(root + "/"):
            return f"{Path(path).relative_to(root)}:{exc.lineno}"
    return ""


# TensorFlow's errors for a lost peer or a broken collective: a worker died or the cluster
# failed, not the user's code. They stay as they are, so Spark retries the stage and the
# workers resume from the backup.
CLUSTER_FAILURES = frozenset(
    {"UnavailableError", "AbortedError", "CancelledError", "DeadlineExceededError"}
)
# torch.distributed's: a peer lost, the store or the network gone.
# gloo's own errors (a peer's connection closed or reset) reach Python as a RuntimeError that
# names gloo's source file.
GLOO_SOURCE = "/gloo/transport/"
TORCH_CLUSTER_FAILURES = frozenset(
    {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}
)


def is_cluster_failure(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, is TensorFlow's or torch's report of
    a lost peer or a failed collective."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kind = type(current)
        if kind.__name__ in CLUSTER_FAILURES and kind.__module__.startswith("tensorflow"):
            return True
        if kind.__name__ in TORCH_CLUSTER_FAILURES and kind.__module__.startswith("torch"):
            return True
        if isinstance(current, RuntimeError) and GLOO_SOURCE in str(current):
            return True  # gloo's transport errors ("Connection closed by peer") are plain
        current = current.__cause__ or current.__context__
    return False


def call_user(spec: JobSpec, fn: Callable[..., Any], *args: Any) -> Any:
    """Call the user's code; an exception becomes a UserCodeError with their frames, except
    a cluster failure (`is_cluster_failure`), which Spark's retry handles."""
    try:
        return fn(*args)
    except Exception as exc:
        if is_cluster_failure(exc):
            raise
        at = where(exc, spec.directory)
        head = f"{type(exc).__name__}: {exc}" + (f" (at {at})" if at else "")
        raise UserCodeError(
            f"your code failed: {head}\n{user_frames(exc, spec.directory)}"
        ) from exc


def record_error(run_dir: Path, message: str, rank: int) -> None:
    """Keep the first user error of the run on shared storage: a retried barrier stage fails
    again at once instead of rerunning the code, and the driver reports it."""
    path = run_dir / ERROR_FILE
    if not path.exists():
        path.write_text(json.dumps({"rank": rank, "error": message, "at": time.time()}))


def recorded_error(run_dir: Path) -> str:
    path = run_dir / ERROR_FILE
    try:
        return str(json.loads(path.read_text())["error"])
    except (OSError, ValueError, KeyError):
        return ""


@dataclass
class JobContext:
    """What the user's functions get (``ctx``); see docs/jobs.md."""

    params: dict[str, Any]
    rank: int
    world_size: int
    is_chief: bool
    strategy: Any
    tf: Any
    # This rank's shard and the validation set (trainstack_training.data.rank.RankData), in
    # memory or streamed: ctx.x .. ctx.y_val, ctx.batches(epoch), ctx.val_batches().
    data: Any
    n_features: int | None  # None for a job that reads its own data (no data stage)
    n_classes: int | None  # a classification's classes; 0 for a regression; None: as above
    batch_size: int  # per worker; the global batch is batch_size x world_size
    epochs: int
    learning_rate: float
    seed: int
    steps_per_execution: int  # for model.compile(steps_per_execution=...)
    steps_per_epoch: int  # the same on every worker (the smallest shard's), or collectives hang
    run_dir: str
    checkpoint_dir: str
    model_path: str
    attempt: int = 0
    # "classification" or "regression": the manifest's, else the data stage's; "" for a job
    # that reads its own data and whose manifest names none
    task: str = CLASSIFICATION
    framework: str = TENSORFLOW
    torch: Any = None  # torch jobs: the torch module (the process group is initialised)
    device: Any = None  # torch jobs: this rank's torch.device (cpu, or its GPU)
    _callbacks: Callable[[], list[Any]] | None = None
    _report: Callable[[dict[str, Any]], None] | None = None
    _save: Callable[[Any], None] | None = None  # the framework's save, when not Keras'
    saved: bool = False

    def __post_init__(self) -> None:
        if self.own_data:  # no data stage ran: nothing is known of the data
            self.n_features = self.n_classes = None

    @property
    def own_data(self) -> bool:
        """The job reads its own data (its manifest's `data = "none"`): no data stage ran, and
        ctx has no shard (its `data` is frameworks.base.NoRankData)."""
        return bool(getattr(self.data, "own_data", False))

    def _no_shard(self, name: str) -> None:
        if self.own_data:
            raise NoDataError(
                f'ctx.{name} is not available: the job\'s manifest says data = "none" (it reads '
                "its own data, so no data stage ran and there is no shard); load the data in "
                "train(ctx)"
            )

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def _arrays(self, part: str, name: str) -> tuple[Any, Any]:
        self._no_shard(name)
        return self.data.arrays(part, f"ctx.{name}")

    @property
    def x(self) -> Any:
        """This worker's shard: features, float32 of shape (rows, n_features)."""
        return self._arrays("train", "x")[0]

    @property
    def y(self) -> Any:
        """Its labels: int32 classes, or float32 targets for a regression (there also when the
        rank streams its data: the label column alone)."""
        self._no_shard("y")
        return self.data.labels("train")

    @property
    def x_val(self) -> Any:
        """The validation set's features (every worker has all of it)."""
        return self._arrays("val", "x_val")[0]

    @property
    def y_val(self) -> Any:
        """The validation set's labels (there also when the rank streams its data)."""
        self._no_shard("y_val")
        return self.data.labels("val")

    @property
    def streams(self) -> bool:
        """Whether this rank streams its data (then ctx.x .. ctx.y_val refuse)."""
        return bool(self.data.streams)

    def batches(self, epoch: int = 0) -> Any:
        """Epoch `epoch`'s (x, y) batches of this worker, as NumPy arrays: steps_per_epoch of
        them, batch_size rows each, shuffled by the seed, the rank and the epoch; from memory
        or streamed, whichever this rank uses."""
        self._no_shard("batches()")
        return self.data.batches(epoch)

    def val_batches(self, batch: int = 0) -> Any:
        """Every validation row once, as (x, y) NumPy batches of `batch` rows (default: the
        larger of batch_size and 1024)."""
        self._no_shard("val_batches()")
        return self.data.val_batches(batch)

    def callbacks(self) -> list[Any]:
        """trainstack's Keras callbacks for a full-mode ``fit``: backup and resume from
        ``checkpoint_dir``, the epoch log (epochs.jsonl, the curves), the pushed progress."""
        return self._callbacks() if self._callbacks else []

    def report(self, **metrics: float) -> None:
        """Record one finished epoch (a loop without Keras callbacks): reaches epochs.jsonl,
        the Pushgateway and the curves. Only the chief's reports are kept. `epoch` numbers
        it: a run whose first report says epoch=0 counts from 0 (`range(epochs)`) and is
        kept and shown as epoch + 1; other numbers are taken as they are (docs/jobs.md)."""
        if self._report:
            self._report({k: float(v) for k, v in metrics.items()})

    def save_model(self, model: Any) -> None:
        """Save the trained model: every worker calls it (saving may need all of them); the
        chief's copy is the run's model (Keras: `model_path`; torch: its state_dict there, and
        TorchScript beside it where the model scripts)."""
        import shutil
        import tempfile

        if self._save is not None:
            self._save(model)
            self.saved = True
            return
        if self.is_chief:
            model.save(self.model_path)
        else:
            tmp = tempfile.mkdtemp(prefix=f"trainstack-worker{self.rank}-")
            try:
                model.save(str(Path(tmp) / "model.keras"))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        self.saved = True
