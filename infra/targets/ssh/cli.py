"""What each server's `command.local.Command` runs: `python -m infra.targets.ssh
facts|teardown` (infra/targets/ssh/__main__.py), with the server in the environment.

`facts` (the command's create) probes the server and prints its facts as JSON; `teardown`
(its delete) runs playbooks/teardown.yml on it, unless the running `up` still lists it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from infra.config.servers import Server, parse_servers
from infra.targets.ssh.facts import SshTargetError, describe, probe, server_transport
from infra.targets.ssh.known_hosts import own_known_hosts

SERVER_ENV = "TRAINSTACK_SERVER"  # the server record (JSON, the config key's spelling)
KNOWN_HOSTS_ENV = "TRAINSTACK_KNOWN_HOSTS"
MIN_MEMORY_ENV = "TRAINSTACK_MIN_MEMORY"  # bytes the server's role needs
CURRENT_ENV = "TRAINSTACK_CURRENT_SERVERS"  # file: the servers of the running `up`
ARTIFACTS_ENV = "TRAINSTACK_TEARDOWN_ARTIFACTS"


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
