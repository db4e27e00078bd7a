"""PySpark's worker daemon with the job's framework imported once, before it forks the task
workers.

Spark starts this instead of `pyspark.daemon` when `spark.python.daemon.module` names it (the
warm runner's context: trainstack_training.spark.context_settings). A barrier task's worker is
forked from the daemon (spark.python.worker.reuse=false: a fresh process per task), so it
starts with its framework imported and pays only what depends on its job. TensorFlow: its
TF_CONFIG, thread counts and collective runtime are read when the job's strategy is made
(frameworks.tensorflow.configure_environment checks that the runtime has not started yet).
torch: imported from the job's packages overlay (TRAINSTACK_PRELOAD_SITE), with the modules
its optimizers load on first use (torch._dynamo, which imports triton). Never both: torch's
triton and TensorFlow each carry LLVM, and the second one loaded aborts the process. The
daemon lives as long as its executor: in the warm runner, the first job pays the import, the
next ones do not (docs/jobs.md).
"""

from __future__ import annotations

import os
import sys

# What the daemon imports ("tensorflow" or "torch"), and the packages overlay torch comes from;
# the warm runner's context sets both for its executors (trainstack_training.spark).
PRELOAD_ENV = "TRAINSTACK_PRELOAD"
PRELOAD_SITE_ENV = "TRAINSTACK_PRELOAD_SITE"


def preload() -> None:
    """Import the job's framework as its workers use it, without starting TensorFlow's runtime
    (no op runs, no device is listed)."""
    if os.environ.get(PRELOAD_ENV) == "torch":
        site = os.environ.get(PRELOAD_SITE_ENV, "")
        if site and site not in sys.path:
            sys.path.insert(0, site)
        import torch
        import torch._dynamo  # noqa: F401  (what the first optimizer imports)

        return
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow  # noqa: F401


if __name__ == "__main__":
    from pyspark import daemon

    preload()
    daemon.manager()
