"""A job's queue process on a node: wait for the job's admission, run `trainstack-train`,
record its state.

    python -m trainstack_training.queue RUN_DIR --lock FILE [--slots N] [--install SCRIPT]
        [--tee] -- <command>

(the command: trainstack-train and its arguments).

`trainstack submit` starts this detached on a worker node (docs/jobs.md); the stack's declared
job (infra.components.training) runs it in the foreground with `--tee`, its output streamed to
`pulumi up` as well. Both get the same record and the same queue. It keeps the job's
record, ``RUN_DIR/job.json``, on shared storage, where `trainstack status` and `list` read it:
``installing`` while SCRIPT installs the job's packages into their overlay (only for a lock
that is not on the cluster yet; an installing job does not hold the queue), ``queued`` until
admission.py admits it (its ranks fit the cluster's N training slots, and no job is ahead of
it: `waiting_for` says what it waits for), then ``running`` holding its `slots`, then
``succeeded``, ``failed`` or ``cancelled``. A running job whose Spark application waits for
cores that another application holds is shown ``queued`` again, with ``waiting_for`` saying
which (trainstack-train's ``waiting.json``), until it has them; it keeps its slots. The job's
output goes to ``RUN_DIR/output.log``, with one line per finished epoch (from the run's
epochs.jsonl) for `trainstack logs`.

SIGTERM (`trainstack cancel`) stops a running job the way Spark stops one: SIGINT to the
driver, whose PySpark handler cancels its jobs (Spark kills the barrier tasks and their
TensorFlow workers on every node) and whose `finally` stops the SparkContext, so the
application ends and its executors go. A driver still there after STOP_GRACE_SECONDS gets
SIGTERM, then SIGKILL KILL_AFTER_SECONDS later, and whatever is left of its process group
(the JVM gateway) is killed when the driver has gone.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainstack_training.epochs import is_metric
from trainstack_training.queue.admission import decide
from trainstack_training.rundir import (
    EPOCH_LOG,
    OUTPUT,
    RECORD,
    STOP_FILE,
    WAITING_FILE,
    read_json,
    read_rows,
    update_json,
)

HEARTBEAT_SECONDS = 2.0
EPOCH_POLL_SECONDS = 0.5  # how often a finished epoch is copied into the output
STOP_GRACE_SECONDS = 5.0  # SIGINT to the driver, then SIGTERM to its process group
KILL_AFTER_SECONDS = 5.0  # then SIGKILL
QUEUE_POLL_SECONDS = 0.5


class CancelledError(Exception):
    """SIGTERM while the job waited in the queue."""


def read_record(run_dir: Path) -> dict[str, Any]:
    return read_json(run_dir / RECORD)


# The heartbeat thread and the main thread both write the record: one merge at a time, or a
# heartbeat that read the record before the final state was written would write it back
# (update_json merges one at a time; this lock also keeps show_waiting's check-then-write
# whole).
_RECORD_LOCK = threading.RLock()


def write_record(run_dir: Path, **changes: Any) -> dict[str, Any]:
    """Merge `changes` into the record, atomically (readers never see half a file)."""
    with _RECORD_LOCK:
        return update_json(run_dir / RECORD, **changes)


# The records read so far, by path, with the (inode, mtime, size) they were read at: a runs
# directory keeps every run that ever ended, and a waiting job decides twice a second.
_READ: dict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = {}


def other_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of the runs directory's other runs (the queue's ledger); a record that has
    not changed since it was last read is not read again."""
    found = []
    for path in run_dir.parent.glob(f"*/{RECORD}"):
        if path.parent == run_dir:
            continue
        try:
            st = path.stat()
        except OSError:
            continue
        seen = _READ.get(path)
        if seen is None or seen[0] != (st.st_ino, st.st_mtime_ns, st.st_size):
            seen = ((st.st_ino, st.st_mtime_ns, st.st_size), read_json(path))
            _READ[path] = seen
        found.append(seen[1])
    return found


@contextlib.contextmanager
def queue_lock(path: Path) -> Iterator[None]:
    """The cluster's queue lock (flock on shared storage): one admission decision at a time,
    held for milliseconds, never while a job runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def epoch_line(row: dict[str, Any], epochs: int) -> str:
    metrics = " ".join(f"{k} {float(v):.4f}" for k, v in row.items() if is_metric(k, v))
    return (
        f"[trainstack] epoch {row.get('epoch')}/{epochs} {metrics} "
        f"({float(row.get('train_seconds', 0)):.1f} s, attempt {row.get('attempt', 0)})\n"
    )


class Runner:
    def __init__(
        self,
        run_dir: Path,
        lock: Path,
        command: list[str],
        epochs: int,
        install: str = "",
        tee: bool = False,
        capacity: int = 0,
    ) -> None:
        self.run_dir, self.lock, self.command, self.epochs = run_dir, lock, command, epochs
        self.install_script = install
        self.tee = tee  # the job's output on this process's stdout too (the stack's job)
        self.capacity = capacity  # the cluster's training slots (0: unknown)
        self.child: subprocess.Popen[bytes] | None = None
        self.cancelled = False
        self.stop_started = 0.0
        self.terminated = False
        self.interrupted = False  # SIGINT sent to the child
        self.done = threading.Event()
        self.epochs_seen = 0
        self.waiting_for = ""  # what the record shows the job's application waits for

    def on_term(self, signum: int, frame: Any) -> None:
        # Only flags are set here (an exception raised from a handler can land inside any
        # library call, even Thread.start); the main loop acts on them at safe points.
        del signum, frame
        if not self.cancelled:
            self.cancelled = True
            self.stop_started = time.monotonic()
        if self.child is not None:
            self.interrupt_child()

    def interrupt_child(self) -> None:
        """SIGINT to the child, once: PySpark cancels its jobs, then stops."""
        assert self.child is not None
        if not self.interrupted:
            self.interrupted = True
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child.pid, signal.SIGINT)

    def heartbeat(self) -> None:
        """Copy each finished epoch into the output, and keep the record alive."""
        last = 0.0
        while not self.done.wait(EPOCH_POLL_SECONDS):
            self.copy_epochs()
            self.show_waiting()
            if time.monotonic() - last >= HEARTBEAT_SECONDS:
                write_record(self.run_dir, heartbeat=time.time())
                last = time.monotonic()

    def show_waiting(self) -> None:
        """A running job's Spark application waits for cores held by another: `queued` with
        why, until it has them (then `running` again)."""
        reason = str(read_json(self.run_dir / WAITING_FILE).get("reason") or "")
        if reason == self.waiting_for:
            return  # nothing to change: the record is not read again
        with _RECORD_LOCK:
            if self.done.is_set():
                return
            state = "queued" if reason else "running"  # admitted: it keeps its slots
            write_record(self.run_dir, state=state, waiting_for=reason)
            self.waiting_for = reason

    def copy_epochs(self) -> None:
        rows = read_rows(self.run_dir / EPOCH_LOG)  # whole rows only: a half line waits
        new = rows[self.epochs_seen :]
        self.epochs_seen = len(rows)
        if new:
            with (self.run_dir / OUTPUT).open("a") as out:
                out.writelines(epoch_line(row, self.epochs) for row in new)

    def check_cancelled(self) -> None:
        """A safe point: leave by CancelledError when a SIGTERM came and no child runs."""
        if self.cancelled:
            raise CancelledError()

    def wait_turn(self) -> None:
        """Wait in the queue until admitted (admission.py), then hold the job's slots: the
        record says `running` with its `slots` (released when the job ends)."""
        told = ""
        while True:
            self.check_cancelled()
            with queue_lock(self.lock):
                mine = read_record(self.run_dir)
                need = int(mine.get("workers") or 1)
                capacity = self.capacity or need  # unknown: the job's own size, one at a time
                verdict = decide(mine, other_records(self.run_dir), capacity)
                if verdict.admitted:
                    self.check_cancelled()
                    write_record(
                        self.run_dir, state="running", slots=need, waiting_for="",
                        started_at=time.time(),
                    )  # fmt: skip
                    return
            if verdict.reason != told:
                write_record(self.run_dir, waiting_for=verdict.reason)
                self.say(verdict.reason)
                told = verdict.reason
            time.sleep(QUEUE_POLL_SECONDS)

    def say(self, line: str) -> None:
        with (self.run_dir / OUTPUT).open("a") as out:
            out.write(f"[trainstack] {line}\n")

    def install(self) -> tuple[int | None, str]:
        """Run the packages' install in the `installing` state: (exit code, why it failed)."""
        started = time.monotonic()
        self.say("installing the job's packages on the cluster ...")
        self.check_cancelled()
        with (self.run_dir / OUTPUT).open("ab") as out:
            self.child = subprocess.Popen(
                ["sh", self.install_script], stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            code = self.wait_child()
        self.child = None
        if self.cancelled:
            return None, "cancelled while installing"
        if code != 0:
            return (
                code,
                f"installing the job's packages failed (exit {code}); see `trainstack logs`",
            )
        self.say(f"packages installed in {time.monotonic() - started:.1f} s")
        return 0, ""

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_term)
        signal.signal(signal.SIGINT, self.on_term)
        phase = "installing" if self.install_script else "queued"
        # A SIGTERM while no child runs is acted on at the next safe point (check_cancelled),
        # even right after the start: the job ends `cancelled`, never half-recorded.
        try:
            # Why an earlier launch in this directory waited for cores is not this one's.
            (self.run_dir / WAITING_FILE).unlink(missing_ok=True)
            write_record(
                self.run_dir, state=phase, host=socket.gethostname(), pid=os.getpid(),
                heartbeat=time.time(),
            )  # fmt: skip
            beat = threading.Thread(target=self.heartbeat, daemon=True)
            beat.start()
            self.check_cancelled()
            if self.install_script:
                code, why = self.install()
                if why:
                    return self.finish(code, why)
                phase = "queued"
                write_record(self.run_dir, state=phase)
            self.wait_turn()
            self.check_cancelled()
            with (self.run_dir / OUTPUT).open("ab") as out:
                self.child = subprocess.Popen(
                    self.command,
                    stdout=subprocess.PIPE if self.tee else out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                copier = self.start_tee(out)
                code = self.wait_child()
                if copier is not None:
                    copier.join(timeout=10)
        except CancelledError:
            return self.finish(None, f"cancelled while {phase}")
        return self.finish(code, "")

    def start_tee(self, out: Any) -> threading.Thread | None:
        """With `tee`: copy the child's output into the job's output and onto stdout as it
        comes (the stack's declared job streams it to `pulumi up`)."""
        if not self.tee:
            return None
        assert self.child is not None and self.child.stdout is not None
        fd = self.child.stdout.fileno()

        def copy() -> None:
            for chunk in iter(lambda: os.read(fd, 65536), b""):
                out.write(chunk)
                out.flush()
                with contextlib.suppress(OSError, ValueError):
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.buffer.flush()

        thread = threading.Thread(target=copy, daemon=True)
        thread.start()
        return thread

    def wait_child(self) -> int:
        assert self.child is not None
        try:
            while True:
                try:
                    return self.child.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    if self.cancelled:
                        self.interrupt_child()  # when the SIGTERM came before the start
                        self.escalate()
        finally:
            # What is left of the job's process group once its driver has gone (the JVM
            # gateway, a stray subprocess of the user's code) goes with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signal.SIGKILL)

    def escalate(self) -> None:
        """A cancelled driver that has not stopped: SIGTERM its group, then SIGKILL it."""
        assert self.child is not None
        waited = time.monotonic() - self.stop_started
        sig = None
        if waited > STOP_GRACE_SECONDS + KILL_AFTER_SECONDS:
            sig = signal.SIGKILL
        elif waited > STOP_GRACE_SECONDS and not self.terminated:
            sig, self.terminated = signal.SIGTERM, True
        if sig is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.child.pid, sig)

    def finish(self, code: int | None, reason: str) -> int:
        self.done.set()
        self.copy_epochs()
        summary = self.summary()
        if self.cancelled:
            # A sweep's lagging trial: its driver named the stop before the SIGTERM.
            stop = read_json(self.run_dir / STOP_FILE).get("reason")
            state = "pruned" if stop == "pruned" else "cancelled"
        elif code == 0 and summary.get("ok"):
            state = "succeeded"
        else:
            state = "failed"
        write_record(
            self.run_dir,
            state=state,
            ended_at=time.time(),
            exit_code=code,
            waiting_for="",
            error=reason or ("" if state != "failed" else str(summary.get("error") or "")),
            result=summary if summary.get("ok") else {},
        )
        with (self.run_dir / OUTPUT).open("a") as out:
            out.write(f"[trainstack] job {state}\n")
        return 0 if state == "succeeded" else 1

    def summary(self) -> dict[str, Any]:
        """The job's last JSON line (trainstack-train's summary)."""
        try:
            lines = (self.run_dir / OUTPUT).read_text(errors="replace").splitlines()
        except OSError:
            return {}
        for line in reversed(lines):
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    return dict(json.loads(line))
        return {}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m trainstack_training.queue",
        usage=(
            "%(prog)s RUN_DIR --lock FILE [--epochs N] [--install SCRIPT] [--tee] -- COMMAND ..."
        ),
    )
    parser.add_argument("run_dir")
    parser.add_argument("--lock", required=True)
    parser.add_argument("--epochs", type=int, default=0)
    parser.add_argument("--install", default="", help="the packages' install script")
    parser.add_argument(
        "--tee", action="store_true", help="the job's output on stdout too, as it comes"
    )
    parser.add_argument(
        "--slots", type=int, default=0, help="the cluster's training slots (admission.py)"
    )
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("no command after --")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    command = argv[split + 1 :]
    return Runner(
        run_dir, Path(args.lock), command, args.epochs, args.install, args.tee, args.slots
    ).run()


if __name__ == "__main__":
    sys.exit(main())
