"""Each rank's own log in the run directory: ``rank-<N>.log``, read by `trainstack logs --rank N`.

A barrier task's output would otherwise exist only in the Spark executor's stderr on whichever
node ran it (spark-tensorflow-distributor's users' complaint). While a rank runs, its process's
file descriptors 1 and 2 go through a pipe: a thread copies every chunk to the rank's log on
shared storage and to the executor's stderr as before. Descriptors, not ``sys.stdout``, so
TensorFlow's C++ logging and the output of child processes are in the log too. A retried stage
appends to the same file under a header naming the attempt.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path
from typing import IO

from trainstack_training.rundir import rank_log

DRAIN_SECONDS = 5.0  # at the end, how long the copy may take to reach the end of the pipe


class RankLog:
    """Tee this process's stdout and stderr into ``run_dir/rank-<rank>.log`` while active."""

    _active: RankLog | None = None

    def __init__(self, run_dir: Path, rank: int, attempt: int, host: str) -> None:
        self.path = Path(run_dir) / rank_log(rank)
        self.header = (
            f"--- rank {rank}, attempt {attempt}, on {host}, "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC ---\n"
        )
        self._file: IO[bytes] | None = None
        self._saved: dict[int, int] = {}
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RankLog:
        _flush_std()
        try:
            self._file = self.path.open("ab", buffering=0)
            self._file.write(self.header.encode())
            saved = {fd: os.dup(fd) for fd in (1, 2)}
        except OSError as exc:  # no log is no reason to fail the rank: say so where it writes
            print(f"trainstack: no rank log at {self.path}: {exc}", file=sys.stderr, flush=True)
            if self._file is not None:
                self._file.close()
                self._file = None
            return self
        read_end, write_end = os.pipe()
        self._saved = saved
        for fd in (1, 2):
            os.dup2(write_end, fd)
        os.close(write_end)
        self._thread = threading.Thread(
            target=self._copy, args=(read_end,), name="trainstack-rank-log", daemon=True
        )
        self._thread.start()
        RankLog._active = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _copy(self, read_end: int) -> None:
        out = self._file
        executor = self._saved.get(2)
        try:
            while chunk := os.read(read_end, 65536):
                if out is not None:
                    with contextlib.suppress(OSError, ValueError):  # a full disk: rank goes on
                        out.write(chunk)
                if executor is not None:
                    with contextlib.suppress(OSError):
                        os.write(executor, chunk)
        finally:
            os.close(read_end)

    def close(self) -> None:
        """Put descriptors 1 and 2 back and let the copy reach the end of the pipe."""
        if not self._saved:
            return
        _flush_std()
        for fd, original in self._saved.items():
            os.dup2(original, fd)  # the last write ends of the pipe close here (children aside)
        if RankLog._active is self:
            RankLog._active = None
        saved, self._saved = self._saved, {}
        if self._thread is not None:
            self._thread.join(DRAIN_SECONDS)
            if self._thread.is_alive():
                # A child process still holds the pipe: the copy goes on with the file and the
                # executor's descriptor, which stay open until this process ends.
                return
        for fd in saved.values():
            os.close(fd)
        if self._file is not None:
            self._file.close()
            self._file = None

    @classmethod
    def close_active(cls) -> None:
        """Before ``os._exit``: what the rank wrote last reaches its log."""
        if cls._active is not None:
            cls._active.close()


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
