"""Every job an MLflow run, on the shared stack (docs/monitoring.md, "Compare runs"): the
stack's declared job and the jobs the earlier modules submitted (TensorFlow, the regressions,
torch, a failed and a cancelled one) are runs with their params, tags, every epoch's metrics
once and their artifacts; a client without the login is refused; the tracking server killed
mid-job loses nothing; the UI in a real browser shows the runs and one run's chart (the
screenshots go to .artifacts/)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import requests
from trainstack_training.epochs import is_metric
from trainstack_training.rundir import EPOCH_LOG

from tests.support.browser import screenshot
from tests.support.stacks import ROOT, wait_until

from .cli import EXAMPLES, status, trainstack
from .conftest import MODELS, TRACKING_NODE, mlflow_login, sh

pytestmark = pytest.mark.e2e

SERVER_PROGRAM = "mlflow"
SHOTS = ROOT / ".artifacts" / "screenshots"


def _run_of(client, job_id: str, timeout: float = 120):
    """The run tagged with `job_id`, once its sync has completed it (tracking.json)."""
    found: list = []

    def synced() -> bool:
        runs = client.search_runs(
            [e.experiment_id for e in client.search_experiments()],
            filter_string=f"tags.`trainstack.job_id` = '{job_id}'",
        )
        found[:] = runs
        return len(runs) == 1 and runs[0].info.status != "RUNNING"

    wait_until(f"the MLflow run of job {job_id}", synced, timeout)
    return found[0]


def _steps(client, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def _record(platform, job_id: str) -> dict:
    return status(platform, job_id)


# The training settings that are params beside the job's own [params] (docs/jobs.md, Tracking).
SETTINGS = ("workers", "epochs", "batch_size", "strategy", "data", "framework")


def _expected_params(job: dict) -> dict[str, str]:
    """The run's params from the job's record (`trainstack list --json`): its [params] with
    the overrides, over the training settings; a value that is not a string as JSON."""
    assert isinstance(job.get("params"), dict), job
    merged = {k: job[k] for k in SETTINGS if job.get(k) not in (None, "")} | job["params"]
    return {
        k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in merged.items()
    }


def _epochs_ran(platform, job_id: str) -> dict[int, dict]:
    """The epochs the job ran, by number: its run directory's epochs.jsonl (the chief's rows;
    after a resume an epoch is there twice and the last row wins), {} when it has none (a job
    that failed before its first epoch). A file that is there but cannot be read fails."""
    path = f"{MODELS}/{job_id}/{EPOCH_LOG}"
    code, text = sh(platform.container(TRACKING_NODE), f"if [ -e {path} ]; then cat {path}; fi")
    assert code == 0, f"{path} on {TRACKING_NODE}: cannot read it: {text[-500:]}"
    rows: dict[int, dict] = {}
    for line in text.splitlines():
        if line.strip():
            row = json.loads(line)
            rows[int(row["epoch"])] = row
    return rows


def _epoch_mismatches(platform, client, job_id: str, run_id: str) -> tuple[list, int]:
    """Each epoch metric of the job's epochs.jsonl against the run's history: (the metrics
    whose steps are not each epoch the job ran exactly once, the number of points checked).
    The server keeps one of identical points, so a step sent twice with the same point is not
    seen here; tests/training/test_tracking_sync.py counts what the sync sends."""
    rows = _epochs_ran(platform, job_id)
    keys = sorted({k for row in rows.values() for k, v in row.items() if is_metric(k, v)})
    wrong: list[tuple[str, dict]] = []
    points = 0
    for key in keys:
        wanted = sorted(e for e, row in rows.items() if is_metric(key, row.get(key)))
        have = _steps(client, run_id, key)
        points += len(wanted)
        if have != wanted:
            wrong.append((key, {"epochs ran": wanted, "steps in MLflow": have}))
    return wrong, points


def _each_epoch_once(platform, client, job: dict, run_id: str) -> int:
    """Assert that the run has every epoch's metrics once; the points checked. A cancelled
    job's chief may write its last row a moment after the record says cancelled: the daemon
    syncs it within seconds, so a difference is looked at again for a while before it fails."""
    deadline = time.monotonic() + 30
    wrong, points = _epoch_mismatches(platform, client, job["id"], run_id)
    while wrong and time.monotonic() < deadline:
        time.sleep(2)
        wrong, points = _epoch_mismatches(platform, client, job["id"], run_id)
    assert not wrong, (job["id"], job["state"], wrong)
    return points


def _declared_run(platform, client):
    """The MLflow run of the stack's declared job, as its `training` output names it. The job
    may have been launched more than once in its directory (test_75 goes back to the default
    job): each launch is a run of its own, and the output names the last."""
    training = platform.outputs()["training"]
    assert training["tracking"].get("run_id") and training["tracking"]["url"], training
    run = client.get_run(training["tracking"]["run_id"])
    assert run.data.tags["trainstack.job_id"] == training["run_id"], run.data.tags
    return run


def test_the_declared_job_is_a_finished_run_with_its_epochs_and_artifacts(platform, mlflow_client):
    run = _declared_run(platform, mlflow_client)
    assert run.info.status == "FINISHED", run.info
    epochs = int(run.data.params["epochs"])
    assert _steps(mlflow_client, run.info.run_id, "val_accuracy") == list(range(1, epochs + 1))
    for tag in ("job_id", "code_sha", "framework", "mode", "stack", "spark_application"):
        assert run.data.tags.get(f"trainstack.{tag}"), (tag, run.data.tags)
    for param in ("workers", "epochs", "batch_size", "strategy", "data", "hidden_units"):
        assert param in run.data.params, (param, run.data.params)
    # The declared job's output went to `pulumi up` and to its output.log, as a submitted job's.
    artifacts = {a.path for a in mlflow_client.list_artifacts(run.info.run_id)}
    assert {"curves.png", "metrics.json", "model.keras", "output.log"} <= artifacts, artifacts


@pytest.fixture(scope="module")
def failed_job(platform, tmp_path_factory) -> str:
    """A submitted TensorFlow job whose code raises (the earlier modules' failing jobs are
    declared ones); its id, once it has failed."""
    job = tmp_path_factory.mktemp("tracking") / "failing"
    shutil.copytree(EXAMPLES / "digits", job)
    with (job / "model.py").open("a") as model:
        model.write("\n\ndef build_model(ctx):\n    raise RuntimeError('no model today')\n")
    submitted = trainstack(platform, "submit", str(job))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    trainstack(platform, "logs", "-f", job_id, timeout=300)
    assert _record(platform, job_id)["state"] == "failed"
    return job_id


def test_submitted_jobs_are_runs_whatever_their_framework_and_end(
    platform, mlflow_client, failed_job
):
    listed = trainstack(platform, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    jobs = json.loads(listed.stdout)
    ends = {"succeeded": "FINISHED", "failed": "FAILED", "cancelled": "KILLED", "pruned": "KILLED"}
    seen: dict[str, set[str]] = {}
    points: dict[str, int] = {}  # epoch metric points checked, per framework
    for job in jobs:
        # The stack's declared jobs are in `list` too (origin "stack"): a run directory
        # launched again is one MLflow run per launch, checked below and by the test above.
        if job["state"] not in ends or job.get("origin") == "stack":
            continue
        run = _run_of(mlflow_client, job["id"])
        assert run.info.status == ends[job["state"]], (job, run.info)
        framework = run.data.tags["trainstack.framework"]
        seen.setdefault(framework, set()).add(run.info.status)
        assert run.data.params == _expected_params(job), (job["id"], run.data.params, job)
        points[framework] = points.get(framework, 0) + _each_epoch_once(
            platform, mlflow_client, job, run.info.run_id
        )
        if job["state"] == "succeeded" and job.get("mode") == "simple":
            # A simple-mode job that succeeded ran all its epochs: the check above saw them.
            ran = sorted(_epochs_ran(platform, job["id"]))
            assert ran == list(range(1, int(job["epochs"]) + 1)), (job["id"], ran, job)
        artifacts = {a.path for a in mlflow_client.list_artifacts(run.info.run_id)}
        assert "output.log" in artifacts, (job["id"], artifacts)
        if job["state"] == "failed":
            assert run.data.tags.get("trainstack.error"), run.data.tags
    assert failed_job in {job["id"] for job in jobs}, jobs
    # The declared jobs that failed their `up` (test_75's broken code; test_70's missing data
    # in the full suite) are runs too, FAILED with their error.
    declared = mlflow_client.search_runs(
        [e.experiment_id for e in mlflow_client.search_experiments()],
        filter_string=(
            "tags.`trainstack.job_id` LIKE 'run-%' and tags.`trainstack.state` = 'failed'"
        ),
    )
    assert declared, "no failed declared job among the runs"
    for run in declared:
        assert run.info.status == "FAILED" and run.data.tags.get("trainstack.error"), run
    # test_76 (a cancelled TensorFlow job) and test_79_torch ran before this.
    assert seen.get("tensorflow", set()) >= {"FINISHED", "FAILED", "KILLED"}, seen
    assert "FINISHED" in seen.get("torch", set()), seen
    assert points.get("tensorflow") and points.get("torch"), points  # epochs were checked


def test_list_shows_one_metric_column_and_status_the_run(platform, mlflow_client, failed_job):
    listed = trainstack(platform, "list", "--metric", "val_loss")
    assert listed.returncode == 0, listed.stderr
    assert "VAL_LOSS" in listed.stdout.splitlines()[0].split(), listed.stdout
    shown = trainstack(platform, "status", failed_job)
    assert shown.returncode == 1, shown.stderr  # the job failed (docs/jobs.md, exit codes)
    run = _run_of(mlflow_client, failed_job)
    assert run.info.run_id in shown.stdout, shown.stdout


def test_a_client_without_the_login_is_refused(platform):
    url = platform.outputs()["mlflowUiUrl"] + "/api/2.0/mlflow/experiments/search"
    user, password = mlflow_login(platform)
    ok = requests.get(url, params={"max_results": 5}, auth=(user, password), timeout=30)
    assert ok.status_code == 200 and "experiments" in ok.json(), ok.text[:300]
    anonymous = requests.get(url, params={"max_results": 5}, timeout=30)
    assert anonymous.status_code == 401, anonymous.text[:300]
    wrong = requests.get(url, params={"max_results": 5}, auth=(user, "not-it"), timeout=30)
    assert wrong.status_code == 401, wrong.text[:300]


def _server(platform, action: str) -> str:
    code, out = sh(platform.container(TRACKING_NODE), f"supervisorctl {action} {SERVER_PROGRAM}")
    assert code == 0, out
    return out


def test_the_server_killed_mid_job_loses_and_repeats_no_metric(platform, mlflow_client):
    """The tracking server stops while a job trains: the job goes on; when the server is back,
    the run is completed with every epoch's metrics exactly once."""
    epochs = 80
    submitted = trainstack(platform, "submit", str(EXAMPLES / "digits"), "--epochs", str(epochs))
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    partial: list = []
    tracked_run: list[str] = []

    def some_epochs_tracked() -> bool:
        runs = mlflow_client.search_runs(
            [e.experiment_id for e in mlflow_client.search_experiments()],
            filter_string=f"tags.`trainstack.job_id` = '{job_id}'",
        )
        partial[:] = _steps(mlflow_client, runs[0].info.run_id, "val_loss") if runs else []
        tracked_run[:] = [runs[0].info.run_id] if runs else []
        return bool(partial)

    wait_until("the job's first epochs in MLflow", some_epochs_tracked, 180, every=0.5)
    _server(platform, "stop")
    try:
        stopped_at = len(partial)
        assert stopped_at < epochs, "the job was tracked to its end before the server stopped"
        follow = trainstack(platform, "logs", "-f", job_id, timeout=600)
        assert follow.returncode == 0, follow.stdout[-2000:] + follow.stderr
        assert _record(platform, job_id)["state"] == "succeeded"
        # The sync that logged the first epochs wrote tracking.json; none since has reached
        # the server, so it still says the run is not complete.
        tracking_file = f"{MODELS}/{job_id}/tracking.json"
        code, tracked = sh(platform.container(TRACKING_NODE), f"cat {tracking_file}")
        assert code == 0, f"{tracking_file} on {TRACKING_NODE}: cannot read it: {tracked}"
        try:
            record = json.loads(tracked)
        except ValueError as exc:
            raise AssertionError(f"{tracking_file}: not JSON ({exc}): {tracked[:500]}") from exc
        assert record.get("complete") is False, f"{tracking_file} after the job: {record}"
        assert record.get("run_id") == tracked_run[0], (record, tracked_run)
    finally:
        _server(platform, "start")
    run = _run_of(mlflow_client, job_id, timeout=240)
    assert run.info.status == "FINISHED", run.info
    for key in ("loss", "val_loss", "accuracy", "val_accuracy"):
        assert _steps(mlflow_client, run.info.run_id, key) == list(range(1, epochs + 1)), key
    print(f"server stopped after {stopped_at} of {epochs} epochs were tracked; all {epochs} once")


def test_the_ui_shows_the_stacks_runs_and_a_runs_chart(platform, mlflow_client):
    url = platform.outputs()["mlflowUiUrl"]
    run = _declared_run(platform, mlflow_client)
    experiment = run.info.experiment_id
    login = mlflow_login(platform)
    started = time.monotonic()
    page = screenshot(
        f"{url}/#/experiments/{experiment}/runs",
        SHOTS / "mlflow-runs.png",
        login=login,
        wait_for=(run.info.run_name,),
    )
    assert "matching run" in page, page[:500]
    screenshot(
        f"{url}/#/experiments/{experiment}/runs/{run.info.run_id}/model-metrics",
        SHOTS / "mlflow-run-metrics.png",
        login=login,
        wait_for=("val_accuracy",),
        wait_css=("svg .scatterlayer .trace path",),
    )
    assert Path(SHOTS / "mlflow-run-metrics.png").stat().st_size > 10_000
    print(f"two pages in {time.monotonic() - started:.1f} s; screenshots in {SHOTS}")
