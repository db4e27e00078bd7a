"""The warm runner's own process: one long-lived PySpark driver per node and user, started by
a job's driver (client.py) as `python -m trainstack_training.warm --state DIR --keep-alive
SECONDS --key KEY` (__main__.py), with its output in `DIR/runner.log`.

`WarmServer` builds the Spark context from the settings of the job that started it
(`DIR/config.json`), publishes its Py4J gateway in `DIR/runner.json` (mode 0600) for the jobs
that attach, registers itself in the runs directory (rundir.WARM_RUNNER_FILE, a heartbeat),
and then polls: it cancels the Spark jobs of leases whose process has gone, and stops when
idle too long, when another Spark application waits for its cores (the yield, counted in
rundir.WARM_RUNNER_YIELDS and pushed to Prometheus), when a job on another node asks it to
(rundir.WARM_RUNNER_STOP), when its context has stopped, or on SIGTERM (the package's
docstring has the whole story).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainstack_training import sparkmaster
from trainstack_training.config import TrainConfig
from trainstack_training.metrics import PUSHGATEWAY_ENV, push_runner_yields
from trainstack_training.rundir import (
    WARM_RUNNER_FILE,
    WARM_RUNNER_STOP,
    WARM_RUNNER_YIELDS,
    read_json,
    write_json,
)
from trainstack_training.spark import build_context
from trainstack_training.warm.state import (
    CONFIG,
    HEARTBEAT_SECONDS,
    INFO,
    LEASE_PREFIX,
    alive,
    locked,
    locked_file,
)

if TYPE_CHECKING:
    from pyspark import SparkContext

APP_NAME = "trainstack-runner"
POLL_SECONDS = 1.0
WARM_UP_GROUP = "trainstack-warm-up"
YIELD_CONFIRM_CHECKS = 2  # the same application seen waiting this many checks in a row


class WarmServer:
    """The warm runner's Spark application and its poll loop (`serve`)."""

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
            held = read_json(lease)
            if alive(int(held.get("pid", 0) or lease.name[len(LEASE_PREFIX) :] or 0)):
                live += 1
                continue
            if self.sc is not None and held.get("group"):
                self.log(f"job {held['group']} ended without detaching: cancelling its Spark jobs")
                with contextlib.suppress(Exception):
                    self.sc.cancelJobGroup(str(held["group"]))
            lease.unlink(missing_ok=True)
        return live

    def asked_to_stop(self) -> bool:
        request = read_json(self.runs_dir / WARM_RUNNER_STOP)
        if request.get("host") == self.host and request.get("pid") == os.getpid():
            with contextlib.suppress(OSError):
                (self.runs_dir / WARM_RUNNER_STOP).unlink()
            return True
        return False

    def beat(self) -> None:
        with contextlib.suppress(OSError):
            write_json(
                self.runs_dir / WARM_RUNNER_FILE,
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
        with locked(self.state):
            if self.reap():
                return ""
            (self.state / INFO).unlink(missing_ok=True)
            return why

    def count_yield(self) -> None:
        """One more yield in the cluster's count (shared storage), pushed to Prometheus."""
        path = self.runs_dir / WARM_RUNNER_YIELDS
        try:
            with locked_file(path.with_name(f".{path.name}.lock")):
                total = int(read_json(path).get("yields", 0)) + 1
                write_json(path, {"yields": total}, mode=0o644)
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
        write_json(
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
            mode=0o600,
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
            if read_json(self.state / INFO).get("pid") == os.getpid():
                (self.state / INFO).unlink()
            if read_json(self.runs_dir / WARM_RUNNER_FILE).get("pid") == os.getpid():
                (self.runs_dir / WARM_RUNNER_FILE).unlink()
        if self.sc is not None:
            with contextlib.suppress(Exception):
                self.sc.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainstack_training.warm")
    parser.add_argument("--state", required=True)
    parser.add_argument("--keep-alive", type=float, required=True)
    parser.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    cfg = TrainConfig.from_dict(read_json(Path(args.state) / CONFIG))
    return WarmServer(Path(args.state), args.keep_alive, args.key, cfg).serve()
