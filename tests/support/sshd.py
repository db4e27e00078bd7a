"""Servers for the ssh target's tests and benchmark: containers that run Debian's sshd.

Each container is a plain Debian 12 machine as far as trainstack can tell: Debian's
`openssh-server` (installed by apt when the image is built), a non-root user `deploy` with
passwordless sudo, host keys made when the container starts, a key pair made per test. The
only thing the containers share is a volume mounted at /srv/trainstack: it stands in for
the shared file system (NFS) the operator of real servers mounts there (docs/targets.md).

Two kinds of server: a bare one (Debian with sshd, nothing of trainstack: provisioning does
the full install over SSH), and one from this tree's node image with the same sshd, login user
and sudo added (`node_image=` on `start`): every install task finds its work done and reports
`ok`, as on an operator's server that an earlier `up` installed. The second kind costs one
apt install per run instead of a full install per server; its image (a layer over the node
image) is removed with the servers, so that `make clean-images` can remove that node image
once it is stale.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import docker

from infra.nodes import SHARED_ROOT

BASE_IMAGE = "debian:bookworm"
LOGIN_USER = "deploy"
SHARED_MOUNT = SHARED_ROOT
LABEL = "org.trainstack.test-sshd"
_HOME = f"/home/{LOGIN_USER}"
START = " && ".join(
    [
        "ssh-keygen -A >/dev/null",
        f"install -d -m 0700 -o {LOGIN_USER} -g {LOGIN_USER} {_HOME}/.ssh",
        f"printf '%s\\\\n' \\\"$AUTHORIZED_KEY\\\" > {_HOME}/.ssh/authorized_keys",
        f"chown {LOGIN_USER}: {_HOME}/.ssh/authorized_keys",
        f"chmod 0600 {_HOME}/.ssh/authorized_keys",
        "exec /usr/sbin/sshd -D -e",
    ]
)
# {base}: Debian, or the node image; {lists}: whether apt's lists go (the node image keeps
# them, as its roles' package tasks expect a fresh index).
DOCKERFILE_TEMPLATE = """\
FROM {base}
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      openssh-server sudo python3 \\
 && {lists}rm -rf /etc/ssh/ssh_host_* \\
 && mkdir -p /run/sshd \\
 && useradd --create-home --shell /bin/bash {user} \\
 && echo '{user} ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/{user} \\
 && chmod 0440 /etc/sudoers.d/{user} \\
 && printf 'PasswordAuthentication no\\nPermitRootLogin no\\n' \\
      > /etc/ssh/sshd_config.d/trainstack-test.conf
# Host keys are made per container; the authorized key comes from the test.
ENTRYPOINT []
CMD ["sh", "-c", "{start}"]
"""
DOCKERFILE = DOCKERFILE_TEMPLATE.format(
    base=BASE_IMAGE, lists="rm -rf /var/lib/apt/lists/* && ", user=LOGIN_USER, start=START
)
IMAGE_TAG = "trainstack-test-sshd:" + hashlib.sha256(DOCKERFILE.encode()).hexdigest()[:12]
# The label value of a server image built on the node image (removed with its servers, and by
# `python -m tests.support.leftovers` after a killed run).
NODE_IMAGE_LABEL = "node-image"


def _build(client: docker.DockerClient, dockerfile: str, tag: str, kind: str) -> str:
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    client.images.build(
        fileobj=io.BytesIO(dockerfile.encode()),
        tag=tag,
        rm=True,
        forcerm=True,
        labels={LABEL: kind},
    )
    return tag


def build_image(client: docker.DockerClient, node_image: str = "") -> str:
    """The sshd image on Debian, or on `node_image` (built once per Dockerfile digest; apt
    reaches Debian's mirror)."""
    if not node_image:
        return _build(client, DOCKERFILE, IMAGE_TAG, "image")
    dockerfile = DOCKERFILE_TEMPLATE.format(base=node_image, lists="", user=LOGIN_USER, start=START)
    digest = hashlib.sha256(dockerfile.encode()).hexdigest()[:12]
    return _build(client, dockerfile, f"trainstack-test-sshd-node:{digest}", NODE_IMAGE_LABEL)


def remove_node_images(client: docker.DockerClient) -> list[str]:
    """Remove every sshd image built on a node image; returns their tags."""
    removed = []
    for image in client.images.list(filters={"label": f"{LABEL}={NODE_IMAGE_LABEL}"}):
        for tag in image.tags:
            client.images.remove(tag, force=True)
            removed.append(tag)
    return removed


def make_key(directory: Path) -> Path:
    """A fresh ed25519 key pair; returns the private key file (mode 0600)."""
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "trainstack-test", "-f", str(key)],
        check=True,
    )
    key.chmod(0o600)
    return key


@dataclass
class SshServers:
    """A set of sshd containers on one network, sharing one volume at /srv/trainstack."""

    prefix: str
    key_file: Path
    client: docker.DockerClient

    def __post_init__(self) -> None:
        self.network = f"{self.prefix}-sshnet"
        self.volume = f"{self.prefix}-shared"
        self.names: list[str] = []

    def start(
        self, names: list[str], *, memory: str = "3g", node_image: str = ""
    ) -> dict[str, str]:
        """Start (or find) one container per name, bare Debian or from `node_image` (a node
        image's tag); returns name -> IP address."""
        image = build_image(self.client, node_image)
        labels = {LABEL: self.prefix}
        if not self.client.networks.list(names=[self.network]):
            self.client.networks.create(self.network, driver="bridge", labels=labels)
        if not self.client.volumes.list(filters={"name": self.volume}):
            self.client.volumes.create(self.volume, labels=labels)
        public_key = Path(f"{self.key_file}.pub").read_text().strip()
        for name in names:
            container_name = f"{self.prefix}-{name}"
            try:
                self.client.containers.get(container_name)
            except docker.errors.NotFound:
                self.client.containers.run(
                    image,
                    name=container_name,
                    hostname=name,
                    detach=True,
                    environment={"AUTHORIZED_KEY": public_key},
                    network=self.network,
                    volumes={self.volume: {"bind": SHARED_MOUNT, "mode": "rw"}},
                    mem_limit=memory,
                    labels=labels,
                )
            if name not in self.names:
                self.names.append(name)
        return {name: self.address(name) for name in names}

    def address(self, name: str) -> str:
        container = self.client.containers.get(f"{self.prefix}-{name}")
        for _ in range(50):
            container.reload()
            ip = container.attrs["NetworkSettings"]["Networks"][self.network]["IPAddress"]
            if ip:
                return str(ip)
            time.sleep(0.1)
        raise RuntimeError(f"{container.name} has no address on {self.network}")

    def wait_ready(self, names: list[str], timeout_s: float = 60) -> None:
        """Until sshd on each server answers (a banner on port 22)."""
        import socket

        deadline = time.monotonic() + timeout_s
        for name in names:
            address = self.address(name)
            while True:
                try:
                    with socket.create_connection((address, 22), timeout=2) as sock:
                        if sock.recv(64).startswith(b"SSH-"):
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd on {name} ({address}) did not answer")
                time.sleep(0.3)

    def host_key_line(self, name: str) -> str:
        """The server's ed25519 host key as a known_hosts line (read through the engine)."""
        container = self.client.containers.get(f"{self.prefix}-{name}")
        code, out = container.exec_run(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"])
        if code != 0:
            raise RuntimeError(f"{name}: no host key yet")
        kind, key = out.decode().split()[:2]
        return f"{self.address(name)} {kind} {key}"

    def server_records(self, roles: dict[str, list[str]]) -> list[dict]:
        """The `trainstack:servers` list for these containers (name -> roles, in order)."""
        return [
            {
                "name": name,
                "address": self.address(name),
                "user": LOGIN_USER,
                "privateKeyFile": str(self.key_file),
                "roles": list(node_roles),
            }
            for name, node_roles in roles.items()
        ]

    def remove(self) -> None:
        """Remove every container, the network and the shared volume of this set."""
        for container in self.client.containers.list(
            all=True, filters={"label": f"{LABEL}={self.prefix}"}
        ):
            container.remove(force=True, v=True)
        for network in self.client.networks.list(filters={"label": f"{LABEL}={self.prefix}"}):
            network.remove()
        for volume in self.client.volumes.list(filters={"label": f"{LABEL}={self.prefix}"}):
            volume.remove(force=True)
        remove_node_images(self.client)
