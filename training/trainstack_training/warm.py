"""The warm runner: a Spark application that outlives a job, so that the next job pays no
Spark start-up.

    python -m trainstack_training.warm --state DIR --keep-alive SECONDS --key KEY

`trainstack-train --runner-keep-alive N` (N > 0) runs its job in the warm
runner of the node it runs on. It starts one when none runs there (or when the one there was
built with other Spark settings), then attaches to it (`attach`). The runner is a PySpark
driver like any other: its JVM holds one SparkContext, registered with the masters (the
multi-master URL: it survives the loss of the ALIVE master as any client does), with its
executors on the workers. Each job stays a fresh Python process of its own, the
`trainstack-train` that attached: its code, imports and data stage are its own, and its Spark
jobs run in the runner's context in a job group of its own. The barrier tasks get fresh Python
workers on the executors, as before (spark.python.worker.reuse=false).

What a job reaches the runner by is the Py4J gateway of its JVM: on 127.0.0.1 only and
authenticated by a secret in ``DIR/runner.json``, mode 0600 in a 0700 directory of the user
who runs jobs (the holder of the cluster's secret, which that user's Spark config already
holds). It adds no port that other machines can reach and none without authentication.

The runner stops its context and exits:
- while no job runs in it, as soon as another Spark application waits for the cores it holds
  (every POLL_SECONDS; `--runner-yield`, on by default: the ALIVE master's JSON page says so,
  trainstack_training.sparkmaster), so that the cluster stays a Spark cluster for everyone;
  a running job keeps its cores until it ends. The yield is logged, and counted in Prometheus
  (`trainstack_runner_yields_total`, through the Pushgateway);
- after SECONDS without a job, so the cluster's cores go back to other applications (barrier
  stages cannot use dynamic allocation, SPARK-24819); the next job starts it again;
- when a job on another node asks it to (one warm runner per cluster: its executors hold the
  cores that job needs), through ``<runs directory>/.warm-runner.stop`` on shared storage;
- when its context has stopped (every master gone for good), or on SIGTERM.

A job whose process dies (SIGKILL) leaves Spark jobs behind in the runner's context: the
runner cancels the job group of every lease whose process has gone.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainstack_training import sparkmaster
from trainstack_training.config import TrainConfig
from trainstack_training.metrics import PUSHGATEWAY_ENV, push_runner_yields
from trainstack_training.spark import build_context

if TYPE_CHECKING:
    from pyspark import SparkContext

APP_NAME = "trainstack-runner"
INFO = "runner.json"  # port, secret, settings key, pid: mode 0600
LOG = "runner.log"
CONFIG = "config.json"  # the settings of the job that started the runner
LOCK = "lock"
LEASE_PREFIX = "lease-"  # lease-<pid>: a job attached; holds its job group
SHARED = ".warm-runner.json"  # in the runs directory: which node's runner holds the cores
STOP_REQUEST = ".warm-runner.stop"
POLL_SECONDS = 1.0
HEARTBEAT_SECONDS = 3.0  # how often the shared registration is rewritten
HEARTBEAT_STALE_SECONDS = 10.0
START_TIMEOUT_SECONDS = 300.0  # the JVM and the context (not the executors: the job waits)
EVICT_TIMEOUT_SECONDS = 60.0
WARM_UP_GROUP = "trainstack-warm-up"
YIELD_CONFIRM_CHECKS = 2  # the same application seen waiting this many checks in a row
YIELDS = ".warm-runner.yields.json"  # in the runs directory: the cluster's yields so far
# A user's runner state lives in STATE_DIR_PREFIX + uid on each node (the common role's teardown
# removes it: common_warm_runner_dir_prefix).
STATE_DIR_PREFIX = "/tmp/trainstack-warm-"


class WarmRunnerError(RuntimeError):
    """The warm runner could not be started or reached; the message says why and where its
    log is."""


def state_dir() -> Path:
    """The node-local directory of this user's runner: 0700, owned by this user."""
    path = Path(os.environ.get("TRAINSTACK_WARM_DIR") or f"{STATE_DIR_PREFIX}{os.getuid()}")
    path.mkdir(mode=0o700, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise WarmRunnerError(
            f"{path} must be a directory of uid {os.getuid()} with mode 0700 "
            f"(it is uid {st.st_uid}, mode {st.st_mode & 0o777:o}); remove it and run again"
        )
    return path


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


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own child that exited) is not alive.
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, value: dict[str, Any], mode: int = 0o600) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(value, sort_keys=True))
    os.chmod(tmp, mode)
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked_file(path: Path, mode: int = 0o600) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _locked(state: Path) -> contextlib.AbstractContextManager[None]:
    """This node's runner lock: held while a job attaches and while the runner decides to
    stop, so that no job attaches to a runner that is stopping."""
    return _locked_file(state / LOCK)


def live_runner(state: Path) -> dict[str, Any]:
    """This node's runner (its runner.json), or {} when none runs."""
    info = _read_json(state / INFO)
    return info if info and _alive(int(info.get("pid", 0))) else {}


def _stop_pid(pid: int, timeout: float = 30.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _evict_other_nodes(runs_dir: Path, say: Any) -> None:
    """Ask a warm runner on another node to stop (it holds the cores this job needs), and
    wait until it has gone or stopped beating."""
    host = socket.gethostname()
    other = _read_json(runs_dir / SHARED)
    if not other or other.get("host") == host:
        return
    if time.time() - float(other.get("heartbeat", 0)) > HEARTBEAT_STALE_SECONDS:
        return  # its node went away with it
    say(f"stopping the warm runner on {other.get('host')} (one per cluster)")
    with contextlib.suppress(OSError):
        _write_json(
            runs_dir / STOP_REQUEST, {"host": other.get("host"), "pid": other.get("pid")}, 0o644
        )
    deadline = time.monotonic() + EVICT_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        now = _read_json(runs_dir / SHARED)
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
    _write_json(state / CONFIG, cfg.to_dict())
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
        info = _read_json(state / INFO)
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
    with _locked(state):
        info = live_runner(state)
        if info and info.get("key") != key:
            say("the warm runner here has other Spark settings: starting it again with this job's")
            _stop_pid(int(info["pid"]))
            info = {}
        started = not info
        if info:
            up = time.time() - float(info["started_at"])
            say(f"running in the warm runner (pid {info['pid']}, up {up:.0f} s)")
        else:
            _evict_other_nodes(Path(cfg.output).resolve().parent, say)
            info = _start(state, cfg, key, say)
        _write_json(lease, {"pid": os.getpid(), "group": group})
    try:
        sc = _connect(int(info["port"]), str(info["secret"]))
    except BaseException:
        lease.unlink(missing_ok=True)
        raise
    sc.setJobGroup(group, f"{cfg.app_name}: {cfg.output}", interruptOnCancel=True)
    return Attached(sc, group, lease, time.time(), started)


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


# -- the runner's own process ----------------------------------------------------------------


class Runner:
    def __init__(self, state: Path, keep_alive: float, key: str, cfg: TrainConfig) -> None:
        self.state, self.keep_alive, self.key, self.cfg = state, keep_alive, key, cfg
        self.runs_dir = Path(cfg.output).resolve().parent
        self.host = socket.gethostname()
        self.stopping = False
        self.sc: SparkContext | None = None
        self.gateway = ""
        self.seen_waiting: tuple[str | None, int] = (None, 0)

    def on_term(self, signum: int, frame: Any) -> None:
        del signum, frame
        self.stopping = True

    def log(self, line: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}", flush=True)

    def leases(self) -> list[Path]:
        return sorted(self.state.glob(f"{LEASE_PREFIX}*"))

    def reap(self) -> int:
        """Cancel the job group of every lease whose job has gone; the number still live."""
        live = 0
        for lease in self.leases():
            held = _read_json(lease)
            if _alive(int(held.get("pid", 0) or lease.name[len(LEASE_PREFIX) :] or 0)):
                live += 1
                continue
            if self.sc is not None and held.get("group"):
                self.log(f"job {held['group']} ended without detaching: cancelling its Spark jobs")
                with contextlib.suppress(Exception):
                    self.sc.cancelJobGroup(str(held["group"]))
            lease.unlink(missing_ok=True)
        return live

    def asked_to_stop(self) -> bool:
        request = _read_json(self.runs_dir / STOP_REQUEST)
        if request.get("host") == self.host and request.get("pid") == os.getpid():
            with contextlib.suppress(OSError):
                (self.runs_dir / STOP_REQUEST).unlink()
            return True
        return False

    def beat(self) -> None:
        with contextlib.suppress(OSError):
            _write_json(
                self.runs_dir / SHARED,
                {"host": self.host, "pid": os.getpid(), "heartbeat": time.time()},
                mode=0o644,
            )

    def yield_to(self) -> sparkmaster.Application | None:
        """The application this idle runner should give its cores to: at once when no worker
        has a free core; else one seen waiting in YIELD_CONFIRM_CHECKS checks in a row (a new
        application is WAITING for the moment before the master schedules it on free cores)."""
        assert self.sc is not None
        view = sparkmaster.alive_master(self.cfg.master, self.cfg.master_ui_port)
        app = sparkmaster.waiting_for_cores(view, self.sc.applicationId) if view else None
        if app is None:
            self.seen_waiting = (None, 0)
            return None
        if view is not None and view.free_cores == 0:
            return app  # no free core anywhere: it cannot be about to get one
        seen, count = self.seen_waiting
        count = count + 1 if seen == app.id else 1
        self.seen_waiting = (app.id, count)
        return app if count >= YIELD_CONFIRM_CHECKS else None

    def stop_if_idle(self, why: str) -> str:
        """`why` when no job has attached meanwhile (the runner's info is then gone, so none
        attaches later), else "": no job attaches while the runner decides."""
        with _locked(self.state):
            if self.reap():
                return ""
            (self.state / INFO).unlink(missing_ok=True)
            return why

    def count_yield(self) -> None:
        """One more yield in the cluster's count (shared storage), pushed to Prometheus."""
        path = self.runs_dir / YIELDS
        try:
            with _locked_file(path.with_name(f".{path.name}.lock")):
                total = int(_read_json(path).get("yields", 0)) + 1
                _write_json(path, {"yields": total}, mode=0o644)
        except OSError as exc:
            self.log(f"counting the yield failed: {exc}")
            return
        push_runner_yields(self.gateway, total)

    def serve(self) -> int:
        signal.signal(signal.SIGTERM, self.on_term)
        started = time.time()
        self.sc = build_context(self.cfg, app_name=APP_NAME)
        signal.signal(signal.SIGINT, self.on_term)  # after PySpark's own handler
        assert self.sc._gateway is not None  # no public accessor for the gateway's port
        gateway = self.sc._gateway.gateway_parameters
        # The Pushgateway the executors get (the spark role's client config), for the yields.
        self.gateway = self.sc.getConf().get(
            f"spark.executorEnv.{PUSHGATEWAY_ENV}", os.environ.get(PUSHGATEWAY_ENV, "")
        )
        self.beat()
        _write_json(
            self.state / INFO,
            {
                "pid": os.getpid(),
                "port": int(gateway.port),
                "secret": str(gateway.auth_token),
                "key": self.key,
                "host": self.host,
                "started_at": started,
                "app_id": self.sc.applicationId,
                "keep_alive": self.keep_alive,
            },
        )
        self.log(
            f"up in {time.time() - started:.1f} s: application {self.sc.applicationId}, "
            f"keep-alive {self.keep_alive:.0f} s"
        )
        threading.Thread(target=self.warm_executors, daemon=True).start()
        idle_since = beaten = time.monotonic()
        why = ""
        while not why:
            time.sleep(POLL_SECONDS)
            if time.monotonic() - beaten >= HEARTBEAT_SECONDS:
                self.beat()
                beaten = time.monotonic()
            live = self.reap()
            if live:
                idle_since = time.monotonic()
            if self.stopping:
                why = "SIGTERM"
            elif self.sc._jsc.sc().isStopped():
                why = "its Spark context stopped (the masters gave up on it)"
            elif self.asked_to_stop():
                why = "a job on another node needs the cores"
            elif not live and self.cfg.runner_yield and (other := self.yield_to()) is not None:
                why = self.stop_if_idle(f"yielding the cores to {other}, which waits for them")
            elif time.monotonic() - idle_since >= self.keep_alive:
                why = self.stop_if_idle(f"idle for {self.keep_alive:.0f} s")
            if not why and time.monotonic() - idle_since >= self.keep_alive:
                idle_since = time.monotonic()  # a job attached while the runner decided
        self.stop(why)
        if why.startswith("yielding"):  # counted once the cores are given back
            self.count_yield()
        return 0

    def warm_executors(self) -> None:
        """Start the Python daemon on the executors now (one small task per TensorFlow
        worker): each imports TensorFlow once (trainstack_training.daemon), while the first
        job is still connecting and reading its data, not in its barrier stage."""
        assert self.sc is not None
        n = max(1, self.cfg.workers)
        started = time.monotonic()
        try:
            self.sc.setJobGroup(WARM_UP_GROUP, "start the executors' Python daemons")
            hosts = self.sc.parallelize(range(n), n).map(lambda _: socket.gethostname()).collect()
        except Exception as exc:  # the runner works without it; the job pays the import
            self.log(f"warming the executors failed: {str(exc).splitlines()[0][:200]}")
            return
        self.log(
            f"executors' Python daemons up on {', '.join(sorted(set(hosts)))} "
            f"in {time.monotonic() - started:.1f} s"
        )

    def stop(self, why: str) -> None:
        self.log(f"stopping: {why}")
        with contextlib.suppress(OSError):
            if _read_json(self.state / INFO).get("pid") == os.getpid():
                (self.state / INFO).unlink()
            if _read_json(self.runs_dir / SHARED).get("pid") == os.getpid():
                (self.runs_dir / SHARED).unlink()
        if self.sc is not None:
            with contextlib.suppress(Exception):
                self.sc.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainstack_training.warm")
    parser.add_argument("--state", required=True)
    parser.add_argument("--keep-alive", type=float, required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    cfg = TrainConfig.from_dict(_read_json(Path(args.state) / CONFIG))
    return Runner(Path(args.state), args.keep_alive, args.key, cfg).serve()


if __name__ == "__main__":
    sys.exit(main())
