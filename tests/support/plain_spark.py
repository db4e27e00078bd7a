"""A plain PySpark application of the test's own (not trainstack's code), run on a node as the
user who holds the cluster's client config: the multi-master URL and the secret come from
SPARK_CONF_DIR, as for a user's own data preparation. Used by tests/platform/test_77_yield.py
and bench/bench_yield.py."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from infra.nodes import NODE_PATHS

NAME_PREFIX = "plain-spark-"
# Prints a JSON line when its context is up and one when its job is done, with when its first
# task started. Its driver is kept small: it runs beside a node's daemons.
SCRIPT = """
import json, sys, time
from pyspark import SparkConf, SparkContext

name, hold = sys.argv[1], float(sys.argv[2])
conf = (SparkConf().setAppName(name).set("spark.driver.memory", "512m")
        .set("spark.executor.memory", "512m").set("spark.ui.enabled", "false"))
sc = SparkContext(conf=conf)
up = time.time()
print(json.dumps({"event": "up", "app": sc.applicationId, "at": up}), flush=True)

def task(i):
    started = time.time()
    time.sleep(hold)
    return started

starts = sc.parallelize(range(2), 2).map(task).collect()
print(json.dumps({"event": "done", "app": sc.applicationId, "up": up,
                  "first_task": min(starts), "ended": time.time()}), flush=True)
sc.stop()
"""


class PlainApp:
    """One plain application's driver in `container` (as the `trainstack` user); each of its
    two tasks sleeps `hold` seconds."""

    def __init__(self, container: str, name: str, hold: float = 0.0) -> None:
        self.container, self.name = container, NAME_PREFIX + name
        self.submitted = time.time()
        self.proc = subprocess.Popen(
            [
                "docker", "exec", "-u", "trainstack", container,
                "env", f"SPARK_CONF_DIR={NODE_PATHS.spark_conf_dir}",
                f"PYSPARK_PYTHON={NODE_PATHS.venv_dir}/bin/python",
                f"{NODE_PATHS.venv_dir}/bin/python", "-c", SCRIPT, self.name, str(hold),
            ],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        )  # fmt: skip

    def result(self, timeout: float) -> dict[str, Any]:
        """Its `done` line, once it has ended (it must end 0), with `submitted` added."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"{self.name} did not end in {timeout:.0f} s") from None
        assert self.proc.returncode == 0, out[-3000:]
        done = [json.loads(ln) for ln in out.splitlines() if ln.startswith('{"event": "done"')]
        assert done, out[-3000:]
        return {**done[-1], "submitted": self.submitted}

    def stop(self) -> None:
        """Kill it (a killed `docker exec` leaves its process in the container: that too)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        subprocess.run(
            ["docker", "exec", self.container, "pkill", "-f", self.name],
            capture_output=True, check=False,
        )  # fmt: skip
