"""A job's processes on a worker node, as the jobs tests and bench/bench_jobs.py count them."""

from __future__ import annotations

# A shell script that prints one line per process of a job on the node: its runner
# (trainstack_training.runner), its driver (trainstack-train), and its TensorFlow ranks, the
# Python workers that an executor's pyspark.daemon forks for the barrier tasks. The warm
# runner (trainstack_training.warm), its executor JVM and that pyspark.daemon outlive a job by
# design (docs/jobs.md, "The warm runner"). The patterns begin with a bracket, so they do not
# match the shell that runs them.
JOB_PROCESSES = (
    "{ pgrep -af '[t]rainstack_training[.]runner |bin/[t]rainstack-train '; "
    "for d in $(pgrep -f '[p]yspark[.]daemon'); do pgrep -a -P $d; done; } || true"
)
