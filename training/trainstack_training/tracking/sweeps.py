"""A sweep's MLflow parent run, each of its trials' runs a child of it (issue 50).

A sweep's trials are jobs with run directories of their own, synced as every run is
(sync.py), each record naming its sweep and number (rundir.SWEEP_FIELD, TRIAL_FIELD). The
sweep's directory, `<models dir>/sweeps/<id>` (sweep.json, trials.json), is one more run:

    the parent  in the trials' experiment (by the rule of a run's: the first trial synced
                names it, or the sweep's record if the sweep is synced first), named the
                sweep id; params: sweep.json's `describe`; tags trainstack.sweep = the id,
                trainstack.kind = sweep, trainstack.best_trial = the best trial's job id;
                metric best_<metric> at step = the trials finished, logged as the best value
                changes; ended (FINISHED, FAILED, KILLED: succeeded, failed, cancelled) once
                sweep.json's state is final and every trial run trials.json lists is synced
                complete (one with no run directory is not waited for); resumed, running
    a child     a trial's run: tags mlflow.parentRunId (the MLflow UI nests it),
                trainstack.sweep and trainstack.trial, from its creation on;
                trainstack.best = true on the best trial's run (false on the one before it)

The parent is made once, by the first sync of any of its trials (child_tags) or the first pass
over the sweep (sync_sweep), and its id kept in the sweep's tracking.json (`trainstack sweep
status` reads it), written first-writer-wins: of two syncs racing to make it (the sweep's
.tracking.lock keeps them apart on one node), the loser deletes its run and takes the
winner's; one made but not written down (a sync stopped in between) is found by its tags and
adopted. A pass (after a trial's sync, and each of the daemon's rounds) sends only what
changed since tracking.json's record of what it sent (`best`, `status`): a file read costs no
request, the parent's metric history one per sweep per round. A point sent again (a sync
stopped before tracking.json) is the very same point (stamped with the best trial's end; its
step the same unless a trial finished meanwhile), of which MLflow keeps one. A pass that fails
after a trial's sync is left to the daemon's next round. A trial whose sweep directory is
missing or unreadable is synced as a plain run (no parent, no error).

Runs in the tracking sync's process (a trial's sync, the daemon's rounds, the `sync` command),
in the mlflow role's venv; `mlflow` is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainstack_training.rundir import (
    RECORD,
    TRACKING_FILE,
    TRACKING_LOCK,
    TRIAL_FIELD,
    read_json,
    write_json,
)
from trainstack_training.tracking.runfiles import (
    KIND_TAG,
    SWEEP_KIND,
    SWEEP_TAG,
    TAG_PREFIX,
    RunFiles,
    SweepFiles,
    is_run_dir,
    number,
    read_tracking,
    run_url,
    sweep_dirs,
    sweep_up_to_date,
)
from trainstack_training.tracking.sync import (
    Synced,
    experiment_id,
    log_batches,
    sync_each,
)

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

TRIAL_TAG = f"{TAG_PREFIX}trial"
BEST_TRIAL_TAG, BEST_TAG = f"{TAG_PREFIX}best_trial", f"{TAG_PREFIX}best"
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own: the UI nests the run under that one
# A sweep's final state -> its parent run's status (MLflow's RunStatus names).
SWEEP_STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED"}
RUNNING = "RUNNING"


# -- what a pass sends: from the files alone ----------------------------------------------


@dataclass
class Changes:
    """What a pass sends since the last (none of it: no request). `best` and `status` are what
    tracking.json keeps of it afterwards."""

    best: dict[str, Any]
    status: str
    metric: tuple[str, float, int, int] | None = None  # key, value, timestamp (ms), step
    best_trial: str = ""  # the parent's trainstack.best_trial, when it changes
    best_run: str = ""  # the child run to tag trainstack.best = true
    was_best: str = ""  # the child run that held it before: false
    end: bool = False  # the parent's status changes to `status`

    def __bool__(self) -> bool:
        return bool(self.metric or self.best_trial or self.best_run or self.end)


def target_status(sweep: SweepFiles) -> str:
    """The parent's status: the sweep's final state's once every trial run is synced
    complete; RUNNING before (and again, for a sweep resumed)."""
    status = SWEEP_STATUS.get(sweep.state, RUNNING)
    if status != RUNNING and not all(
        read_tracking(d).get("complete") for d in sweep.trial_dirs() if is_run_dir(d)
    ):
        return RUNNING
    return status


def changes(sweep: SweepFiles, sent: dict[str, Any]) -> Changes:
    """What the files say that `sent` (tracking.json) has not been sent yet."""
    logged = dict(sent.get("best") or {})
    status = target_status(sweep)
    todo = Changes(best=logged, status=status, end=status != sent.get("status", RUNNING))
    best = sweep.best()
    if best is None:
        return todo
    job_id, value = best
    tagged = str(logged.get("run_id") or "")
    if logged.get("value") != value:
        step = sweep.finished()
        todo.metric = (f"best_{sweep.metric}", value, _ended_ms(sweep, job_id), step)
        logged |= {"value": value, "step": step}
    if logged.get("job_id") != job_id:
        todo.best_trial = job_id
        logged["job_id"] = job_id
    # The best trial's run is tagged once synced (its tracking.json names it); until then the
    # one before keeps its tag.
    child = str(read_tracking(sweep.models_dir / job_id).get("run_id") or "")
    if child and child != tagged:
        todo.best_run, todo.was_best = child, tagged
        logged["run_id"] = child
    todo.best = logged
    return todo


def _ended_ms(sweep: SweepFiles, job_id: str) -> int:
    """The best trial's end (its record's), the best value's timestamp: the same each time."""
    ended = number(read_json(sweep.models_dir / job_id / RECORD).get("ended_at"))
    ended = ended if ended is not None else number(sweep.table.get("updated_at"))
    return int((ended if ended is not None else time.time()) * 1000)


# -- the parent run -------------------------------------------------------------------------


@contextlib.contextmanager
def sweep_lock(sweep_dir: Path) -> Iterator[bool]:
    """One sync of a sweep's parent at a time on this node (as sync.run_lock for a run).
    False when the sweep directory cannot take the lock (gone, not writable): nothing done."""
    with contextlib.ExitStack() as held:
        try:
            handle = held.enter_context(open(sweep_dir / TRACKING_LOCK, "a"))
        except OSError:
            handle = None
        if handle is not None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield handle is not None


def make_parent(
    client: MlflowClient, sweep: SweepFiles, experiment: str, *, stack: str = "",
    ui_url: str = "", replace: bool = False,
) -> str:  # fmt: skip
    """The sweep's parent run, made (or found by its tags: made by a sync stopped before it
    wrote tracking.json) with its params and tags, then written down first-writer-wins: the
    id the sweep uses, the winner's. `replace`: the one tracking.json names is gone."""
    from mlflow.entities import Param, RunTag
    from mlflow.exceptions import MlflowException

    where = experiment_id(client, experiment)
    wanted = f"tags.`{SWEEP_TAG}` = '{sweep.id}' and tags.`{KIND_TAG}` = '{SWEEP_KIND}'"
    found = client.search_runs([where], filter_string=wanted, max_results=1)
    tags = sweep.tags(stack)
    run = found[0] if found else client.create_run(
        where, start_time=sweep.start_ms(), tags=tags, run_name=sweep.id
    )  # fmt: skip
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in sweep.params().items() if k not in run.data.params]
    missing = [RunTag(k, v) for k, v in tags.items() if run.data.tags.get(k) != v]
    log_batches(client, run_id, [], params, missing)
    record = {
        "run_id": run_id, "experiment_id": where, "experiment": experiment,
        "url": run_url(ui_url, where, run_id), "status": RUNNING, "made_at": time.time(),
    }  # fmt: skip
    path = sweep.sweep_dir / TRACKING_FILE
    if replace or not write_json(path, record, first=True):
        winner = "" if replace else str(read_json(path).get("run_id") or "")
        if not winner:  # replaced, or a file not whole: this one is the sweep's
            write_json(path, record)
        elif winner != run_id:  # another sync made the sweep's parent first
            with contextlib.suppress(MlflowException):  # deleted by its own maker meanwhile
                client.delete_run(run_id)
            run_id = winner
    sweep.tracking = read_json(path)
    return run_id


def live_parent(client: MlflowClient, sweep: SweepFiles, experiment: str, *, stack: str = "",
                ui_url: str = "") -> tuple[str, bool]:  # fmt: skip
    """The parent's id and whether it was made now: tracking.json's, checked with the server
    (a pass that sends something), made again if gone (a new server store); made if none."""
    from mlflow.exceptions import MlflowException

    known = str(sweep.tracking.get("run_id") or "")
    if known:
        try:
            if client.get_run(known).info.lifecycle_stage == "active":
                return known, False
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
    made = make_parent(client, sweep, experiment, stack=stack, ui_url=ui_url, replace=bool(known))
    return made, True


def send(client: MlflowClient, parent: str, todo: Changes, end_ms: int) -> int:
    """Send `todo` to the parent and the trials' runs; the metric points sent."""
    from mlflow.exceptions import MlflowException

    if todo.metric:
        key, value, stamp, step = todo.metric
        client.log_metric(parent, key, value, timestamp=stamp, step=step)
    if todo.best_trial:
        client.set_tag(parent, BEST_TRIAL_TAG, todo.best_trial)
    if todo.best_run:
        client.set_tag(todo.best_run, BEST_TAG, "true")
        if todo.was_best:
            with contextlib.suppress(MlflowException):  # that run gone: nothing to untag
                client.set_tag(todo.was_best, BEST_TAG, "false")
    if todo.end and todo.status == RUNNING:
        client.update_run(parent, status=RUNNING)
    elif todo.end:
        client.set_terminated(parent, status=todo.status, end_time=end_ms)
    return 1 if todo.metric else 0


# -- a trial's sync, a sweep's pass, the daemon's rounds -----------------------------------


def child_tags(client: MlflowClient, files: RunFiles, *, stack: str = "",
               ui_url: str = "") -> dict[str, str]:  # fmt: skip
    """A trial's tags naming its sweep and parent run (the parent made now if the sweep has
    none yet); {} for a job of no sweep and a trial whose sweep directory is missing or
    unreadable. No request once the sweep has its parent (tracking.json names it)."""
    sweep = SweepFiles.of_trial(files)
    if sweep is None:
        return {}
    parent = str(sweep.tracking.get("run_id") or "")
    if not parent:
        with sweep_lock(sweep.sweep_dir) as locked:
            if not locked:
                return {}
            sweep = SweepFiles.read(sweep.sweep_dir)  # another sync may have made it meanwhile
            parent = str(sweep.tracking.get("run_id") or "") or make_parent(
                client, sweep, files.experiment(stack), stack=stack, ui_url=ui_url
            )
    tags = {PARENT_TAG: parent, SWEEP_TAG: sweep.id}
    trial = files.record.get(TRIAL_FIELD)
    if isinstance(trial, int) and not isinstance(trial, bool):
        tags[TRIAL_TAG] = str(trial)
    return tags


def trial_synced(client: MlflowClient, files: RunFiles, *, stack: str = "",
                 ui_url: str = "") -> None:  # fmt: skip
    """After a trial's sync: its sweep's pass (the best value, the best trial's tag, the end)."""
    sweep = SweepFiles.of_trial(files)
    if sweep is not None:
        sync_sweep(sweep.sweep_dir, client, stack=stack, ui_url=ui_url,
                   experiment=files.experiment(stack))  # fmt: skip


def sync_sweep(sweep_dir: Path, client: MlflowClient, *, stack: str = "", ui_url: str = "",
               experiment: str = "") -> Synced:  # fmt: skip
    """Make the sweep's parent run agree with its directory: made if missing, the best value
    and tags, the end; then tracking.json. Safe to repeat; MLflow's errors propagate."""
    with sweep_lock(sweep_dir) as locked:
        sweep = SweepFiles.read(sweep_dir)
        if not locked or not sweep.id:
            return Synced(sweep_dir.name, skipped=True)
        experiment = experiment or sweep.experiment(stack)
        before = dict(sweep.tracking)
        todo = changes(sweep, before)
        parent, made = str(before.get("run_id") or ""), False
        if todo or not parent:
            parent, made = live_parent(client, sweep, experiment, stack=stack, ui_url=ui_url)
            if made:  # a new parent has been sent nothing
                todo = changes(sweep, sweep.tracking)
        points = send(client, parent, todo, sweep.end_ms()) if todo else 0
        state = {**sweep.tracking, "best": todo.best, "status": todo.status}
        complete = todo.status != RUNNING  # the files' signature then: unchanged, skipped
        state |= {"complete": complete, "files": sweep.signature() if complete else ""}
        if ui_url:
            state["url"] = run_url(ui_url, str(state.get("experiment_id") or ""), parent)
        if {**state, "synced_at": 0} != {**before, "synced_at": 0}:
            write_json(sweep_dir / TRACKING_FILE, {**state, "synced_at": time.time()})
        return Synced(
            sweep.id, parent, str(state.get("experiment_id") or ""), str(state.get("url") or ""),
            len(sweep.params()) if made else 0, points, [], todo.status,
            complete=bool(state["complete"]),
        )  # fmt: skip


def sync_sweeps(models_dir: Path, client: MlflowClient, *, stack: str = "", ui_url: str = "",
                force: bool = False) -> list[Synced]:  # fmt: skip
    """The pass over every sweep of the models directory (after the runs: a trial's final sync
    comes before its sweep's end); an error is that sweep's `error`."""
    return sync_each(
        sweep_dirs(models_dir), sweep_up_to_date, sync_sweep, client,
        stack=stack, ui_url=ui_url, force=force,
    )  # fmt: skip
