"""A sweep's trial as a job: its run directory, its start under the queue, what it has
reported, and its stop. Runs in the sweep's driver on a worker node (driver.py).

A trial is an ordinary job (docs/jobs.md, "Sweeps"): the same queue process, admission,
record, logs and cancel as a job of `trainstack submit`. `trainstack sweep` built the job
once on the control machine (infra/jobs/sweeps.py) and left its template in the sweep's
record: the first record of every trial (``record``), the queue process's command line
(``command``) and the packages' install script (``install``, "" for none). The command holds
three placeholders that each trial fills in:

    @RUN_DIR@   the trial's run directory (inside an argument, e.g. --output @RUN_DIR@)
    @ID@        the trial's job id (the Spark application's name)
    @PARAMS@    a whole argument: the trial's parameters as a JSON object (--job-params)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainstack_training.epochs import is_metric, read_epochs
from trainstack_training.queue.admission import STALE_SECONDS
from trainstack_training.rundir import (
    FINAL_STATES,
    INSTALL_SCRIPT,
    RECORD,
    STOP_FILE,
    SWEEP_FIELD,
    TRIAL_FIELD,
    model_file,
    read_json,
    write_json,
)

RUN_DIR_TOKEN, ID_TOKEN, PARAMS_TOKEN = "@RUN_DIR@", "@ID@", "@PARAMS@"


def trial_job_id(sweep_id: str, number: int) -> str:
    """A trial's job id (its run directory's name): the sweep's id and its number."""
    return f"{sweep_id}-t{number:03d}"


def fill(command: list[str], run_dir: Path, job_id: str, params: dict[str, Any]) -> list[str]:
    """The template's command for one trial (the placeholders above filled in)."""
    given = json.dumps(params, sort_keys=True)
    return [
        given
        if arg == PARAMS_TOKEN
        else arg.replace(RUN_DIR_TOKEN, str(run_dir)).replace(ID_TOKEN, job_id)
        for arg in command
    ]


@dataclass
class TrialJob:
    """One trial's job, as its driver follows it."""

    number: int
    job_id: str
    run_dir: Path
    params: dict[str, Any]
    reported: set[int] = field(default_factory=set)  # the epochs told to the study
    process: subprocess.Popen[bytes] | None = None
    stopping: str = ""  # why it was stopped ("" = not stopped)

    # -- start -------------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        models_dir: Path,
        sweep_id: str,
        number: int,
        params: dict[str, Any],
        template: dict[str, Any],
    ) -> TrialJob:
        """Write the trial's first record (and install script) and start its queue process,
        detached in a session of its own, as `trainstack submit` starts a job: it outlives
        the driver. A run directory that is there already (a driver that stopped between the
        record and the start) is started again only when its record never began."""
        job_id = trial_job_id(sweep_id, number)
        run_dir = models_dir / job_id
        run_dir.mkdir(parents=True, exist_ok=True)
        install = str(template.get("install") or "")
        record = {
            **dict(template["record"]),
            "id": job_id,
            "state": "installing" if install else "queued",
            "submitted_at": time.time(),
            "params": params,
            SWEEP_FIELD: sweep_id,
            TRIAL_FIELD: number,
        }
        if install:
            (run_dir / INSTALL_SCRIPT).write_text(install)
        write_json(run_dir / RECORD, record)
        command = fill(list(template["command"]), run_dir, job_id, params)
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return cls(number, job_id, run_dir, params, process=process)

    # -- what it has done --------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        return read_json(self.run_dir / RECORD)

    def reap(self) -> None:
        """Collect the queue process's exit (no zombie) when this driver started it."""
        if self.process is not None and self.process.poll() is not None:
            self.process = None

    def lost(self, record: dict[str, Any], now: float) -> bool:
        """Its queue process has gone without recording an end (its node lost, or killed):
        no heartbeat for STALE_SECONDS, counted from its submission while it has none."""
        if record.get("state") in FINAL_STATES:
            return False
        beat = float(record.get("heartbeat") or record.get("submitted_at") or 0)
        return now - beat > STALE_SECONDS

    def new_epochs(self, metric: str) -> list[tuple[int, float | None, list[str]]]:
        """The epochs finished since the last call: (epoch, the metric's value or None
        when the row lacks it, the row's metric names)."""
        found = []
        for row in read_epochs(self.run_dir):
            epoch = int(row["epoch"])
            if epoch in self.reported:
                continue
            self.reported.add(epoch)
            value = row.get(metric)
            names = sorted(k for k, v in row.items() if is_metric(k, v))
            found.append((epoch, _number(metric, value), names))
        return found

    def epochs_done(self) -> int:
        return len(self.reported)

    def last_value(self, metric: str) -> float | None:
        """The metric at the trial's last epoch (the model it saved), None without one."""
        rows = read_epochs(self.run_dir)
        return _number(metric, rows[-1].get(metric)) if rows else None

    def model_path(self, record: dict[str, Any]) -> str:
        return str(self.run_dir / model_file(str(record.get("framework") or "tensorflow")))

    # -- stop --------------------------------------------------------------------------
    def stop(self, reason: str) -> bool:
        """Stop the job as `trainstack cancel` does (SIGTERM to its queue process: its driver
        stops the Spark way, its ranks go); `reason` "pruned" makes it end `pruned`, any
        other `cancelled`. False when it has no queue process to signal here (not started
        yet, or on another node: a driver resumed elsewhere)."""
        if self.stopping:
            return True
        if reason == "pruned":
            write_json(self.run_dir / STOP_FILE, {"reason": reason, "at": time.time()})
        record = self.record()
        pid = int(record.get("pid") or 0)
        if pid <= 0 or record.get("host") != socket.gethostname():
            return False
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return False
        self.stopping = reason
        return True


def _number(metric: str, value: Any) -> float | None:
    """An epoch row's value of `metric` as a float; None when the row has no such number."""
    return float(value) if value is not None and is_metric(metric, value) else None
