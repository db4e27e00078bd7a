"""A sweep's driver: the Optuna study that proposes trials, runs each as a job, stops the
ones that lag, and keeps the trials' table. Runs detached on a worker node:

    python -m trainstack_training.sweep SWEEP_DIR

(`trainstack sweep` starts it, `trainstack sweep resume` starts it again.) What it reads and
writes is in the sweep's directory (rundir.py: sweep.json, study.journal, trials.json,
output.log). The study lives in an Optuna JournalStorage file on the shared storage, so a
driver started again, on any node, goes on where the last one stopped:

- a trial whose job ended while no driver watched is told its end from the job's record;
- a trial whose job still runs is followed again (its epochs reported from where they were);
- a trial whose job's queue process has gone without an end (its node lost) is failed and
  its parameters run once more as a new trial, said in the output;
- a trial asked but never started (the driver stopped in between) is started now.

No trial's job runs twice: the job id is the trial's number, written to the study before
the job starts. One driver at a time: a second one exits at once (a lock file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainstack_training.rundir import (
    FINAL_STATES,
    OUTPUT,
    STOP_FILE,
    STUDY_JOURNAL,
    SWEEP_RECORD,
    TRIALS_FILE,
    append_line,
    read_json,
    update_json,
    write_json,
)
from trainstack_training.sweep import space
from trainstack_training.sweep.trialjob import TrialJob, trial_job_id

HEARTBEAT_SECONDS = 2.0
POLL_SECONDS = 1.0
LOCK_FILE = ".driver.lock"
JOB_ID_ATTR, RERUN_ATTR = "job_id", "rerun_of"


class DriverError(Exception):
    """The sweep cannot go on: one sentence for its record."""


@contextlib.contextmanager
def only_driver(sweep_dir: Path) -> Iterator[bool]:
    """True while this process holds the sweep's driver lock; False when another driver runs
    it."""
    with (sweep_dir / LOCK_FILE).open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


class Driver:
    def __init__(self, sweep_dir: Path) -> None:
        self.dir = sweep_dir
        self.models_dir = sweep_dir.parent.parent
        self.record = read_json(sweep_dir / SWEEP_RECORD)
        if not self.record.get("definition"):
            raise DriverError(f"{sweep_dir / SWEEP_RECORD} has no sweep definition")
        self.id = str(self.record["id"])
        self.spec = space.SweepSpec.from_dict(self.record["definition"])
        self.template: dict[str, Any] = dict(self.record["template"])
        self.base_params: dict[str, Any] = dict(self.record.get("params") or {})
        self.running: dict[int, TrialJob] = {}
        self.handles: dict[int, Any] = {}  # each running trial's optuna Trial, by number
        self.rows: dict[int, dict[str, Any]] = {}  # the trials' table, by number
        self.done = threading.Event()
        self.study: Any = None

    # -- output and records ------------------------------------------------------------
    def say(self, line: str) -> None:
        append_line(self.dir / OUTPUT, f"[{time.strftime('%H:%M:%S')}] {line}")

    def set_state(self, **changes: Any) -> None:
        self.record = update_json(self.dir / SWEEP_RECORD, **changes)

    def heartbeat(self) -> None:
        while not self.done.wait(HEARTBEAT_SECONDS):
            self.set_state(heartbeat=time.time())

    def better(self, a: float, b: float) -> bool:
        return a > b if self.spec.goal == "max" else a < b

    def write_trials(self) -> None:
        best = None
        for row in self.rows.values():
            value = row.get("value")
            if (
                row["state"] == "succeeded"
                and value is not None
                and (best is None or self.better(value, best["value"]))
            ):
                best = row
        table = {
            "metric": self.spec.metric,
            "goal": self.spec.goal,
            "trials": [self.rows[n] for n in sorted(self.rows)],
            "best": (
                {k: best[k] for k in ("number", "job_id", "value", "params", "model")}
                if best
                else None
            ),
            "updated_at": time.time(),
        }
        if read_json(self.dir / TRIALS_FILE).get("trials") != table["trials"]:
            write_json(self.dir / TRIALS_FILE, table, indent=1, sort_keys=False)

    def row(self, trial: TrialJob, state: str, **more: Any) -> None:
        self.rows[trial.number] = {
            "number": trial.number,
            "job_id": trial.job_id,
            "params": {k: trial.params[k] for k in self.swept()},
            "state": state,
            "value": more.get("value", self.rows.get(trial.number, {}).get("value")),
            "epochs": trial.epochs_done(),
            "model": more.get("model", ""),
        }

    def swept(self) -> list[str]:
        return [p.name for p in self.spec.params]

    # -- the study ---------------------------------------------------------------------
    def open_study(self) -> Any:
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        path = str(self.dir / STUDY_JOURNAL)
        # The open() lock: the file lock Optuna names for network file systems.
        storage = JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))
        study = optuna.create_study(
            study_name=self.id,
            storage=storage,
            sampler=space.sampler(self.spec),
            pruner=space.pruner(self.spec),
            direction=space.direction(self.spec),
            load_if_exists=True,
        )
        asked = len(study.get_trials(deepcopy=False))
        if asked and self.spec.seed is not None and self.spec.method != "grid":
            # A resumed study's seeded sampler would replay the first driver's draws: seeded
            # past them instead (reproducible from the same stopping point). Not the grid's:
            # its seed orders the grid, and trial N takes the order's Nth point, so the same
            # seed is what keeps a resumed grid from repeating a point.
            seed = (self.spec.seed + asked) % 2**32
            study.sampler = space.sampler(dataclasses.replace(self.spec, seed=seed))
        return study

    def trials(self) -> list[Any]:
        return list(self.study.get_trials(deepcopy=False))

    def counted(self) -> int:
        """Trials toward `trials`: those asked, but not those lost with their node (each is
        run again: its parameters wait in the study until the next ask)."""
        from optuna.trial import TrialState

        return sum(
            1
            for t in self.trials()
            if not t.user_attrs.get("lost") and t.state != TrialState.WAITING
        )

    def failures(self) -> int:
        from optuna.trial import TrialState

        return sum(
            1
            for t in self.trials()
            if t.state == TrialState.FAIL
            and not t.user_attrs.get("lost")
            and not t.user_attrs.get("cancelled")
        )

    # -- trials ------------------------------------------------------------------------
    def launch(self, trial: Any, params: dict[str, Any]) -> None:
        job_id = trial_job_id(self.id, trial.number)
        trial.set_user_attr(JOB_ID_ATTR, job_id)  # in the study before the job exists
        merged = {**self.base_params, **params}
        job = TrialJob.start(self.models_dir, self.id, trial.number, merged, self.template)
        self.running[trial.number], self.handles[trial.number] = job, trial
        self.row(job, "queued")
        shown = ", ".join(f"{k}={_short(v)}" for k, v in params.items())
        self.say(f"trial {trial.number} started as job {job_id}: {shown}")

    def ask_next(self) -> None:
        trial = self.study.ask(space.distributions(self.spec))
        self.launch(trial, dict(trial.params))

    def recover(self) -> None:
        """Trials a stopped driver left running (see the module's docstring)."""
        import optuna
        from optuna.trial import TrialState

        for frozen in self.trials():
            job_id = frozen.user_attrs.get(JOB_ID_ATTR) or trial_job_id(self.id, frozen.number)
            run_dir = self.models_dir / job_id
            params = {**self.base_params, **frozen.params}
            job = TrialJob(frozen.number, job_id, run_dir, params)
            job.reported = set(frozen.intermediate_values)
            if frozen.state != TrialState.RUNNING:
                self.row(job, _study_state(frozen), value=frozen.value)
                continue
            trial = optuna.trial.Trial(self.study, frozen._trial_id)
            if not (run_dir / "job.json").exists():
                self.say(f"trial {frozen.number} was asked but never started: starting it now")
                self.launch(trial, dict(frozen.params))
                continue
            record = job.record()
            if job.lost(record, time.time()):
                trial.set_user_attr("lost", True)
                self.study.tell(trial, state=TrialState.FAIL)
                self.row(job, "lost")
                self.say(
                    f"trial {frozen.number} (job {job_id}) lost its queue process while no "
                    "driver watched (its node gone?): its parameters run once more"
                )
                self.study.enqueue_trial(
                    dict(frozen.params), user_attrs={RERUN_ATTR: frozen.number}
                )
                continue
            self.running[frozen.number], self.handles[frozen.number] = job, trial
            self.row(job, str(record.get("state") or "queued"))
            self.say(f"trial {frozen.number} (job {job_id}) followed again")

    def follow(self, number: int, job: TrialJob) -> None:
        """Report the trial's new epochs, stop it when it lags, tell its end."""
        from optuna.trial import TrialState

        trial = self.handles[number]
        record = job.record()
        state = str(record.get("state") or "queued")
        for epoch, value, names in job.new_epochs(self.spec.metric):
            if value is None:
                job.stop("cancelled")
                raise DriverError(
                    f"metric {self.spec.metric!r}: trial {number}'s epoch {epoch} has no such "
                    f"metric; the job reports {', '.join(names) or 'none'} ([sweep] metric)"
                )
            trial.report(value, epoch)
            self.say(f"trial {number} epoch {epoch}: {self.spec.metric}={_short(value)}")
            # Its last epoch is never stopped: the trial has done its work (its value counts).
            last = epoch >= int(record.get("epochs") or 0) > 0
            stoppable = state not in FINAL_STATES and not last and not job.stopping
            if stoppable and trial.should_prune():  # said once: its stop takes a few epochs
                self.say(f"trial {number} pruned at epoch {epoch} (it lags the others)")
                job.stop("pruned")
        job.reap()
        if state not in FINAL_STATES:
            if job.lost(record, time.time()):
                self.study.tell(trial, state=TrialState.FAIL)
                self.row(job, "failed")
                self.say(f"trial {number} failed: its queue process is gone")
                del self.running[number], self.handles[number]
            else:
                self.row(job, state)
            return
        del self.running[number], self.handles[number]
        if state == "succeeded":
            value = job.last_value(self.spec.metric)
            if value is None:
                self.study.tell(trial, state=TrialState.FAIL)
                self.row(job, "failed")
                self.say(f"trial {number} failed: its job reported no {self.spec.metric}")
                return
            self.study.tell(trial, value)
            self.row(job, "succeeded", value=value, model=job.model_path(record))
            self.say(f"trial {number} succeeded: {self.spec.metric}={_short(value)}")
        elif state == "pruned":
            self.study.tell(trial, state=TrialState.PRUNED)
            self.row(job, "pruned")
        else:
            if state == "cancelled":
                trial.set_user_attr("cancelled", True)
            self.study.tell(trial, state=TrialState.FAIL)
            self.row(job, state)
            error = str(record.get("error") or "")
            self.say(f"trial {number} {state}" + (f": {error}" if error else ""))

    def stop_all(self, reason: str) -> None:
        for job in self.running.values():
            job.stop(reason)

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> int:
        self.study = self.open_study()
        self.set_state(
            state="running", pid=os.getpid(), host=socket.gethostname(),
            started_at=time.time(), heartbeat=time.time(), error="",
        )  # fmt: skip
        beat = threading.Thread(target=self.heartbeat, daemon=True)
        beat.start()
        self.say(
            f"sweep {self.id}: {self.spec.trials} trials, {self.spec.parallel} at once, "
            f"{self.spec.method}, {self.spec.goal} {self.spec.metric}"
        )
        try:
            self.recover()
            state, error = self.loop()
        except DriverError as exc:
            self.say(f"stopping every running trial: {exc}")
            self.stop_all("cancelled")
            self.wait_stopped()
            state, error = "failed", str(exc)
        finally:
            self.done.set()
        self.write_trials()
        self.set_state(state=state, error=error, ended_at=time.time(), heartbeat=time.time())
        self.say(f"sweep {state}" + (f": {error}" if error else ""))
        return 0 if state == "succeeded" else 1

    def loop(self) -> tuple[str, str]:
        while True:
            if read_json(self.dir / STOP_FILE):
                return self.cancel()
            for number, job in list(self.running.items()):
                self.follow(number, job)
            failed = self.failures()
            if failed >= self.spec.max_failed:
                self.stop_all("cancelled")
                self.wait_stopped()
                return (
                    "failed",
                    f"{failed} trials failed ([sweep] max_failed = {self.spec.max_failed})",
                )
            while len(self.running) < self.spec.parallel and self.counted() < self.spec.trials:
                self.ask_next()
            self.write_trials()
            if not self.running:
                return self.ending()
            time.sleep(POLL_SECONDS)

    def ending(self) -> tuple[str, str]:
        states = [r["state"] for r in self.rows.values()]
        if "succeeded" in states:
            return "succeeded", ""
        said = ", ".join(f"{states.count(s)} {s}" for s in sorted(set(states)))
        return "failed", f"no trial succeeded ({said})"

    def cancel(self) -> tuple[str, str]:
        self.say("cancel asked: stopping every running trial")
        self.stop_all("cancelled")
        self.wait_stopped()
        return "cancelled", ""

    def wait_stopped(self, timeout: float = 60.0) -> None:
        """Until every running trial has ended; a job whose queue process had not written its
        pid yet is signalled again each round."""
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            for number, job in list(self.running.items()):
                job.stop("cancelled")
                with contextlib.suppress(DriverError):
                    self.follow(number, job)
            time.sleep(POLL_SECONDS)


def _study_state(frozen: Any) -> str:
    if frozen.user_attrs.get("lost"):
        return "lost"
    if frozen.user_attrs.get("cancelled"):
        return "cancelled"
    return {"COMPLETE": "succeeded", "PRUNED": "pruned", "FAIL": "failed"}.get(
        frozen.state.name, frozen.state.name.lower()
    )


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m trainstack_training.sweep SWEEP_DIR")
        return 2
    sweep_dir = Path(argv[0])
    with only_driver(sweep_dir) as mine:
        if not mine:
            append_line(sweep_dir / OUTPUT, "another driver runs this sweep: this one exits")
            return 3
        try:
            return Driver(sweep_dir).run()
        except DriverError as exc:
            update_json(sweep_dir / SWEEP_RECORD, state="failed", error=str(exc))
            append_line(sweep_dir / OUTPUT, f"sweep failed: {exc}")
            return 1
