"""The ssh target's host keys: how a server is named in known_hosts, the keys recorded for
it, and the known_hosts files trainstack writes (the stack's, and each server's own copy
that its teardown uses after `up` dropped it from the stack's)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from infra.config.servers import Server


def known_hosts_entry(server: Server) -> str:
    """How OpenSSH names the server in known_hosts."""
    return server.address if server.port == 22 else f"[{server.address}]:{server.port}"


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
