"""Result of a run: the metrics JSON, the training-curve PNG and the one-line summary."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainstack_training.attempts import count_attempts
from trainstack_training.config import TrainConfig
from trainstack_training.data import DataInfo
from trainstack_training.epochs import headline, metric_names, read_epochs
from trainstack_training.rundir import EPOCH_LOG, METRICS_FILE, PLOT_FILE, write_json

# Series kept at the top level of metrics.json, as before any model could report others.
CLASSIFIER_SERIES = ("loss", "accuracy", "val_loss", "val_accuracy")


class ReportError(RuntimeError):
    """The job's own code succeeded and its model is saved, but trainstack's report of the run
    (metrics.json, curves.png, the summary) failed; the message names the model and the
    step."""


@contextlib.contextmanager
def after_training(out: Path, model_file: str) -> Iterator[None]:
    """The platform's steps after the user's code succeeded: an exception in them becomes one
    ReportError sentence that names the saved model, so no traceback of trainstack's stands
    between the user and their model."""
    try:
        yield
    except Exception as exc:
        model = out / model_file
        kept = f"the model is saved at {model}" if model.exists() else f"no {model_file} in {out}"
        raise ReportError(
            f"training finished, but trainstack's report of the run failed "
            f"({type(exc).__name__}: {exc}); {kept}, and each epoch's metrics are in "
            f"{out / EPOCH_LOG}"
        ) from exc


def build_metrics(
    cfg: TrainConfig,
    info: DataInfo,
    results: list[dict[str, Any]],
    out: Path,
    train_wall: float,
    total_wall: float,
    metric: str = "",
) -> dict[str, Any]:
    """metrics.json's content; `metric` is the one the job wants shown first (its manifest's
    `metric`; ignored when the job does not have it)."""
    epochs = read_epochs(out)
    timings = [r.get("timings", {}) for r in results]
    attempts = max(1, count_attempts(out))
    train_secs = sum(float(e["train_seconds"]) for e in epochs)
    samples = sum(int(e["samples"]) for e in epochs)
    chief = results[0] if results else {}

    names = metric_names(epochs)
    history = {name: [float(e[name]) for e in epochs if name in e] for name in names}
    # The result's final metrics: what a full-mode job returned, verbatim; else each series'
    # last value.
    returned = chief.get("returned") or {}
    final = dict(returned) if returned else {n: v[-1] for n, v in history.items() if v}
    # Today's keys, kept for classifiers (loss and val_loss always, empty when not logged);
    # `accuracy` only when the job has it, so no code path can trip over a missing accuracy.
    top = {
        name: history.get(name, [])
        for name in CLASSIFIER_SERIES
        if name in history or name in ("loss", "val_loss")
    }
    finals = {f"final_{n}": final[n] for n in ("val_accuracy", "val_loss") if n in final}
    shown = headline(final, metric) or headline(names, metric)

    return {
        # The manifest's task, else the data stage's; none for a job that reads its own data
        # and names none (its result has no task).
        **({"task": info.task} if info.task else {}),
        "workers": cfg.workers,
        "epochs": len(epochs),
        "attempts": attempts,
        "final_val_loss": None,
        **finals,
        **top,
        "metric": shown,
        "metric_value": final.get(shown) if shown else None,
        "final": final,
        "history": history,
        "epoch_attempt": [int(e["attempt"]) for e in epochs],
        # None when nothing counted the samples (a job that reads its own data and reports
        # none: ctx.report(samples=...))
        "samples_per_second": samples / train_secs if train_secs > 0 and samples else None,
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
        # per worker: its input (memory or stream), why, and the memory it had
        "worker_input": [r.get("data_input", {}) for r in results],
        "input": "stream"
        if any(r.get("data_input", {}).get("input") == "stream" for r in results)
        else "memory",
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
    "input_wait",  # of fit: waiting for the streamed data's reads (0 when it is in memory)
    "finish",  # the model's save, Spark's stop, the report
    "other",  # the rest of the barrier stage: earlier attempts, waiting for results
)


# A rank's start-up timings (frameworks' timing breakdowns): TensorFlow's and torch's.
STARTUP_TIMINGS = (
    "import_tf", "import_torch", "strategy_setup", "process_group", "load_shards", "build_model",
)  # fmt: skip


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
                sum(last.get(k, 0.0) for k in STARTUP_TIMINGS),
            ),
            ("input_wait", last.get("input_wait", 0.0)),
            ("training", last.get("fit", 0.0) - last.get("input_wait", 0.0)),
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
    write_json(out / METRICS_FILE, metrics, indent=2, sort_keys=False)
    if plot:
        write_plot(metrics, out / PLOT_FILE)


def plot_panels(names: list[str], first: str | None = None) -> list[str]:
    """One panel per metric, its train and validation series together: the pair of `first`
    (the result's headline metric; by default the names' own headline: loss for a classifier)
    first, at most four."""
    bases: list[str] = []
    for name in names:
        base = name.removeprefix("val_")
        if base not in bases:
            bases.append(base)
    first = (first or headline(names) or "").removeprefix("val_")
    bases.sort(key=lambda b: b != first)
    return bases[:4]


def write_plot(metrics: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes
    import matplotlib.pyplot as plt

    history: dict[str, list[float]] = metrics.get("history") or {}
    panels = plot_panels(list(history), metrics.get("metric"))
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    from matplotlib.ticker import MaxNLocator

    for ax, name in zip(axes[0], panels, strict=True):
        for key, label in ((name, "train"), (f"val_{name}", "validation")):
            if history.get(key):
                ax.plot(range(1, len(history[key]) + 1), history[key], marker="o", label=label)
        ax.set(title=name, xlabel="epoch")
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
        "framework",
        "task",
        "metric",
        "metric_value",
        "final",
        "epochs",
        "workers",
        "attempts",
        "samples_per_second",
        "input",
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
    # A result without a task (a job that reads its own data and names none) shows none.
    picked = {k: metrics.get(k) for k in keys if k != "task" or metrics.get("task")}
    if "final_val_accuracy" in metrics:
        # A classifier's "accuracy" is its final validation accuracy (as before any model
        # could report other metrics).
        picked = {
            "accuracy": metrics["final_val_accuracy"],
            "final_val_accuracy": metrics["final_val_accuracy"],
            **picked,
        }
    return picked


def summary_line(result: dict[str, Any]) -> str:
    """The CLI's human line: the headline metric first (a classifier's validation accuracy)."""
    if result.get("final_val_accuracy") is not None:
        lead = f"validation accuracy {result['final_val_accuracy']:.4f}"
    elif result.get("metric") and result.get("metric_value") is not None:
        lead = f"{result['metric']} {result['metric_value']:.4f}"
    else:
        lead = "no metrics"
    speed = result.get("samples_per_second")
    return (
        f"{lead} after {result.get('epochs')} epochs on {result.get('workers')} worker(s) in "
        f"{result.get('attempts')} attempt(s); "
        + (f"{speed:.0f} samples/s; " if speed is not None else "")
        + f"model {result.get('model_path')}"
    )
