"""PyTorch's backend: DistributedDataParallel over a gloo (CPU) or NCCL (GPU) process group.

The mechanism is Spark's TorchDistributor's (pyspark.ml.torch.distributor): one barrier task
per process, MASTER_ADDR and MASTER_PORT from the barrier's allGather (rank 0's host and a
port it picked), RANK and WORLD_SIZE from the task's partition. Unlike TorchDistributor, the
rank trains in the barrier task's own Python process instead of a `torch.distributed.run`
child: Spark's stage retry is the restart (with resume from the checkpoint on shared
storage), and the per-rank logs, the no-progress watchdog and the cancel reach the process
that trains. torch comes from the job's packages overlay (docs/jobs.md, "PyTorch").

Runs in each rank: a barrier task's Python process on an executor (trainstack_training.train
picks this backend). The model's state (FSDP sharding, the checkpoint, the saved model) is in
frameworks/torch_checkpoint.py.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from trainstack_training import rundir
from trainstack_training.config import REGRESSION
from trainstack_training.context import JobContext, UserCodeError, call_user
from trainstack_training.data.rank import VAL_BATCH
from trainstack_training.frameworks.base import (
    Backend,
    EpochHold,
    EpochReporter,
    RankRun,
    WorkerResult,
    call_train,
    check_datasets,
    datasets_in_memory,
    peak_rss_mb,
)
from trainstack_training.frameworks.torch_checkpoint import (
    checkpoint,
    resume,
    save_model,
    shard,
    shard_sizes,
    sharded,
)
from trainstack_training.manifest import FSDP
from trainstack_training.rundir import BACKUP_DIR, EPOCH_LOG, FAULT_MARKER

# How long a collective may wait for a peer before the process group fails (then Spark
# retries the stage); TorchDistributor leaves torch's default (30 minutes for gloo).
COLLECTIVE_TIMEOUT_S = 300


class TorchBackend(Backend):
    name = "torch"
    model_file = rundir.model_file(name)

    def configure(self, run: RankRun) -> None:
        master = run.peers[0] if run.peers else "127.0.0.1:29500"
        host, _, port = master.rpartition(":")
        os.environ.update(
            {
                "MASTER_ADDR": host,
                "MASTER_PORT": port,
                "RANK": str(run.rank),
                "WORLD_SIZE": str(run.cfg.workers),
                "LOCAL_RANK": "0",
                "OMP_NUM_THREADS": str(run.cores),
            }
        )

    def load(self, run: RankRun) -> Any:
        torch = import_torch(run.cores, run.cfg.job_env)
        run.marks["torch_imported"] = time.time()
        return torch

    def run(self, run: RankRun, module: Any, framework: Any) -> WorkerResult:
        torch = framework
        torch.manual_seed(run.cfg.seed)  # the same initial weights on every rank
        device = rank_device(torch, run)
        distributed = run.cfg.workers > 1
        if distributed:
            backend = process_group_backend(device)
            torch.distributed.init_process_group(
                backend=backend,
                init_method="env://",
                timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
            )
            # In the rank's log (`trainstack logs --rank N`): which collectives it runs on.
            print(
                f"process group: {backend}, rank {run.rank} of {run.cfg.workers}, on {device}",
                flush=True,
            )
        run.marks["process_group_ready"] = time.time()
        ctx, reporter = self._context(run, torch, device)
        run.marks["data_loaded"] = time.time()
        if run.spec.mode == "full":
            returned, fit_seconds = call_train(run, module, ctx)
            loop = Loop(epochs=reporter.epochs, total=fit_seconds)
            done = result(
                run, ctx, loop, fit_seconds, {k: [v] for k, v in returned.items()}, returned
            )
        else:
            done = simple(run, module, ctx, reporter)
        # Only after success: a failed rank keeps its connections until its error is recorded
        # and its process ends, so its peers see its error first, not a closed connection.
        if distributed and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        return done

    def _context(self, run: RankRun, torch: Any, device: Any) -> tuple[JobContext, Any]:
        cfg, info, out = run.cfg, run.info, run.out
        data = run.rank_data()
        data.open()  # now: the time split's load_shards
        reporter = EpochReporter(
            out / EPOCH_LOG,
            run.is_chief,
            run.attempt,
            info.shard_rows[run.rank] * cfg.workers,
            cfg.epochs,
            cfg.workers,
        )

        def report(metrics: dict[str, Any]) -> None:
            run.touch()
            reporter.report(metrics)

        ctx = JobContext(
            params=dict(run.spec.params), rank=run.rank, world_size=cfg.workers,
            is_chief=run.is_chief, strategy=None, tf=None, data=data,
            n_features=info.n_features, n_classes=info.n_classes, batch_size=cfg.batch_size,
            epochs=cfg.epochs, learning_rate=cfg.learning_rate, seed=cfg.seed,
            steps_per_execution=1, steps_per_epoch=run.steps_per_epoch,
            run_dir=str(out), checkpoint_dir=str(out / BACKUP_DIR),
            model_path=str(out / self.model_file), attempt=run.attempt, task=info.task,
            framework=self.name, torch=torch, device=device, _report=report,
        )  # fmt: skip
        ctx._save = lambda model: save_model(ctx, model)
        Path(ctx.checkpoint_dir).mkdir(parents=True, exist_ok=True)
        return ctx, reporter


def rank_device(torch: Any, run: RankRun) -> Any:
    """The rank's device: the first GPU Spark gave its task, else the CPU."""
    if not run.gpus:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError(
            f"Spark gave rank {run.rank} GPU {run.gpus[0]} on {run.host}, but torch sees no "
            "CUDA device there (driver or container GPU access missing)"
        )
    device = torch.device(f"cuda:{run.gpus[0]}")
    torch.cuda.set_device(device)
    return device


def process_group_backend(device: Any) -> str:
    """The process group's backend for a rank on `device`: NCCL on a GPU, else gloo."""
    return "nccl" if device.type == "cuda" else "gloo"


def import_torch(cores: int, env_site: str = "") -> Any:
    """Import torch (from the job's packages overlay, `env_site`) with its thread pools sized
    to the cores Spark gave this task."""
    if env_site and env_site not in sys.path:
        sys.path.insert(0, env_site)  # import_entry puts the job's directory before it
    try:
        import torch
    except ImportError as exc:
        raise UserCodeError(
            "your code failed: the job's framework is torch, but torch is not installed for "
            f"it ({exc}); list it in the job's requirements file, e.g. torch==2.15.0 "
            "(docs/jobs.md, PyTorch)"
        ) from None
    torch.set_num_threads(cores)
    return torch


class Loop:
    """The training loop's own clock: epochs run, their training-step seconds, the first
    step's, and validation's."""

    def __init__(self, epochs: int = 0, total: float = 0.0) -> None:
        self.epochs, self.total, self.first_step, self.validation = epochs, total, 0.0, 0.0
        self.last = 0.0  # the last epoch's training-step seconds


def simple(run: RankRun, module: Any, ctx: JobContext, reporter: EpochReporter) -> WorkerResult:
    """trainstack's DDP loop over the model `build_model(ctx)` returns: per-epoch train and
    validation metrics, a checkpoint every epoch (resumed on a stage retry), the chief's
    save."""
    torch, spec = ctx.torch, run.spec
    arrays: tuple[Any, Any, Any, Any] | None = None  # None: streamed (data/stream.py)
    datasets_in_memory(ctx, spec)
    if spec.has_datasets:
        returned = call_user(spec, module.datasets, ctx)
        (x, y), (x_val, y_val) = check_datasets(returned, spec, len(ctx.x))
        arrays = (x, y, x_val, y_val)
    elif not ctx.streams:
        arrays = (ctx.x, ctx.y, ctx.x_val, ctx.y_val)
    model = call_user(spec, module.build_model, ctx)
    if not isinstance(model, torch.nn.Module):
        raise UserCodeError(
            f"your code failed: build_model(ctx) in {spec.entry_file} returned "
            f"{type(model).__name__}; a torch job's build_model must return a torch.nn.Module"
        )
    model.to(ctx.device)
    if spec.strategy == FSDP and ctx.world_size > 1:
        shard(torch, model)  # before the optimizer: it must see the sharded parameters
        local, total = shard_sizes(model)
        print(f"FSDP: this rank holds {local} of the model's {total} parameters", flush=True)
    regression = ctx.task == REGRESSION
    loss_fn = (
        call_user(spec, module.loss_fn, ctx)
        if hasattr(module, "loss_fn")
        else (torch.nn.MSELoss() if regression else torch.nn.CrossEntropyLoss())
    )
    optimizer = (
        call_user(spec, module.optimizer, ctx, model)
        if hasattr(module, "optimizer")
        else torch.optim.Adam(model.parameters(), lr=ctx.learning_rate)
    )
    start = resume(ctx, model, optimizer)
    wrapped = model
    if ctx.world_size > 1 and not sharded(model):
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    data = Tensors(torch, ctx.device, regression, arrays)
    hold = EpochHold(run.cfg.hold_file, ctx.epochs, run.rank, run.attempt)
    loop, curves = Loop(), dict[str, list[float]]()
    run.marks["fit_start"] = time.time()
    fit_start = time.perf_counter()
    for epoch in range(start, ctx.epochs):
        row = train_epoch(run, ctx, wrapped, loss_fn, optimizer, data, epoch, loop)
        row.update(validate(ctx, model, loss_fn, data, loop))
        for key, value in row.items():
            curves.setdefault(key, []).append(value)
        # The row before the checkpoint: a rank killed between the two trains the epoch
        # again on resume (its row twice: the report keeps the last).
        reporter.report({"epoch": epoch + 1, "train_seconds": loop.last, **row})
        checkpoint(ctx, model, optimizer, epoch + 1)
        hold.after_epoch(epoch + 1)
    fit_seconds = time.perf_counter() - fit_start
    run.marks["fit_end"] = time.time()
    ctx.save_model(model)
    run.marks["saved"] = time.time()
    return result(run, ctx, loop, fit_seconds, curves)


class Tensors:
    """The shard and the validation set as tensors on the rank's device: float32 features,
    int64 classes or float32 targets of the model's output shape (rows, 1). A rank that
    streams (no `arrays`) makes them batch by batch from its readers."""

    def __init__(
        self,
        torch: Any,
        device: Any,
        regression: bool,
        arrays: tuple[Any, Any, Any, Any] | None,
    ) -> None:
        self.torch, self.device, self.regression = torch, device, regression
        self.streamed = arrays is None
        if arrays is not None:
            x, y, x_val, y_val = arrays
            self.x = torch.tensor(x).float().to(device)  # a copy: the arrays may be read-only
            self.y = self.labels(y).to(device)
            self.x_val = torch.tensor(x_val).float().to(device)
            self.y_val = self.labels(y_val).to(device)

    def labels(self, values: Any) -> Any:
        t = self.torch.tensor(values)
        return t.float().reshape(-1, 1) if self.regression else t.long()

    def batch(self, x: Any, y: Any) -> tuple[Any, Any]:
        """A streamed batch (NumPy arrays, maybe read-only views) as tensors on the device."""
        return self.torch.tensor(x).float().to(self.device), self.labels(y).to(self.device)

    def train_batches(self, ctx: JobContext, epoch: int) -> Iterator[tuple[Any, Any]]:
        """Epoch `epoch`'s steps_per_epoch batches of this rank, reshuffled each epoch."""
        if self.streamed:
            for x, y in ctx.data.batches(epoch):
                yield self.batch(x, y)
            return
        torch, batch = self.torch, ctx.batch_size
        order = torch.randperm(
            len(self.x),
            generator=torch.Generator().manual_seed(ctx.seed + 1000 * epoch + ctx.rank),
        ).to(self.x.device)
        for step in range(ctx.steps_per_epoch):
            idx = order[step * batch : (step + 1) * batch]
            yield self.x[idx], self.y[idx]

    def val_batches(self, ctx: JobContext, batch: int) -> Iterator[tuple[Any, Any]]:
        """Every validation row once, in batches of `batch`."""
        if self.streamed:
            for x, y in ctx.data.val_batches(batch):
                yield self.batch(x, y)
            return
        for first in range(0, len(self.x_val), batch):
            yield self.x_val[first : first + batch], self.y_val[first : first + batch]


def train_epoch(
    run: RankRun,
    ctx: JobContext,
    model: Any,
    loss_fn: Any,
    optimizer: Any,
    data: Tensors,
    epoch: int,
    loop: Loop,
) -> dict[str, float]:
    """One epoch of steps over this rank's shard, reshuffled each epoch (every rank runs the
    same number of steps); its metrics summed over all ranks."""
    torch, steps = ctx.torch, ctx.steps_per_epoch
    kill_at = steps // 2 if fault_due(run, epoch + 1) else -1
    model.train()
    sums = torch.zeros(3, dtype=torch.float64)  # loss x rows, correct (or |error|), rows
    started = time.perf_counter()
    for step, (x, y) in enumerate(data.train_batches(ctx, epoch)):
        if step == kill_at:
            kill_self(run, epoch + 1)
        out = model(x)
        loss = loss_fn(out, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            sums += torch.tensor([float(loss) * len(y), score(out, y, data), len(y)])
        if loop.epochs == 0 and step == 0 and loop.first_step == 0.0:
            loop.first_step = time.perf_counter() - started
        run.touch()
    loop.last = time.perf_counter() - started
    loop.total += loop.last
    loop.epochs += 1
    if ctx.world_size > 1:
        torch.distributed.all_reduce(sums)
    loss_sum, scored, rows = (float(v) for v in sums)
    return {"loss": loss_sum / rows, metric_name(data): scored / rows}


def validate(
    ctx: JobContext, model: Any, loss_fn: Any, data: Tensors, loop: Loop
) -> dict[str, float]:
    """The whole validation set on every rank (the same metrics everywhere), in large
    batches."""
    torch = ctx.torch
    started = time.perf_counter()
    model.eval()
    loss_sum, scored, rows = 0.0, 0.0, 0
    batch = max(ctx.batch_size, VAL_BATCH)
    with torch.no_grad():
        for x, target in data.val_batches(ctx, batch):
            out = model(x)
            loss_sum += float(loss_fn(out, target)) * len(target)
            scored += score(out, target, data)
            rows += len(target)
    loop.validation += time.perf_counter() - started
    rows = max(1, rows)
    return {"val_loss": loss_sum / rows, f"val_{metric_name(data)}": scored / rows}


def metric_name(data: Tensors) -> str:
    """The simple loop's metric, as Keras names it: mae for a regression, else accuracy."""
    return "mae" if data.regression else "accuracy"


def score(out: Any, target: Any, data: Tensors) -> float:
    """Sum over the batch of the metric: |error| for a regression, correct answers else."""
    if data.regression:
        return float((out.detach() - target).abs().sum())
    return float((out.detach().argmax(dim=1) == target).sum())


def fault_due(run: RankRun, epoch: int) -> bool:
    """TEST ONLY (--fault-kill-epoch): whether this rank kills itself in `epoch`."""
    cfg = run.cfg
    return (
        cfg.fault_kill_epoch == epoch
        and run.rank == cfg.fault_kill_worker
        and not (run.out / FAULT_MARKER).exists()
    )


def kill_self(run: RankRun, epoch: int) -> None:
    """TEST ONLY: SIGKILL this rank's process halfway through an epoch, once (a real crash:
    Spark sees a lost Python worker and retries the stage)."""
    (run.out / FAULT_MARKER).write_text(f"killed pid {os.getpid()} in epoch {epoch}\n")
    os.kill(os.getpid(), signal.SIGKILL)


def result(
    run: RankRun,
    ctx: JobContext,
    loop: Loop,
    fit_seconds: float,
    curves: dict[str, list[float]],
    returned: dict[str, float] | None = None,
) -> WorkerResult:
    marks = run.marks
    return WorkerResult(
        task_index=run.rank,
        attempt=run.attempt,
        host=run.host,
        epochs_run=loop.epochs,
        train_seconds=loop.total or fit_seconds,
        fit_seconds=fit_seconds,
        samples=loop.epochs * ctx.steps_per_epoch * ctx.batch_size,
        peak_rss_mb=peak_rss_mb(),
        model_path=ctx.model_path if run.is_chief else "",
        history=curves,
        returned=returned or {},
        timings={
            "import_torch": marks["torch_imported"] - marks["task_start"],
            "process_group": marks["process_group_ready"] - marks["torch_imported"],
            "load_shards": marks["data_loaded"] - marks["process_group_ready"],
            "build_model": marks["fit_start"] - marks["data_loaded"],
            "fit": fit_seconds,
            "first_step": loop.first_step,
            "train_steps": max(0.0, loop.total - loop.first_step),
            "validation": loop.validation,
            "fit_other": max(0.0, fit_seconds - loop.total - loop.validation),
            "save_model": marks["saved"] - marks["fit_end"],
            "worker_total": marks["saved"] - marks["task_start"],
            "task_start_at": marks["task_start"],
            "fit_start_at": marks["fit_start"],
            "input_wait": ctx.data.wait_seconds(),
        },
        data_input=ctx.data.choice.to_dict(),
    )
