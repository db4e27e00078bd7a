"""The no-progress timeout of a job's rank: a job that stops making progress fails, with every
thread's Python stack of each stuck rank in the run directory.

Progress is a finished training batch or epoch (trainstack's Keras callbacks, in simple mode
and in full mode with ``ctx.callbacks()``) or a ``ctx.report(...)``. A rank that makes none
for ``progress_timeout`` seconds (the manifest's ``[job] progress_timeout``, docs/jobs.md)
writes every thread's stack (Python's ``faulthandler``) to ``stacks-rank<N>.txt`` in the run
directory, records the failure as the job's error (so Spark's retries fail at once rather
than hang again) and ends its process. Spark then fails the barrier stage and kills the
other ranks' tasks.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trainstack_training.ranklog import RankLog
from trainstack_training.rundir import STACKS_FILE


class Watchdog:
    """Fails this rank when `touch()` has not been called for `timeout` seconds (0: off)."""

    def __init__(
        self,
        timeout: float,
        run_dir: Path,
        rank: int,
        on_timeout: Callable[[str], None] | None = None,
    ) -> None:
        self.timeout, self.run_dir, self.rank = timeout, run_dir, rank
        self.on_timeout = on_timeout or exit_rank
        self.last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def touch(self) -> None:
        """Progress: a batch, an epoch or a report."""
        self.last = time.monotonic()

    def __enter__(self) -> Watchdog:
        if self.timeout > 0:
            self.touch()
            self._thread = threading.Thread(target=self._watch, name="trainstack-watchdog")
            self._thread.daemon = True
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _watch(self) -> None:
        poll = min(5.0, max(0.1, self.timeout / 10))
        while not self._stop.wait(poll):
            idle = time.monotonic() - self.last
            if idle < self.timeout:
                continue
            path = self.run_dir / STACKS_FILE.format(rank=self.rank)
            with path.open("w") as fh:
                fh.write(f"rank {self.rank}: no progress for {idle:.0f} s; every thread:\n")
                fh.flush()
                faulthandler.dump_traceback(file=fh, all_threads=True)
            message = (
                f"no progress for {self.timeout:g} s on rank {self.rank} (no finished batch, "
                f"epoch or ctx.report); every thread's Python stack is in {path}"
            )
            self.on_timeout(message)
            return


def exit_rank(message: str) -> None:
    """The stuck rank's end: its stacks to its log as well, then the process ends (its
    main thread is stuck, so nothing else would end it)."""
    print(f"trainstack: {message}", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    RankLog.close_active()
    os._exit(1)
