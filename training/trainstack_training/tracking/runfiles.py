"""Reading a run directory for its MLflow run: what the job's files say (RunFiles), whether
they changed since the last sync (files_signature, tracking.json), and which directories of
the models directory are runs; and a sweep's directory for its parent run (SweepFiles,
sweep_dirs: `<models dir>/sweeps/<id>`, never a run: rundir.NOT_RUNS).

Runs in the tracking sync's process on the tracking node (the daemon, or one `sync` command:
see the package's docstring), in the mlflow role's venv; `trainstack status` on the control
machine reads tracking.json with TRACKING_FILE and run_url (infra/jobs/commands.py). Reads
files only: no MLflow here.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainstack_training.attempts import EXIT_CANCELLED, launch_record, launched_at
from trainstack_training.epochs import is_metric
from trainstack_training.rundir import (
    EPOCH_LOG,
    FAILED_FILE,
    FINAL_STATES,
    METRICS_FILE,
    NOT_RUNS,
    OUTPUT,
    RECORD,
    RESULT_FILES,
    SWEEP_FIELD,
    SWEEP_RECORD,
    SWEEPS_DIR,
    TRACKING_FILE,
    TRIALS_FILE,
    read_json,
    read_rows,
    write_json,
)

TAG_PREFIX = "trainstack."
DEFAULT_EXPERIMENT = "trainstack"  # neither the manifest nor the stack names one
# What the sync uploads once the job has ended: the result's files and the output.
ARTIFACTS = (*RESULT_FILES, OUTPUT)
# The training settings logged as params, beside the job's own [params].
SETTINGS = ("workers", "epochs", "batch_size", "strategy", "data", "framework")
PARAM_MAX = 6000  # MLflow's longest param value
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a job's or sweep's id, as trainstack makes
# A sweep's parent run's tags (sweeps.py): its sweep's id (a trial's run has it too), its kind.
SWEEP_TAG, KIND_TAG, SWEEP_KIND = f"{TAG_PREFIX}sweep", f"{TAG_PREFIX}kind", "sweep"


@dataclass
class RunFiles:
    """What a run directory holds, read once: the job's record (job.json: a submitted job's
    and the stack's declared job's alike, the one source of what the job is and how it
    ended), metrics.json (its result, once it succeeded) and the epoch rows."""

    run_dir: Path
    record: dict[str, Any]
    metrics: dict[str, Any]
    epochs: list[dict[str, Any]]
    launched_at: float | None = None

    @classmethod
    def read(cls, run_dir: Path) -> RunFiles:
        metrics = read_json(run_dir / METRICS_FILE)
        launched = launched_at(run_dir)
        record = read_json(run_dir / RECORD) or earlier_record(run_dir, metrics, launched)
        return cls(run_dir, record, metrics, read_epochs(run_dir), launched)

    @property
    def launch(self) -> str:
        """The stack's declared job's launch stamp as a tag value: that job's directory (its
        run id) is launched again when the stack goes back to a job and settings it ran
        before. "" for a submitted job (its id is its submission's own; it is a run from
        `queued`, before its launch) and for a run from before launch stamps."""
        if self.record.get("origin", "submit") != "stack" or self.launched_at is None:
            return ""
        return f"{self.launched_at:.3f}"

    @property
    def launched(self) -> bool:
        """The stack's declared job's driver has stamped this launch (its launch.json names
        this record): until then the directory's stamp is an earlier launch's, and the run is
        not synced, so that an earlier launch's MLflow run is never reopened. Always True for
        a submitted job (its run starts at `queued`) and for a run from before records."""
        if self.record.get("origin", "submit") != "stack" or "submitted_at" not in self.record:
            return True
        return launch_record(self.run_dir) == self.record["submitted_at"]

    @property
    def job_id(self) -> str:
        return str(self.record.get("id") or self.run_dir.name)

    @property
    def state(self) -> str:
        return str(self.record.get("state") or "queued")

    @property
    def error(self) -> str:
        return str(self.record.get("error") or "")

    @property
    def ended(self) -> bool:
        return self.state in FINAL_STATES

    def code_sha(self) -> str:
        return str(self.record.get("code_sha") or "")

    def params(self) -> dict[str, str]:
        """The job's [params] with the overrides, then the training settings."""
        own = self.record.get("params")
        settings = {key: self.record.get(key) for key in SETTINGS}
        settings["framework"] = self.framework()
        merged = {k: v for k, v in settings.items() if v not in (None, "")}
        merged.update(own if isinstance(own, dict) else {})
        return {str(k): param_value(v) for k, v in merged.items()}

    def framework(self) -> str:
        return str(self.record.get("framework") or "tensorflow")

    def tags(self, stack: str) -> dict[str, str]:
        values = {
            "job_id": self.job_id,
            "code_sha": self.code_sha(),
            "env_sha": self.record.get("env_sha", ""),
            "framework": self.framework(),
            "mode": self.record.get("mode", ""),
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
            self.record.get("experiment") or self.record.get("stack") or stack or DEFAULT_EXPERIMENT
        )

    def start_ms(self) -> int:
        start = (
            self.record.get("started_at") or self.record.get("submitted_at") or _mtime(self.run_dir)
        )
        return int(float(start) * 1000)

    def end_ms(self) -> int:
        end = self.record.get("ended_at") or _mtime(self.run_dir / METRICS_FILE)
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


def earlier_record(
    run_dir: Path, metrics: dict[str, Any], launched: float | None
) -> dict[str, Any]:
    """The record of a stack's declared job launched before declared jobs had one (the job
    record is the one source since): made once, here, from what such a run left: its result
    (metrics.json and the settings it ran with) or how its launch ended (failed.json)."""
    config = dict(metrics.get("config") or {})
    failure = read_json(run_dir / FAILED_FILE)
    if failure:
        state = "cancelled" if failure.get("exit") == EXIT_CANCELLED else "failed"
    else:
        state = "succeeded" if metrics else "running"
    params = metrics.get("params")
    if not isinstance(params, dict):  # a result from before it carried them: the overrides
        try:
            params = dict(json.loads(str(config.get("job_params") or "{}")))
        except (ValueError, TypeError):
            params = {}
    job_dir = str(config.get("job_dir") or "")
    return {
        "id": run_dir.name,
        "origin": "stack",
        "state": state,
        "error": str(failure.get("error") or ""),
        "params": params,
        "workers": config.get("workers"),
        "epochs": config.get("epochs"),
        "batch_size": config.get("batch_size"),
        "strategy": config.get("train_strategy"),
        "data": config.get("data"),
        "framework": metrics.get("framework") or config.get("framework") or "tensorflow",
        "mode": metrics.get("mode", ""),
        "experiment": metrics.get("experiment", ""),
        "code_sha": Path(job_dir).name if job_dir else "",
        "started_at": launched or metrics.get("started_at"),
        "ended_at": failure.get("ended_at"),
    }


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def param_value(value: Any) -> str:
    """A param's value as MLflow keeps it: a string of at most PARAM_MAX characters."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text[:PARAM_MAX]


def read_epochs(run_dir: Path) -> list[dict[str, Any]]:
    """The chief's epoch rows; after a resume an epoch may be there twice: the last wins. A
    line being written (no newline yet) is left for the next sync."""
    rows: dict[int, dict[str, Any]] = {}
    for row in read_rows(run_dir / EPOCH_LOG):
        with contextlib.suppress(ValueError, KeyError, TypeError):
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
    return read_json(run_dir / TRACKING_FILE)


def write_tracking(run_dir: Path, content: dict[str, Any]) -> None:
    """tracking.json, written whole (`trainstack status` may read it meanwhile)."""
    write_json(run_dir / TRACKING_FILE, content)


def is_run_dir(path: Path) -> bool:
    return (
        path.is_dir()
        and path.name not in NOT_RUNS
        and not path.name.startswith(".")
        and any((path / name).is_file() for name in (RECORD, METRICS_FILE, FAILED_FILE))
    )


def run_dirs(models_dir: Path) -> list[Path]:
    """The run directories of the models directory, by name."""
    try:
        return sorted(p for p in models_dir.iterdir() if is_run_dir(p))
    except OSError:
        return []


def up_to_date(run_dir: Path) -> bool:
    """A complete run whose files have not changed since its sync: skipped cheaply."""
    done = read_tracking(run_dir)
    return bool(done.get("complete")) and done.get("files") == files_signature(run_dir)


def run_url(ui_url: str, experiment_id: str, run_id: str) -> str:
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}" if ui_url else ""


# -- a sweep's directory (sweeps.py: its MLflow parent run) ---------------------------


@dataclass
class SweepFiles:
    """A sweep's directory, read once: its record (sweep.json), the trials' table
    (trials.json) and what the sync made of it (tracking.json)."""

    sweep_dir: Path
    record: dict[str, Any]
    table: dict[str, Any]
    tracking: dict[str, Any]

    @classmethod
    def read(cls, sweep_dir: Path) -> SweepFiles:
        return cls(
            sweep_dir,
            read_json(sweep_dir / SWEEP_RECORD),
            read_json(sweep_dir / TRIALS_FILE),
            read_json(sweep_dir / TRACKING_FILE),
        )

    @classmethod
    def of_trial(cls, files: RunFiles) -> SweepFiles | None:
        """A trial's sweep; None for a job of no sweep, and for a trial whose sweep directory
        is missing or unreadable (its run is then a plain one)."""
        sweep_id = files.record.get(SWEEP_FIELD)
        if not isinstance(sweep_id, str) or not SAFE_ID.match(sweep_id):
            return None
        sweep = cls.read(files.run_dir.parent / SWEEPS_DIR / sweep_id)
        return sweep if sweep.id == sweep_id else None

    @property
    def id(self) -> str:
        found = str(self.record.get("id") or "")
        return found if SAFE_ID.match(found) else ""  # it goes into a search filter

    @property
    def models_dir(self) -> Path:
        return self.sweep_dir.parent.parent

    @property
    def state(self) -> str:
        return str(self.record.get("state") or "running")

    @property
    def metric(self) -> str:
        return str(self.table.get("metric") or "")

    def experiment(self, stack: str) -> str:
        """As a run's (RunFiles.experiment): the sweep's own, else its stack's."""
        return str(
            self.record.get("experiment") or self.record.get("stack") or stack or DEFAULT_EXPERIMENT
        )

    def params(self) -> dict[str, str]:
        describe = self.record.get("describe")
        if not isinstance(describe, dict):
            return {}
        return {str(k): param_value(v) for k, v in describe.items()}

    def tags(self, stack: str) -> dict[str, str]:
        values = {
            SWEEP_TAG: self.id,
            KIND_TAG: SWEEP_KIND,
            f"{TAG_PREFIX}stack": self.record.get("stack") or stack,
            f"{TAG_PREFIX}job": self.record.get("job") or "",
        }
        return {k: str(v) for k, v in values.items() if v}

    def start_ms(self) -> int:
        return int((number(self.record.get("submitted_at")) or time.time()) * 1000)

    def end_ms(self) -> int:
        return int((number(self.record.get("ended_at")) or time.time()) * 1000)

    def trials(self) -> list[dict[str, Any]]:
        rows = self.table.get("trials")
        return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []

    def finished(self) -> int:
        """The trials that have ended (the best value's step)."""
        return sum(1 for row in self.trials() if row.get("state") in FINAL_STATES)

    def trial_dirs(self) -> list[Path]:
        """The run directories of the trials the table lists (those there are)."""
        ids = (str(row.get("job_id") or "") for row in self.trials())
        return [self.models_dir / i for i in ids if SAFE_ID.match(i)]

    def best(self) -> tuple[str, float] | None:
        """The best trial's job id and value, None while there is none."""
        best = self.table.get("best")
        if not isinstance(best, dict) or not self.metric:
            return None
        job_id, value = str(best.get("job_id") or ""), number(best.get("value"))
        return (job_id, value) if SAFE_ID.match(job_id) and value is not None else None

    def signature(self) -> str:
        """sweep.json's and trials.json's size and modification time (unchanged, a complete
        sweep is skipped)."""
        parts = []
        for name in (SWEEP_RECORD, TRIALS_FILE):
            with contextlib.suppress(OSError):
                st = (self.sweep_dir / name).stat()
                parts.append(f"{name}:{st.st_size}:{st.st_mtime_ns}")
        return ";".join(parts)


def number(value: Any) -> float | None:
    """A finite number of a JSON file, None for anything else."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def sweep_dirs(models_dir: Path) -> list[Path]:
    """The sweeps' directories of the models directory (those with a sweep.json), by name."""
    try:
        found = (models_dir / SWEEPS_DIR).iterdir()
        return sorted(p for p in found if (p / SWEEP_RECORD).is_file())
    except OSError:
        return []


def sweep_up_to_date(sweep_dir: Path) -> bool:
    """A complete sweep (its parent ended) whose files have not changed since: skipped."""
    done = read_json(sweep_dir / TRACKING_FILE)
    signature = SweepFiles(sweep_dir, {}, {}, {}).signature()
    return bool(done.get("complete")) and done.get("files") == signature
