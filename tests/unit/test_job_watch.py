"""tests/support/jobs.py's JobWatch, which the cancel tests on the shared stack use: which new
processes of the job user are the job's (its runner, its driver, its ranks: forks of an
executor's Python daemon), which outlive it by design (a warm runner it started, the JVMs,
the daemons), and which of them are left after the stop, by PID and start time. The node is
a scripted listing here, as the real one prints it (LIST_PROCESSES)."""

from __future__ import annotations

import json

import pytest

from tests.support.jobs import LIST_PROCESSES, JobWatch

pytestmark = pytest.mark.unit

UID, ROOT = 999, 0
VENV = "/opt/trainstack/venv/bin/python"
JAVA = "/usr/lib/jvm/java-17-openjdk-amd64/bin/java -cp /opt/spark/conf"
WORKER_JVM = (100, 10, 1, UID, f"{JAVA} org.apache.spark.deploy.worker.Worker")
EXPORTER = (110, 11, 1, 998, "/usr/bin/prometheus-node-exporter")
# What a job starts on its node: its runner and driver, a warm runner (its Python process, its
# gateway JVM), an executor JVM with its Python daemon, the daemon's forks (the ranks), and a
# child of a rank.
RUNNER = (200, 50, 1, UID, f"{VENV} -m trainstack_training.queue /srv/m/job-1 --lock x --")
DRIVER = (201, 51, 200, UID, f"{VENV} /opt/trainstack/venv/bin/trainstack-train --epochs 400")
WARM = (210, 52, 1, UID, f"{VENV} -m trainstack_training.warm --keep-alive 600")
GATEWAY = (211, 53, 210, UID, f"{JAVA} org.apache.spark.deploy.SparkSubmit pyspark-shell")
EXECUTOR = (220, 54, 100, UID, f"{JAVA} org.apache.spark.executor.CoarseGrainedExecutorBackend")
DAEMON = (221, 55, 220, UID, f"{VENV} -m trainstack_training.daemon pyspark.worker")
RANK = (230, 60, 221, UID, f"{VENV} -m trainstack_training.daemon pyspark.worker")
RANK_CHILD = (231, 61, 230, UID, "/bin/sh -c helper")
ROOT_SHELL = (240, 62, 1, ROOT, "bash -c something")


class Node:
    """A node whose process listing the test changes between calls."""

    def __init__(self, *procs: tuple) -> None:
        self.procs = list(procs)
        self.commands: list[str] = []

    def sh(self, container: str, command: str) -> tuple[int, str]:
        self.commands.append(command)
        return 0, f"uid={UID}\n{json.dumps([list(p) for p in self.procs])}\n"


def test_the_job_is_its_new_processes_less_what_outlives_it_by_design():
    node = Node(WORKER_JVM, EXPORTER)
    watch = JobWatch(node.sh, ["worker-1"])
    assert node.commands == [LIST_PROCESSES]
    node.procs += [RUNNER, DRIVER, WARM, GATEWAY, EXECUTOR, DAEMON, RANK, RANK_CHILD, ROOT_SHELL]
    ranks = watch.sample()
    assert [p.pid for p in ranks] == [230] == [p.pid for p in watch.ranks.values()]
    assert sorted(p.pid for p in watch.seen.values()) == [200, 201, 230, 231]
    assert sorted(p.pid for p in watch.kept.values()) == [210, 211, 220, 221]
    # All still there: all left. Then the job's processes end; the warm runner stays.
    assert sorted(p.pid for p in watch.left()) == [200, 201, 230, 231]
    node.procs = [WORKER_JVM, EXPORTER, WARM, GATEWAY, EXECUTOR, DAEMON]
    assert watch.left() == [] and watch.wait_gone(0) == []


def test_a_pid_handed_to_a_new_process_is_not_the_recorded_one():
    node = Node(WORKER_JVM)
    watch = JobWatch(node.sh, ["worker-1"])
    node.procs += [EXECUTOR, DAEMON, RANK]
    assert [p.pid for p in watch.sample()] == [230]
    node.procs[-1] = (230, 999, 221, UID, RANK[4])  # the same PID, started later
    assert watch.left() == []
    node.procs[-1] = RANK
    assert [p.pid for p in watch.left()] == [230]


def test_a_pyspark_daemons_forks_are_ranks_too_and_what_ran_before_is_not_the_jobs():
    daemon = (221, 55, 220, UID, f"{VENV} -m pyspark.daemon pyspark.worker")
    rank = (230, 60, 221, UID, f"{VENV} -m pyspark.daemon pyspark.worker")
    node = Node(WORKER_JVM, EXECUTOR, daemon, RUNNER)  # a runner from before the submit
    watch = JobWatch(node.sh, ["worker-1"])
    node.procs.append(rank)
    assert [p.pid for p in watch.sample()] == [230]
    assert [p.pid for p in watch.seen.values()] == [230] and not watch.kept
