"""Result of a run: the metrics JSON, the training-curve PNG and the one-line summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trainstack_training.config import TrainConfig
from trainstack_training.data import DataInfo
from trainstack_training.launcher import count_attempts
from trainstack_training.train import EPOCH_LOG

METRICS_FILE = "metrics.json"
PLOT_FILE = "curves.png"  # the name the Pulumi training component copies back


def read_epoch_log(out: Path) -> list[dict[str, Any]]:
    """Per-epoch rows; after a resume an epoch may appear twice: the last attempt's wins."""
    path = out / EPOCH_LOG
    rows: dict[int, dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[int(row["epoch"])] = row
    return [rows[k] for k in sorted(rows)]


def build_metrics(
    cfg: TrainConfig,
    info: DataInfo,
    results: list[dict[str, Any]],
    out: Path,
    train_wall: float,
    total_wall: float,
) -> dict[str, Any]:
    epochs = read_epoch_log(out)
    timings = [r.get("timings", {}) for r in results]
    attempts = max(1, count_attempts(out))
    train_secs = sum(float(e["train_seconds"]) for e in epochs)
    samples = sum(int(e["samples"]) for e in epochs)
    chief = results[0] if results else {}

    def series(key: str) -> list[float]:
        return [float(e[key]) for e in epochs if key in e]

    return {
        "workers": cfg.workers,
        "epochs": len(epochs),
        "attempts": attempts,
        "final_val_accuracy": series("val_accuracy")[-1] if epochs else None,
        "final_val_loss": series("val_loss")[-1] if epochs else None,
        "loss": series("loss"),
        "accuracy": series("accuracy"),
        "val_loss": series("val_loss"),
        "val_accuracy": series("val_accuracy"),
        "epoch_attempt": [int(e["attempt"]) for e in epochs],
        "samples_per_second": samples / train_secs if train_secs > 0 else None,
        "global_batch": cfg.batch_size * cfg.workers,
        "data_seconds": info.seconds,
        "data_rows": info.total_rows,
        "data_rows_per_second": info.total_rows / info.seconds if info.seconds > 0 else None,
        "train_rows": info.train_rows,
        "val_rows": info.val_rows,
        "shard_rows": info.shard_rows,
        "train_seconds": train_wall,  # barrier stage wall time: TF start-up and retries included
        "total_seconds": total_wall,
        "peak_rss_mb_per_worker": [float(r["peak_rss_mb"]) for r in results],
        # per worker, seconds: task launch, TF import, strategy set-up, first step, steps, ...
        "worker_timings": timings,
        # Wall clock (epoch seconds) of the first training step of the job: when the first
        # worker entered fit. `submit` to here is what a user waits before training.
        "first_step_at": min(
            (float(t["fit_start_at"]) for t in timings if "fit_start_at" in t), default=0.0
        ),
        "data_path": info.path,
        "hosts": [r["host"] for r in results],
        "master": cfg.master,
        "model_path": chief.get("model_path", ""),
        "metrics_path": str(out / METRICS_FILE),
        "plot_path": str(out / PLOT_FILE) if cfg.plot else "",
        "config": cfg.to_dict(),
    }


# The parts of a job's wall time (`time_split`), in the order a job goes through them.
SPLIT_PARTS = (
    "spark_startup",  # context, SQL session, executors, slot check, the barrier tasks' launch
    "data",  # the data stage's own work
    "tensorflow_startup",  # TensorFlow import, the strategy's collective set-up, shards, model
    "training",  # model.fit: the epochs, validation and per-epoch checkpoints
    "finish",  # the model's save, Spark's stop, the report
    "other",  # the rest of the barrier stage: earlier attempts, waiting for results
)


def time_split(
    total: float,
    before_barrier: float,
    data: float,
    barrier: float,
    worker_timings: list[dict[str, float]],
) -> dict[str, float]:
    """Where a job's wall time went: SPLIT_PARTS, in seconds, adding up to `total`.

    `before_barrier` is everything before the barrier stage, of which `data` was the data
    stage's own work; `barrier` the barrier stage's wall time (`train_seconds`). Inside the
    barrier stage the parts are those of the worker that finished last (the critical path),
    each cut to what is left of the stage, so that clock differences between nodes cannot
    make the parts add up to more than the stage."""
    data = min(max(data, 0.0), before_barrier)
    split = dict.fromkeys(SPLIT_PARTS, 0.0)
    split["spark_startup"] = before_barrier - data
    split["data"] = data
    if worker_timings:
        last = max(
            worker_timings, key=lambda t: t.get("task_launch", 0.0) + t.get("worker_total", 0.0)
        )
        left = barrier
        for part, value in (
            ("spark_startup", last.get("task_launch", 0.0)),
            (
                "tensorflow_startup",
                sum(
                    last.get(k, 0.0)
                    for k in ("import_tf", "strategy_setup", "load_shards", "build_model")
                ),
            ),
            ("training", last.get("fit", 0.0)),
            ("finish", last.get("save_model", 0.0)),
        ):
            taken = min(max(value, 0.0), left)
            split[part] += taken
            left -= taken
        split["other"] = left
    else:
        split["other"] = barrier
    split["finish"] += total - before_barrier - barrier
    return {k: round(v, 3) for k, v in split.items()}


def write_outputs(metrics: dict[str, Any], out: Path, plot: bool = True) -> None:
    (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
    if plot:
        write_plot(metrics, out / PLOT_FILE)


def write_plot(metrics: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes
    import matplotlib.pyplot as plt

    epochs = list(range(1, len(metrics["loss"]) + 1))
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(epochs, metrics["loss"], marker="o", label="train")
    ax_loss.plot(epochs, metrics["val_loss"], marker="o", label="validation")
    ax_loss.set(title="loss", xlabel="epoch")
    ax_acc.plot(epochs, metrics["accuracy"], marker="o", label="train")
    ax_acc.plot(epochs, metrics["val_accuracy"], marker="o", label="validation")
    ax_acc.set(title="accuracy", xlabel="epoch")
    from matplotlib.ticker import MaxNLocator

    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"trainstack: {metrics['workers']} worker(s), {metrics['attempts']} attempt(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """The CLI's last line: the numbers a caller needs, without the per-epoch series."""
    keys = (
        "final_val_accuracy",
        "epochs",
        "workers",
        "attempts",
        "samples_per_second",
        "data_seconds",
        "train_seconds",
        "total_seconds",
        "time_split",
        "training_share",
        "spark_application",
        "started_at",
        "first_step_at",
        "model_path",
        "metrics_path",
        "plot_path",
    )
    # "accuracy" is the final validation accuracy (the number callers compare runs by).
    return {"accuracy": metrics["final_val_accuracy"], **{k: metrics.get(k) for k in keys}}
