"""The warm runner's bookkeeping (trainstack_training.warm) without Spark: its private
directory, the settings key, leases of jobs that died, and the one-per-cluster stop request.
The runner with real Spark and TensorFlow: tests/training/test_warm.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from trainstack_training import warm
from trainstack_training.config import TrainConfig
from trainstack_training.rundir import WARM_RUNNER_FILE, WARM_RUNNER_STOP, read_json, write_json
from trainstack_training.spark import context_settings
from trainstack_training.warm import client
from trainstack_training.warm.server import WarmServer

pytestmark = pytest.mark.unit


def test_the_state_directory_is_private_and_a_readable_one_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "w"
    monkeypatch.setenv("TRAINSTACK_WARM_DIR", str(path))
    assert warm.state_dir() == path and path.stat().st_mode & 0o777 == 0o700
    path.chmod(0o755)
    with pytest.raises(warm.WarmRunnerError, match="mode 0700"):
        warm.state_dir()


def test_the_settings_key_changes_with_any_spark_setting_but_not_the_app_name():
    base = TrainConfig(master="spark://a:7077,b:7077", workers=2)
    key = warm.settings_key(context_settings(base))
    renamed = TrainConfig(master="spark://a:7077,b:7077", workers=2, app_name="other")
    assert warm.settings_key(context_settings(renamed)) == key
    for changed in (
        TrainConfig(master="spark://a:7077", workers=2),
        TrainConfig(master="spark://a:7077,b:7077", workers=2, cores_per_worker=2),
        TrainConfig(master="spark://a:7077,b:7077", spark_conf="spark.executor.memory=2g"),
    ):
        assert warm.settings_key(context_settings(changed)) != key


def _runner(tmp_path: Path) -> WarmServer:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    cfg = TrainConfig(master="spark://a:7077", output=str(tmp_path / "runs" / "run-1"))
    (tmp_path / "runs").mkdir()
    return WarmServer(state, 60, "k", cfg)


def test_a_lease_of_a_job_that_died_is_reaped_and_a_live_one_kept(tmp_path):
    runner = _runner(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_json(runner.state / f"lease-{dead.pid}", {"pid": dead.pid, "group": "g-dead"})
    write_json(runner.state / f"lease-{os.getpid()}", {"pid": os.getpid(), "group": "g"})
    assert runner.reap() == 1
    assert [p.name for p in runner.leases()] == [f"lease-{os.getpid()}"]


def test_a_stop_request_stops_only_the_runner_it_names(tmp_path):
    runner = _runner(tmp_path)
    request = runner.runs_dir / WARM_RUNNER_STOP
    write_json(request, {"host": runner.host, "pid": os.getpid() + 1}, mode=0o644)
    assert not runner.asked_to_stop()  # an earlier runner on this host, gone since
    write_json(request, {"host": "elsewhere", "pid": os.getpid()}, mode=0o644)
    assert not runner.asked_to_stop()
    write_json(request, {"host": runner.host, "pid": os.getpid()}, mode=0o644)
    assert runner.asked_to_stop() and not request.exists()


def test_a_runner_on_another_node_is_asked_to_stop_and_a_silent_one_ignored(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    said: list[str] = []
    # Silent for longer than the staleness limit: its node went away with it.
    stale = {"host": "worker-9", "pid": 7, "heartbeat": time.time() - 60}
    write_json(runs / WARM_RUNNER_FILE, stale, mode=0o644)
    client._evict_other_nodes(runs, said.append)
    assert not said and not (runs / WARM_RUNNER_STOP).exists()
    # Beating: asked to stop; it answers by removing its registration.
    live = {"host": "worker-9", "pid": 7, "heartbeat": time.time()}
    write_json(runs / WARM_RUNNER_FILE, live, mode=0o644)

    # The other runner, played by a thread: it waits for the stop request, records what it
    # read, and answers by removing its registration (also when no request came, so that the
    # eviction below does not wait out its whole timeout). The checks run in this thread:
    # an assert in the helper thread would only be a warning.
    received: list[dict] = []

    def answer() -> None:
        deadline = time.monotonic() + 10
        request: dict = {}
        while not request and time.monotonic() < deadline:
            request = read_json(runs / WARM_RUNNER_STOP)
            time.sleep(0.05)
        received.append(request)
        (runs / WARM_RUNNER_FILE).unlink()

    t = threading.Thread(target=answer)
    t.start()
    client._evict_other_nodes(runs, said.append)
    # The eviction returned only once the other runner had answered.
    answered = not (runs / WARM_RUNNER_FILE).exists()
    t.join()
    assert received == [{"host": "worker-9", "pid": 7}], "no stop request reached worker-9"
    assert answered, "the eviction returned before the other runner had stopped"
    assert said == ["stopping the warm runner on worker-9 (one per cluster)"]
    # This node's own registration is never evicted.
    write_json(runs / WARM_RUNNER_FILE, {**live, "host": socket.gethostname()}, mode=0o644)
    client._evict_other_nodes(runs, said.append)
    assert len(said) == 1


def test_a_changed_spark_client_config_changes_the_key(tmp_path, monkeypatch):
    """A secret rotation rewrites spark-defaults.conf: the runner from before is not used."""
    settings = context_settings(TrainConfig(master="spark://a:7077"))
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("spark.authenticate.secret old\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf))
    before = warm.settings_key(settings)
    assert warm.settings_key(settings) == before
    (conf / "spark-defaults.conf").write_text("spark.authenticate.secret new\n")
    assert warm.settings_key(settings) != before


def test_the_runners_daemon_preloads_the_jobs_framework_only():
    """One framework per runner: torch's triton and TensorFlow abort one process that loads
    both (each carries LLVM); a torch runner preloads torch from the job's overlay."""
    tf = context_settings(TrainConfig(runner_keep_alive=600, framework="tensorflow"))
    torch = context_settings(TrainConfig(runner_keep_alive=600, framework="torch", job_env="/e"))
    assert tf["spark.python.daemon.module"] == torch["spark.python.daemon.module"]
    assert tf["spark.executorEnv.TRAINSTACK_PRELOAD"] == "tensorflow"
    assert "spark.executorEnv.TRAINSTACK_PRELOAD_SITE" not in tf
    assert torch["spark.executorEnv.TRAINSTACK_PRELOAD"] == "torch"
    assert torch["spark.executorEnv.TRAINSTACK_PRELOAD_SITE"] == "/e"
    assert warm.settings_key(tf) != warm.settings_key(torch)  # a torch job never joins a TF runner
    assert "spark.python.daemon.module" not in context_settings(TrainConfig())


def test_the_daemon_imports_torch_from_the_overlay_and_not_tensorflow(tmp_path):
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "_dynamo.py").write_text("")
    code = (
        "import sys; from trainstack_training import daemon; daemon.preload(); "
        "print('torch' in sys.modules, 'tensorflow' in sys.modules)"
    )
    env = {**os.environ, "TRAINSTACK_PRELOAD": "torch", "TRAINSTACK_PRELOAD_SITE": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.stdout.split() == ["True", "False"], out.stderr[-2000:]
