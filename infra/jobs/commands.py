"""What each `trainstack` command does on a stack (infra.jobs.cli parses the arguments).

The stack's outputs come from `pulumi stack output`, once per state of the stack
(infra.jobs.outputs_cache); the jobs are reached over the stack's
transports (infra.transport), their records read from the cluster's shared storage.
`CliError` carries the exit code the CLI ends with (the codes: infra/jobs/cli.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainstack_training.rundir import FINAL_STATES, INSTALL_SCRIPT, OUTPUT, RECORD, rank_log
from trainstack_training.tracking import TRACKING_FILE, run_url

from infra.config.values import PROJECT_DIR
from infra.jobs import envs
from infra.jobs.envs import EnvError
from infra.jobs.launch import (
    JobFacts,
    LaunchSettings,
    job_record,
    runner_command,
    train_command,
)
from infra.jobs.outputs_cache import cached_outputs
from infra.jobs.package import JobDirError, Packed, pack
from infra.jobs.remote import (
    JOB_USER,
    JOBS_DIR,
    MODELS_DIR,
    NODE_ENV,
    NODE_VENV,
    RemoteError,
    ship,
    submitter,
    sync_tracking,
)
from infra.transport import Transport, TransportError, transports_for

EXIT_FAILED, EXIT_INPUT, EXIT_UNREACHABLE = 1, 2, 3
# How long `cancel` waits for the runner to record the end (its driver gets 5 s to stop
# the Spark way, then SIGTERM, then SIGKILL 5 s later: docs/jobs.md).
CANCEL_WAIT_SECONDS = 40
LOG_POLL_SECONDS = 0.5


class CliError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def project_env() -> dict[str, str]:
    """The environment `eval "$(make -s env)"` gives (scripts/env.sh): the project's Pulumi
    CLI, backend and passphrase, on top of this process's environment."""
    script = PROJECT_DIR / "scripts" / "env.sh"
    try:
        dump = subprocess.run(
            ["bash", "-c", f'eval "$({shlex.quote(str(script))})" && env -0'],
            capture_output=True,
            check=True,
        ).stdout.decode()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise CliError(f"cannot read the project's Pulumi settings ({script}): {exc}", 3) from None
    return dict(item.split("=", 1) for item in dump.split("\0") if "=" in item)


def _pulumi_env() -> dict[str, str]:
    """The caller's environment when it has a Pulumi backend (`eval "$(make -s env)"` or a
    test's), else the project's."""
    return dict(os.environ) if os.environ.get("PULUMI_BACKEND_URL") else project_env()


def _pulumi_outputs(stack: str | None, env: dict[str, str]) -> dict[str, Any]:
    """What `pulumi stack output --json` prints for the stack (the selected one without
    `stack`)."""
    cmd = ["pulumi", "stack", "output", "--json", "--non-interactive"]
    if stack:
        cmd += ["--stack", stack]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=PROJECT_DIR, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CliError(f"cannot run `pulumi`: {exc}", EXIT_UNREACHABLE) from None
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise CliError(
            f"cannot read the stack's outputs ({said[-1] if said else 'pulumi failed'}); "
            "pick a stack with --stack NAME, or `pulumi stack select`",
            EXIT_UNREACHABLE,
        )
    try:
        outputs = json.loads(proc.stdout or "{}")
    except ValueError:
        outputs = None
    if not isinstance(outputs, dict):
        raise CliError(
            f"`pulumi stack output --json` printed no JSON object: {proc.stdout[:200]!r}",
            EXIT_UNREACHABLE,
        )
    return outputs


def stack_outputs(stack: str | None) -> dict[str, Any]:
    """The stack's outputs, with `jobNodes` and `jobDefaults`. Pulumi is asked once per
    state of the stack: while its state file in a local backend is unchanged, the outputs
    kept beside it are used (infra.jobs.outputs_cache)."""
    env = _pulumi_env()
    outputs = cached_outputs(stack, env, lambda: _pulumi_outputs(stack, env))
    if not outputs.get("jobNodes") or not outputs.get("jobDefaults"):
        raise CliError(
            f"stack {stack or '(selected)'} has no jobNodes/jobDefaults outputs: bring it up "
            "with this version (`pulumi up`) first",
            EXIT_UNREACHABLE,
        )
    return dict(outputs)


def queued_command(
    settings: LaunchSettings, run_dir: str, app_name: str, *, install: bool, slots: int = 0
) -> list[str]:
    """A submitted job's command: the job runner (the job's record, the queue lock, the
    packages' install when `install`) around `trainstack-train`, both from infra.jobs.launch."""
    train = train_command(settings, run_dir, app_name=app_name)
    return runner_command(settings, run_dir, train, install=install, tee=False, slots=slots)


@dataclass(frozen=True)
class Prepared:
    """A job ready to run (Jobs.prepare): the node that starts it, how it trains, what it
    is, and its packages' install script ("" = none)."""

    node: Transport
    launch: LaunchSettings
    facts: JobFacts
    install: str


class Jobs:
    """A stack's jobs, over its transports."""

    def __init__(self, outputs: dict[str, Any]) -> None:
        self.defaults: dict[str, Any] = outputs["jobDefaults"]
        self.nodes: list[Transport] = transports_for(outputs["jobNodes"])
        # Tracking on (the stack's `tracking` output: the tracking node's record, the server's
        # URI, the auth file on that node, the UI's URL), else {}.
        self.tracking_setup: dict[str, Any] = dict(outputs.get("tracking") or {})

    def any_node(self) -> Transport:
        try:
            return submitter(self.nodes, check_venv=False)
        except RemoteError as exc:
            raise CliError(str(exc), EXIT_UNREACHABLE) from None

    def node_named(self, name: str) -> Transport | None:
        for node in self.nodes:
            if node.name == name or node.name.endswith(f"-{name}"):
                return node
        return None

    def record(self, job_id: str, node: Transport | None = None) -> dict[str, Any]:
        node = node or self.any_node()
        path = f"{MODELS_DIR}/{job_id}/{RECORD}"
        for _ in range(5):
            try:
                text = node.fetch(path)
            except TransportError:
                raise CliError(
                    f"no job {job_id!r} on this stack (`trainstack list` shows its jobs)",
                    EXIT_INPUT,
                ) from None
            with contextlib.suppress(ValueError):  # replaced atomically: a retry reads it whole
                return dict(json.loads(text))
            time.sleep(0.2)
        raise CliError(f"{path} on {node.name} is not valid JSON", EXIT_FAILED)

    def tracking(self, job_id: str, node: Transport | None = None) -> dict[str, Any]:
        """The job's tracking.json (its MLflow run, tracking/), or {} when it has none."""
        node = node or self.any_node()
        try:
            found = dict(json.loads(node.fetch(f"{MODELS_DIR}/{job_id}/{TRACKING_FILE}")))
        except (TransportError, ValueError, TypeError):
            return {}
        # The UI's URL as it is now (the stack output; an engine-picked port can change).
        ui_url = str(self.tracking_setup.get("ui_url") or "")
        if ui_url and found.get("run_id"):
            found["url"] = run_url(ui_url, str(found.get("experiment_id")), str(found["run_id"]))
        return found

    def sync(self, job_id: str) -> dict[str, Any]:
        """Sync the job's MLflow run (all jobs' without `job_id`) now, on the tracking node:
        the `sync` command's JSON line (trainstack_training.tracking)."""
        if not self.tracking_setup.get("node"):
            raise CliError("tracking is off on this stack (trainstack:tracking)", EXIT_INPUT)
        try:
            return sync_tracking(self.tracking_setup, str(self.defaults.get("stack") or ""), job_id)
        except RemoteError as exc:
            raise CliError(str(exc), 3) from None

    def records(self) -> list[dict[str, Any]]:
        node = self.any_node()
        # Every run's record: submitted jobs' (job-*) and the stack's declared job's (run-*).
        script = f'for f in {MODELS_DIR}/*/{RECORD}; do [ -f "$f" ] && cat "$f" && echo; done; true'
        _, out = node.run(["sh", "-c", script], user=JOB_USER)
        found = []
        for line in out.decode(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except ValueError:
                    continue
        return sorted(found, key=lambda r: (r.get("submitted_at", 0), r.get("id", "")))

    # -- submit -------------------------------------------------------------------------
    def check_workers(self, workers: int, given: str = "--workers") -> None:
        """A job's ranks fit the cluster's training slots (one rank a slot), before anything
        is shipped: one sentence with both numbers otherwise. `given`: where the number came
        from (`--workers N`, or the manifest's `[job] workers = N`)."""
        slots = int(self.defaults.get("slots") or self.defaults["workers"])
        what = f"{given} {workers}" if given == "--workers" else f"{given} = {workers}"
        if workers < 1:
            raise CliError(f"{what}: a job needs at least 1 worker", EXIT_INPUT)
        if workers > slots:
            raise CliError(
                f"{what}: this cluster has {slots} training slot"
                f"{'s' if slots != 1 else ''} (one rank each); ask for at most {slots}",
                EXIT_INPUT,
            )
        if workers != int(self.defaults["workers"]) and self.defaults.get("strategy") == "single":
            raise CliError(
                f"{what}: the stack trains with the `single` strategy (one worker "
                "with all of its cores); leave --workers out",
                EXIT_INPUT,
            )

    def queue_slots(self) -> int:
        """The queue's capacity a submitted job's queue process is given: the cluster's training
        slots, or 0 (one job at a time) with `trainstack:concurrentJobs` false."""
        return int(self.defaults.get("slots") or 0) if self.defaults.get("concurrent", True) else 0

    def prepare(
        self,
        directory: Path,
        params: dict[str, Any],
        overrides: dict[str, Any],
        *,
        default_workers: int | None = None,
    ) -> Prepared:
        """A job directory checked, packed, shipped to the cluster with its packages staged,
        and its launch settings and facts: all of a submit but the run (a sweep's trials share
        one). `default_workers`: the job's ranks when neither --workers nor the manifest
        says (None: the stack's)."""
        from trainstack_training.jobsettings import chosen_data
        from trainstack_training.manifest import JobError, load_spec

        if "workers" in overrides:
            self.check_workers(int(overrides["workers"]))
        try:
            spec = load_spec(directory, params)
            if spec.workers and "workers" not in overrides:  # --workers wins over the manifest
                self.check_workers(spec.workers, "[job] workers")
                overrides = {**overrides, "workers": spec.workers}
            elif default_workers and "workers" not in overrides:
                overrides = {**overrides, "workers": default_workers}
            packed: Packed = pack(directory)
            # The data set: --data, else the manifest's, else the stack's (docs/jobs.md,
            # Data); "none" for a job that reads its own data (then --data is refused).
            given = str(overrides.get("data") or "")
            data = chosen_data(spec, f"{JOBS_DIR}/{packed.sha}", given, "--data")
            env = envs.resolve(directory, spec.requirements)
        except (JobError, JobDirError, EnvError) as exc:
            raise CliError(str(exc), EXIT_INPUT) from None
        overrides = {**overrides, **({"data": data} if data else {})}
        node = self.any_node_with_venv()
        try:
            ship(node, packed)
        except RemoteError as exc:
            raise CliError(str(exc), EXIT_UNREACHABLE) from None
        # The wheels go to the cluster now (a conflicting pin fails here, before anything
        # runs); the install itself is the job's first state, `installing` (its queue process).
        try:
            staged = envs.stage(node, env, f"{NODE_VENV}/bin/python", JOB_USER) if env else None
        except EnvError as exc:
            raise CliError(str(exc), EXIT_FAILED) from None
        launch = LaunchSettings.submitted(
            {**self.defaults, **overrides},
            job_sha=packed.sha,
            job_params=json.dumps(spec.params, sort_keys=True),
            job_env=staged.site if staged else "",
        )
        facts = JobFacts(
            job=str(directory.resolve()),
            code_sha=packed.sha,
            env_sha=env.sha if env else "",
            params=spec.params,
            mode=spec.mode,
            framework=spec.framework,
            experiment=spec.experiment,
            stack=str(self.defaults.get("stack") or ""),
        )
        return Prepared(node, launch, facts, staged.script if staged else "")

    def submit(
        self,
        directory: Path,
        params: dict[str, Any],
        overrides: dict[str, Any],
        priority: int = 0,
    ) -> str:
        prepared = self.prepare(directory, params, overrides)
        node, launch, install = prepared.node, prepared.launch, prepared.install
        job_id = f"job-{datetime.now(UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
        run_dir = f"{MODELS_DIR}/{job_id}"
        state = "installing" if install else "queued"
        record = job_record(
            job_id, launch, prepared.facts, node=node.name, state=state, origin="submit",
            priority=priority,
        )  # fmt: skip
        command = queued_command(
            launch, run_dir, f"trainstack-{job_id}", install=bool(install),
            slots=self.queue_slots(),
        )  # fmt: skip
        detached = f"setsid nohup {shlex.join(command)} >/dev/null 2>&1 </dev/null &"
        try:
            node.run(["mkdir", "-p", run_dir], user=JOB_USER)
            node.put(f"{run_dir}/{RECORD}", json.dumps(record).encode(), user=JOB_USER)
            if install:
                node.put(f"{run_dir}/{INSTALL_SCRIPT}", install.encode(), user=JOB_USER)
            code, out = node.run(["sh", "-c", detached], user=JOB_USER, env=NODE_ENV)
        except TransportError as exc:
            raise CliError(
                f"cannot start the job on {node.name}: {exc}", EXIT_UNREACHABLE
            ) from None
        if code != 0:
            raise CliError(
                f"cannot start the job on {node.name}: {out.decode(errors='replace')[-300:]}",
                EXIT_UNREACHABLE,
            )
        return job_id

    def any_node_with_venv(self) -> Transport:
        try:
            return submitter(self.nodes, check_venv=True)
        except RemoteError as exc:
            raise CliError(str(exc), EXIT_UNREACHABLE) from None

    # -- logs and cancel ----------------------------------------------------------------
    def output_from(
        self, job_id: str, offset: int, node: Transport, rank: int | None = None
    ) -> bytes:
        """The job's output from `offset` on: the runner's, or one TensorFlow rank's own."""
        name = OUTPUT if rank is None else rank_log(rank)
        code, out = node.run(
            ["tail", "-c", f"+{offset + 1}", f"{MODELS_DIR}/{job_id}/{name}"], user=JOB_USER
        )
        return out if code == 0 else b""

    def cancel(self, job_id: str) -> dict[str, Any]:
        record = self.record(job_id)
        if record.get("state") in FINAL_STATES:
            return record
        node = self.node_named(str(record.get("node", "")))
        if node is None:
            raise CliError(
                f"job {job_id} runs on {record.get('node')!r}, which is not a node of this stack "
                "any more",
                EXIT_UNREACHABLE,
            )
        pid = int(record.get("pid") or 0)
        if pid <= 0:  # the runner has not written its pid yet: wait for it a moment
            for _ in range(20):
                time.sleep(0.25)
                record = self.record(job_id, node)
                pid = int(record.get("pid") or 0)
                if pid:
                    break
        if pid:
            node.run(["kill", "-TERM", str(pid)], user=JOB_USER)
        deadline = time.monotonic() + CANCEL_WAIT_SECONDS
        while time.monotonic() < deadline:
            record = self.record(job_id, node)
            if record.get("state") in FINAL_STATES:
                return record
            time.sleep(0.25)
        raise CliError(
            f"job {job_id} did not stop within {CANCEL_WAIT_SECONDS} s (runner pid {pid} on "
            f"{node.name})",
            EXIT_FAILED,
        )


def check_rank(record: dict[str, Any], rank: int | None) -> None:
    """A rank the job has, or a CliError naming the ones it has."""
    if rank is None:
        return
    workers = int(record.get("workers") or 0)
    if rank < 0 or (workers and rank >= workers):
        have = f"ranks 0-{workers - 1}" if workers > 1 else "rank 0"
        raise CliError(
            f"--rank {rank}: job {record.get('id')} has {workers} TensorFlow worker(s), {have}",
            EXIT_INPUT,
        )


def follow_logs(jobs: Jobs, job_id: str, follow: bool, rank: int | None = None) -> int:
    record = jobs.record(job_id)
    check_rank(record, rank)
    node = jobs.any_node()
    offset = 0
    while True:
        chunk = jobs.output_from(job_id, offset, node, rank)
        if chunk:
            offset += len(chunk)
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        if not follow:
            return 0
        if record.get("state") in FINAL_STATES and not chunk:
            return 0 if record.get("state") == "succeeded" else EXIT_FAILED
        time.sleep(LOG_POLL_SECONDS)
        record = jobs.record(job_id, node)
