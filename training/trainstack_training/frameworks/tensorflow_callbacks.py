"""trainstack's Keras callbacks for a TensorFlow rank (runs in each rank, a barrier task's
Python process, beside frameworks/tensorflow.py): progress for the no-progress watchdog, the
epoch timer, the chief's epoch log (`epochs.jsonl`), backup and resume (BackupAndRestore in the
run's `backup/`), the pushed progress, and the test-only fault and hold.

The callback classes are made inside a function (`callback_classes`): TensorFlow may only be
imported after TF_CONFIG is set, so nothing at module level may subclass its classes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from trainstack_training import metrics as push_metrics
from trainstack_training.data.rank import RankData
from trainstack_training.frameworks.base import EpochHold, RankRun, append_row
from trainstack_training.rundir import BACKUP_DIR, EPOCH_LOG, FAULT_MARKER


def keras_callbacks(
    run: RankRun,
    tf: Any,
    classes: tuple[Any, Any, Any, Any],
    timer: Any,
    samples: int,
    data: RankData,
) -> list[Any]:
    """trainstack's Keras callbacks: progress, the epoch timer and log, backup and resume, the
    pushed progress, and the test-only fault and hold."""
    cfg, out = run.cfg, run.out
    _, epoch_log, fault_injector, hold_point = classes

    class Progress(tf.keras.callbacks.Callback):
        """Each finished batch is progress for the no-progress timeout."""

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            run.touch()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            run.touch()

    class StreamStart(tf.keras.callbacks.Callback):
        """A streaming rank's first epoch is the one fit resumes at (its shuffle is that
        epoch's, data/stream.py)."""

        def on_train_begin(self, logs: Any = None) -> None:
            data.start_epoch = restored_epoch(self.model)

    cbs: list[Any] = [
        Progress(),
        timer,
        epoch_log(out / EPOCH_LOG, run.is_chief, run.attempt, timer, samples),
        # On shared storage, so a retried barrier stage resumes from the last finished epoch.
        # After the epoch's row: a worker killed between the two then trains that epoch
        # again on resume (its row twice: the report keeps the last), whereas a backup
        # before the row would resume past an epoch whose row was never written.
        tf.keras.callbacks.BackupAndRestore(backup_dir=str(out / BACKUP_DIR)),
        StreamStart(),  # after the restore
    ]
    if cfg.fault_kill_epoch >= 1 and run.rank == cfg.fault_kill_worker:
        cbs.append(fault_injector(cfg.fault_kill_epoch, timer.steps, out))
    # The chief pushes each epoch to Prometheus's Pushgateway when one is configured.
    cbs += push_metrics.keras_callbacks(
        tf, str(out), cfg.epochs, cfg.workers, run.is_chief, run.attempt, timer, samples
    )
    if cfg.hold_file:
        # Last, so the epoch's backup, its epochs.jsonl row and its push are done before the
        # hold. Every worker holds: none waits inside a collective meanwhile.
        cbs.append(hold_point(EpochHold(cfg.hold_file, cfg.epochs, run.rank, run.attempt)))
    return cbs


def restored_epoch(model: Any) -> int:
    """The epoch a resumed fit starts at: the one after the last that BackupAndRestore had
    saved (its restored state, tf-keras' own counter), 0 without a backup."""
    try:
        saved = int(model._training_state._ckpt_saved_epoch.numpy())
    except (AttributeError, TypeError, ValueError):  # no backup callback, or another Keras
        return 0
    return saved + 1 if saved >= 0 else 0


def callback_classes(tf: Any) -> tuple[Any, Any, Any, Any]:
    """Define the Keras callbacks inside a function: TensorFlow may only be imported after
    TF_CONFIG is set, so nothing at module level may subclass its classes."""
    base = tf.keras.callbacks.Callback

    class EpochTimer(base):  # type: ignore[misc,valid-type]
        """Times the training steps of each epoch, excluding validation."""

        def __init__(self, steps: int) -> None:
            super().__init__()
            self.steps, self.epochs, self.total, self.last = steps, 0, 0.0, 0.0
            self._start = self._batch_end = 0.0
            # first_step: the first call of this process (tracing, first all-reduce).
            self.first_step, self.step_count, self.validation = 0.0, 0, 0.0
            self._val_start = 0.0

        def on_train_begin(self, logs: Any = None) -> None:
            # A job that reads its own data has no steps_per_epoch of trainstack's: fit's.
            if not self.steps:
                self.steps = int((self.params or {}).get("steps") or 0)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._start = self._batch_end = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self._batch_end = time.perf_counter()
            if self.step_count == 0:
                self.first_step = self._batch_end - self._start
            self.step_count += 1
            # With steps_per_execution N this is called once per N steps, the last with
            # batch == steps - 1.
            if self.steps and batch >= self.steps - 1:
                self._count()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if not self.steps:  # an epoch of a length fit did not know: to its last batch
                self._count()

        def _count(self) -> None:
            self.last = self._batch_end - self._start
            self.total += self.last
            self.epochs += 1

        def on_test_begin(self, logs: Any = None) -> None:
            self._val_start = time.perf_counter()

        def on_test_end(self, logs: Any = None) -> None:
            self.validation += time.perf_counter() - self._val_start

    class EpochLog(base):  # type: ignore[misc,valid-type]
        """The chief appends each epoch's metrics to a JSON-lines file on shared storage, so
        the curves survive a restart (a resumed fit's History only has the later epochs)."""

        def __init__(
            self, path: Path, enabled: bool, attempt: int, timer: Any, samples: int
        ) -> None:
            super().__init__()
            self.path, self.enabled, self.attempt = path, enabled, attempt
            self.timer, self.samples = timer, samples

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if not self.enabled:
                return
            row = {
                "epoch": epoch + 1,
                "attempt": self.attempt,
                "train_seconds": self.timer.last,
                "samples": self.samples,
                "ended_at": time.time(),
            }
            row.update({k: float(v) for k, v in (logs or {}).items()})
            append_row(self.path, row)

    class FaultInjector(base):  # type: ignore[misc,valid-type]
        """TEST ONLY: SIGKILL this worker's own Python process halfway through an epoch, once.

        A real crash (no exception, no cleanup), so Spark sees a lost Python worker.
        """

        def __init__(self, epoch: int, steps: int, out: Path) -> None:
            super().__init__()
            self.epoch, self.batch = epoch, max(0, steps // 2)
            self.marker = out / FAULT_MARKER
            self.current = 0

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.current = epoch + 1

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if self.current == self.epoch and batch == self.batch and not self.marker.exists():
                self.marker.write_text(f"killed pid {os.getpid()} in epoch {self.epoch}\n")
                os.kill(os.getpid(), signal.SIGKILL)

    class HoldPoint(base):  # type: ignore[misc,valid-type]
        """TEST ONLY: runs an EpochHold at each epoch end (see EpochHold)."""

        def __init__(self, hold: EpochHold) -> None:
            super().__init__()
            self.hold = hold

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.hold.after_epoch(epoch + 1)

    return EpochTimer, EpochLog, FaultInjector, HoldPoint
