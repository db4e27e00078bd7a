"""What trainstack does to a simple-mode job's Keras model before it trains it.

The models themselves are the jobs' (docs/jobs.md); today's model is examples/digits.
"""

from __future__ import annotations

import types
from typing import Any


def local_step_logs(model: Any, tf: Any) -> None:
    """Keep the gradient all-reduce the only collective of a training step.

    Keras's default step returns `metric.result()` for every metric, which under
    MultiWorkerMirroredStrategy all-reduces each metric's variables, and then sums the step's
    logs across workers (`distribute_reduction_method="auto"`): more collectives per step than
    the gradients' one, each a network round trip. Here a step returns this worker's running
    values (no collective), taken as they are ("first"). The epoch's training metrics are still
    global: at the end of each epoch Keras replaces the logs by `get_metrics_result()`, read
    across workers. Validation logs are exact as they are, since every worker evaluates the
    whole validation set. Only per-batch logs (which nothing here uses) are per worker.
    The model stays a plain Sequential (the saved file needs no custom class).
    """

    def compute_metrics(self: Any, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> Any:
        del x
        self.compiled_metrics.update_state(y, y_pred, sample_weight)
        logs = {}
        for metric in self.metrics:
            if hasattr(metric, "total") and hasattr(metric, "count"):
                logs[metric.name] = tf.math.divide_no_nan(metric.total, metric.count)
            else:  # not a mean-type metric: its global value at the end of the epoch
                logs[metric.name] = tf.constant(0.0)
        return logs

    model.compute_metrics = types.MethodType(compute_metrics, model)
    model.distribute_reduction_method = "first"
