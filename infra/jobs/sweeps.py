"""What each `trainstack sweep` command does on a stack: start a sweep's driver on the
cluster, read its record and its trials' table, cancel it, resume it.

A sweep (docs/jobs.md, "Sweeps") is a driver process on a worker node
(trainstack_training.sweep) that runs an Optuna study's trials as jobs. This side checks the
sweep's definition and the job before anything is created, builds the job once (Jobs.prepare:
packed, shipped, packages staged) and leaves it as a template in the sweep's record, which
the driver fills in for each trial. The sweep's files are named in trainstack_training.rundir.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import shlex
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainstack_training.queue.admission import STALE_SECONDS
from trainstack_training.rundir import (
    OUTPUT,
    STOP_FILE,
    SWEEP_RECORD,
    SWEEPS_DIR,
    TRACKING_FILE,
    TRIALS_FILE,
)
from trainstack_training.sweep import space
from trainstack_training.sweep.trialjob import ID_TOKEN, PARAMS_TOKEN, RUN_DIR_TOKEN

from infra.jobs.commands import (
    EXIT_FAILED,
    EXIT_INPUT,
    EXIT_UNREACHABLE,
    CliError,
    Jobs,
    queued_command,
)
from infra.jobs.launch import job_record
from infra.jobs.remote import JOB_USER, MODELS_DIR, NODE_ENV, NODE_VENV
from infra.transport import Transport, TransportError

SWEEPS = f"{MODELS_DIR}/{SWEEPS_DIR}"
SWEEP_ID = re.compile(r"sweep-\d{8}-\d{6}-[0-9a-f]{4}")
SWEEP_FINAL = ("succeeded", "failed", "cancelled")
# How long `sweep cancel` waits for the driver to stop every trial and record the end.
CANCEL_WAIT_SECONDS = 90
# A trial's ranks when neither --workers nor the manifest's [job] workers says: one, so that
# `parallel` trials run side by side on the cluster's slots.
TRIAL_WORKERS = 1


def check_id(sweep_id: str) -> None:
    """A sweep id as `trainstack sweep` prints them (it names a directory on the cluster)."""
    if not SWEEP_ID.fullmatch(sweep_id):
        raise CliError(
            f"{sweep_id!r} is not a sweep id (sweep-YYYYMMDD-HHMMSS-xxxx: "
            "`trainstack sweep list` shows them)",
            EXIT_INPUT,
        )


def driver_alive(record: dict[str, Any], now: float | None = None) -> bool:
    """The sweep's driver beats (its heartbeat is at most STALE_SECONDS old)."""
    now = time.time() if now is None else now
    return now - float(record.get("heartbeat") or record.get("submitted_at") or 0) < STALE_SECONDS


class Sweeps:
    """A stack's sweeps, over the same transports and shared storage as its jobs."""

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs

    # -- submit ------------------------------------------------------------------------
    def submit(
        self,
        directory: Path,
        params: dict[str, Any],
        overrides: dict[str, Any],
        *,
        sweep_file: Path | None = None,
        trials: int | None = None,
        parallel: int | None = None,
        priority: int = 0,
    ) -> str:
        from trainstack_training.manifest import JobError, load_spec

        try:
            job_params = load_spec(directory, params).params
            spec = space.read_sweep(directory, job_params, sweep_file)
            spec = spec.with_overrides(trials=trials, parallel=parallel)
        except (JobError, space.SweepError) as exc:
            raise CliError(str(exc), EXIT_INPUT) from None
        prepared = self.jobs.prepare(directory, params, overrides, default_workers=TRIAL_WORKERS)
        node = prepared.node
        sweep_id = f"sweep-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
        launch = replace(prepared.launch, job_params=PARAMS_TOKEN)
        install = prepared.install
        template_record = job_record(
            ID_TOKEN, launch, prepared.facts, node=node.name, state="queued", origin="sweep",
            priority=priority,
        )  # fmt: skip
        command = queued_command(
            launch, RUN_DIR_TOKEN, f"trainstack-{ID_TOKEN}", install=bool(install),
            slots=self.jobs.queue_slots(),
        )  # fmt: skip
        record = {
            "id": sweep_id,
            "state": "starting",
            "submitted_at": time.time(),
            "node": node.name,
            "job": str(directory.resolve()),
            "experiment": prepared.facts.experiment,
            "stack": prepared.facts.stack,
            "framework": prepared.facts.framework,
            "workers": launch.workers,
            "epochs": launch.epochs,
            "priority": priority,
            "params": dict(prepared.facts.params),
            "definition": spec.to_dict(),
            "describe": space.describe(spec),
            "template": {"record": template_record, "command": command, "install": install},
            "error": "",
        }
        sweep_dir = f"{SWEEPS}/{sweep_id}"
        try:
            node.run(["mkdir", "-p", sweep_dir], user=JOB_USER)
            node.put(f"{sweep_dir}/{SWEEP_RECORD}", json.dumps(record).encode(), user=JOB_USER)
        except TransportError as exc:
            raise CliError(
                f"cannot write the sweep on {node.name}: {exc}", EXIT_UNREACHABLE
            ) from None
        self.start_driver(node, sweep_dir)
        return sweep_id

    def start_driver(self, node: Transport, sweep_dir: str) -> None:
        command = [f"{NODE_VENV}/bin/python", "-m", "trainstack_training.sweep", sweep_dir]
        detached = f"setsid nohup {shlex.join(command)} >/dev/null 2>&1 </dev/null &"
        try:
            code, out = node.run(["sh", "-c", detached], user=JOB_USER, env=NODE_ENV)
        except TransportError as exc:
            raise CliError(
                f"cannot start the sweep's driver on {node.name}: {exc}", EXIT_UNREACHABLE
            ) from None
        if code != 0:
            said = out.decode(errors="replace")[-300:]
            raise CliError(
                f"cannot start the sweep's driver on {node.name}: {said}", EXIT_UNREACHABLE
            )

    # -- read --------------------------------------------------------------------------
    def _json(self, node: Transport, path: str) -> dict[str, Any]:
        for _ in range(5):
            try:
                text = node.fetch(path)
            except TransportError:
                return {}
            with contextlib.suppress(ValueError):  # replaced atomically: a retry reads it whole
                return dict(json.loads(text))
            time.sleep(0.2)
        return {}

    def _raw(self, sweep_id: str, node: Transport | None = None) -> dict[str, Any]:
        check_id(sweep_id)
        node = node or self.jobs.any_node()
        record = self._json(node, f"{SWEEPS}/{sweep_id}/{SWEEP_RECORD}")
        if not record:
            raise CliError(
                f"no sweep {sweep_id!r} on this stack (`trainstack sweep list` shows its sweeps)",
                EXIT_INPUT,
            )
        return record

    def record(self, sweep_id: str) -> dict[str, Any]:
        """The sweep's record with its trials' table (`trials`, `best`) and its MLflow parent
        run (`tracking`, when synced); the template is left out."""
        node = self.jobs.any_node()
        record = self._raw(sweep_id, node)
        table = self._json(node, f"{SWEEPS}/{sweep_id}/{TRIALS_FILE}")
        tracking = self._json(node, f"{SWEEPS}/{sweep_id}/{TRACKING_FILE}")
        shown = {k: v for k, v in record.items() if k != "template"}
        shown["trials"] = list(table.get("trials") or [])
        shown["best"] = table.get("best")
        if tracking:
            shown["tracking"] = tracking
        return shown_state(shown)

    def records(self) -> list[dict[str, Any]]:
        """Every sweep's record (no template), with its trials' counts and best value."""
        node = self.jobs.any_node()
        script = (
            f'for d in {SWEEPS}/*/; do [ -f "${{d}}{SWEEP_RECORD}" ] || continue; '
            f'printf "%s\\t" "$(tr -d "\\n" < "${{d}}{SWEEP_RECORD}")"; '
            f'[ -f "${{d}}{TRIALS_FILE}" ] && tr -d "\\n" < "${{d}}{TRIALS_FILE}"; echo; done; true'
        )
        _, out = node.run(["sh", "-c", script], user=JOB_USER)
        found = []
        for line in out.decode(errors="replace").splitlines():
            head, _, tail = line.partition("\t")
            try:
                record = dict(json.loads(head))
                table = dict(json.loads(tail)) if tail.strip() else {}
            except ValueError:
                continue
            record.pop("template", None)
            trials = list(table.get("trials") or [])
            record["trials_done"] = sum(
                1
                for t in trials
                if t.get("state") in ("succeeded", "failed", "pruned", "cancelled")
            )
            record["best"] = table.get("best")
            found.append(shown_state(record))
        return sorted(found, key=lambda r: (r.get("submitted_at", 0), r.get("id", "")))

    def output_from(self, sweep_id: str, offset: int) -> bytes:
        check_id(sweep_id)
        node = self.jobs.any_node()
        code, out = node.run(
            ["tail", "-c", f"+{offset + 1}", f"{SWEEPS}/{sweep_id}/{OUTPUT}"], user=JOB_USER
        )
        return out if code == 0 else b""

    # -- cancel and resume -------------------------------------------------------------
    def cancel(self, sweep_id: str) -> dict[str, Any]:
        """Stop the sweep: its driver stops every running trial (each ends `cancelled`) and
        records the sweep `cancelled`. Without a live driver, the trials are cancelled from
        here and the record written so."""
        node = self.jobs.any_node()
        record = self._raw(sweep_id, node)
        if record.get("state") in SWEEP_FINAL:
            return self.record(sweep_id)
        stop = json.dumps({"reason": "cancelled", "at": time.time()}).encode()
        node.put(f"{SWEEPS}/{sweep_id}/{STOP_FILE}", stop, user=JOB_USER)
        if driver_alive(record):
            deadline = time.monotonic() + CANCEL_WAIT_SECONDS
            while time.monotonic() < deadline:
                if self._raw(sweep_id, node).get("state") in SWEEP_FINAL:
                    return self.record(sweep_id)
                time.sleep(1.0)
            raise CliError(
                f"sweep {sweep_id}'s driver did not stop within {CANCEL_WAIT_SECONDS} s "
                f"(pid {record.get('pid')} on {record.get('node')})",
                EXIT_FAILED,
            )
        for trial in self.record(sweep_id).get("trials") or []:
            if trial.get("state") not in ("succeeded", "failed", "pruned", "cancelled", "lost"):
                with contextlib.suppress(CliError):
                    self.jobs.cancel(str(trial["job_id"]))
        self._write(node, sweep_id, {**record, "state": "cancelled", "ended_at": time.time()})
        return self.record(sweep_id)

    def resume(self, sweep_id: str) -> dict[str, Any]:
        """Start the sweep's driver again, on the node it ran on when that node is up, else on
        another: it goes on where the last one stopped (trainstack_training.sweep.driver)."""
        node = self.jobs.any_node()
        record = self._raw(sweep_id, node)
        if record.get("state") in SWEEP_FINAL and record.get("state") != "failed":
            raise CliError(f"sweep {sweep_id} has {record['state']}: nothing to resume", EXIT_INPUT)
        if record.get("state") != "failed" and self.driver_running(record):
            raise CliError(
                f"sweep {sweep_id}'s driver runs (pid {record.get('pid')} on "
                f"{record.get('node')}): nothing to resume",
                EXIT_INPUT,
            )
        target = self.jobs.node_named(str(record.get("node") or ""))
        if target is None or target.unavailable():
            target = self.jobs.any_node_with_venv()
        fresh = {**record, "state": "starting", "node": target.name, "heartbeat": time.time()}
        fresh.pop("ended_at", None)
        self._write(target, sweep_id, fresh)
        target.run(["rm", "-f", f"{SWEEPS}/{sweep_id}/{STOP_FILE}"], user=JOB_USER)
        self.start_driver(target, f"{SWEEPS}/{sweep_id}")
        return self.record(sweep_id)

    def driver_running(self, record: dict[str, Any]) -> bool:
        """The sweep's driver process is there: asked on its node when that node answers
        (a driver killed a moment ago is gone at once), else by its heartbeat."""
        node = self.jobs.node_named(str(record.get("node") or ""))
        pid = int(record.get("pid") or 0)
        if node is None or pid <= 0:
            return driver_alive(record)
        try:
            code, _ = node.run(
                ["grep", "-q", "trainstack_training.sweep", f"/proc/{pid}/cmdline"], user=JOB_USER
            )
        except TransportError:
            return driver_alive(record)
        return code == 0

    def _write(self, node: Transport, sweep_id: str, record: dict[str, Any]) -> None:
        node.put(f"{SWEEPS}/{sweep_id}/{SWEEP_RECORD}", json.dumps(record).encode(), user=JOB_USER)


def shown_state(record: dict[str, Any]) -> dict[str, Any]:
    """A running sweep whose driver stopped beating is shown `stopped` (resume it)."""
    if record.get("state") in ("running", "starting") and not driver_alive(record):
        return {**record, "state": "stopped"}
    return record
