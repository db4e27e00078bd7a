"""Every job an MLflow run, made from its run directory's files (docs/jobs.md, "Tracking").

    python -m trainstack_training.tracking watch --models-dir DIR --tracking-uri URL
        [--auth-file INI] [--ui-url URL] [--stack NAME] [--interval S]
    python -m trainstack_training.tracking sync [--job JOB_DIR_OR_ID] (same options)

The job never talks to MLflow: its chief's records in the run directory are the source
(runner.py's ``job.json``, ``epochs.jsonl``, ``output.log``; the report's ``metrics.json``,
``curves.png`` and the model file), and `sync_run` turns them into the run, as often as it
is called: the run is found by its tags ``trainstack.job_id`` and ``trainstack.launch`` (a
declared job launched again in its directory is a new run), a param already logged is not
logged again, an epoch's metrics are logged only at steps the run does not have yet, an
artifact already listed (same size) is not uploaded again. The tracking server down loses
nothing: the next sync completes the run. After a sync, ``<run dir>/tracking.json`` says
where the run is (`trainstack status` reads it; nothing there talks to MLflow), and a
complete run whose files have not changed since is skipped without a request.

`watch` is the daemon (supervisor, on the tracking node): every `interval` it syncs each run
directory that is not complete. `mlflow` is imported inside the functions: the training venv
on the nodes has no MLflow, and the training package imports without it.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import fcntl
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainstack_training.attempts import EXIT_CANCELLED, FAILED_FILE, launched_at
from trainstack_training.epochs import EPOCH_LOG, is_metric
from trainstack_training.frameworks.torch import EXPORTED_FILE
from trainstack_training.report import METRICS_FILE, PLOT_FILE
from trainstack_training.runner import FINAL_STATES, OUTPUT, RECORD

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

TRACKING_FILE = "tracking.json"
# Held while a run is synced (run_lock).
LOCK_FILE = ".tracking.lock"
TAG_PREFIX = "trainstack."
JOB_ID_TAG = f"{TAG_PREFIX}job_id"
# A launch of the declared job's run directory (attempts.py's stamp): launched again in its
# directory, it is a second MLflow run of that job, not more epochs of the first.
LAUNCH_TAG = f"{TAG_PREFIX}launch"
ERROR_TAG = f"{TAG_PREFIX}error"
NOTE_TAG = "mlflow.note.content"  # the run's description in the MLflow UI
DEFAULT_EXPERIMENT = "trainstack"  # neither the manifest nor the stack names one
# A job's state -> the run's status (MLflow's RunStatus names).
RUN_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
# The model files a run may leave: each framework's (frameworks' `model_file`) and torch's
# exported program.
MODEL_FILES = ("model.keras", "model.pt", EXPORTED_FILE)
ARTIFACTS = (*MODEL_FILES, PLOT_FILE, METRICS_FILE, OUTPUT)
# Directories under the models directory that are not runs (the jobs' code, their packages).
NOT_RUNS = frozenset({"jobs", "envs"})
# The training settings logged as params, beside the job's own [params].
SETTINGS = ("workers", "epochs", "batch_size", "strategy", "data", "framework")
PARAM_MAX = 6000  # MLflow's longest param value
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Against a server that is down, the client must fail at once (the next round retries), not
# after MLflow's own retries with back-off (minutes).
# No usage telemetry: the cluster has no way out, and a user's runs are not reported anywhere.
CLIENT_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}
EXIT_FAILED, EXIT_USAGE = 1, 2


class TrackingError(Exception):
    """One sentence: the run could not be synced now (the next sync retries)."""


@dataclass
class RunFiles:
    """What a run directory holds, read once: the runner's record (a submitted job's; the
    stack's declared job has none), metrics.json (a job that succeeded) and the epoch rows."""

    run_dir: Path
    record: dict[str, Any]
    metrics: dict[str, Any]
    epochs: list[dict[str, Any]]
    launched_at: float | None = None
    failure: dict[str, Any] = field(default_factory=dict)  # failed.json (attempts.py)

    @classmethod
    def read(cls, run_dir: Path) -> RunFiles:
        return cls(run_dir, _json(run_dir / RECORD), _json(run_dir / METRICS_FILE),
                   read_epochs(run_dir), launched_at(run_dir),
                   _json(run_dir / FAILED_FILE))  # fmt: skip

    @property
    def launch(self) -> str:
        """The stack's declared job's launch stamp as a tag value: that job's directory (its
        run id) is launched again when the stack goes back to a job and settings it ran
        before. "" for a submitted job (its id is its submission's own; it is a run from
        `queued`, before its launch) and for a run from before launch stamps."""
        if self.record or self.launched_at is None:
            return ""
        return f"{self.launched_at:.3f}"

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.metrics.get("config") or {})

    @property
    def job_id(self) -> str:
        return str(self.record.get("id") or self.run_dir.name)

    @property
    def state(self) -> str:
        """The job's state: a submitted job's record's; the declared job's (no record) from
        how its launch ended (failed.json, else metrics.json), running until then."""
        if self.record:
            return str(self.record.get("state") or "queued")
        if self.failure:
            return "cancelled" if self.failure.get("exit") == EXIT_CANCELLED else "failed"
        return "succeeded" if self.metrics else "running"

    @property
    def error(self) -> str:
        return str(self.record.get("error") or self.failure.get("error") or "")

    @property
    def ended(self) -> bool:
        return self.state in FINAL_STATES

    def code_sha(self) -> str:
        job_dir = str(self.config.get("job_dir") or "")
        return str(self.record.get("code_sha") or (Path(job_dir).name if job_dir else ""))

    def params(self) -> dict[str, str]:
        """The job's [params] with the overrides, then the training settings."""
        own = self.record.get("params")
        if not isinstance(own, dict):  # the declared job's: in its result
            own = self.metrics.get("params")
        if not isinstance(own, dict):  # a result from before it carried them: the overrides
            with contextlib.suppress(ValueError, TypeError):
                own = json.loads(str(self.config.get("job_params") or "{}"))
        settings = {
            "workers": self.record.get("workers", self.config.get("workers")),
            "epochs": self.record.get("epochs", self.config.get("epochs")),
            "batch_size": self.record.get("batch_size", self.config.get("batch_size")),
            "strategy": self.record.get("strategy", self.config.get("train_strategy")),
            "data": self.record.get("data", self.config.get("data")),
            "framework": self.framework(),
        }
        merged = {k: v for k, v in settings.items() if v not in (None, "")}
        merged.update(own if isinstance(own, dict) else {})
        return {str(k): _param(v) for k, v in merged.items()}

    def framework(self) -> str:
        return str(
            self.record.get("framework")
            or self.metrics.get("framework")
            or self.config.get("framework")
            or "tensorflow"
        )

    def tags(self, stack: str) -> dict[str, str]:
        values = {
            "job_id": self.job_id,
            "code_sha": self.code_sha(),
            "env_sha": self.record.get("env_sha", ""),
            "framework": self.framework(),
            "mode": self.record.get("mode") or self.metrics.get("mode", ""),
            # The result's task; none for a job that reads its own data and names none.
            "task": self.metrics.get("task", ""),
            "stack": self.record.get("stack") or stack,
            "job_dir": self.run_dir.name,
            "launch": self.launch,
            "job": self.record.get("job", ""),
            "spark_application": self.metrics.get("spark_application_id")
            or self.metrics.get("spark_application", ""),
            "state": self.state,
        }
        return {TAG_PREFIX + k: str(v) for k, v in values.items() if v}

    def experiment(self, stack: str) -> str:
        return str(
            self.record.get("experiment")
            or self.metrics.get("experiment")
            or self.record.get("stack")
            or stack
            or DEFAULT_EXPERIMENT
        )

    def start_ms(self) -> int:
        start = (
            self.record.get("started_at")
            or self.record.get("submitted_at")
            or self.launched_at
            or self.metrics.get("started_at")
            or _mtime(self.run_dir)
        )
        return int(float(start) * 1000)

    def end_ms(self) -> int:
        end = (
            self.record.get("ended_at")
            or self.failure.get("ended_at")
            or _mtime(self.run_dir / METRICS_FILE)
        )
        return int(float(end) * 1000)

    def final_metrics(self) -> dict[str, float]:
        """Once the job has ended: its final metrics and the time split."""
        final = self.metrics.get("final") or {}
        numbers = {f"final_{k}": v for k, v in final.items() if is_metric(k, v)}
        split = self.metrics.get("time_split") or {}
        numbers |= {f"time_{k}_s": v for k, v in split.items() if is_metric(k, v)}
        for key in ("total_seconds", "train_seconds", "samples_per_second", "attempts"):
            if is_metric(key, self.metrics.get(key)):
                numbers[key] = self.metrics[key]
        return {k: float(v) for k, v in numbers.items()}


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return dict(value) if isinstance(value, dict) else {}


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def _param(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text[:PARAM_MAX]


def read_epochs(run_dir: Path) -> list[dict[str, Any]]:
    """The chief's epoch rows; after a resume an epoch may be there twice: the last wins. A
    line being written (no newline yet) is left for the next sync."""
    try:
        text = (run_dir / EPOCH_LOG).read_text()
    except OSError:
        return []
    rows: dict[int, dict[str, Any]] = {}
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        with contextlib.suppress(ValueError, KeyError, TypeError):
            row = json.loads(line)
            rows[int(row["epoch"])] = row
    return [rows[k] for k in sorted(rows)]


def files_signature(run_dir: Path) -> str:
    """What the sync reads, by size and modification time: unchanged = nothing to sync."""
    parts = []
    for name in (RECORD, EPOCH_LOG, FAILED_FILE, *ARTIFACTS):
        with contextlib.suppress(OSError):
            st = (run_dir / name).stat()
            parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
    return ";".join(parts)


def read_tracking(run_dir: Path) -> dict[str, Any]:
    """The run directory's tracking.json ({} when it has none)."""
    return _json(run_dir / TRACKING_FILE)


def write_tracking(run_dir: Path, content: dict[str, Any]) -> None:
    tmp = run_dir / f".{TRACKING_FILE}.{os.getpid()}.{threading.get_ident()}"
    tmp.write_text(json.dumps(content, sort_keys=True))
    os.replace(tmp, run_dir / TRACKING_FILE)


def is_run_dir(path: Path) -> bool:
    return (
        path.is_dir()
        and path.name not in NOT_RUNS
        and not path.name.startswith(".")
        and any((path / name).is_file() for name in (RECORD, METRICS_FILE, FAILED_FILE))
    )


def up_to_date(run_dir: Path) -> bool:
    """A complete run whose files have not changed since its sync: skipped cheaply."""
    done = read_tracking(run_dir)
    return bool(done.get("complete")) and done.get("files") == files_signature(run_dir)


def run_url(ui_url: str, experiment_id: str, run_id: str) -> str:
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}" if ui_url else ""


# -- the sync ----------------------------------------------------------------------------


@dataclass
class Synced:
    """What one sync did (the `sync` command's JSON line carries it)."""

    job_id: str
    run_id: str = ""
    experiment_id: str = ""
    url: str = ""
    params: int = 0
    metrics: int = 0
    artifacts: list[str] = field(default_factory=list)
    status: str = ""
    complete: bool = False
    skipped: bool = False
    error: str = ""


def _experiment_id(client: MlflowClient, name: str) -> str:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            client.restore_experiment(found.experiment_id)
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(name))
    except MlflowException:  # made meanwhile by another sync
        again = client.get_experiment_by_name(name)
        if again is None:
            raise
        return str(again.experiment_id)


def find_or_create_run(client: MlflowClient, files: RunFiles, stack: str) -> tuple[Any, bool]:
    """The job's run (found by its job id tag) and whether it was there already."""
    job_id = files.job_id
    if not _SAFE_ID.match(job_id):
        raise TrackingError(f"{files.run_dir}: job id {job_id!r} is not a trainstack job id")
    experiment_id = _experiment_id(client, files.experiment(stack))
    wanted = f"tags.`{JOB_ID_TAG}` = '{job_id}'"
    if files.launch:
        wanted += f" and tags.`{LAUNCH_TAG}` = '{files.launch}'"
    found = client.search_runs([experiment_id], filter_string=wanted, max_results=1)
    if found:
        return found[0], True
    run = client.create_run(
        experiment_id, start_time=files.start_ms(), tags=files.tags(stack), run_name=job_id
    )
    return run, False


def known_run(client: MlflowClient, files: RunFiles) -> tuple[Any, dict[str, set[int]]]:
    """The run of an earlier sync (its tracking.json) and the steps that sync logged: one
    request instead of a search and a history per metric, for the daemon's rounds while a job
    trains. A step logged after the last tracking.json was written (a sync stopped in between)
    is sent again; MLflow keeps one of identical points (key, step, timestamp, value; the
    timestamp is the epoch row's own), so nothing is duplicated. (None, {}) when there is no
    such run: the caller finds it by its tag and asks the server what it holds."""
    from mlflow.exceptions import MlflowException

    before = read_tracking(files.run_dir)
    if not before.get("run_id"):
        return None, {}
    try:
        run = client.get_run(str(before["run_id"]))
    except MlflowException:  # gone (a new server store): found or made again by its tag
        return None, {}
    if run.data.tags.get(JOB_ID_TAG) != files.job_id or run.info.lifecycle_stage != "active":
        return None, {}
    if files.launch and run.data.tags.get(LAUNCH_TAG) != files.launch:
        return None, {}  # the run of an earlier launch of this directory
    steps = {int(step) for step in before.get("synced_steps") or []}
    # Every key of the run has the synced epochs' steps; the final metrics are at step 0.
    return run, {key: steps | {0} for key in run.data.metrics}


def logged_steps(client: MlflowClient, run: Any) -> dict[str, set[int]]:
    """The steps each metric of the run has already (from the server: the files are the
    source, the server says what it holds)."""
    return {
        key: {m.step for m in client.get_metric_history(run.info.run_id, key)}
        for key in run.data.metrics
    }


def epoch_metrics(files: RunFiles, have: dict[str, set[int]]) -> list[Any]:
    """Every epoch row's metrics at step = epoch, those the run does not have yet."""
    from mlflow.entities import Metric

    new = []
    for row in files.epochs:
        step = int(row["epoch"])
        stamp = int(float(row.get("ended_at") or time.time()) * 1000)
        for key, value in row.items():
            if is_metric(key, value) and step not in have.get(key, set()):
                new.append(Metric(key, float(value), stamp, step))
    return new


def _final_metrics(files: RunFiles, have: dict[str, set[int]]) -> list[Any]:
    from mlflow.entities import Metric

    if not files.ended:
        return []
    stamp = files.end_ms()
    return [
        Metric(key, value, stamp, 0)
        for key, value in files.final_metrics().items()
        if key not in have
    ]


def _log_batches(client: MlflowClient, run_id: str, metrics: list[Any], params: list[Any],
                 tags: list[Any]) -> None:  # fmt: skip
    """In MLflow's batch limits: 1000 metrics, 100 params, 100 tags a request."""
    for start in range(0, max(len(params), len(tags)), 100):
        client.log_batch(run_id, params=params[start : start + 100], tags=tags[start : start + 100])
    for start in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[start : start + 1000])


def _artifacts(client: MlflowClient, files: RunFiles, run_id: str) -> list[str]:
    """Once the job has ended: the model file(s), the curves, metrics.json and the output;
    one already listed with the same size is not uploaded again."""
    if not files.ended:
        return []
    listed = {f.path: f.file_size for f in client.list_artifacts(run_id)}
    sent = []
    for name in ARTIFACTS:
        path = files.run_dir / name
        if path.is_file() and listed.get(name) != path.stat().st_size:
            client.log_artifact(run_id, str(path))
            sent.append(name)
    return sent


def _finish(client: MlflowClient, files: RunFiles, run: Any) -> str:
    """The run's status follows the job's; a failed job's run carries its error."""
    status = RUN_STATUS.get(files.state, "RUNNING")
    error = files.error
    if error and run.data.tags.get(ERROR_TAG) != error:
        client.set_tag(run.info.run_id, ERROR_TAG, error[:5000])
        client.set_tag(run.info.run_id, NOTE_TAG, f"trainstack job {files.state}: {error}")
    if status == "RUNNING":
        if run.info.status != "RUNNING":
            client.update_run(run.info.run_id, status="RUNNING")
    elif run.info.status != status or not run.info.end_time:
        client.set_terminated(run.info.run_id, status=status, end_time=files.end_ms())
    return status


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """One sync of a run at a time: the daemon and a `trainstack sync` (or the stack's own
    after its job) on the same node would otherwise both create the run, or both log the
    same steps."""
    with open(run_dir / LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def sync_run(run_dir: Path, client: MlflowClient, *, stack: str = "", ui_url: str = "") -> Synced:
    """Make the job's MLflow run agree with its run directory (safe to repeat; see the module
    docstring) and write tracking.json. MLflow's and HTTP errors propagate."""
    with run_lock(run_dir):
        return _sync_run(run_dir, client, stack=stack, ui_url=ui_url)


def _sync_run(run_dir: Path, client: MlflowClient, *, stack: str, ui_url: str) -> Synced:
    from mlflow.entities import Param, RunTag

    files = RunFiles.read(run_dir)
    signature = files_signature(run_dir)
    run, have = known_run(client, files)
    if run is None:
        run, existed = find_or_create_run(client, files, stack)
        have = logged_steps(client, run) if existed else {}
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in files.params().items() if k not in run.data.params]
    tags = [RunTag(k, v) for k, v in files.tags(stack).items() if run.data.tags.get(k) != v]
    metrics = epoch_metrics(files, have) + _final_metrics(files, have)
    _log_batches(client, run_id, metrics, params, tags)
    sent = _artifacts(client, files, run_id)
    status = _finish(client, files, run)
    done = Synced(
        files.job_id, run_id, run.info.experiment_id,
        run_url(ui_url, run.info.experiment_id, run_id), len(params), len(metrics), sent,
        status, complete=files.ended,
    )  # fmt: skip
    write_tracking(
        run_dir,
        {
            "run_id": run_id,
            "experiment_id": run.info.experiment_id,
            "experiment": files.experiment(stack),
            "url": done.url,
            "synced_steps": sorted({int(r["epoch"]) for r in files.epochs}),
            "complete": files.ended,
            "status": status,
            "files": signature,
            "synced_at": time.time(),
        },
    )
    return done


# -- many runs: sync and watch ----------------------------------------------------------


def tracking_errors() -> tuple[type[BaseException], ...]:
    """The errors of a sync that a later sync may not have: the server's, HTTP's, the disk's."""
    from mlflow.exceptions import MlflowException
    from requests import RequestException

    return (MlflowException, RequestException, OSError, TrackingError)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def run_dirs(models_dir: Path) -> list[Path]:
    try:
        return sorted(p for p in models_dir.iterdir() if is_run_dir(p))
    except OSError:
        return []


def sync_all(
    dirs: Iterable[Path], client: MlflowClient, *, stack: str = "", ui_url: str = "",
    force: bool = False,
) -> list[Synced]:  # fmt: skip
    """Sync each run directory (an up-to-date one is skipped unless `force`); an error is
    that run's `error`, and the others are synced all the same."""
    errors = tracking_errors()
    done = []
    for run_dir in dirs:
        if not force and up_to_date(run_dir):
            done.append(Synced(run_dir.name, skipped=True, complete=True))
            continue
        try:
            done.append(sync_run(run_dir, client, stack=stack, ui_url=ui_url))
        except errors as exc:
            done.append(Synced(run_dir.name, error=one_line(exc)))
    return done


def watch(
    models_dir: Path, client: MlflowClient, interval: float = 2.0, *, stack: str = "",
    ui_url: str = "", stop: threading.Event | None = None,
) -> None:  # fmt: skip
    """The daemon's loop: every `interval`, sync every run directory that is not complete.
    An error is one line on stderr (once until it changes) and is retried next round; `stop`
    (SIGTERM, when run as the daemon) ends the loop."""
    stop = stop or threading.Event()
    said: dict[str, str] = {}
    while not stop.is_set():
        try:
            synced = sync_all(run_dirs(models_dir), client, stack=stack, ui_url=ui_url)
        except Exception as exc:  # the daemon must outlive anything one round meets
            synced = [Synced(str(models_dir), error=one_line(exc))]
        for s in synced:
            if s.error and said.get(s.job_id) != s.error:
                print(f"tracking: {s.job_id}: not synced ({s.error}); retrying", file=sys.stderr)
            elif not s.error and not s.skipped and s.job_id in said:
                print(f"tracking: {s.job_id}: synced", file=sys.stderr)
            said[s.job_id] = s.error
        stop.wait(interval)


# -- the command line -------------------------------------------------------------------


COMMANDS = {
    "watch": "the daemon: sync every run that is not complete",
    "sync": "sync once (one job, or all) and print one JSON line",
}


class UsageError(Exception):
    """A bad argument: one line, exit code 2."""


def read_auth_file(path: str) -> tuple[str, str]:
    """The admin login from the auth file's [mlflow] admin_username and admin_password."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path) as fh:
            parser.read_file(fh)
        section = parser["mlflow"]
        return section["admin_username"], section["admin_password"]
    except OSError as exc:
        raise UsageError(f"--auth-file {path}: cannot read it ({exc.strerror})") from None
    except (configparser.Error, KeyError) as exc:
        raise UsageError(
            f"--auth-file {path}: needs [mlflow] admin_username and admin_password ({exc})"
        ) from None


def make_client(tracking_uri: str, auth_file: str = "") -> MlflowClient:
    """The real MLflow client on `tracking_uri`, logged in with the auth file's login."""
    if not re.match(r"^(https?|file|sqlite)://", tracking_uri):
        raise UsageError(f"--tracking-uri {tracking_uri!r}: give the server's http(s):// URL")
    if auth_file:
        user, password = read_auth_file(auth_file)
        os.environ["MLFLOW_TRACKING_USERNAME"] = user
        os.environ["MLFLOW_TRACKING_PASSWORD"] = password
    for key, value in CLIENT_ENV.items():
        os.environ.setdefault(key, value)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainstack_training.tracking",
        description="Turn trainstack run directories into MLflow runs.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in COMMANDS.items():
        p = sub.add_parser(name, help=text)
        p.add_argument("--models-dir", default="/srv/trainstack/models")
        p.add_argument("--tracking-uri", required=True)
        p.add_argument("--auth-file", default="")
        p.add_argument("--ui-url", default="")
        p.add_argument("--stack", default="", help="the experiment of jobs that name none")
        if name == "watch":
            p.add_argument("--interval", type=float, default=2.0)
        else:
            p.add_argument("--job", default="", help="a run directory, or a job id")
    return parser


def _job_dirs(models_dir: Path, job: str) -> list[Path]:
    if not job:
        return run_dirs(models_dir)
    path = Path(job) if "/" in job else models_dir / job
    if not is_run_dir(path):
        raise UsageError(f"--job {job}: no run directory with job.json or metrics.json there")
    return [path]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    models_dir = Path(args.models_dir)
    stop = threading.Event()
    if args.command == "watch":  # before MLflow's import (seconds): a SIGTERM then ends it too
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if not models_dir.is_dir():
            raise UsageError(f"--models-dir {models_dir}: no such directory")
        client = make_client(args.tracking_uri, args.auth_file)
        if args.command == "sync":
            dirs = _job_dirs(models_dir, args.job)
            with contextlib.redirect_stdout(sys.stderr):  # MLflow prints "View run ..."
                synced = sync_all(dirs, client, stack=args.stack, ui_url=args.ui_url,
                                  force=bool(args.job))  # fmt: skip
            print(json.dumps({"synced": [vars(s) for s in synced]}, sort_keys=True))
            return EXIT_FAILED if any(s.error for s in synced) else 0
        if args.interval <= 0:
            raise UsageError(f"--interval {args.interval}: must be > 0")
    except UsageError as exc:
        print(f"tracking: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with contextlib.suppress(KeyboardInterrupt):
        watch(models_dir, client, args.interval, stack=args.stack, ui_url=args.ui_url, stop=stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
