"""The ssh target's facts probe: connect to a server, read its facts (OS, cores, memory,
free disk, python3, sudo) and check that it can run its roles; the host key it presented
is recorded on the way (first contact) or checked against the recorded ones."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.config.servers import Server
from infra.config.values import parse_size
from infra.targets.ssh.known_hosts import host_keys, own_known_hosts, write_known_hosts

if TYPE_CHECKING:
    from infra.transport import SshTransport

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
echo "gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c . || true)"
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
    gpus: int = 0  # the NVIDIA GPUs nvidia-smi lists (0 without it)

    def as_dict(self) -> dict[str, Any]:
        return {
            "os": self.os_name,
            "os_id": self.os_id,
            "os_version": self.os_version,
            "cores": self.cores,
            "memory_bytes": self.memory_bytes,
            "disk_free_bytes": self.disk_free_bytes,
        }


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
        gpus=number("gpus"),
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
    if server.gpus > facts.gpus:
        errors.append(
            f"declares gpus {server.gpus}, but nvidia-smi lists {facts.gpus} GPU(s) there "
            "(no NVIDIA driver, or fewer GPUs); install the driver or lower its gpus"
        )
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
