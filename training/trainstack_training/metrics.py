"""The run's progress for Prometheus: the chief pushes each epoch to the Pushgateway.

The Pushgateway's address comes from the environment (`TRAINSTACK_PUSHGATEWAY`, e.g.
`http://control-1:9091`; the spark role sets it for executors through
`spark.executorEnv`); without it nothing is pushed. The metrics are grouped by the run's id
(the run directory's name), so each run keeps its own series:

    trainstack_training_epoch            last finished epoch (0 at the start of an attempt)
    trainstack_training_epochs           epochs the run is to train
    trainstack_training_attempt          attempt of the barrier stage (1 = no restart)
    trainstack_training_<metric>         each of the model's metrics after the last epoch
                                         (loss, val_loss, accuracy, mae, ...: what it logs)
    trainstack_training_samples_per_second   of the last epoch's training steps
    trainstack_training_last_progress_timestamp_seconds   when the chief last pushed

The warm runner pushes how often it gave the cluster's cores to another application
(trainstack_training.warm), grouped by nothing but its job, so the series is the cluster's:

    trainstack_runner_yields_total       yields since the stack's shared storage was made

A push that fails is reported on stderr and training goes on: monitoring never stops a run.
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from trainstack_training.epochs import is_metric

PUSHGATEWAY_ENV = "TRAINSTACK_PUSHGATEWAY"
JOB = "trainstack_training"
PREFIX = "trainstack_training_"
# The run's own gauges: a metric of the same name is pushed as `metric_<name>`.
RESERVED = frozenset(
    {"epoch", "epochs", "workers", "attempt", "samples_per_second"}
    | {"last_progress_timestamp_seconds"}
)
_NOT_IN_A_NAME = re.compile(r"[^a-zA-Z0-9_]")


def gauge_name(key: str) -> str:
    """A metric's name as a Prometheus metric name's tail (`val_mae`, `top_5_accuracy`)."""
    name = _NOT_IN_A_NAME.sub("_", key)
    return f"metric_{name}" if name in RESERVED else name


def pushgateway_url() -> str:
    return os.environ.get(PUSHGATEWAY_ENV, "").strip()


class EpochPusher:
    """Holds the run's gauges and pushes them, replacing the run's group each time."""

    def __init__(self, gateway: str, run_id: str, epochs: int, workers: int) -> None:
        from prometheus_client import CollectorRegistry, Gauge

        self.gateway, self.run_id = gateway, run_id
        self.registry = CollectorRegistry()

        def gauge(name: str, doc: str) -> Any:
            return Gauge(PREFIX + name, doc, registry=self.registry)

        self.epoch = gauge("epoch", "Last finished epoch of the run (0: attempt started).")
        self.epochs = gauge("epochs", "Epochs the run is to train.")
        self.workers = gauge("workers", "TensorFlow workers of the run.")
        self.attempt = gauge("attempt", "Attempt of the barrier stage (1: no restart).")
        self.progress = gauge(
            "last_progress_timestamp_seconds", "When the chief last reported progress."
        )
        self._gauge = gauge
        # Made at their first value, so an attempt's start does not report a loss of 0.
        self.logs: dict[str, Any] = {}
        self.samples_per_second: Any = None
        self.epochs.set(epochs)
        self.workers.set(workers)
        self.failures = 0

    def push(
        self,
        epoch: int,
        attempt: int,
        logs: dict[str, Any] | None = None,
        samples_per_second: float | None = None,
    ) -> bool:
        self.epoch.set(epoch)
        self.attempt.set(attempt)
        for key, value in (logs or {}).items():
            try:
                number = float(value)  # Keras' logs may hold NumPy or TensorFlow scalars
            except (TypeError, ValueError):
                continue  # not a metric (a job's own ctx.report may carry other fields)
            if not is_metric(key, number) or isinstance(value, bool):
                continue
            name = gauge_name(key)
            if name not in self.logs:
                self.logs[name] = self._gauge(name, f"{key} after the last finished epoch.")
            self.logs[name].set(number)
        if samples_per_second is not None:
            if self.samples_per_second is None:
                self.samples_per_second = self._gauge(
                    "samples_per_second", "Samples per second of the last epoch's training steps."
                )
            self.samples_per_second.set(samples_per_second)
        self.progress.set(time.time())
        from prometheus_client import push_to_gateway

        try:
            push_to_gateway(
                self.gateway,
                job=JOB,
                registry=self.registry,
                grouping_key={"run_id": self.run_id},
                timeout=5,
            )
            return True
        except Exception as exc:  # monitoring must never stop the run
            self.failures += 1
            print(f"trainstack: pushing metrics to {self.gateway} failed: {exc}", file=sys.stderr)
            return False


RUNNER_JOB = "trainstack_runner"


def push_runner_yields(gateway: str, total: int) -> bool:
    """Push the warm runners' yield count (a counter: it only grows, kept on shared storage
    by the runner); False when there is no Pushgateway or the push failed (said on stderr)."""
    if not gateway:
        return False
    from prometheus_client import CollectorRegistry, Counter, push_to_gateway

    registry = CollectorRegistry()
    counter = Counter(
        "trainstack_runner_yields",
        "Times an idle warm runner gave the cluster's cores to another Spark application.",
        registry=registry,
    )
    counter.inc(total)
    try:
        push_to_gateway(gateway, job=RUNNER_JOB, registry=registry, timeout=5)
        return True
    except Exception as exc:  # monitoring must never stop the runner
        print(
            f"trainstack: pushing the runner's yields to {gateway} failed: {exc}", file=sys.stderr
        )
        return False


def keras_callbacks(
    tf: Any,
    output: str,
    epochs: int,
    workers: int,
    is_chief: bool,
    attempt: int,
    timer: Any,
    samples: int,
) -> list[Any]:
    """The Keras callback that pushes the chief's epochs; [] on other workers or when no
    Pushgateway is configured. `timer` has the last epoch's training seconds in `.last`."""
    gateway = pushgateway_url()
    if not is_chief or not gateway:
        return []
    pusher = EpochPusher(gateway, Path(output).resolve().name, epochs, workers)

    class PushMetrics(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs: Any = None) -> None:
            # After a resume the first epochs are already done; 0 until the next finishes.
            pusher.push(0, attempt)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            seconds = float(getattr(timer, "last", 0.0) or 0.0)
            pusher.push(epoch + 1, attempt, logs, samples / seconds if seconds > 0 else None)

    return [PushMetrics()]
