"""A job's processes on the worker nodes, as the jobs tests and bench/bench_jobs.py see them;
and a full-mode regression job that the shared stack's tests submit."""

from __future__ import annotations

import json
import shlex
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from infra.nodes import NODE_PATHS

# Who runs a job's processes on a node (infra/jobs/remote.py's JOB_USER).
JOB_USER = "trainstack"

# The Python daemons of Spark's executors, which fork a job's ranks: PySpark's own, and the
# warm runner's (trainstack_training.daemon, Spark's spark.python.daemon.module), which
# imports the job's framework before forking. A rank is a fork of its daemon: the same
# command line, and the daemon as its parent (whose own parent is the executor's JVM).
DAEMON_MODULES = ("pyspark.daemon", "trainstack_training.daemon")

# A shell script that prints one line per process of a job on the node: its runner
# (trainstack_training.queue), its driver (trainstack-train), and its ranks (TensorFlow or
# torch), the Python workers that an executor's daemon forks for the barrier tasks (with
# their own children). The warm runner (trainstack_training.warm), its executor JVM and the
# daemon outlive a job by design (docs/jobs.md, "The warm runner"). The patterns begin with
# a bracket, so they do not match the shell that runs them. A stateless count, for
# bench/bench_jobs.py; the tests follow the very processes instead (JobWatch).
JOB_PROCESSES = (
    "{ pgrep -af '[t]rainstack_training[.]queue |bin/[t]rainstack-train '; "
    "for d in $(pgrep -f '[p]yspark[.]daemon|[t]rainstack_training[.]daemon'); "
    "do pgrep -a -P $d; done; } || true"
)

# Run on a node (as root): one JSON line, every process there as [pid, start time (clock
# ticks since boot, field 22 of /proc/PID/stat), parent pid, owner's uid, command line].
# Zombies are left out: they have ended. This program's own process is root's.
_LIST_PROGRAM = r"""
import json, os
procs = []
for name in os.listdir("/proc"):
    if not name.isdigit():
        continue
    try:
        uid = os.stat("/proc/" + name).st_uid
        with open("/proc/" + name + "/stat") as fh:
            stat = fh.read().rsplit(")", 1)[1].split()
        with open("/proc/" + name + "/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        continue
    if stat[0] != "Z":
        procs.append([int(name), int(stat[19]), int(stat[1]), uid, cmd])
print(json.dumps(procs))
"""
_NODE_PYTHON = f"{NODE_PATHS.venv_dir}/bin/python"
LIST_PROCESSES = f"echo uid=$(id -u {JOB_USER}); {_NODE_PYTHON} -c {shlex.quote(_LIST_PROGRAM)}"

# Runs a shell command on a node: (exit code, output). tests/platform/conftest.py's `sh`.
Shell = Callable[[str, str], tuple[int, str]]


@dataclass(frozen=True)
class NodeProc:
    """A process on a node: its PID with its start time (a PID the kernel hands out again
    later is not taken for it), its parent, its owner and its command line."""

    node: str
    pid: int
    started: int
    ppid: int
    uid: int
    cmdline: str

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.node, self.pid, self.started)

    def __str__(self) -> str:
        return f"{self.node}: {self.pid} {self.cmdline[:160]}"


def node_processes(sh: Shell, node: str) -> tuple[list[NodeProc], int]:
    """Every running process on `node`, and the job user's uid there."""
    code, out = sh(node, LIST_PROCESSES)
    lines = out.splitlines()
    uid = [ln[4:] for ln in lines if ln.startswith("uid=")]
    rows = [ln for ln in lines if ln.startswith("[")]
    assert code == 0 and uid and uid[0].isdigit() and len(rows) == 1, out[-2000:]
    return [NodeProc(node, *row) for row in json.loads(rows[0])], int(uid[0])


def _is_daemon(cmdline: str) -> bool:
    return any(f"-m {module}" in cmdline for module in DAEMON_MODULES)


def _is_jvm(cmdline: str) -> bool:
    return cmdline.split(" ", 1)[0].endswith("/java") or cmdline.startswith("java ")


def kept_by_design(p: NodeProc, by_pid: dict[int, NodeProc]) -> bool:
    """What a job may start that outlives it by design: a warm runner (its Python process and
    its JVMs) and the executors' JVMs and Python daemons (docs/jobs.md, "The warm runner")."""
    if "trainstack_training.warm" in p.cmdline or _is_jvm(p.cmdline):
        return True
    parent = by_pid.get(p.ppid)
    return _is_daemon(p.cmdline) and parent is not None and _is_jvm(parent.cmdline)


def is_rank(p: NodeProc, by_pid: dict[int, NodeProc]) -> bool:
    """A rank: a task's Python worker, forked from an executor's Python daemon."""
    parent = by_pid.get(p.ppid)
    return _is_daemon(p.cmdline) and parent is not None and _is_daemon(parent.cmdline)


class JobWatch:
    """The processes a job starts on the worker nodes, for a check that none is left after it
    was stopped. `JobWatch(sh, nodes)` before the submit records what already runs there;
    `sample()` while the job trains records every process of the job user that was not there
    before (its runner, its driver, its ranks and what they started), less what outlives a
    job by design (`kept_by_design`); `left()` after the stop: those of them still running,
    by PID and start time."""

    def __init__(self, sh: Shell, nodes: Iterable[str]) -> None:
        self.sh = sh
        self.nodes = list(nodes)
        self.before: set[tuple[str, int, int]] = set()
        for node in self.nodes:
            procs, _ = node_processes(sh, node)
            self.before.update(p.key for p in procs)
        self.seen: dict[tuple[str, int, int], NodeProc] = {}
        self.ranks: dict[tuple[str, int, int], NodeProc] = {}
        self.kept: dict[tuple[str, int, int], NodeProc] = {}

    def sample(self) -> list[NodeProc]:
        """Record the job's processes running now; the ranks among them."""
        ranks = []
        for node in self.nodes:
            procs, uid = node_processes(self.sh, node)
            by_pid = {p.pid: p for p in procs}
            for p in procs:
                if p.uid != uid or p.key in self.before:
                    continue
                if kept_by_design(p, by_pid):
                    self.kept[p.key] = p
                    continue
                self.seen[p.key] = p
                if is_rank(p, by_pid):
                    self.ranks[p.key] = p
                    ranks.append(p)
        return ranks

    def left(self) -> list[NodeProc]:
        """Those of the recorded processes that still run (the same PID and start time)."""
        left = []
        for node in {p.node for p in self.seen.values()}:
            procs, _ = node_processes(self.sh, node)
            running = {p.key for p in procs}
            left += [p for key, p in self.seen.items() if key in running]
        return left

    def wait_gone(self, timeout: float = 30.0) -> list[NodeProc]:
        """The recorded processes still running after up to `timeout` seconds (polled with a
        back-off: 0.5 s, doubling up to 5 s)."""
        deadline = time.monotonic() + timeout
        pause = 0.5
        left = self.left()
        while left and time.monotonic() < deadline:
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 5.0)
            left = self.left()
        return left


# A full-mode job (docs/jobs.md) for examples/regression's table: its own loop on the data
# stage's float32 targets (ctx.y), and a returned dict that becomes the result's metrics
# verbatim. WAIT_HOLD: after training, every TensorFlow worker waits (up to 300 s) while that
# file exists, still inside the barrier stage, holding its cores ("" = no wait).
REGRESSION_FULL_MODE = """\
import os
import time

WAIT_HOLD = {hold!r}


def train(ctx):
    tf = ctx.tf
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    train = (
        tf.data.Dataset.from_tensor_slices((ctx.x, ctx.y))
        .batch(ctx.global_batch_size, drop_remainder=True).repeat().with_options(options)
    )
    val = tf.data.Dataset.from_tensor_slices((ctx.x_val, ctx.y_val)).batch(512).repeat()
    with ctx.strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.layers.Input((ctx.n_features,)),
            tf.keras.layers.Dense(32, activation="relu"),
            tf.keras.layers.Dense(1, bias_initializer=tf.keras.initializers.Constant(150.0)),
        ])
        model.compile(tf.keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
    history = model.fit(
        train, epochs=ctx.epochs, steps_per_epoch=ctx.steps_per_epoch,
        validation_data=val.with_options(options), validation_steps=1,
        callbacks=ctx.callbacks(), verbose=0,
    )
    deadline = time.time() + 300
    while WAIT_HOLD and os.path.exists(WAIT_HOLD) and time.time() < deadline:
        time.sleep(0.5)
    ctx.save_model(model)
    return {{"val_mae": history.history["val_mae"][-1], "val_mse": history.history["val_loss"][-1]}}
"""


def regression_full_mode(examples: Path, directory: Path, hold: str = "") -> Path:
    """examples/regression as a full-mode job in `directory` (see REGRESSION_FULL_MODE)."""
    shutil.copytree(examples / "regression", directory)
    (directory / "model.py").write_text(REGRESSION_FULL_MODE.format(hold=hold))
    return directory
