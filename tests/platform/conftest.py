"""One real stack for the whole product: end to end, monitoring, security and the failure drills.

Building a stack (up, provision, train) is the suite's most expensive step, so these modules
share one, as Molecule shares one instance between converge, idempotence and verify. It is the
default topology (3 control nodes, 2 masters, 2 workers) with monitoring on at its default
scrape interval (5 s) and a short alert `for:`, so that an alert fires within seconds.

The modules run in file order, and each documents what it changes:

  test_10_platform     read only: the first `up`'s trained model, outputs, testinfra, a no-op `up`
  test_20_monitoring   read only: targets, counts, the run's metrics, the utilisation picture
  test_30_security     read only: outsiders refused by Spark and ZooKeeper, no secret in the clear
  test_40_alerts       kills a worker's daemon until its alert fires, then lets it clear
  test_50_rotation     rotates the secrets (`rotateSecrets`): that `up` stopped with two
                       SIGINTs (drill 4a), then one more `up` converges
  test_60_scaling      scales the workers 2 -> 3 (the drills need the third)
  test_70_failed_job   a training job that fails, then the fix
  test_75_jobs         the user's own code through `pulumi up`: a broken job, the CNN with a
                       package, the regression example, then the default job again
  test_76_submit       `trainstack submit/status/logs/cancel/list`, packages, refusals
                       (cli.py: the `trainstack` helpers that test_76 to test_79 share)
  test_77_side_by_side several jobs at once: two one-worker jobs admitted together, each
                       equal to its run alone; a failed and a cancelled one beside a
                       training one; `--workers` past the slots refused; the declared job
                       in `list`
  test_77_yield        the warm runner yields to plain Spark applications; a job queued
                       behind one
  test_78_any_model    regressions in simple and full mode through `trainstack submit`
  test_79_sweep        a sweep: a grid of trials two at once, lagging ones pruned, the driver
                       killed and resumed, its MLflow parent run with the trials as children
  test_79_torch        PyTorch jobs: torch installed once, DDP and full mode, cancel
  test_79_tracking     every job above an MLflow run; no login refused; the tracking server
                       killed mid-job; the UI in a real browser (screenshots in .artifacts/)
  test_80_drills       the failure drills, which kill masters, workers and whole containers
  test_90_destroy      `pulumi destroy` leaves nothing of the stack

A drill that must strike a training run in the middle holds the run at an epoch boundary with
the job's test-only hold file (`TRAINSTACK_TEST_HOLD_FILE`, docs/training.md), instead of
counting on a large workload to be slow enough.
"""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from infra.nodes import NODE_PATHS
from tests.support.stacks import ROOT, Stack

CONFIG = {
    "uiPortBase": "0",
    "monitoringPort": "0",
    # The default scrape interval (5 s): at 2 s the exporters and Prometheus took about a tenth
    # of a core for the whole stream, on a CI bound by its CPU (tests/README.md).
    "monitoringAlertFor": "4s",
    "trainEpochs": "8",
    # Fixed, so scaling the servers does not launch a new run.
    "trainWorkers": "2",
    # The warm runner that the first `up`'s job starts stays up through the read-only modules
    # (test_30_security checks who can reach it), however slowly they run.
    "runnerKeepAlive": "30m",
}
WORKERS = 2  # until test_60_scaling adds the third
MODELS = NODE_PATHS.models_dir
DATA = NODE_PATHS.data_dir
# The job's test-only hold hook: while this file exists, the run waits at each epoch's end.
HOLD_ENV = "TRAINSTACK_TEST_HOLD_FILE"
HOLD_FILE = f"{MODELS}/.test-hold"
# The tracking server's node and its login file (the mlflow role).
TRACKING_NODE = "control-1"
AUTH_FILE = "/etc/trainstack/mlflow/auth.ini"


@dataclass
class Platform:
    stack: Stack
    first: subprocess.CompletedProcess  # the first `up`, from nothing to a trained model

    def outputs(self) -> dict[str, Any]:
        return self.stack.outputs()

    def container(self, node: str) -> str:
        return f"{self.stack.label}-{node}"


@pytest.fixture(scope="package")
def platform(tmp_path_factory, engine) -> Iterator[Platform]:
    stack = Stack(tmp_path_factory.mktemp("platform"), prefix="tsplat")
    stack.env[HOLD_ENV] = HOLD_FILE
    try:
        stack.init(**CONFIG)
        yield Platform(stack, stack.up())
    finally:
        stack.destroy_and_remove()


def sh(container: str, command: str, user: str = "root", timeout: int = 300) -> tuple[int, str]:
    """Run a shell command in a node's container as `user`: (exit code, stdout+stderr)."""
    proc = subprocess.run(
        ["docker", "exec", "-u", user, container, "bash", "-c", command],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def node(outputs: dict, name: str) -> dict:
    return next(n for n in outputs["nodes"] if n["name"] == name)


def hold(platform: Platform) -> None:
    """Make every run of the stack wait at its next epoch end until `release`."""
    code, out = sh(platform.container("control-3"), f"touch {HOLD_FILE}")
    assert code == 0, out


def release(platform: Platform) -> None:
    code, out = sh(platform.container("control-3"), f"rm -f {HOLD_FILE}")
    assert code == 0, out


def epoch_rows(platform: Platform, run_dir: str) -> list[dict[str, Any]]:
    """The run's epochs.jsonl rows (control-3 holds no master: no drill kills it mid-run)."""
    code, out = sh(platform.container("control-3"), f"cat {run_dir}/epochs.jsonl 2>/dev/null")
    return [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")] if code == 0 else []


# The drills' figures (docs/reliability.md), one entry per drill, merged run after run.
DRILLS_REPORT = ROOT / "bench" / "results" / "drills.json"


def record_drill(drill: str, **fields: Any) -> None:
    """Merge one drill's figures into the JSON report (other drills' entries are kept)."""
    DRILLS_REPORT.parent.mkdir(parents=True, exist_ok=True)
    report = json.loads(DRILLS_REPORT.read_text()) if DRILLS_REPORT.exists() else {}
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    report[drill] = {
        **fields,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit,
        "load_average_1m": round(os.getloadavg()[0], 1),
    }
    DRILLS_REPORT.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def mlflow_login(platform) -> tuple[str, str]:
    """The tracking server's admin login, from its auth file on the tracking node."""
    code, text = sh(platform.container(TRACKING_NODE), f"cat {AUTH_FILE}")
    assert code == 0, text
    ini = configparser.ConfigParser()
    ini.read_string(text)
    return ini["mlflow"]["admin_username"], ini["mlflow"]["admin_password"]


@pytest.fixture(scope="module")
def mlflow_client(platform) -> Iterator:
    """The MLflow client on the control machine, through the published UI (mlflowUiUrl)."""
    from mlflow.tracking import MlflowClient

    user, password = mlflow_login(platform)
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")}
    os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = user, password
    try:
        yield MlflowClient(platform.outputs()["mlflowUiUrl"])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
