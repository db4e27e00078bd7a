"""The warm runner: a Spark application that outlives a job, so that the next job pays no
Spark start-up. Two processes, one module each:

- `server.py` runs in the warm runner's own process, a long-lived PySpark driver per node and
  user, started as

      python -m trainstack_training.warm --state DIR --keep-alive SECONDS --key KEY

  (`__main__.py`; the command line other tools look for, `pgrep -f trainstack_training.warm`);
- `client.py` runs in the job's driver process (`trainstack-train --runner-keep-alive N`,
  N > 0): it starts the node's runner when none runs there (or when the one there was built
  with other Spark settings), then attaches to it (`attach`) and leases it while the job runs;
- `state.py`, read by both: the runner's private directory on the node (its files, its lock,
  whether a runner lives).

The runner is a PySpark driver like any other: its JVM holds one SparkContext, registered with
the masters (the multi-master URL: it survives the loss of the ALIVE master as any client
does), with its executors on the workers. Each job stays a fresh Python process of its own, the
`trainstack-train` that attached: its code, imports and data stage are its own, and its Spark
jobs run in the runner's context in a job group of its own. The barrier tasks get fresh Python
workers on the executors, as before (spark.python.worker.reuse=false).

What a job reaches the runner by is the Py4J gateway of its JVM: on 127.0.0.1 only and
authenticated by a secret in ``DIR/runner.json``, mode 0600 in a 0700 directory of the user
who runs jobs (the holder of the cluster's secret, which that user's Spark config already
holds). It adds no port that other machines can reach and none without authentication.

The runner stops its context and exits:
- while no job runs in it, as soon as another Spark application waits for the cores it holds
  (every POLL_SECONDS; `--runner-yield`, on by default: the ALIVE master's JSON page says so,
  trainstack_training.sparkmaster), so that the cluster stays a Spark cluster for everyone;
  a running job keeps its cores until it ends. The yield is logged, and counted in Prometheus
  (`trainstack_runner_yields_total`, through the Pushgateway);
- after SECONDS without a job, so the cluster's cores go back to other applications (barrier
  stages cannot use dynamic allocation, SPARK-24819); the next job starts it again;
- when a job on another node asks it to (one warm runner per cluster: its executors hold the
  cores that job needs), through ``<runs directory>/.warm-runner.stop`` on shared storage
  (rundir.WARM_RUNNER_STOP);
- when its context has stopped (every master gone for good), or on SIGTERM.

A job whose process dies (SIGKILL) leaves Spark jobs behind in the runner's context: the
runner cancels the job group of every lease whose process has gone.

The names other code imports are here; the runner's own process (`server.WarmServer`) is not
imported by a job.
"""

from __future__ import annotations

from trainstack_training.warm.client import Attached, attach, settings_key
from trainstack_training.warm.state import (
    INFO,
    LOG,
    STATE_DIR_PREFIX,
    WarmRunnerError,
    live_runner,
    state_dir,
)

__all__ = [
    "INFO",
    "LOG",
    "STATE_DIR_PREFIX",
    "Attached",
    "WarmRunnerError",
    "attach",
    "live_runner",
    "settings_key",
    "state_dir",
]
