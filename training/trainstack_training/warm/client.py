"""The job's side of the warm runner: runs in the job's driver process (`trainstack-train
--runner-keep-alive N`, trainstack_training.launcher). It finds this node's runner, starts it
when none runs there (or when the one there was built with other Spark settings; it first asks
a runner on another node to stop: one per cluster), and attaches to it: a lease the runner
keeps while the job's process lives, and a SparkContext on the runner's JVM through its Py4J
gateway. The runner's own process is server.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainstack_training.config import TrainConfig
from trainstack_training.rundir import WARM_RUNNER_FILE, WARM_RUNNER_STOP, read_json, write_json
from trainstack_training.warm.state import (
    CONFIG,
    HEARTBEAT_STALE_SECONDS,
    INFO,
    LEASE_PREFIX,
    LOG,
    WarmRunnerError,
    alive,
    live_runner,
    locked,
    state_dir,
)

if TYPE_CHECKING:
    from pyspark import SparkContext

START_TIMEOUT_SECONDS = 300.0  # the JVM and the context (not the executors: the job waits)
EVICT_TIMEOUT_SECONDS = 60.0
LEASE_POLL_SECONDS = 1.0  # how often a job waits for the runner's jobs of other settings


def settings_key(settings: dict[str, str]) -> str:
    """The runner a job may use was built with exactly its Spark settings, and with the same
    Spark client config (SPARK_CONF_DIR: the masters, the cluster's secret), so that a runner
    from before a secret rotation or a provisioning change is started again, not used."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    conf_dir = os.environ.get("SPARK_CONF_DIR", "")
    if conf_dir and Path(conf_dir).is_dir():
        for path in sorted(Path(conf_dir).iterdir()):
            with contextlib.suppress(OSError):
                if path.is_file():
                    digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _stop_pid(pid: int, timeout: float = 30.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _evict_other_nodes(runs_dir: Path, say: Any) -> None:
    """Ask a warm runner on another node to stop (it holds the cores this job needs), and
    wait until it has gone or stopped beating."""
    host = socket.gethostname()
    other = read_json(runs_dir / WARM_RUNNER_FILE)
    if not other or other.get("host") == host:
        return
    if time.time() - float(other.get("heartbeat", 0)) > HEARTBEAT_STALE_SECONDS:
        return  # its node went away with it
    say(f"stopping the warm runner on {other.get('host')} (one per cluster)")
    with contextlib.suppress(OSError):
        write_json(
            runs_dir / WARM_RUNNER_STOP,
            {"host": other.get("host"), "pid": other.get("pid")},
            mode=0o644,
        )
    deadline = time.monotonic() + EVICT_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        now = read_json(runs_dir / WARM_RUNNER_FILE)
        if not now or now.get("host") != other.get("host"):
            return
        if time.time() - float(now.get("heartbeat", 0)) > HEARTBEAT_STALE_SECONDS:
            return
        time.sleep(0.5)
    say(f"the warm runner on {other.get('host')} did not stop within {EVICT_TIMEOUT_SECONDS:.0f} s")


def _start(state: Path, cfg: TrainConfig, key: str, say: Any) -> dict[str, Any]:
    """Start this node's runner for `cfg`'s settings and wait until its context is up."""
    (state / INFO).unlink(missing_ok=True)
    log = (state / LOG).open("ab")
    # The job's settings in a file of the private directory, not on the command line (where
    # every user's `ps` would show the job's parameters).
    write_json(state / CONFIG, cfg.to_dict(), mode=0o600)
    command = [
        sys.executable, "-m", "trainstack_training.warm",
        "--state", str(state), "--keep-alive", str(cfg.runner_keep_alive), "--key", key,
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, close_fds=True,
    )  # fmt: skip
    log.close()
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        info = read_json(state / INFO)
        if info.get("pid") == proc.pid and info.get("key") == key:
            say(f"warm runner started (pid {proc.pid}, keep-alive {cfg.runner_keep_alive} s)")
            return info
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    tail = (state / LOG).read_text(errors="replace").strip().splitlines()[-5:]
    raise WarmRunnerError(
        f"the warm runner did not start (exit {proc.poll()}); its log {state / LOG} ends: "
        + " | ".join(tail)
    )


@dataclass
class Attached:
    """A job's hold on the warm runner: its lease (the runner does not stop while the job's
    process lives) and its job group (cancelled when the job ends, however it ends)."""

    sc: SparkContext
    group: str
    lease: Path
    since: float  # when the job attached (its executors' wait starts there)
    started: bool  # this job started the runner (a cold start) rather than finding it up

    @property
    def mode(self) -> str:
        return "warm-runner started" if self.started else "warm-runner"

    def detach(self) -> None:
        """Cancel whatever Spark still runs for this job; the context stays up."""
        with contextlib.suppress(Exception):
            self.sc.cancelJobGroup(self.group)
        self.lease.unlink(missing_ok=True)


def attach(cfg: TrainConfig, settings: dict[str, str]) -> Attached:
    """This job's SparkContext in this node's warm runner (started when needed)."""

    def say(line: str) -> None:
        print(f"[trainstack] {line}", file=sys.stderr, flush=True)

    state = state_dir()
    # A runner that yields (or not) as this job asks, and asks the masters' UI on its port.
    key = settings_key(
        {**settings, "trainstack.runnerYield": str(cfg.runner_yield),
         "trainstack.masterUiPort": str(cfg.master_ui_port)}
    )  # fmt: skip
    group = f"trainstack-{os.getpid()}-{secrets.token_hex(4)}"
    lease = state / f"{LEASE_PREFIX}{os.getpid()}"
    told = False
    while True:
        with locked(state):
            info = live_runner(state)
            busy = live_leases(state) if info and info.get("key") != key else 0
            if not busy:
                if info and info.get("key") != key:
                    say(
                        "the warm runner here has other Spark settings: starting it again with "
                        "this job's"
                    )
                    _stop_pid(int(info["pid"]))
                    info = {}
                started = not info
                if info:
                    up = time.time() - float(info["started_at"])
                    say(f"running in the warm runner (pid {info['pid']}, up {up:.0f} s)")
                else:
                    _evict_other_nodes(Path(cfg.output).resolve().parent, say)
                    info = _start(state, cfg, key, say)
                write_json(lease, {"pid": os.getpid(), "group": group}, mode=0o600)
                break
        # Jobs with other Spark settings (another framework preloaded) run in it: it is
        # started again with this job's once they have ended, never under them.
        if not told:
            say(
                f"waiting for the warm runner's {busy} job{'s' if busy != 1 else ''} with other "
                "Spark settings to end"
            )
            told = True
        time.sleep(LEASE_POLL_SECONDS)
    try:
        sc = _connect(int(info["port"]), str(info["secret"]))
    except BaseException:
        lease.unlink(missing_ok=True)
        raise
    sc.setJobGroup(group, f"{cfg.app_name}: {cfg.output}", interruptOnCancel=True)
    # A pool of its own under the runner's FAIR scheduler: jobs in flight at once share the
    # executors' slots (each barrier stage starts when all of its tasks fit).
    sc.setLocalProperty("spark.scheduler.pool", group)
    return Attached(sc, group, lease, time.time(), started)


def live_leases(state: Path) -> int:
    """The jobs attached to this node's runner now, but this process."""
    count = 0
    for lease in state.glob(f"{LEASE_PREFIX}*"):
        pid = int(read_json(lease).get("pid", 0) or lease.name[len(LEASE_PREFIX) :] or 0)
        count += pid != os.getpid() and alive(pid)
    return count


def _connect(port: int, secret: str) -> SparkContext:
    """A PySpark SparkContext on the runner's JVM and its running context: PySpark's own way
    to use a gateway that is already up (PYSPARK_GATEWAY_PORT and _SECRET)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    os.environ["PYSPARK_GATEWAY_PORT"] = str(port)
    os.environ["PYSPARK_GATEWAY_SECRET"] = secret
    try:
        gateway = launch_gateway()
    finally:  # the job's own code does not get the runner's secret from the environment
        os.environ.pop("PYSPARK_GATEWAY_PORT", None)
        os.environ.pop("PYSPARK_GATEWAY_SECRET", None)
    jvm = gateway.jvm
    jsc = jvm.org.apache.spark.api.java.JavaSparkContext.fromSparkContext(
        jvm.org.apache.spark.SparkContext.getOrCreate()
    )
    conf = SparkConf(_jvm=jvm, _jconf=jsc.getConf())
    sc = SparkContext(conf=conf, gateway=gateway, jsc=jsc)
    sc.setLogLevel("ERROR")
    return sc
