"""An outsider on a stack's network, and the secrets it must not find: a fresh container from
the node image on the cluster's network has Spark, ZooKeeper's jars and Java, but not the
cluster's secrets (docs/security.md)."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable

import docker
from trainstack_training.rundir import OUTPUT as JOB_OUTPUT
from trainstack_training.rundir import RANK_LOG
from trainstack_training.warm import LOG as RUNNER_LOG
from trainstack_training.warm import STATE_DIR_PREFIX

from infra.nodes import NODE_PATHS
from tests.support.stacks import LABEL_STACK, ROOT, Stack

SPARK_HOME = f"{NODE_PATHS.venv_dir}/lib/python3.11/site-packages/pyspark"
JAAS_CLIENT = f"{NODE_PATHS.spark_conf_dir}/zookeeper-client.jaas"
APP_NAME = "outsider-app"


def node(outputs: dict, name: str) -> dict:
    return next(n for n in outputs["nodes"] if n["name"] == name)


def sh(container: str, command: str, user: str = "root") -> tuple[int, str]:
    """Run a shell command in a node as `user`: (exit code, stdout+stderr)."""
    proc = subprocess.run(
        ["docker", "exec", "-u", user, container, "bash", "-c", command],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=300,
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def _start_outsider(outputs: dict, command: str):
    """A new container from the node image on the cluster network, running `command`."""
    return docker.from_env().containers.run(
        outputs["nodeImage"]["tag"],
        ["bash", "-c", command],
        network=outputs["network"],
        user="trainstack",
        detach=True,
        labels={LABEL_STACK: f"tssec-outsider-{outputs['network']}"},
    )


def outsider(outputs: dict, command: str, timeout: int = 180) -> tuple[int, str]:
    """Run `command` in a new container from the node image on the cluster network."""
    container = _start_outsider(outputs, command)
    try:
        code = container.wait(timeout=timeout)["StatusCode"]
        return code, container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)


def outsider_until(
    outputs: dict, command: str, seen: Callable[[str], bool], timeout: float, grace: float = 2.0
) -> str:
    """Run `command` like `outsider`, but stop it as soon as its output shows what `seen`
    looks for (`grace` seconds later, so that the entry that showed it, a stack trace, is
    whole): its output then. Also its output when it ends first, or after `timeout` seconds
    (a backstop), with a last line saying so: the caller's assertion on `seen` then fails
    with it."""
    container = _start_outsider(outputs, command)
    try:
        deadline = time.monotonic() + timeout
        while True:
            log = container.logs().decode(errors="replace")
            if seen(log):
                time.sleep(grace)
                return container.logs().decode(errors="replace")
            container.reload()
            if container.status in ("exited", "dead"):
                log = container.logs().decode(errors="replace")
                code = container.attrs["State"]["ExitCode"]
                return log + f"\n[the outsider ended (exit {code})]"
            if time.monotonic() > deadline:
                return log + f"\n[the outsider was stopped after {timeout:.0f} s]"
            time.sleep(0.5)
    finally:
        container.remove(force=True)


def spark_secret(outputs: dict) -> str:
    conf = sh(
        node(outputs, "worker-1")["container"], "cat /etc/trainstack/spark/spark-defaults.conf"
    )
    return re.search(r"^spark\.authenticate\.secret\s+(\S+)$", conf[1], re.M).group(1)


def zookeeper_password(outputs: dict) -> str:
    jaas = sh(node(outputs, "control-1")["container"], "cat /etc/trainstack/zookeeper/jaas.conf")
    return re.search(r'user_spark="([^"]+)"', jaas[1]).group(1)


def zookeeper_connect(outputs: dict) -> str:
    return ",".join(f"{n['address']}:2181" for n in outputs["nodes"] if "zookeeper" in n["roles"])


def _spark_client_script(outputs: dict, secret: str | None, crypto: bool) -> str:
    """A Spark application's driver: with no secret, Spark's defaults (no authentication, no
    encryption: Spark itself refuses encryption without authentication, on the client, before
    it reaches a master); it prints REGISTERED once it ran a job on the cluster."""
    conf = {
        "spark.master": outputs["sparkMasterUrl"],
        "spark.app.name": APP_NAME,
        "spark.driver.memory": "512m",
        "spark.cores.max": "1",
    }
    if crypto:
        conf["spark.network.crypto.enabled"] = "true"
    if secret is not None:
        conf |= {"spark.authenticate": "true", "spark.authenticate.secret": secret}
    return (
        "import socket\n"
        "from pyspark import SparkConf, SparkContext\n"
        f"conf = SparkConf().setAll({sorted(conf.items())!r})\n"
        "conf.set('spark.driver.host', socket.gethostbyname(socket.gethostname()))\n"
        "sc = SparkContext(conf=conf)\n"
        "print('REGISTERED', sc.applicationId, sc.parallelize(range(10), 1).sum(), flush=True)\n"
        "sc.stop()\n"
    )


def spark_client(outputs: dict, secret: str | None, crypto: bool) -> tuple[int, str]:
    """A Spark application from outside the cluster that should register with the masters
    (run to its end). Its job needs an executor started on a worker (a JVM, then a Python
    worker): a CI run at machine-speed index 1.85, beside another stack, saw that take over
    50 s, so the bound is generous; a refused client never gets that far."""
    script = _spark_client_script(outputs, secret, crypto)
    return outsider(
        outputs,
        f"export SPARK_CONF_DIR=/tmp; timeout 180 /opt/trainstack/venv/bin/python -c {shq(script)}",
    )


def spark_refused(outputs: dict, log: str) -> bool:
    """Whether a Spark client's log shows the masters' refusal: the standalone client's warning
    "Failed to connect to master <host:port>" (the cause, the failed handshake, below it) for
    every master of the cluster, or its end, "All masters are unresponsive! Giving up." (after
    3 x 20 s of registration tries)."""
    masters = outputs["sparkMasterUrl"].removeprefix("spark://").split(",")
    return "All masters are unresponsive" in log or all(
        f"Failed to connect to master {m}" in log for m in masters
    )


def refused_spark_client(
    outputs: dict, secret: str | None, crypto: bool, timeout: float = 150
) -> str:
    """A Spark application from outside the cluster that the masters must refuse: its output,
    stopped as soon as it shows the refusal (`spark_refused`), or after `timeout` seconds."""
    script = _spark_client_script(outputs, secret, crypto)
    return outsider_until(
        outputs,
        f"export SPARK_CONF_DIR=/tmp; exec /opt/trainstack/venv/bin/python -c {shq(script)}",
        lambda log: spark_refused(outputs, log),
        timeout,
    )


def shq(text: str) -> str:
    return "'" + text.replace("'", "'\"'\"'") + "'"


def zk_cli(outputs: dict, command: str, jaas: str | None = None) -> str:
    flags = f"-Djava.security.auth.login.config={jaas}" if jaas else "-Dzookeeper.sasl.client=false"
    return (
        f"timeout 40 java {flags} -cp '{SPARK_HOME}/jars/*' org.apache.zookeeper.ZooKeeperMain "
        f"-server {zookeeper_connect(outputs)} {command} 2>&1"
    )


# A watcher's event as zkCli prints it: from another thread, so it may land after the listing
# or even inside it ("[leader_election" / the event / ", master_status]", CI 2026-12-07).
ZK_WATCHER_EVENT = re.compile(r"\n?WATCHER::\s*\n\s*WatchedEvent [^\n]*\n?")


def zk_listing(log: str) -> str:
    """The children `ls` printed, the watcher's events taken out of it (ZK_WATCHER_EVENT)."""
    lines = [line.strip() for line in ZK_WATCHER_EVENT.sub("", log).splitlines()]
    return next(
        (line for line in reversed(lines) if line.startswith("[") and line.endswith("]")), ""
    )


def wait_alive(outputs: dict, timeout: float = 240) -> dict:
    """The ALIVE master's status once it has every worker back (after a restart the new
    leader recovers from ZooKeeper first)."""
    workers = sum("spark_worker" in n["roles"] for n in outputs["nodes"])
    masters = [n for n in outputs["nodes"] if "spark_master" in n["roles"]]
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        for m in masters:
            code, out = sh(
                m["container"],
                'python3 -c "import urllib.request; print(urllib.request.urlopen('
                f"'http://{m['address']}:8080/json', timeout=5).read().decode())\"",
            )
            if code == 0:
                status = json.loads(out)
                seen.append(f"{m['name']}: {status['status']} {status['aliveworkers']}")
                if status["status"] == "ALIVE" and status["aliveworkers"] == workers:
                    return status
        time.sleep(3)
    raise AssertionError(f"no ALIVE master with {workers} workers in {timeout}s: {seen[-4:]}")


def spark_znode(outputs: dict) -> str:
    return f"/trainstack/{outputs['inventory']['all']['vars']['trainstack_stack']}/spark"


# The jobs' own logs, each printed after a "==> PATH <==" line (tail -v): every TensorFlow
# rank's log and a submitted job's output in its run directory (<models>/<run or job id>/), on
# the shared storage every node mounts, so read once. A submitted job's output.log exists only
# once a job was submitted (test_76_submit, later), so it may be absent; the stack's first
# `up` trained, so rank logs are there.
JOB_LOGS = (
    f"find {NODE_PATHS.models_dir} -mindepth 2 -maxdepth 2 -type f "
    f"\\( -name '{RANK_LOG.format(rank='*')}' -o -name '{JOB_OUTPUT}' \\) "
    "-exec tail -v -n +1 {} +"
)
# The warm runner's log in its state directory, on the node it ran on (absent on the others).
RUNNER_LOGS = (
    f"for f in {STATE_DIR_PREFIX}*/{RUNNER_LOG}; do "
    'if [ -f "$f" ]; then tail -v -n +1 "$f" || exit 1; fi; done'
)


def files_read(text: str) -> dict[str, str]:
    """The files a `tail -v` printed, each with its text."""
    parts = re.split(r"^==> (.+) <==$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def leaks(stack: Stack, outputs: dict, values: dict[str, str]) -> list[str]:
    found = []
    first = outputs["nodes"][0]
    code, out = sh(first["container"], JOB_LOGS)
    assert code == 0, f"the jobs' logs could not be read on {first['name']}: {out[-2000:]}"
    job_logs = files_read(out)
    rank_logs = [p for p in job_logs if re.fullmatch(r"rank-\d+\.log", p.rsplit("/", 1)[-1])]
    assert rank_logs, f"no rank log read under {NODE_PATHS.models_dir}: {sorted(job_logs)}"
    for n in outputs["nodes"]:
        _, procs = sh(n["container"], "ps -eo args")
        _, logs = sh(n["container"], "cat /var/log/trainstack/* 2>/dev/null")
        code, out = sh(n["container"], RUNNER_LOGS)
        assert code == 0, f"the warm runner's log could not be read on {n['name']}: {out[-2000:]}"
        for what, value in values.items():
            if value in procs:
                found.append(f"{what} in the process arguments on {n['name']}")
            if value in logs:
                found.append(f"{what} in the logs on {n['name']}")
        job_logs |= {f"{n['name']}:{path}": text for path, text in files_read(out).items()}
    for path, text in job_logs.items():
        found += [f"{what} in {path}" for what, value in values.items() if value in text]
    artifacts = ROOT / ".artifacts" / stack.name
    assert artifacts.is_dir(), artifacts
    for path in artifacts.rglob("*"):
        if path.is_file():
            text = path.read_text(errors="ignore")
            found += [f"{what} in {path}" for what, value in values.items() if value in text]
    state = stack.run("stack", "export").stdout
    found += [f"{what} in the Pulumi state" for what, value in values.items() if value in state]
    return found
