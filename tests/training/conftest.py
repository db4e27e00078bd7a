"""Fixtures for the training package's tests (real Spark in local mode, real TensorFlow)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.overlays import torch_overlay

JAVA_HOMES = ("/usr/lib/jvm/java-17-openjdk-amd64", "/usr/lib/jvm/java-1.17.0-openjdk-amd64")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "training: real Spark and TensorFlow runs")


def _require_runtime() -> None:
    """Fail (never skip) with the reason when Java or the Python packages are missing."""
    if not os.environ.get("JAVA_HOME"):
        for home in JAVA_HOMES:
            if Path(home, "bin", "java").exists():
                os.environ["JAVA_HOME"] = home
                break
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None
    if not (java and java.exists()) and not shutil.which("java"):
        pytest.fail(
            "Java is missing: Spark needs a JDK 17+ (apt-get install openjdk-17-jdk or "
            "set JAVA_HOME)",
            pytrace=False,
        )
    # pyspark and trainstack_training are imported (pytest uses them); TensorFlow and tf_keras
    # only found: the ranks and the few tests that need them import them in processes of
    # their own, and their import would cost pytest about 10 CPU-seconds for nothing.
    for module in ("pyspark", "tensorflow", "tf_keras", "trainstack_training"):
        try:
            if module in ("tensorflow", "tf_keras"):
                if importlib.util.find_spec(module) is None:
                    raise ImportError(f"No module named {module!r}")
            else:
                __import__(module)
        except ImportError as exc:
            pytest.fail(
                f"{module} is not importable ({exc}); install training/ and "
                "`pip install --no-deps tf-keras==2.21.0`",
                pytrace=False,
            )


@pytest.fixture(scope="session", autouse=True)
def training_runtime() -> None:
    _require_runtime()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] session for the data-stage tests (the training tests use the CLI)."""
    from trainstack_training.config import TrainConfig
    from trainstack_training.spark import build_session

    session = build_session(TrainConfig(master="local[2]", slot_wait_seconds=3))
    yield session
    session.stop()


# A job run with these arguments runs in the warm runner of `warm_runner`'s directory, as the
# stack's jobs do by default (`trainstack:runnerKeepAlive`): idle for this long, it stops.
IN_WARM_RUNNER = ["--runner-keep-alive", "60"]


@pytest.fixture(scope="module")
def warm_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The directory (TRAINSTACK_WARM_DIR) of one warm runner for a module's jobs run with
    IN_WARM_RUNNER: one local Spark JVM for them all, and one TensorFlow import, in its
    executor's daemon, for all their ranks and retries (a job's own application starts a JVM,
    and every rank of every attempt imports TensorFlow: about 10 CPU-seconds each). The
    runner is stopped after the module; tests/training/test_warm.py tests the runner itself."""
    path = tmp_path_factory.mktemp("warm") / "state"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINSTACK_WARM_DIR", str(path))
        yield path
    info = path / "runner.json"
    pid = int(json.loads(info.read_text()).get("pid", 0)) if info.exists() else 0
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)


def in_warm_runner(stderr: str) -> bool:
    """Whether the job whose stderr this is ran in a warm runner (it says so as it attaches)."""
    return "warm runner started (pid " in stderr or "running in the warm runner (pid " in stderr


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DIGITS_JOB = str(EXAMPLES / "digits")


def run_cli(args: list[str], timeout: int = 600) -> tuple[int, dict[str, Any], str]:
    """Run `trainstack-train` in a fresh process; return (rc, last-line JSON, stderr).
    Without --job-dir in `args`, the job is examples/digits."""
    if "--job-dir" not in args:
        args = ["--job-dir", DIGITS_JOB, *args]
    proc = subprocess.run(
        [sys.executable, "-m", "trainstack_training", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert lines, f"no stdout; stderr tail:\n{proc.stderr[-3000:]}"
    try:
        summary = json.loads(lines[-1])
    except json.JSONDecodeError:
        pytest.fail(f"last stdout line is not JSON: {lines[-1]!r}\nstderr:\n{proc.stderr[-3000:]}")
    return proc.returncode, summary, proc.stderr


@pytest.fixture(scope="session")
def torch_site() -> str:
    """The site directory of an overlay with torch in it (what --job-env names)."""
    return torch_overlay()
