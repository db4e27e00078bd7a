"""Secret rotation on the shared stack, interrupted once: `rotateSecrets` and an `up` that is
stopped with two SIGINTs (Ctrl-C twice: Pulumi stops at once) right after the new secret was
written and before the daemons restarted; the next `up` converges, every service has new
secrets, every daemon was restarted, every master is logged in to ZooKeeper, and the old
secrets are refused. Changes the stack's secrets.

One rotation serves two checks that each paid for their own: the rotation itself, and failure
drill 4a (docs/reliability.md; bench/results/drills.json `4a_two_sigints_during_provisioning`),
whose interrupted provisioning needs a change that restarts daemons, which a rotation is. Drill
2 (test_80_drills) later kills the ALIVE master: the standby that this interrupted rotation
restarted must take over.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.outsiders import (
    JAAS_CLIENT,
    leaks,
    node,
    refused_spark_client,
    sh,
    spark_client,
    spark_refused,
    spark_secret,
    spark_znode,
    wait_alive,
    zk_cli,
    zk_listing,
    zookeeper_password,
)
from tests.support.processes import Recorder, wait_gone
from tests.support.stacks import BackgroundUp, wait_until

from .conftest import record_drill

pytestmark = pytest.mark.security

# Prints `stale <program>` for a Spark daemon started before its configuration was last
# written, `fresh <program>` for one started after; nothing for a program the node does not
# run. Exits 2, saying why, when it cannot tell (no configuration time, no process age).
STALE_SPARK = (
    "conf=$(find /etc/trainstack/spark -type f -printf '%T@\\n' | sort -n | tail -n 1); "
    "conf=${conf%.*}; "
    "case $conf in ''|*[!0-9]*) echo \"probe: no configuration time ($conf)\"; exit 2;; esac; "
    "for prog in spark-master spark-worker; do "
    "p=$(supervisorctl pid $prog 2>/dev/null); case $p in ''|0|*[!0-9]*) continue;; esac; "
    "age=$(ps -o etimes= -p $p | tr -d ' '); "
    "case $age in ''|*[!0-9]*) echo \"probe: no age for $prog (pid $p)\"; exit 2;; esac; "
    "if [ $(( $(date +%s) - age + 2 )) -lt $conf ]; then echo stale $prog; "
    "else echo fresh $prog; fi; done"
)


@dataclass
class Rotation:
    old: dict[str, str]
    new: dict[str, str]
    started: float  # wall clock, when the rotation's first `up` began
    stopped_code: int  # the stopped `up`'s exit code
    stopped_out: str  # its output
    stopped_s: float  # from the second SIGINT to the `up`'s exit
    recorded: list[Any]  # every process of the stopped run, sampled while it ran
    sample_errors: list[str]
    left: list[Any]  # those still there 30 s after the stop
    servers_before: dict[str, Any]  # container name -> (id, CPU limit) before the rotation
    servers_after_stop: dict[str, Any]  # the same, once the stopped run's processes are gone
    next_up: str  # the converging `up`'s output
    recovery_s: float  # from the second SIGINT to the end of the next `up`


def _servers(engine: Any, selector: str) -> dict[str, Any]:
    """The stack's containers: name -> (id, CPU limit)."""
    return {
        c.name: (c.id, c.attrs["HostConfig"]["NanoCpus"])
        for c in engine.containers.list(filters={"label": selector})
    }


def _record_descendants(recorder: Recorder, stop: threading.Event) -> list[str]:
    """Sample the descendants of the recorder's root until `stop` is set (run in a thread);
    the errors of samples that failed, if any."""
    errors: list[str] = []
    while not stop.is_set():
        try:
            recorder.sample()
        except Exception as exc:  # a process that went while it was read: the next sample
            errors.append(repr(exc))
        stop.wait(0.5)
    return errors


@pytest.fixture(scope="module")
def rotation(platform, engine) -> Iterator[Rotation]:
    stack, outputs = platform.stack, platform.outputs()
    old = {"spark secret": spark_secret(outputs), "zookeeper password": zookeeper_password(outputs)}
    before = _servers(engine, stack.selector)
    started = time.time()
    stack.set_config(rotateSecrets="rotation-1")
    up = BackgroundUp(stack)
    # Every process of the run (Pulumi's plugins, the provisioning, Ansible, Mitogen's
    # helpers, whatever their command lines) is recorded while it runs, to be found gone after.
    recorder, stop = Recorder(up.proc.pid), threading.Event()
    with ThreadPoolExecutor(1) as pool:
        sampling = pool.submit(_record_descendants, recorder, stop)
        try:
            # The new secret is on the nodes, the restart handlers have not run yet.
            up.wait_for(r"changed\s+Ensure spark-defaults.conf", timeout=600)
            stop.set()  # sampled up to the stop, which follows at once
            interrupted = time.monotonic()
            code, out = up.stop_at_once()
        finally:
            stop.set()
        sample_errors = sampling.result()
    stopped_s = time.monotonic() - interrupted
    recorded = list(recorder.seen.values())
    # The provisioning child gives the CPU limits back first, then goes.
    left = wait_gone(recorder.left(), timeout=30)
    after = _servers(engine, stack.selector)
    again = stack.up()
    recovery_s = time.monotonic() - interrupted
    new = {"spark secret": spark_secret(outputs), "zookeeper password": zookeeper_password(outputs)}
    yield Rotation(
        old=old,
        new=new,
        started=started,
        stopped_code=code,
        stopped_out=out,
        stopped_s=stopped_s,
        recorded=recorded,
        sample_errors=sample_errors,
        left=left,
        servers_before=before,
        servers_after_stop=after,
        next_up=again.stdout + again.stderr,
        recovery_s=recovery_s,
    )


@pytest.mark.drills
def test_two_sigints_during_provisioning_stop_the_run_with_pulumi(rotation):
    """Drill 4a: Pulumi stops at once and kills its providers; the Ansible run stops with them
    (no process of the run left, the nodes' CPU limits given back), the servers are the same."""
    assert rotation.stopped_code != 0, rotation.stopped_out[-3000:]
    assert any("ansible-playbook" in p.cmdline for p in rotation.recorded), (
        [str(p) for p in rotation.recorded],
        rotation.sample_errors[-5:],
    )
    assert not rotation.left, [str(p) for p in rotation.left]
    assert rotation.servers_after_stop == rotation.servers_before


@pytest.mark.drills
def test_the_next_up_converges_with_no_daemon_on_the_old_configuration(platform, rotation):
    """Drill 4a: the next `up` re-runs provisioning, which restarts the daemons still running
    the old secret; a preview after it has nothing to do."""
    assert "Traceback" not in rotation.next_up, rotation.next_up[-3000:]
    outputs = platform.outputs()
    wait_alive(outputs)
    spark_nodes = {
        n["name"]: (n["container"], DAEMONS[role])
        for n in outputs["nodes"]
        for role in ("spark_master", "spark_worker")
        if role in n["roles"]
    }
    assert len(spark_nodes) >= 4, spark_nodes  # two masters, the workers
    for name, (container, program) in spark_nodes.items():
        code, stale = sh(container, STALE_SPARK)
        assert code == 0 and f"fresh {program}" in stale.split("\n"), (name, stale)
        assert "stale" not in stale, f"{name} runs Spark with an old configuration: {stale}"
    platform.stack.run("preview", "--expect-no-changes")
    record_drill(
        "4a_two_sigints_during_provisioning",
        outcome="Pulumi stopped at once; the run was stopped with it (no Ansible process left, "
        "CPU limits given back); the next `up` re-ran provisioning, which restarted the "
        "daemons still on the old secret; no hand edit",
        stopped_after_s=round(rotation.stopped_s, 1),
        pending_operations_mentioned="pending" in rotation.next_up,
        recovery_s=round(rotation.recovery_s, 1),
        recovery_is="from the second SIGINT to the end of the next `up`",
        lost="nothing",
    )


def election_nodes(outputs: dict) -> list[str]:
    """The children of the Spark masters' leader election in ZooKeeper (one per master whose
    ZooKeeper client is logged in)."""
    _, log = sh(
        node(outputs, "control-1")["container"],
        zk_cli(outputs, f"ls {spark_znode(outputs)}/leader_election", jaas=JAAS_CLIENT),
        user="trainstack",
    )
    listing = zk_listing(log).strip("[]")
    return [child.strip() for child in listing.split(",") if child.strip()]


# The supervisor program of each daemon whose role a node has (roles/*/defaults: *_program).
DAEMONS = {"zookeeper": "zookeeper", "spark_master": "spark-master", "spark_worker": "spark-worker"}


def test_rotation_reaches_every_service(platform, rotation):
    stack, outputs = platform.stack, platform.outputs()
    old, new, started = rotation.old, rotation.new, rotation.started
    assert all(new[k] != old[k] for k in old)
    # Every node has the new secret, and every daemon started after the rotation began.
    for n in outputs["nodes"]:
        _, conf = sh(n["container"], "cat /etc/trainstack/spark/spark-defaults.conf")
        assert new["spark secret"] in conf, n["name"]
        _, status = sh(n["container"], "supervisorctl status")
        listed = {line.split()[0]: line for line in status.splitlines() if line.split()}
        expected = [program for role, program in DAEMONS.items() if role in n["roles"]]
        # The listing has the node's daemons before they are judged.
        assert expected and set(expected) <= set(listed), (n["name"], expected, status)
        for program in expected:
            _, since = sh(
                n["container"],
                f"ps -o lstart= -p $(supervisorctl pid {program}) | date -f - +%s",
            )
            assert int(since.strip()) >= int(started) - 1, (n["name"], listed[program])
    # The cluster works with the new secrets: a master is ALIVE (it logged in to ZooKeeper
    # with the new password) with the worker back (same secret), a client with the new secret
    # runs a job, and the old secrets are refused.
    wait_alive(outputs)
    with ThreadPoolExecutor(2) as pool:
        with_new = pool.submit(spark_client, outputs, new["spark secret"], True)
        with_old = pool.submit(refused_spark_client, outputs, old["spark secret"], True)
        log_new, log_old = with_new.result()[1], with_old.result()
    assert "REGISTERED" in log_new, log_new[-3000:]
    assert spark_refused(outputs, log_old), log_old[-3000:]
    assert "REGISTERED" not in log_old, log_old[-3000:]
    _, log = sh(
        node(outputs, "control-1")["container"],
        zk_cli(outputs, f"ls {spark_znode(outputs)}", jaas=JAAS_CLIENT),
        user="trainstack",
    )
    assert "leader_election" in zk_listing(log), log[-2000:]
    # Every master, not only the ALIVE one, is logged in with the new password: each holds a
    # node of the leader election, so a standby can take over (a master whose SASL login
    # failed keeps running as STANDBY with none; docs/troubleshooting.md).
    masters = [n for n in outputs["nodes"] if "spark_master" in n["roles"]]
    assert len(masters) >= 2, masters

    def every_master_elects() -> list[str] | None:
        found = election_nodes(outputs)
        return found if len(found) == len(masters) else None

    latches = wait_until(
        f"a leader-election node for each of the {len(masters)} masters",
        every_master_elects,
        timeout=60,
        every=5,
    )
    assert len(latches) == len(masters), latches
    assert leaks(stack, outputs, {**new, **{f"old {k}": v for k, v in old.items()}}) == []


def _s3_listing(url: str, access_key: str, secret_key: str, bucket: str) -> str:
    """List the bucket through the published endpoint: "ok", or the client's one-line error."""
    from pyarrow import fs

    host = url.removeprefix("http://").rstrip("/")
    s3 = fs.S3FileSystem(
        access_key=access_key,
        secret_key=secret_key,
        endpoint_override=host,
        scheme="http",
        region="us-east-1",
        force_virtual_addressing=False,
        retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=1),
    )
    try:
        s3.get_file_info(fs.FileSelector(bucket, recursive=False))
    except OSError as exc:
        return str(exc).splitlines()[0]
    return "ok"


def test_rotation_reaches_the_object_store(platform, rotation):
    """The store's secret key is derived from the cluster secret: after the rotation the
    stack's secret output has the new one, which the store takes, and the old one is refused
    (the store restarted with its new identities file)."""
    from infra.components.secret import derived_secret

    outputs = json.loads(platform.stack.run("stack", "output", "--json", "--show-secrets").stdout)
    url, bucket = outputs["objectStoreUrl"], outputs["objectStoreBucket"]
    access = outputs["objectStoreAccessKey"]
    old_key = derived_secret(rotation.old["spark secret"], "object-store")
    assert outputs["objectStoreSecretKey"] == derived_secret(
        rotation.new["spark secret"], "object-store"
    )
    assert outputs["objectStoreSecretKey"] != old_key
    new = wait_until(
        "the object store takes the new key",
        lambda: (
            (r := _s3_listing(url, access, outputs["objectStoreSecretKey"], bucket)) == "ok" and r
        ),
        timeout=60,
        every=2,
    )
    assert new == "ok"
    refused = _s3_listing(url, access, old_key, bucket)
    assert refused != "ok", "the old object store key still works after the rotation"
    # pyarrow's words for a refused key: SIGNATURE_DOES_NOT_MATCH (a known access key with
    # another secret), ACCESS_DENIED or INVALID_ACCESS_KEY_ID.
    words = ("signature", "access_denied", "accessdenied", "invalid_access_key", "403")
    assert any(w in refused.lower() for w in words), refused
    # Neither key in a process's arguments, a log, the job files or the Pulumi state.
    keys = {"object store key": outputs["objectStoreSecretKey"], "old object store key": old_key}
    assert leaks(platform.stack, platform.outputs(), keys) == []
