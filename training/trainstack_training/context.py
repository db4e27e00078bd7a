"""The rank's side of the job contract: the ``ctx`` the user's functions get, calling the user's
code, and the user's errors.

Where it runs: in a rank, the barrier task of one worker (train.py, frameworks/): it imports
the job's entry module (``import_entry``), builds ``ctx`` (``JobContext``) and calls the user's
functions (``call_user``), whose exception becomes a ``UserCodeError`` trimmed to the user's
frames; the first one of the run is kept in the run directory (``record_error``), so a retried
stage fails at once and the driver, ``trainstack-train``, reports it (``recorded_error``). A
rank gets the job's checked spec from the driver (manifest.py: ``JobSpec``); it never reads
the manifest.

The entry module offers one of two modes (docs/jobs.md):

- **simple**: ``build_model(ctx)`` returns a compiled Keras model, built inside the strategy's
  scope; an optional ``datasets(ctx)`` returns ``((x, y), (x_val, y_val))`` NumPy arrays made
  from ``ctx``'s shard (a reshape, a feature transform). trainstack runs ``fit`` with the
  backup/resume, per-epoch metrics, the chief-only save, the curves and the time split.
- **full**: ``train(ctx)`` trains itself, saves with ``ctx.save_model(model)`` and returns a
  dict of final metrics. ``ctx.callbacks()`` gives trainstack's Keras callbacks (backup and
  resume, the epoch log, the pushed progress); a loop without Keras calls ``ctx.report``.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from trainstack_training import rundir
from trainstack_training.config import CLASSIFICATION
from trainstack_training.manifest import TENSORFLOW, JobSpec


class UserCodeError(RuntimeError):
    """The user's code raised; the message is their error and their frames only."""


class NoDataError(AttributeError):
    """A job that reads its own data (`data = "none"`) touched ctx.x, ctx.y, ctx.x_val or
    ctx.y_val: no data stage ran, so there is no shard. An AttributeError, so `hasattr(ctx,
    "x")` is False for such a job."""


def import_entry(spec: JobSpec, env_site: str = "") -> ModuleType:
    """Import the entry module with the job directory first on sys.path, and its packages'
    overlay (`env_site`, infra/jobs/envs.py) next (in a fresh process: Spark starts one per
    task). An import error is the user's error, with their frames."""
    directory = str(Path(spec.directory).resolve())
    for path in (env_site, directory):  # the directory ends up first
        if path and path not in sys.path:
            sys.path.insert(0, path)
    importlib.invalidate_caches()
    return call_user(spec, importlib.import_module, spec.entry)


def user_frames(exc: BaseException, directory: str) -> str:
    """The traceback of ``exc`` trimmed to the frames in the user's files (all frames when
    none is theirs), ending with the exception line."""
    root = str(Path(directory).resolve())
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if str(Path(f.filename).resolve()).startswith(root + "/")]
    for f in mine:
        f.filename = str(Path(f.filename).resolve().relative_to(root))
    lines = traceback.format_list(mine or frames)
    lines += traceback.format_exception_only(type(exc), exc)
    return "Traceback (your code, most recent call last):\n" + "".join(lines).rstrip()


def where(exc: BaseException, directory: str) -> str:
    """``file:line`` of the innermost frame of the user's code, or ""."""
    root = str(Path(directory).resolve())
    for f in reversed(traceback.extract_tb(exc.__traceback__)):
        path = str(Path(f.filename).resolve())
        if path.startswith(root + "/"):
            return f"{Path(path).relative_to(root)}:{f.lineno}"
    if isinstance(exc, SyntaxError) and exc.filename:
        path = str(Path(exc.filename).resolve())
        if path.startswith(root + "/"):
            return f"{Path(path).relative_to(root)}:{exc.lineno}"
    return ""


# TensorFlow's errors for a lost peer or a broken collective: a worker died or the cluster
# failed, not the user's code. They stay as they are, so Spark retries the stage and the
# workers resume from the backup.
CLUSTER_FAILURES = frozenset(
    {"UnavailableError", "AbortedError", "CancelledError", "DeadlineExceededError"}
)
# torch.distributed's: a peer lost, the store or the network gone.
# gloo's own errors (a peer's connection closed or reset) reach Python as a RuntimeError that
# names gloo's source file.
GLOO_SOURCE = "/gloo/transport/"
TORCH_CLUSTER_FAILURES = frozenset(
    {"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}
)


def is_cluster_failure(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, is TensorFlow's or torch's report of
    a lost peer or a failed collective."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kind = type(current)
        if kind.__name__ in CLUSTER_FAILURES and kind.__module__.startswith("tensorflow"):
            return True
        if kind.__name__ in TORCH_CLUSTER_FAILURES and kind.__module__.startswith("torch"):
            return True
        if isinstance(current, RuntimeError) and GLOO_SOURCE in str(current):
            return True  # gloo's transport errors ("Connection closed by peer") are plain
        current = current.__cause__ or current.__context__
    return False


def call_user(spec: JobSpec, fn: Callable[..., Any], *args: Any) -> Any:
    """Call the user's code; an exception becomes a UserCodeError with their frames, except
    a cluster failure (`is_cluster_failure`), which Spark's retry handles."""
    try:
        return fn(*args)
    except Exception as exc:
        if is_cluster_failure(exc):
            raise
        at = where(exc, spec.directory)
        head = f"{type(exc).__name__}: {exc}" + (f" (at {at})" if at else "")
        raise UserCodeError(
            f"your code failed: {head}\n{user_frames(exc, spec.directory)}"
        ) from exc


def record_error(run_dir: Path, message: str, rank: int) -> None:
    """Keep the first user error of the run on shared storage: a retried barrier stage fails
    again at once instead of rerunning the code, and the driver reports it. Written whole, and
    only by the first rank to fail (rundir.write_json: a later error leaves it as it is)."""
    value = {"rank": rank, "error": message, "at": time.time()}
    rundir.write_json(run_dir / rundir.ERROR_FILE, value, first=True)


def recorded_error(run_dir: Path) -> str:
    """The run's first user error (`record_error`), or "" when none is recorded."""
    return str(rundir.read_json(run_dir / rundir.ERROR_FILE).get("error") or "")


@dataclass
class JobContext:
    """What the user's functions get (``ctx``); see docs/jobs.md."""

    params: dict[str, Any]
    rank: int
    world_size: int
    is_chief: bool
    strategy: Any
    tf: Any
    # This rank's shard and the validation set (trainstack_training.data.rank.RankData), in
    # memory or streamed: ctx.x .. ctx.y_val, ctx.batches(epoch), ctx.val_batches().
    data: Any
    n_features: int | None  # None for a job that reads its own data (no data stage)
    n_classes: int | None  # a classification's classes; 0 for a regression; None: as above
    batch_size: int  # per worker; the global batch is batch_size x world_size
    epochs: int
    learning_rate: float
    seed: int
    steps_per_execution: int  # for model.compile(steps_per_execution=...)
    steps_per_epoch: int  # the same on every worker (the smallest shard's), or collectives hang
    run_dir: str
    checkpoint_dir: str
    model_path: str
    attempt: int = 0
    # "classification" or "regression": the manifest's, else the data stage's; "" for a job
    # that reads its own data and whose manifest names none
    task: str = CLASSIFICATION
    framework: str = TENSORFLOW
    torch: Any = None  # torch jobs: the torch module (the process group is initialised)
    device: Any = None  # torch jobs: this rank's torch.device (cpu, or its GPU)
    _callbacks: Callable[[], list[Any]] | None = None
    _report: Callable[[dict[str, Any]], None] | None = None
    _save: Callable[[Any], None] | None = None  # the framework's save, when not Keras'
    saved: bool = False

    def __post_init__(self) -> None:
        if self.own_data:  # no data stage ran: nothing is known of the data
            self.n_features = self.n_classes = None

    @property
    def own_data(self) -> bool:
        """The job reads its own data (its manifest's `data = "none"`): no data stage ran, and
        ctx has no shard (its `data` is data.rank.NoRankData)."""
        return bool(getattr(self.data, "own_data", False))

    def _no_shard(self, name: str) -> None:
        if self.own_data:
            raise NoDataError(
                f'ctx.{name} is not available: the job\'s manifest says data = "none" (it reads '
                "its own data, so no data stage ran and there is no shard); load the data in "
                "train(ctx)"
            )

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    def _arrays(self, part: str, name: str) -> tuple[Any, Any]:
        self._no_shard(name)
        return self.data.arrays(part, f"ctx.{name}")

    @property
    def x(self) -> Any:
        """This worker's shard: features, float32 of shape (rows, n_features)."""
        return self._arrays("train", "x")[0]

    @property
    def y(self) -> Any:
        """Its labels: int32 classes, or float32 targets for a regression (there also when the
        rank streams its data: the label column alone)."""
        self._no_shard("y")
        return self.data.labels("train")

    @property
    def x_val(self) -> Any:
        """The validation set's features (every worker has all of it)."""
        return self._arrays("val", "x_val")[0]

    @property
    def y_val(self) -> Any:
        """The validation set's labels (there also when the rank streams its data)."""
        self._no_shard("y_val")
        return self.data.labels("val")

    @property
    def streams(self) -> bool:
        """Whether this rank streams its data (then ctx.x .. ctx.y_val refuse)."""
        return bool(self.data.streams)

    def batches(self, epoch: int = 0) -> Any:
        """Epoch `epoch`'s (x, y) batches of this worker, as NumPy arrays: steps_per_epoch of
        them, batch_size rows each, shuffled by the seed, the rank and the epoch; from memory
        or streamed, whichever this rank uses."""
        self._no_shard("batches()")
        return self.data.batches(epoch)

    def val_batches(self, batch: int = 0) -> Any:
        """Every validation row once, as (x, y) NumPy batches of `batch` rows (default: the
        larger of batch_size and 1024)."""
        self._no_shard("val_batches()")
        return self.data.val_batches(batch)

    def callbacks(self) -> list[Any]:
        """trainstack's Keras callbacks for a full-mode ``fit``: backup and resume from
        ``checkpoint_dir``, the epoch log (epochs.jsonl, the curves), the pushed progress."""
        return self._callbacks() if self._callbacks else []

    def report(self, **metrics: float) -> None:
        """Record one finished epoch (a loop without Keras callbacks): reaches epochs.jsonl,
        the Pushgateway and the curves. Only the chief's reports are kept. `epoch` numbers
        it: a run whose first report says epoch=0 counts from 0 (`range(epochs)`) and is
        kept and shown as epoch + 1; other numbers are taken as they are (docs/jobs.md)."""
        if self._report:
            self._report({k: float(v) for k, v in metrics.items()})

    def save_model(self, model: Any) -> None:
        """Save the trained model: every worker calls it (saving may need all of them); the
        chief's copy is the run's model (Keras: `model_path`; torch: its state_dict there, and
        TorchScript beside it where the model scripts)."""
        import shutil
        import tempfile

        if self._save is not None:
            self._save(model)
            self.saved = True
            return
        if self.is_chief:
            model.save(self.model_path)
        else:
            tmp = tempfile.mkdtemp(prefix=f"trainstack-worker{self.rank}-")
            try:
                model.save(str(Path(tmp) / "model.keras"))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        self.saved = True
