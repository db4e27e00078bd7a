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

The command line of this module is what those resources run:
`python -m infra.targets.ssh facts|teardown` with the server in the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
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
from infra.config.servers import Server, parse_servers
from infra.config.values import parse_size
from infra.errors import UserFacingError, short_provider_errors
from infra.topology import NodeSpec

if TYPE_CHECKING:
    from infra.targets.base import TargetArgs
    from infra.transport import SshTransport

ROOT = Path(__file__).resolve().parents[2]

short_provider_errors()

SERVER_ENV = "TRAINSTACK_SERVER"  # the server record (JSON, the config key's spelling)
KNOWN_HOSTS_ENV = "TRAINSTACK_KNOWN_HOSTS"
MIN_MEMORY_ENV = "TRAINSTACK_MIN_MEMORY"  # bytes the server's role needs
CURRENT_ENV = "TRAINSTACK_CURRENT_SERVERS"  # file: the servers of the running `up`
ARTIFACTS_ENV = "TRAINSTACK_TEARDOWN_ARTIFACTS"
# The roles are written for Debian 12 (roles/common/vars/Debian.yml, Debian's packages).
SUPPORTED_OS = (("debian", "12"),)
MIN_FREE_DISK = parse_size("4g")  # Java, Spark, TensorFlow and the wheels: about 3 GB
FACTS_SCRIPT = r"""
. /etc/os-release 2>/dev/null
echo "os_id=${ID:-unknown}"
echo "os_version=${VERSION_ID:-unknown}"
echo "os_name=${PRETTY_NAME:-unknown}"
echo "cores=$(nproc 2>/dev/null || echo 0)"
echo "memory_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null || echo 0)"
echo "disk_free_kb=$(df -Pk / 2>/dev/null | awk 'NR == 2 {print $4}')"
echo "python3=$(command -v python3 || true)"
if [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; then echo "become=yes"; else echo "become=no"; fi
"""


class SshTargetError(Exception):
    """A server cannot be used; the message names it and says why in one line."""


@dataclass(frozen=True)
class Facts:
    os_id: str
    os_version: str
    os_name: str
    cores: int
    memory_bytes: int
    disk_free_bytes: int
    python3: str
    become: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "os": self.os_name,
            "os_id": self.os_id,
            "os_version": self.os_version,
            "cores": self.cores,
            "memory_bytes": self.memory_bytes,
            "disk_free_bytes": self.disk_free_bytes,
        }


def known_hosts_entry(server: Server) -> str:
    """How OpenSSH names the server in known_hosts."""
    return server.address if server.port == 22 else f"[{server.address}]:{server.port}"


def server_transport(
    server: Server, known_hosts: Path, *, first_contact: bool = False
) -> SshTransport:
    """How trainstack reaches `server`: its login, checked against `known_hosts`."""
    from infra.transport import SshTransport

    return SshTransport(
        server.name,
        server.address,
        server.port,
        server.user,
        server.private_key_file,
        str(known_hosts),
        first_contact=first_contact,
    )


def describe(server: Server) -> str:
    return f"server {server.name} ({server.user}@{server.address}:{server.port})"


def parse_facts(text: str) -> Facts:
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def number(key: str) -> int:
        try:
            return int(values.get(key, "0") or 0)
        except ValueError:
            return 0

    return Facts(
        os_id=values.get("os_id", "unknown"),
        os_version=values.get("os_version", "unknown"),
        os_name=values.get("os_name", "unknown"),
        cores=number("cores"),
        memory_bytes=number("memory_kb") * 1024,
        disk_free_bytes=number("disk_free_kb") * 1024,
        python3=values.get("python3", ""),
        become=values.get("become") == "yes",
    )


def fit_errors(server: Server, facts: Facts, min_memory: int) -> list[str]:
    """Why `server` cannot run its roles, one sentence each."""
    errors = []
    if (facts.os_id, facts.os_version) not in SUPPORTED_OS:
        allowed = ", ".join(f"{i} {v}" for i, v in SUPPORTED_OS)
        errors.append(f"runs {facts.os_name}; the roles support {allowed}")
    if facts.memory_bytes < min_memory:
        errors.append(
            f"has {facts.memory_bytes / 2**30:.1f} GiB of memory; its roles "
            f"({', '.join(server.roles)}) need at least {min_memory / 2**30:.1f} GiB"
        )
    if facts.disk_free_bytes < MIN_FREE_DISK:
        errors.append(
            f"has {facts.disk_free_bytes / 2**30:.1f} GiB free on /; the install needs "
            f"{MIN_FREE_DISK / 2**30:.0f} GiB"
        )
    if not facts.python3:
        errors.append("has no python3, which Ansible needs: apt-get install python3")
    if not facts.become:
        errors.append(f"user {server.user} cannot sudo without a password, which the roles need")
    return errors


def probe(
    server: Server, known_hosts: Path, min_memory: int, *, first_contact: bool = True
) -> dict[str, Any]:
    """Connect, read the facts, check the fit, return the facts with the recorded host key.

    `first_contact`: a server not yet in `known_hosts` is accepted and its key recorded;
    without it only the keys already in `known_hosts` are trusted."""
    from infra.transport import TransportError, one_line

    known_hosts.parent.mkdir(parents=True, exist_ok=True)
    known_hosts.touch(mode=0o600, exist_ok=True)
    transport = server_transport(server, known_hosts, first_contact=first_contact)
    try:
        code, out = transport.run(["sh", "-c", FACTS_SCRIPT])
    except TransportError as exc:
        raise SshTargetError(
            f"{describe(server)}: cannot connect over SSH: {exc.reason or exc}"
        ) from None
    text = out.decode(errors="replace")
    if code != 0:
        said = one_line(text) or "no output"
        raise SshTargetError(f"{describe(server)}: the facts script failed: {said}")
    facts = parse_facts(text)
    errors = fit_errors(server, facts, min_memory)
    if errors:
        raise SshTargetError(f"{describe(server)} does not fit: " + "; ".join(errors))
    keys = host_keys(server, known_hosts)
    # The server's own copy: its teardown needs the key after `up` has dropped the server
    # from the stack's file (which holds the listed servers only).
    write_known_hosts(own_known_hosts(server, known_hosts), keys)
    return {**facts.as_dict(), "host_keys": keys}


def own_known_hosts(server: Server, known_hosts: Path) -> Path:
    """The known_hosts file with only `server`'s recorded keys, beside the stack's."""
    return known_hosts.parent / "hosts" / f"{server.name}-{server.address}-{server.port}"


def host_keys(server: Server, known_hosts: Path) -> list[str]:
    """The known_hosts lines recorded for `server`."""
    proc = subprocess.run(
        ["ssh-keygen", "-F", known_hosts_entry(server), "-f", str(known_hosts)],
        capture_output=True,
        text=True,
    )
    return sorted(
        line.strip()
        for line in proc.stdout.splitlines()
        if line.strip() and not line.startswith("#")
    )


def write_known_hosts(path: Path, lines: list[str]) -> None:
    """known_hosts with exactly the recorded keys (mode 0600), replacing what was there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text("".join(f"{line}\n" for line in sorted(set(lines))))
    temporary.chmod(0o600)
    temporary.replace(path)


def _server_from_env() -> Server:
    servers, errors = parse_servers([json.loads(os.environ[SERVER_ENV])])
    if errors or not servers:
        raise SshTargetError("; ".join(errors) or "no server given")
    return servers[0]


def _renamed(server: Server) -> str:
    """The name under which the running `up` lists a server at the same address and port
    ("" when none other does): a renamed server, whose teardown would undo its new install.
    `pulumi destroy` does not run the program, so the file is the last `up`'s list, where
    the server has its own name."""
    current = os.environ.get(CURRENT_ENV, "")
    try:
        listed = json.loads(Path(current).read_text()) if current else []
    except (OSError, ValueError):
        return ""
    for entry in listed:
        same = entry.get("address") == server.address and int(entry.get("port") or 22) == (
            server.port
        )
        if same and entry.get("name") != server.name:
            return str(entry.get("name"))
    return ""


def teardown(server: Server, known_hosts: Path, artifacts: Path) -> str:
    """Run playbooks/teardown.yml on `server`; returns a one-line summary."""
    from infra import topology
    from infra.provisioning.runner import run_playbook

    renamed = _renamed(server)
    if renamed:
        return f"{describe(server)}: still listed, as {renamed}; nothing removed"
    own = own_known_hosts(server, known_hosts)
    if own.exists():
        known_hosts = own
    # A server that is gone (or reinstalled: its host key changed) must not block its
    # removal from the stack: nothing can be removed from it, and the user is told so.
    why = server_transport(server, known_hosts).unavailable()
    if why:
        return f"{describe(server)}: cannot be reached ({why}); trainstack's files stay on it"
    result = run_playbook(
        topology.teardown_inventory([server], known_hosts),
        "teardown.yml",
        artifacts_dir=artifacts,
        mitogen=False,
    )
    if not result.ok:
        raise SshTargetError(
            f"{describe(server)}: the teardown playbook failed ({result.status}); see {artifacts}"
        )
    own.unlink(missing_ok=True)
    return f"{describe(server)}: trainstack removed"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in (["facts"], ["teardown"]):
        print("usage: python -m infra.targets.ssh facts|teardown (server in the environment)")
        return 2
    try:
        server = _server_from_env()
        known_hosts = Path(os.environ[KNOWN_HOSTS_ENV])
        if args == ["facts"]:
            facts = probe(server, known_hosts, int(os.environ.get(MIN_MEMORY_ENV) or 0))
            print(json.dumps(facts, sort_keys=True))
        else:
            artifacts = Path(os.environ.get(ARTIFACTS_ENV) or known_hosts.parent / "teardown")
            print(teardown(server, known_hosts, artifacts), file=sys.stderr)
    except (SshTargetError, KeyError, ValueError, OSError) as exc:
        print(f"trainstack: {exc}", file=sys.stderr)
        return 1
    return 0


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
    spark_auth_secret: pulumi.Output[str]
    secret_id: pulumi.Output[str]
    submit_candidates: list[dict]
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
                config, self.prefix, plan, servers=servers, known_hosts=str(self.known_hosts)
            )
        )
        self.submit_candidates = [
            {
                "name": spec.key,
                "transport": "ssh",
                "host": by_name[spec.key].address,
                "port": by_name[spec.key].port,
                "user": by_name[spec.key].user,
                "private_key_file": by_name[spec.key].private_key_file,
                "known_hosts_file": str(self.known_hosts),
            }
            for spec in plan
            if "spark_worker" in spec.roles
        ]
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


if __name__ == "__main__":
    sys.exit(main())
