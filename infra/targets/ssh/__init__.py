"""The ssh target: servers you already have, reached over SSH (docs/targets.md).

Each server of `trainstack:servers` is one resource, a stock `command.local.Command`
(pulumi-command) whose create connects over SSH, records the server's facts (OS, cores,
memory, free disk, host key) and fails with a one-line reason when the server cannot be
reached or does not fit; whose delete runs the teardown playbook on it, so that removing a
server from the list (or `pulumi destroy`) removes trainstack's services and files from it.
`Command` has no read (pulumi/pulumi-command#432), so beside it each server has a small
dynamic resource, `ServerProbe`, holding the facts: its create takes what the command
recorded (no second connection), its read connects again, so `pulumi refresh` re-reads the
facts and fails, naming the server, when one cannot be reached or no longer fits.
Host keys: the first contact records the server's key in the stack's known_hosts file
(`.artifacts/<stack>/ssh/known_hosts`); the facts keep it in the state, and every later
connection (Ansible, the training launch) checks against what `up` recorded.

This package, by concept: the resources are here (`SshCluster`, the ComponentResource, and
`ServerProbe`); `facts` is the probe (connect, read the facts, check the fit);
`known_hosts` the host keys and the files that record them; `cli` is what each server's
command runs, as `python -m infra.targets.ssh facts|teardown` (`__main__`), with the server
in the environment.

Two names are in the stacks' state and must stay: `python -m infra.targets.ssh` (each
command's delete runs the recorded line) and `infra.targets.ssh._ProbeProvider` (the
dynamic provider is pickled by reference; refresh and destroy load it from the state).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pulumi
from pulumi.dynamic import (
    CreateResult,
    DiffResult,
    ReadResult,
    Resource,
    ResourceProvider,
    UpdateResult,
)

from infra.config import StackConfig
from infra.config.servers import parse_servers
from infra.errors import UserFacingError, short_provider_errors
from infra.targets.ssh.cli import (
    ARTIFACTS_ENV,
    CURRENT_ENV,
    KNOWN_HOSTS_ENV,
    MIN_MEMORY_ENV,
    SERVER_ENV,
)
from infra.targets.ssh.facts import SshTargetError, probe
from infra.targets.ssh.known_hosts import write_known_hosts
from infra.topology import NodeSpec

if TYPE_CHECKING:
    from infra.targets.base import TargetArgs

ROOT = Path(__file__).resolve().parents[3]

short_provider_errors()


def reprobe(props: dict[str, Any]) -> dict[str, Any]:
    """The facts of a recorded server, read again over SSH, trusting only its recorded keys."""
    import tempfile

    record = json.loads(props["server"])
    servers, errors = parse_servers([record])
    if errors or not servers:
        # parse_servers names the config key; here the server comes from the state.
        said = "; ".join(e.split(": ", 1)[-1] for e in errors) or "not a server record"
        raise UserFacingError(f"trainstack: server {record.get('name')}: {said}")
    recorded = props.get("facts") or {}
    with tempfile.TemporaryDirectory(prefix="trainstack-probe-") as scratch:
        known_hosts = Path(scratch) / "known_hosts"
        write_known_hosts(known_hosts, list(recorded.get("host_keys", [])))
        try:
            return probe(servers[0], known_hosts, int(props["min_memory"]), first_contact=False)
        except SshTargetError as exc:
            raise UserFacingError(f"trainstack: {exc}") from None


class _ProbeProvider(ResourceProvider):
    """Facts of one server: taken from its `Command` on create, read over SSH on refresh."""

    serialize_as_secret_always = False

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(
            json.loads(props["server"])["name"], {**props, "facts": props["recorded"]}
        )

    def diff(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # What the command recorded, or the server's record, changed: take the new facts.
        # A refresh changes `facts` only, which is not an input.
        keys = ("server", "min_memory", "recorded")
        changed = [k for k in keys if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=[], stables=[])

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult({**news, "facts": news["recorded"]})

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(id_, {**props, "facts": reprobe(props)})


class ServerProbe(Resource, module="ssh", name="ServerProbe"):
    """A server's facts in the state, read again by `pulumi refresh`."""

    facts: pulumi.Output[dict]

    def __init__(
        self,
        name: str,
        record: str,
        min_memory: int,
        recorded: pulumi.Input[dict],
        opts: pulumi.ResourceOptions,
    ) -> None:
        super().__init__(
            _ProbeProvider(),
            name,
            {
                "server": record,  # the server's JSON record, as its command has it
                "min_memory": str(min_memory),
                "recorded": recorded,
                "facts": None,
            },
            opts,
        )


def cluster(target: TargetArgs) -> SshCluster:
    """The ssh target: the servers of `trainstack:servers`."""
    return SshCluster(
        "servers",
        SshClusterArgs(config=target.config, stack=target.stack, artifacts=target.artifacts),
    )


@dataclass
class SshClusterArgs:
    config: StackConfig
    stack: str
    # `.artifacts/<stack>`: known_hosts, the current server list and teardown logs live here.
    artifacts: Path


class SshCluster(pulumi.ComponentResource):
    """The servers of `trainstack:servers`: one `command.local.Command` each (facts on
    create and on any change of its record, teardown on delete), and what provisioning and
    the training launch need to reach them (infra.targets.base.ClusterOutputs)."""

    plan: list[NodeSpec]
    nodes: pulumi.Output[list[dict]]
    inventory: pulumi.Output[dict]
    spark_master_url: str
    ui_urls: pulumi.Output[dict[str, str]]
    monitoring_url: pulumi.Output[str] | None
    tracking_url: pulumi.Output[str] | None
    object_store_url: pulumi.Output[str] | None
    spark_auth_secret: pulumi.Output[str]
    secret_id: pulumi.Output[str]
    submit_candidates: list[dict]
    tracking_node: dict | None
    network_name = None  # the servers' own network
    cpu_boost = False  # the servers' CPUs are theirs: no container limits to lift

    def __init__(
        self, name: str, args: SshClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("trainstack:ssh:Cluster", name, None, opts)
        from pulumi_command import local

        from infra import topology
        from infra.components.secret import cluster_secret

        config = args.config
        servers = config.servers
        plan = self.plan = topology.server_plan(config, servers)
        self.prefix = topology.resource_prefix(config, args.stack)
        state_dir = args.artifacts / "ssh"
        self.known_hosts = state_dir / "known_hosts"
        current = state_dir / "servers.json"
        state_dir.mkdir(parents=True, exist_ok=True)
        current.write_text(json.dumps([s.as_dict() for s in servers], indent=2))
        python = f"{sys.executable} -m infra.targets.ssh"
        facts: dict[str, pulumi.Output[dict]] = {}
        probes: dict[str, pulumi.Output[dict]] = {}
        for server in servers:
            min_memory = (
                config.worker_memory_bytes
                if server.group == "workers"
                else config.control_memory_bytes
            )
            record = json.dumps(server.as_dict(), sort_keys=True)
            command = local.Command(
                f"server-{server.name}",
                create=f"{python} facts",
                delete=f"{python} teardown",
                dir=str(ROOT),
                environment={
                    SERVER_ENV: record,
                    KNOWN_HOSTS_ENV: str(self.known_hosts),
                    MIN_MEMORY_ENV: str(min_memory),
                    CURRENT_ENV: str(current),
                    ARTIFACTS_ENV: str(state_dir / "teardown" / server.name),
                },
                # Another machine is another server: the old one is torn down, the new one
                # probed. A change of user, key or roles probes the same server again.
                triggers=[server.address, server.port],
                # Teardown before the probe: a replaced server (`pulumi up --replace`) is
                # then installed again by provisioning, not wiped after it.
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
            )
            recorded = command.stdout.apply(json.loads)
            facts[server.name] = recorded
            # The facts as last read: by the command on up, again by `pulumi refresh`.
            probes[server.name] = ServerProbe(
                f"probe-{server.name}",
                record,
                min_memory,
                recorded,
                opts=pulumi.ResourceOptions(parent=self),
            ).facts
        every_fact = pulumi.Output.all(**facts)
        last_read = pulumi.Output.all(**probes)
        # known_hosts holds exactly what `up` recorded (a fresh clone of the project gets it
        # back from the state); every later connection checks against it.
        every_fact.apply(self._write_known_hosts)

        secret = cluster_secret(config.rotate_secrets, parent=self)
        self.spark_auth_secret = secret.value
        self.secret_id = secret.id
        reach = {s.name: s.reach for s in servers}
        self.spark_master_url = topology.master_url(plan, reach)
        by_name = {s.name: s for s in servers}
        self.ui_urls = pulumi.Output.from_input(
            {
                spec.key: f"http://{by_name[spec.key].address}:{topology.SPARK_MASTER_UI_PORT}"
                for spec in plan
                if spec.is_master
            }
        )
        monitor = topology.monitoring_node(plan)
        self.monitoring_url = (
            pulumi.Output.from_input(
                f"http://{by_name[monitor.key].address}:{topology.PROMETHEUS_PORT}"
            )
            if monitor
            else None
        )
        # The MLflow server listens on its server's cluster address (nodeAddress, else
        # address), not on every address: its UI is reached there or through `ssh -L`
        # (docs/security.md). None when trainstack:tracking is off.
        tracking_uri = topology.tracking_uri(plan, reach)
        self.tracking_url = (
            pulumi.Output.from_input(tracking_uri) if tracking_uri is not None else None
        )
        # The object store's S3 endpoint, at the same address: what s3a on the nodes uses.
        store = topology.object_store_node(plan)
        self.object_store_url = (
            pulumi.Output.from_input(
                f"http://{reach.get(store.key, store.key)}:{topology.OBJECT_STORE_PORT}"
            )
            if store
            else None
        )
        self.nodes = last_read.apply(
            lambda f: [
                {
                    "name": spec.key,
                    "roles": list(spec.roles),
                    "address": by_name[spec.key].address,
                    "facts": {k: v for k, v in f[spec.key].items() if k != "host_keys"},
                }
                for spec in plan
            ]
        )
        # Provisioning follows the facts: it runs after every server answered.
        self.inventory = every_fact.apply(
            lambda _: topology.inventory(
                config,
                self.prefix,
                plan,
                servers=servers,
                known_hosts=str(self.known_hosts),
            )
        )
        records = {
            spec.key: {
                "name": spec.key,
                "transport": "ssh",
                "host": by_name[spec.key].address,
                "port": by_name[spec.key].port,
                "user": by_name[spec.key].user,
                "private_key_file": by_name[spec.key].private_key_file,
                "known_hosts_file": str(self.known_hosts),
            }
            for spec in plan
        }
        self.submit_candidates = [records[s.key] for s in topology.submit_nodes(plan)]
        tracker = topology.tracking_node(plan)
        self.tracking_node = records[tracker.key] if tracker else None
        self.register_outputs(
            {
                "nodes": self.nodes,
                "spark_master_url": self.spark_master_url,
                "ui_urls": self.ui_urls,
                "inventory": self.inventory,
            }
        )

    def _write_known_hosts(self, facts: dict[str, dict]) -> None:
        lines = [line for f in facts.values() for line in f.get("host_keys", [])]
        if lines:
            write_known_hosts(self.known_hosts, lines)
