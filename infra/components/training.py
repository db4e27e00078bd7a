"""The training job as a resource: launched inside the cluster, its metrics as outputs.

The job is submitted on a node of the cluster (client mode): Spark standalone's cluster
deploy mode does not take Python applications, and the nodes cannot always reach back to
the user's machine. It runs again only when its trigger changes: the training settings,
the data set, the training package, or the user's `trainstack:retrain` token. A run
that was interrupted keeps its run directory, so the next `pulumi up` resumes it from
TensorFlow's backup instead of starting over.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, Resource, ResourceProvider, UpdateResult
from trainstack_training.rundir import METRICS_FILE, PLOT_FILE, RECORD, model_file, rank_log

from infra.errors import UserFacingError, short_provider_errors, write_details
from infra.jobs import envs, remote
from infra.jobs.launch import (
    JobFacts,
    LaunchSettings,
    job_record,
    runner_command,
    train_command,
)
from infra.jobs.remote import RemoteError, ship_directory, submitter, sync_tracking
from infra.transport import Transport, TransportError, transports_for

__all__ = ["Training", "TrainingArgs"]

short_provider_errors()

# TEST ONLY: when the `pulumi` process has this variable (a path on the cluster's shared
# storage, e.g. <MODELS_DIR>/.test-hold), the job is launched with `--hold-file` and every
# worker waits at an epoch end while that file exists (docs/training.md, "Test-only hooks").
# Read at launch, never stored in the resource's inputs: setting or unsetting it changes no
# diff and launches no run.
TEST_HOLD_FILE_ENV = "TRAINSTACK_TEST_HOLD_FILE"


class TrainingError(UserFacingError):
    """The job failed; the message carries the job's own error."""


def _copy_files(
    node: Transport, run_dir: str, dest: Path, names: Sequence[str], required: Sequence[str] = ()
) -> list[str]:
    """Copy `names` from the run directory into `dest`; a missing one of `required` fails."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in names:
        try:
            data = node.fetch(f"{run_dir}/{name}")
        except TransportError as exc:
            if name in required:
                raise TrainingError(f"{run_dir}/{name} was not written by the job: {exc}") from exc
            continue
        (dest / name).write_bytes(data)
        copied.append(str(dest / name))
    return copied


def _rank_logs(workers: int) -> list[str]:
    """Each rank's own log (ranklog.py); a rank that never started has none."""
    return [rank_log(rank) for rank in range(workers)]


def _recorded_error(node: Transport, run_dir: str) -> str:
    """The error the job's queue process recorded (a job cancelled while it was queued has no
    output of its driver), or "" when there is none."""
    try:
        return str(json.loads(node.fetch(f"{run_dir}/{RECORD}")).get("error") or "")
    except (TransportError, ValueError, AttributeError):
        return ""


def _results(framework: str) -> tuple[list[str], list[str]]:
    """What is copied back to the host (the files to try, the ones that must be there): the
    model, the metrics, the curves (optional). Shards and the backup stay on the cluster."""
    model = model_file(framework or "tensorflow")
    return [model, METRICS_FILE, PLOT_FILE], [model, METRICS_FILE]


def _utilisation(
    props: dict[str, Any],
    submitter: Transport,
    run_dir: str,
    host_dir: Path,
    start: float,
    end: float,
) -> dict[str, Any]:
    """The run's utilisation picture from Prometheus (when monitoring is on): the PNG on the
    host and in the run directory beside curves.png, and the bottleneck node. A failure is
    reported in the result and does not fail the run."""
    url = props.get("monitoring_url") or ""
    if not url:
        return {}
    from infra.monitoring import PLOT_FILE, MonitoringError, run_utilisation

    try:
        found = run_utilisation(
            url,
            start,
            end,
            {k: float(v) for k, v in (props.get("node_cpus") or {}).items()},
            props.get("scrape_interval") or "15s",
            host_dir,
        )
    except MonitoringError as exc:
        print(f"utilisation picture: {exc}", file=sys.stderr)
        return {"utilisation_error": str(exc)}
    try:
        submitter.put(f"{run_dir}/{PLOT_FILE}", Path(found["plot"]).read_bytes(), mode=0o644)
    except TransportError as exc:  # the picture is on the host all the same
        print(f"utilisation picture not copied into the run directory: {exc}", file=sys.stderr)
    node = found["bottleneck"]
    share = found["nodes"][node]["cpu_share_of_limit"]
    print(f"utilisation: bottleneck {node} ({share:.0%} of its CPU limit)", file=sys.stderr)
    return {
        "bottleneck_node": node,
        "utilisation_plot": found["plot"],
        "utilisation": found["nodes"],
        "monitoring_url": url,
    }


def _track(props: dict[str, Any]) -> dict[str, Any]:
    """The run as an MLflow run (when tracking is on), synced now rather than on the sync
    daemon's next round, so the result names it: {"tracking": {run_id, url, ...}}. A failure
    is reported in the result and does not fail the run: the daemon syncs it later."""
    if not (props.get("tracking") or {}).get("node"):
        return {}
    try:
        synced = sync_tracking(props["tracking"], props.get("stack") or "", props["run_id"])
    except RemoteError as exc:
        print(f"tracking: {exc}", file=sys.stderr)
        return {"tracking": {"error": str(exc)}}
    run: dict[str, Any] = next(iter(synced.get("synced") or []), {})
    if run.get("error") or not run.get("run_id"):
        why = run.get("error") or "no run"
        print(f"tracking: {why} (the sync daemon retries)", file=sys.stderr)
        return {"tracking": {"error": why}}
    print(f"tracking: MLflow run {run['run_id']} {run.get('url', '')}", file=sys.stderr)
    return {"tracking": {k: run.get(k) for k in ("run_id", "experiment_id", "url", "status")}}


def _candidates(props: dict[str, Any]) -> list[Transport]:
    """The nodes that may submit, in order: node records (or the container names of state
    written before node records; before that, one name in `submit_container`)."""
    return transports_for(list(props.get("submit_candidates") or [props["submit_container"]]))


def _submitter(candidates: list[Any]) -> Transport:
    """The first candidate that is reachable and can start the job (infra.jobs.remote)."""
    try:
        return submitter(candidates)
    except RemoteError as exc:
        raise TrainingError(str(exc)) from None


def _stop_earlier_launches(candidates: list[Transport], run_dir: str, grace_s: int = 60) -> None:
    """Stop a launch of this run that still runs on a node, so that the new one resumes alone.

    A `pulumi up` stopped at once (a second Ctrl-C, a killed `pulumi`) takes this provider
    with it, but not the job it started on the node (`docker exec`, `ssh`): that keeps
    training into the run's directory. Two launches there would share one backup. The old
    driver gets SIGTERM (its Spark application, executors and TensorFlow workers end with
    it), SIGKILL after `grace_s`; the new launch then resumes from the last finished epoch's
    backup.
    """
    # The queue process of a launch (it cancels its driver the way `trainstack cancel` does
    # and records the launch's end), and a driver of a launch from before it had one.
    pattern = f"(trainstack_training.queue {run_dir} |trainstack-train .*--output {run_dir}( |$))"
    for node in candidates:
        try:
            if node.unavailable():
                continue
            code, out = node.run(["pgrep", "-f", pattern])
        except TransportError:  # an unreachable node runs nothing we can stop
            continue
        pids = [p for p in out.decode(errors="replace").split() if p.isdigit()] if code == 0 else []
        if not pids:
            continue
        print(
            f"an earlier launch of this run still runs on {node.name} (pid {' '.join(pids)}; "
            "left by an interrupted `pulumi up`): stopping it, this launch resumes from its "
            "backup",
            file=sys.stderr,
            flush=True,
        )
        script = (
            f"kill -TERM {' '.join(pids)} 2>/dev/null; "
            f"i=0; while [ $i -lt {grace_s} ]; do kill -0 {' '.join(pids)} 2>/dev/null || exit 0; "
            f"i=$((i + 1)); sleep 1; done; kill -KILL {' '.join(pids)} 2>/dev/null; exit 0"
        )
        try:
            node.run(["sh", "-c", script], user="root")
        except TransportError as exc:
            print(f"could not stop it: {exc}", file=sys.stderr, flush=True)


def _ship_job(node: Transport, props: dict[str, Any]) -> None:
    """Put the job's code on the cluster's shared storage at JOBS_DIR/<sha> (once per sha)."""
    sha = props["settings"].get("job_sha")
    if not sha:
        return
    try:
        ship_directory(node, props["job_source"], sha)
    except RemoteError as exc:
        raise TrainingError(f"training job: {exc}") from None
    env_sha = props["settings"].get("env_sha")
    if env_sha:
        env = envs.Env(env_sha, (), Path(props.get("env_wheels") or "/nonexistent"))
        try:
            envs.install(node, env, f"{remote.NODE_VENV}/bin/python", remote.JOB_USER)
        except envs.EnvError as exc:
            raise TrainingError(f"training job: {exc}") from None


def _test_hold_file() -> str:
    """The TEST ONLY hold file named by TEST_HOLD_FILE_ENV in this process's environment
    (inherited from the `pulumi` CLI), or "" when unset or blank."""
    return os.environ.get(TEST_HOLD_FILE_ENV, "").strip()


def _job_command(
    settings: LaunchSettings, run_dir: str, hold_file: str = "", slots: int = 0
) -> list[str]:
    """The command of a launch of this run: `trainstack-train` under the job runner, both from
    infra.jobs.launch, in the foreground with its output streamed (`--tee`): the same queue,
    record and output as a submitted job's. `hold_file`: see TEST_HOLD_FILE_ENV ("" = no hold
    hook)."""
    train = train_command(settings, run_dir, hold_file=hold_file)
    return runner_command(settings, run_dir, train, install=False, tee=True, slots=slots)


def _write_record(
    node: Transport, run_dir: str, run_id: str, launch: LaunchSettings, props: dict[str, Any]
) -> None:
    """The launch's job record, as a submitted job starts with (infra.jobs.launch.job_record):
    `trainstack status`/`list` show the stack's job, and the tracking sync reads it. A launch
    again in the same run directory starts a new record."""
    facts = JobFacts.from_dict(
        {
            **(props.get("facts") or {}),
            "job": props.get("job_source", ""),
            "code_sha": launch.job_sha,
            "env_sha": props["settings"].get("env_sha", ""),
            "stack": props.get("stack") or "",
        }
    )
    record = job_record(run_id, launch, facts, node=node.name, state="queued", origin="stack")
    try:
        node.run(["mkdir", "-p", run_dir], user=remote.JOB_USER)
        node.put(f"{run_dir}/{RECORD}", json.dumps(record).encode(), user=remote.JOB_USER)
    except TransportError as exc:
        raise TrainingError(f"cannot start the job on {node.name}: {exc}") from None


class _TrainingJobProvider(ResourceProvider):
    serialize_as_secret_always = False

    def _run(self, props: dict[str, Any]) -> dict[str, Any]:
        run_dir = f"{remote.MODELS_DIR}/{props['run_id']}"
        # The launch's settings, read once from the props (from an earlier version's state too).
        launch = LaunchSettings.declared(props["settings"], props["master_url"])
        candidates = _candidates(props)
        _stop_earlier_launches(candidates, run_dir)
        node = _submitter(candidates)
        hold_file = _test_hold_file()  # at launch, from the environment: not an input
        if hold_file:
            print(
                f"TEST ONLY: {TEST_HOLD_FILE_ENV} is set: every worker waits at each epoch end "
                f"(but the last) while {hold_file} exists on the nodes",
                file=sys.stderr,
            )
        _ship_job(node, props)
        _write_record(node, run_dir, props["run_id"], launch, props)
        command = _job_command(launch, run_dir, hold_file, int(props.get("slots") or 0))
        print(f"launching on {node.name}: {shlex.join(command)}", file=sys.stderr)
        started = time.time()
        # As the daemons' user, who owns the shared storage and Spark's client config (with
        # the cluster's auth secret, mode 0600).
        code, stdout = node.stream(command, env=remote.NODE_ENV, user=remote.JOB_USER)
        finished = time.time()
        lines = [line for line in stdout.strip().splitlines() if line.startswith("{")]
        summary = json.loads(lines[-1]) if lines else {}
        host_dir = Path(props["host_artifacts_dir"]) / props["run_id"]
        workers = launch.workers
        if code != 0 or not summary.get("ok"):
            log = host_dir / "job.log"
            write_details(log, stdout)
            ranks = _copy_files(node, run_dir, host_dir, _rank_logs(workers))
            why = summary.get("error") or _recorded_error(node, run_dir) or stdout.strip()[-500:]
            raise TrainingError(
                f"training job on {node.name} failed (exit {code}): {why}; job output: {log}"
                + (f", each worker's own output: {host_dir}/rank-<N>.log" if ranks else "")
            )
        wanted, required = _results(str((props.get("facts") or {}).get("framework") or ""))
        copied = _copy_files(node, run_dir, host_dir, [*wanted, *_rank_logs(workers)], required)
        monitoring = _utilisation(props, node, run_dir, host_dir, started, finished)
        copied += [monitoring["utilisation_plot"]] if monitoring.get("utilisation_plot") else []
        tracking = _track(props)
        return {
            **props,
            "result": {
                **summary,
                **monitoring,
                **tracking,
                "run_id": props["run_id"],
                "cluster_run_dir": run_dir,
                "host_dir": str(host_dir),
                "host_files": copied,
                "submitted_on": node.name,
                "job": props.get("job_source", ""),
                "code_sha": launch.job_sha,
                "env_sha": props["settings"].get("env_sha", ""),
                "copy_command": node.copy_command(run_dir),
            },
        }

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(props["run_id"], self._run(props))

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = olds.get("run_id") != news.get("run_id")
        return DiffResult(changes=changed, replaces=[], stables=[])

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(self._run(news))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        """Models and metrics stay on the models volume and in the host folder."""


class _TrainingJob(Resource, module="training", name="TrainingJob"):
    result: pulumi.Output[dict]

    def __init__(self, name: str, props: dict[str, Any], opts: pulumi.ResourceOptions) -> None:
        super().__init__(_TrainingJobProvider(), name, {**props, "result": None}, opts)


@dataclass
class TrainingArgs:
    master_url: str
    # The worker nodes in order, as node records (infra.transport; a bare string is a
    # container name): the job is submitted from the first healthy one.
    submit_candidates: list[dict[str, Any]] | list[str]
    # job_sha, job_params, workers, epochs, batch_size, data, rows, strategy,
    # cores_per_worker, spark_conf, runner_keep_alive, runner_yield, env_sha: in the
    # resource's props as they are (they make its trigger), read at launch by
    # infra.jobs.launch.LaunchSettings.declared
    settings: dict[str, Any]
    trigger: str  # digest of everything that should launch a new run
    host_artifacts_dir: str
    # The job's directory on this machine (settings["job_sha"] is its packed content's sha).
    job_source: str = ""
    # Where the job's packages' wheels are cached on this machine (infra.jobs.envs), when
    # settings["env_sha"] names an overlay.
    env_wheels: str = ""
    # Prometheus's URL on the host (monitoring on): the run's utilisation picture comes from it.
    monitoring: pulumi.Input[str] | None = None
    # The stack's `tracking` output (infra.program.tracking_setup), when tracking is on: the
    # run is synced to MLflow once the job succeeded, and its id and URL are in the result.
    tracking: pulumi.Input[dict[str, Any]] | None = None
    stack: str = ""
    # What the job's manifest says (infra.jobs.launch.JobFacts: params, mode, framework,
    # experiment), for its record; not part of the trigger.
    facts: dict[str, Any] | None = None
    # The cluster's training slots: the job's admission beside submitted jobs (not a trigger).
    slots: int = 0
    node_cpus: dict[str, float] | None = None  # CPU limit per node, for the bottleneck
    scrape_interval: str = "15s"


class Training(pulumi.ComponentResource):
    """Deploys nothing new (provisioning installed the package) and launches the job."""

    result: pulumi.Output[dict]

    def __init__(
        self, name: str, args: TrainingArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:training:Training", name, None, opts)
        job = _TrainingJob(
            f"{name}-job",
            {
                "master_url": args.master_url,
                "submit_candidates": args.submit_candidates,
                "settings": args.settings,
                "run_id": f"run-{args.trigger[:12]}",
                "host_artifacts_dir": args.host_artifacts_dir,
                "job_source": args.job_source,
                "env_wheels": args.env_wheels,
                "monitoring_url": args.monitoring or "",
                "tracking": args.tracking or {},
                "stack": args.stack,
                "facts": args.facts or {},
                "slots": args.slots,
                "node_cpus": args.node_cpus or {},
                "scrape_interval": args.scrape_interval,
            },
            pulumi.ResourceOptions(
                parent=self, custom_timeouts=pulumi.CustomTimeouts(create="60m")
            ),
        )
        self.result = job.result
        self.register_outputs({"result": self.result})
