"""One run directory to its MLflow run (sync_run), safe to repeat, and many (sync_all).

Runs in the tracking sync's process on the tracking node, in the mlflow role's venv: the
daemon's rounds (daemon.py), and the `sync` command (cli.py) that `trainstack sync` on the
control machine and the declared job's provider (infra/components/training.py, in `pulumi
up`) start there over the node's transport (infra.jobs.remote.sync_tracking). `mlflow` is
imported inside the functions: the package imports without it.

A sweep's trial (its record names its sweep) is a child of its sweep's parent run
(sweeps.py): its run is made with the parent's tags (sweeps.child_tags, which makes the parent
if the sweep has none yet), and after its sync the sweep's pass runs (its best value, its
end), its errors left to the daemon's next pass over the sweeps. A trial whose sweep directory
is missing or unreadable is synced as a plain run.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainstack_training.epochs import is_metric
from trainstack_training.rundir import TRACKING_LOCK
from trainstack_training.tracking.runfiles import (
    ARTIFACTS,
    SAFE_ID,
    TAG_PREFIX,
    RunFiles,
    files_signature,
    read_tracking,
    run_url,
    up_to_date,
    write_tracking,
)

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

JOB_ID_TAG = f"{TAG_PREFIX}job_id"
# A launch of the declared job's run directory (attempts.py's stamp): launched again in its
# directory, it is a second MLflow run of that job, not more epochs of the first.
LAUNCH_TAG = f"{TAG_PREFIX}launch"
ERROR_TAG = f"{TAG_PREFIX}error"
NOTE_TAG = "mlflow.note.content"  # the run's description in the MLflow UI
# A job's state -> the run's status (MLflow's RunStatus names).
RUN_STATUS = {
    "succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED", "pruned": "KILLED",
}  # fmt: skip


class TrackingError(Exception):
    """One sentence: the run could not be synced now (the next sync retries)."""


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


def experiment_id(client: MlflowClient, name: str) -> str:
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


def find_or_create_run(
    client: MlflowClient, files: RunFiles, stack: str, parent: dict[str, str] | None = None
) -> tuple[Any, bool]:
    """The job's run (found by its job id tag) and whether it was there already; made with
    `parent`'s tags too (a sweep's trial: its parent run's, sweeps.child_tags)."""
    job_id = files.job_id
    if not SAFE_ID.match(job_id):
        raise TrackingError(f"{files.run_dir}: job id {job_id!r} is not a trainstack job id")
    where = experiment_id(client, files.experiment(stack))
    wanted = f"tags.`{JOB_ID_TAG}` = '{job_id}'"
    if files.launch:
        wanted += f" and tags.`{LAUNCH_TAG}` = '{files.launch}'"
    found = client.search_runs([where], filter_string=wanted, max_results=1)
    if found:
        return found[0], True
    tags = {**files.tags(stack), **(parent or {})}
    run = client.create_run(where, start_time=files.start_ms(), tags=tags, run_name=job_id)
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


def log_batches(client: MlflowClient, run_id: str, metrics: list[Any], params: list[Any],
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
    with open(run_dir / TRACKING_LOCK, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def sync_run(run_dir: Path, client: MlflowClient, *, stack: str = "", ui_url: str = "") -> Synced:
    """Make the job's MLflow run agree with its run directory (safe to repeat; see the
    package's docstring) and write tracking.json. MLflow's and HTTP errors propagate."""
    with run_lock(run_dir):
        return _sync_run(run_dir, client, stack=stack, ui_url=ui_url)


def _sync_run(run_dir: Path, client: MlflowClient, *, stack: str, ui_url: str) -> Synced:
    from mlflow.entities import Param, RunTag

    # sweeps.py builds on this module: imported here, where a trial's sync needs it.
    from trainstack_training.tracking import sweeps

    files = RunFiles.read(run_dir)
    if not files.launched:  # the declared job's new launch, before its driver stamped it
        return Synced(files.job_id, status="PENDING", skipped=True)
    signature = files_signature(run_dir)
    parent = sweeps.child_tags(client, files, stack=stack, ui_url=ui_url)  # {}: no sweep's
    run, have = known_run(client, files)
    if run is None:
        run, existed = find_or_create_run(client, files, stack, parent)
        have = logged_steps(client, run) if existed else {}
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in files.params().items() if k not in run.data.params]
    wanted = {**files.tags(stack), **parent}
    tags = [RunTag(k, v) for k, v in wanted.items() if run.data.tags.get(k) != v]
    metrics = epoch_metrics(files, have) + _final_metrics(files, have)
    log_batches(client, run_id, metrics, params, tags)
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
    if parent:  # the trial's sweep: its best value, its end (the daemon's pass retries it)
        with contextlib.suppress(*tracking_errors()):
            sweeps.trial_synced(client, files, stack=stack, ui_url=ui_url)
    return done


# -- many runs: the `sync` command's and each of the daemon's rounds ---------------------


def tracking_errors() -> tuple[type[BaseException], ...]:
    """The errors of a sync that a later sync may not have: the server's, HTTP's, the disk's."""
    from mlflow.exceptions import MlflowException
    from requests import RequestException

    return (MlflowException, RequestException, OSError, TrackingError)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def sync_all(
    dirs: Iterable[Path], client: MlflowClient, *, stack: str = "", ui_url: str = "",
    force: bool = False,
) -> list[Synced]:  # fmt: skip
    """Sync each run directory (an up-to-date one is skipped unless `force`); an error is
    that run's `error`, and the others are synced all the same."""
    return sync_each(dirs, up_to_date, sync_run, client, stack=stack, ui_url=ui_url, force=force)


def sync_each(
    dirs: Iterable[Path], fresh: Callable[[Path], bool], sync_one: Callable[..., Synced],
    client: MlflowClient, *, stack: str, ui_url: str, force: bool,
) -> list[Synced]:  # fmt: skip
    """`sync_one` over each directory (a run's, or a sweep's: sweeps.py), skipping the ones
    `fresh` says are up to date unless `force`; an error is that directory's `error`, and the
    others are synced all the same."""
    errors = tracking_errors()
    done = []
    for directory in dirs:
        if not force and fresh(directory):
            done.append(Synced(directory.name, skipped=True, complete=True))
            continue
        try:
            done.append(sync_one(directory, client, stack=stack, ui_url=ui_url))
        except errors as exc:
            done.append(Synced(directory.name, error=one_line(exc)))
    return done
