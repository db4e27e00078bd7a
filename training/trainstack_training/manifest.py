"""The job's manifest, ``trainstack.toml``: reading it, and checking a job directory before
anything runs.

Where it runs: on the control machine, where ``trainstack submit`` (infra/jobs/commands.py) and
the stack's Pulumi program (infra/config: `StackValues.job_spec`, which its check and
infra/program.py share) check a job directory with ``load_spec`` before anything is submitted
or declared; and in the driver, ``trainstack-train``, which reads the directory's copy on the
cluster once per launch (jobsettings.job_spec) and hands the checked spec to its ranks as data
(``JobSpec.to_json``): a rank never reads the manifest. Nothing here imports TensorFlow or
torch, nor runs the user's code: the entry module is read as a syntax tree (the machine that
checks it may lack the job's packages).

A job is a directory with a manifest and the user's Python code::

    [job]
    entry = "model"          # a module of this directory: model.py or model/__init__.py
    # framework = "torch"    # or "tensorflow" (the default); `strategy`: a torch job's
    # requirements = "requirements.txt"   # extra packages (docs/jobs.md, "Packages")
    # data = "data/train.parquet"           # the data set (docs/jobs.md, "Data"); "none":
                             # a full-mode job that reads its own data (no data stage)
    # task = "regression"    # or "classification"; default: inferred from the label column
    # label = "target"       # the label column (default "label")
    # metric = "val_mae"     # the metric the summary and the curves show first
    # experiment = "digits"  # the MLflow experiment of its runs (default: the stack's name)
    # workers = 1            # its ranks, a training slot each (default: the stack's)

    [params]                 # defaults; the stack's trainstack:jobParams override them
    learning_rate = 0.001

The entry module defines ``build_model(ctx)`` (simple mode) or ``train(ctx)`` (full mode); what
``ctx`` is, and how the user's code is called in a rank: context.py.
"""

from __future__ import annotations

import ast
import json
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainstack_training.config import DIGITS, OWN_DATA, TASKS

MANIFEST = "trainstack.toml"
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_JOB_KEYS = (
    "entry", "framework", "strategy", "requirements", "progress_timeout", "data", "task",
    "label", "metric", "experiment", "workers",
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
_TOP_KEYS = ("job", "params", "sweep")  # [sweep]: a hyperparameter sweep (sweep/space.py)
SIMPLE_FUNCTIONS = ("build_model", "datasets")
FULL_FUNCTION = "train"


class JobError(ValueError):
    """The job directory cannot be run; the message names the file, the value and the fix."""


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
    # Its ranks, a training slot each (the queue, docs/jobs.md); 0 = the stack's.
    workers: int = 0

    @property
    def reads_own_data(self) -> bool:
        """The manifest says `data = "none"`: the job reads its own data, no data stage runs
        and ctx has no shard."""
        return self.data == OWN_DATA

    def to_json(self) -> str:
        """The spec as the driver hands it to its ranks (they never read the manifest)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> JobSpec:
        return cls(**json.loads(text))


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
            directory,
            f"{MANIFEST}: unknown tables/keys {unknown}; allowed: [job], [params], [sweep]",
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
    workers = job.get("workers", 0)
    if "workers" in job and (
        isinstance(workers, bool) or not isinstance(workers, int) or workers < 1
    ):
        raise _fail(
            directory,
            f"{MANIFEST}: [job] workers = {workers!r}: give the job's ranks, an integer >= 1 "
            "(a training slot each); leave it out for the stack's",
        )
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
        workers=int(workers),
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


def read_where_it_is(data: str) -> bool:
    """`data` names what the cluster reads as it is: the digits, an absolute path or a URL."""
    return data == DIGITS or data.startswith(("/", *DATA_SCHEMES))
