"""What every framework's rank shares: its inputs (RankRun), its result (WorkerResult), the
backend interface (Backend), and the framework-free parts of a run: the epoch report of a
loop without callbacks, the test-only hold, the full-mode call and its checks.

Nothing here imports a framework.
"""

from __future__ import annotations

import json
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from trainstack_training import metrics as push_metrics
from trainstack_training.config import TrainConfig
from trainstack_training.context import JobContext, UserCodeError, call_user
from trainstack_training.data import DataInfo
from trainstack_training.data.rank import NoRankData, RankData
from trainstack_training.epochs import REPORTED_EPOCH
from trainstack_training.manifest import JobSpec
from trainstack_training.rundir import append_line
from trainstack_training.watchdog import Watchdog

# TEST ONLY hold hook (--hold-file): how often a held worker looks at the file again, and how
# long it holds at most before it goes on (and holds no more in this process).
HOLD_POLL_SECONDS = 0.2
HOLD_LIMIT_SECONDS = 900.0


@dataclass
class RankRun:
    """One rank's run: what the barrier task knows, and the timing marks it fills."""

    cfg: TrainConfig
    info: DataInfo
    spec: JobSpec
    rank: int
    peers: list[str]  # every rank's host:port, in rank order (the barrier's allGather)
    cores: int
    attempt: int
    host: str
    marks: dict[str, float]
    watchdog: Watchdog | None = None
    gpus: list[str] = field(default_factory=list)  # the GPU addresses Spark gave the task

    @property
    def out(self) -> Path:
        return Path(self.cfg.output).resolve()

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def world_size(self) -> int:
        return self.cfg.workers

    @property
    def steps_per_epoch(self) -> int:
        """The same on every rank, or the collectives hang: the smallest shard's batches (0
        for a job that reads its own data: its own loop decides)."""
        return min(self.info.shard_rows, default=0) // self.cfg.batch_size

    def rank_data(self) -> RankData:
        """This rank's shard and the validation set, in memory or streamed (data/rank.py);
        nothing for a job that reads its own data (`data = "none"`): a NoRankData, which
        gives what RankData gives, empty."""
        cfg = self.cfg
        if self.spec.reads_own_data:
            return cast(RankData, NoRankData())
        return RankData.create(
            self.info,
            self.rank,
            cfg.seed,
            cfg.batch_size,
            self.steps_per_epoch,
            cfg.data_stream,
            epochs=cfg.epochs,
        )

    def touch(self) -> None:
        """Progress, for the no-progress timeout."""
        if self.watchdog is not None:
            self.watchdog.touch()


class Backend(ABC):
    """A framework's part of a rank's run. `configure` runs first, before the framework or the
    user's code is imported (what the framework reads once, at its start); `load` imports the
    framework; `run` then trains:
    it sets up the framework's distributed context, builds the job's ctx, and runs simple
    mode (trainstack's loop, with checkpoint and resume, epoch reports and the chief-only
    save) or full mode (the user's `train(ctx)`)."""

    name: str
    model_file: str  # in the run directory: the chief's saved model

    @abstractmethod
    def configure(self, run: RankRun) -> None:
        """Set the environment the framework reads once (before it is imported)."""

    @abstractmethod
    def load(self, run: RankRun) -> Any:
        """Import the framework (after `configure`, before the no-progress watchdog starts:
        the import is no progress of the job's) and return its module."""

    @abstractmethod
    def run(self, run: RankRun, module: Any, framework: Any) -> WorkerResult:
        """Train this rank: the job's entry `module` and the `framework` are imported."""


@dataclass
class WorkerResult:
    task_index: int
    attempt: int
    host: str
    epochs_run: int  # epochs this attempt ran (fewer than cfg.epochs after a resume)
    train_seconds: float  # time spent in training steps (validation excluded)
    fit_seconds: float
    samples: int  # samples this worker processed this attempt (global = x workers)
    peak_rss_mb: float
    model_path: str = ""
    history: dict[str, list[float]] = field(default_factory=dict)
    # What a full-mode job's train(ctx) returned: the result's final metrics, verbatim.
    returned: dict[str, float] = field(default_factory=dict)
    # Where this worker's time went, in seconds (see timing_breakdown()).
    timings: dict[str, float] = field(default_factory=dict)
    # Its input: "memory" or "stream", why, and its memory limit (data/rank.py InputChoice).
    data_input: dict[str, Any] = field(default_factory=dict)


def returned_metrics(final: dict[Any, Any], entry_file: str) -> dict[str, float]:
    """A full-mode job's returned dict as the result's metrics: string keys, numbers as floats
    (NumPy and TensorFlow scalars too); anything else is the user's error, named by its key."""
    metrics: dict[str, float] = {}
    for key, value in final.items():
        if not isinstance(key, str) or not key:
            raise UserCodeError(
                f"your code failed: train(ctx) in {entry_file} returned a dict with the key "
                f"{key!r}; its keys must be metric names (non-empty strings)"
            )
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = None
        if number is None or isinstance(value, bool | str | bytes):
            raise UserCodeError(
                f"your code failed: train(ctx) in {entry_file} returned {key}={value!r}; "
                "each value of the returned dict must be a number (a metric's final value)"
            )
        metrics[key] = number
    return metrics


def call_train(run: RankRun, module: Any, ctx: JobContext) -> tuple[dict[str, float], float]:
    """Run a full-mode job's `train(ctx)`; its returned metrics (checked) and its seconds. The
    job must have saved its model (ctx.save_model)."""
    spec = run.spec
    run.marks["fit_start"] = time.time()
    fit_start = time.perf_counter()
    final = call_user(spec, module.train, ctx)
    fit_seconds = time.perf_counter() - fit_start
    run.marks["fit_end"] = time.time()
    if not isinstance(final, dict):
        raise UserCodeError(
            f"your code failed: train(ctx) in {spec.entry_file} returned "
            f"{type(final).__name__}; it must return a dict of final metrics"
        )
    returned = returned_metrics(final, spec.entry_file)
    if not ctx.saved:
        raise UserCodeError(
            f"your code failed: train(ctx) in {spec.entry_file} returned without "
            "ctx.save_model(model): the run has no model"
        )
    run.marks["saved"] = time.time()
    return returned, fit_seconds


def append_row(path: Path, row: dict[str, Any]) -> None:
    """One epoch's row in the run's epochs.jsonl (the chief's only), in one write: its
    readers (the queue process, the tracking sync) never see half a row."""
    append_line(path, json.dumps(row))


def pin_to_cores(task_index: int, cores: int) -> list[int]:
    """Restrict this process to `cores` CPUs of its own. Call before TensorFlow starts its
    threads: they inherit the affinity of the thread that creates them."""
    allowed = sorted(os.sched_getaffinity(0))
    start = task_index * cores
    mine = {allowed[(start + i) % len(allowed)] for i in range(cores)}
    os.sched_setaffinity(0, mine)
    return sorted(mine)


def peak_rss_mb() -> float:
    """Peak resident memory of this process (VmHWM), in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class EpochHold:
    """TEST ONLY: hold this worker at an epoch boundary while a file exists (--hold-file).

    A failure drill creates the file, waits for the run to reach an epoch end (its row in
    epochs.jsonl), does its damage while every worker sits here, then removes the file. Plain
    Python (no TensorFlow), so it can be tested alone; `hold_point` calls it from Keras.
    Never holds after the last epoch (no training is left to strike there, and a forgotten
    file must not delay the result); holds at most `limit` seconds, then warns, goes on and
    holds no more in this process. With no file it costs one stat per epoch.
    """

    def __init__(
        self,
        path: str,
        epochs: int,
        task_index: int = 0,
        attempt: int = 0,
        *,
        poll: float = HOLD_POLL_SECONDS,
        limit: float = HOLD_LIMIT_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.path, self.epochs, self.task_index, self.attempt = path, epochs, task_index, attempt
        self.poll, self.limit, self.sleep, self.clock = poll, limit, sleep, clock
        self.say = say or (lambda line: print(line, flush=True))
        self.active = bool(path)

    def _exists(self) -> bool:
        return os.path.exists(self.path)  # False on any OSError: never fails the run

    def after_epoch(self, epoch: int) -> float:
        """Called when epoch `epoch` (1-based, counted across resumes) has ended; returns the
        seconds held (0.0 when not held)."""
        if not self.active or epoch >= self.epochs or not self._exists():
            return 0.0
        self.say(
            f"holding after epoch {epoch} while {self.path} exists "
            f"(TEST ONLY hold; worker {self.task_index}, attempt {self.attempt}, "
            f"pid {os.getpid()}; remove the file to go on)"
        )
        start = self.clock()
        while self._exists():
            held = self.clock() - start
            if held >= self.limit:
                self.active = False
                self.say(
                    f"WARNING: {self.path} still exists after {held:.0f} s of hold after epoch "
                    f"{epoch} (worker {self.task_index}): going on, and holding no more in "
                    "this attempt"
                )
                return held
            self.sleep(self.poll)
        held = self.clock() - start
        self.say(f"hold released after epoch {epoch} after {held:.1f} s (worker {self.task_index})")
        return held


def datasets_in_memory(ctx: JobContext, spec: JobSpec) -> None:
    """A simple-mode job's `datasets(ctx)` transforms the whole shard in memory: refused, in
    one sentence, on a rank that streams its data (docs/training.md, Streaming)."""
    if spec.has_datasets and ctx.streams:
        raise UserCodeError(
            f"your code failed: datasets(ctx) in {spec.entry_file} transforms the whole shard "
            f"in memory, but this rank streams its data ({ctx.data.choice.reason}); "
            "transform the batches of ctx.batches(epoch) in a full-mode train(ctx), use "
            "more workers, or set data_stream=off to hold the shard anyway"
        )


def check_datasets(arrays: Any, spec: JobSpec, rows: int) -> tuple[Any, Any]:
    """The arrays `datasets(ctx)` returned, checked: ((x, y), (x_val, y_val)), each pair of
    equal length, the shard's rows kept (every worker must run the same number of steps)."""
    where = f"datasets(ctx) in {spec.entry_file}"
    try:
        (x, y), (x_val, y_val) = arrays
        lengths = [len(x), len(y), len(x_val), len(y_val)]
    except (TypeError, ValueError):
        raise UserCodeError(
            f"your code failed: {where} must return ((x, y), (x_val, y_val)) arrays, "
            f"not {type(arrays).__name__}"
        ) from None
    if lengths[0] != lengths[1] or lengths[2] != lengths[3]:
        raise UserCodeError(
            f"your code failed: {where} returned x/y of {lengths[0]}/{lengths[1]} rows and "
            f"x_val/y_val of {lengths[2]}/{lengths[3]}: each pair must have the same length"
        )
    if lengths[0] != rows:
        raise UserCodeError(
            f"your code failed: {where} returned {lengths[0]} training rows for a shard of "
            f"{rows}: transform the rows, do not add or drop any (the workers' step counts "
            "must match)"
        )
    return (x, y), (x_val, y_val)


def epoch_offset(path: Path) -> int | None:
    """What the run adds to the epochs its job reports (`ctx.report(epoch=...)`), as its first
    report decided: 1 when it counted from 0, else 0; None while it has reported none (an
    earlier attempt's rows in `path`, the run's epochs.jsonl, carry the decision over to a
    resumed attempt: a row whose number was moved keeps the job's own in REPORTED_EPOCH)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    offset = None
    for line in lines:
        try:
            row = json.loads(line)
            epoch = int(row["epoch"])
        except (ValueError, KeyError, TypeError):
            continue
        if REPORTED_EPOCH in row:
            return epoch - int(row[REPORTED_EPOCH])
        offset = 0
    return offset


def reported_epoch(value: float) -> int:
    """The epoch number a job gave `ctx.report`, checked: a whole number >= 0."""
    if not float(value).is_integer() or value < 0:
        raise ValueError(
            f"ctx.report(epoch={value!r}): the epoch must be a whole number >= 0, the epoch "
            "that just ended (counted from 0 as range(epochs) does, or from 1)"
        )
    return int(value)


class EpochReporter:
    """`ctx.report(...)` of a full-mode job, and the epochs of a loop without Keras: the
    chief's rows in epochs.jsonl (as the Keras epoch log writes them) and its push to the
    Pushgateway when one is configured.

    The rows count epochs from 1, as Keras' do. A job's own numbers (`epoch=`) are taken as
    they are, unless the run's first report says epoch=0: then the job counts from 0
    (`for epoch in range(epochs)`) and every number of the run is kept and shown as
    epoch + 1, also those of a resumed attempt (`epoch_offset`). Without `epoch`, an
    attempt's reports are counted from 1."""

    def __init__(
        self,
        path: Path,
        enabled: bool,
        attempt: int,
        samples: int,
        epochs: int = 0,
        workers: int = 0,
    ) -> None:
        self.path, self.enabled, self.attempt, self.samples = path, enabled, attempt, samples
        self.epochs = 0
        self.last = time.perf_counter()
        # What the job's own epoch numbers get added: None until the run's first report.
        self.offset = epoch_offset(path) if enabled else None
        gateway = push_metrics.pushgateway_url()
        self.pusher: Any = None
        if enabled and gateway:  # epochs and workers: 0 where the loop is the user's
            self.pusher = push_metrics.EpochPusher(gateway, path.parent.name, epochs, workers)

    def report(self, metrics: dict[str, float]) -> None:
        """Record one epoch; `epoch`, `samples` and `train_seconds` in `metrics` replace the
        counted ones (the epoch's number, the samples of all ranks, the seconds since the
        last report)."""
        now = time.perf_counter()
        seconds, self.last = now - self.last, now
        seconds = float(metrics.pop("train_seconds", seconds))
        given = metrics.pop("epoch", None)
        own = None if given is None else reported_epoch(given)  # checked on every rank
        self.epochs += 1
        if not self.enabled:
            return
        moved: dict[str, int] = {}
        if own is None:
            number = self.epochs
        else:
            if self.offset is None:  # the run's first report: epoch 0 can only count from 0
                self.offset = 1 if own == 0 else 0
            number = own + self.offset
            moved = {REPORTED_EPOCH: own} if self.offset else {}
        row = {
            "epoch": number,
            **moved,
            "attempt": self.attempt,
            "train_seconds": seconds,
            "samples": int(metrics.pop("samples", self.samples)),
            "ended_at": time.time(),
            **metrics,
        }
        append_row(self.path, row)
        if self.pusher is not None:
            speed = row["samples"] / seconds if seconds > 0 and row["samples"] else None
            self.pusher.push(row["epoch"], self.attempt, metrics, speed)
