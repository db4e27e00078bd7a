"""PySpark's worker daemon with TensorFlow imported once, before it forks the task workers.

Spark starts this instead of `pyspark.daemon` when `spark.python.daemon.module` names it. A
barrier task's worker is forked from the daemon (spark.python.worker.reuse=false: a fresh
process per task), so it starts with TensorFlow imported and pays only what depends on its
job: TF_CONFIG, thread counts and the collective runtime, all read when the job's strategy is
made (train.configure_environment checks that TensorFlow has not started its runtime yet).
The daemon lives as long as its executor: in the warm runner, the first job pays the import,
the next ones do not (docs/jobs.md).
"""

from __future__ import annotations

import os


def preload() -> None:
    """Import TensorFlow as the job's workers use it (legacy Keras, quiet C++ logs), without
    starting its runtime (no op runs, no device is listed)."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow  # noqa: F401


if __name__ == "__main__":
    from pyspark import daemon

    preload()
    daemon.manager()
