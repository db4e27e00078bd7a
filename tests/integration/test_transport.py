"""The node transports for real: `SshTransport` against an sshd in a container (the real
OpenSSH client, host keys checked against a known_hosts written from the server's key), and
`DockerTransport` against the same container."""

from __future__ import annotations

import io
import socket
import subprocess
import tarfile
import time
import uuid

import pytest

from infra.transport import DockerTransport, SshTransport, TransportError

pytestmark = pytest.mark.engine

IMAGE = "trainstack-test-sshd:transport"
BASE = "debian:bookworm"
DOCKERFILE = f"""\
FROM {BASE}
RUN apt-get update \\
 && apt-get install -y --no-install-recommends openssh-server sudo \\
 && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_* \\
 && mkdir -p /run/sshd \\
 && useradd -m -s /bin/bash deploy \\
 && useradd -m -s /bin/bash trainstack \\
 && echo 'deploy ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/deploy \\
 && chmod 0440 /etc/sudoers.d/deploy
# Host keys are made when the container starts: every container has its own.
CMD ["sh", "-c", "ssh-keygen -A \\
 && install -d -o deploy -g deploy -m 0700 /home/deploy/.ssh \\
 && printf '%s\\\\n' \\"$AUTHORIZED_KEY\\" > /home/deploy/.ssh/authorized_keys \\
 && chown deploy:deploy /home/deploy/.ssh/authorized_keys \\
 && chmod 0600 /home/deploy/.ssh/authorized_keys \\
 && exec /usr/sbin/sshd -D -e"]
"""


def _file(container, path: str) -> bytes:
    chunks, _ = container.get_archive(path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
        extracted = tar.extractfile(tar.getmembers()[0])
        assert extracted is not None
        return extracted.read()


@pytest.fixture(scope="module")
def sshd_image(engine):
    engine.images.get(BASE)  # present locally (`make setup`); never pulled nor removed here
    engine.images.build(
        fileobj=io.BytesIO(DOCKERFILE.encode()), tag=IMAGE, rm=True, forcerm=True, pull=False
    )
    yield IMAGE
    try:
        engine.images.remove(IMAGE, noprune=False)
    except Exception as exc:  # leave it for the next run rather than fail the tests
        print(f"could not remove {IMAGE}: {exc}")


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    path = tmp_path_factory.mktemp("ssh") / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "trainstack-test", "-f", str(path)],
        check=True,
    )
    return path


@pytest.fixture(scope="module")
def server(engine, sshd_image, key):
    """The container, its published port and its known_hosts line (from its own key)."""
    container = engine.containers.run(
        sshd_image,
        detach=True,
        name=f"tssshd-{uuid.uuid4().hex[:6]}",
        environment={"AUTHORIZED_KEY": key.with_suffix(".pub").read_text().strip()},
        ports={"22/tcp": ("127.0.0.1", None)},
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            container.reload()
            bound = (container.attrs["NetworkSettings"]["Ports"] or {}).get("22/tcp")
            ready = container.exec_run(
                ["sh", "-c", "pgrep -x sshd && test -s /etc/ssh/ssh_host_ed25519_key.pub"]
            )
            if bound and ready.exit_code == 0:
                break
            assert container.status == "running", container.logs().decode()[-2000:]
            assert time.monotonic() < deadline, container.logs().decode()[-2000:]
            time.sleep(0.3)
        port = int(bound[0]["HostPort"])
        host_key = _file(container, "/etc/ssh/ssh_host_ed25519_key.pub").decode().split()
        yield container, port, f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n"
    finally:
        container.remove(force=True)


@pytest.fixture
def node(server, key, tmp_path):
    _container, port, line = server
    known = tmp_path / "known_hosts"
    known.write_text(line)
    return SshTransport("wrk-1", "127.0.0.1", port, "deploy", str(key), str(known))


def test_run_as_the_login_user_and_as_another_with_env(node):
    assert node.unavailable() is None
    assert node.run(["id", "-un"]) == (0, b"deploy\n")
    code, out = node.run(
        ["sh", "-c", 'echo "$SPARK_CONF_DIR|$ODD|$HOME"; id -un'],
        user="trainstack",
        env={"SPARK_CONF_DIR": "/etc/trainstack/spark", "ODD": "a b'c $x"},
    )
    assert (code, out) == (0, b"/etc/trainstack/spark|a b'c $x|/home/trainstack\ntrainstack\n")
    words = ["a b", "it's", "$HOME", "`id`", "x;false", ""]
    assert node.run(["printf", "<%s>", *words]) == (0, b"<a b><it's><$HOME><`id`><x;false><>")
    assert node.run(["sh", "-c", "exit 7"]) == (7, b"")
    assert node.run(["cat"], stdin=b"in\x00put") == (0, b"in\x00put")


def test_stream_echoes_live_and_returns_stdout(node, capfd):
    code, stdout = node.stream(
        ["sh", "-c", 'echo out-1; echo err-1 >&2; echo "$A"; id -un; exit 3'],
        env={"A": "from-env"},
        user="trainstack",
    )
    assert code == 3
    assert stdout == "out-1\nfrom-env\ntrainstack\n"
    echoed = capfd.readouterr().err
    for line in ("out-1", "err-1", "from-env", "trainstack"):
        assert line in echoed


def test_put_and_fetch(node, server, tmp_path):
    container, _, _ = server
    data = bytes(range(256)) * 40
    node.run(["install", "-d", "-o", "trainstack", "-m", "0700", "/srv/run 1"], user="root")
    node.put("/srv/run 1/plot.png", data, mode=0o640, user="trainstack")
    stat = container.exec_run(["stat", "-c", "%U %a %s", "/srv/run 1/plot.png"]).output
    assert stat.decode().split() == ["trainstack", "640", str(len(data))]
    assert node.fetch("/srv/run 1/plot.png") == data  # read with sudo: the dir is 0700
    node.put("/srv/run 1/root.txt", b"r")
    stat = container.exec_run(["stat", "-c", "%U %a", "/srv/run 1/root.txt"]).output
    assert stat.decode().split() == ["root", "644"]
    with pytest.raises(TransportError, match=r"wrk-1: cannot read /srv/run 1/gone \(cat: "):
        node.fetch("/srv/run 1/gone")
    with pytest.raises(TransportError, match=r"wrk-1: cannot write /nowhere/f \(tee: "):
        node.put("/nowhere/f", b"x")
    big = tmp_path / "wheels.tar"  # put_file: ssh reads the file itself (3 MiB and 263 bytes)
    big.write_bytes(bytes(range(256)) * (3 * 4096 + 1) + b"7 bytes")
    node.put_file("/srv/run 1/wheels.tar", big, mode=0o640, user="trainstack")
    stat = container.exec_run(["stat", "-c", "%U %a", "/srv/run 1/wheels.tar"]).output
    assert stat.decode().split() == ["trainstack", "640"]
    assert node.fetch("/srv/run 1/wheels.tar") == big.read_bytes()
    with pytest.raises(TransportError, match=r"wrk-1: cannot write /nowhere/f \(tee: "):
        node.put_file("/nowhere/f", big)


def test_a_wrong_or_unknown_host_key_is_refused(server, key, tmp_path):
    _container, port, _line = server
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    wrong = tmp_path / "known_hosts_wrong"
    wrong.write_text(
        f"[127.0.0.1]:{port} " + " ".join(other.with_suffix(".pub").read_text().split()[:2]) + "\n"
    )
    node = SshTransport("wrk-1", "127.0.0.1", port, "deploy", str(key), str(wrong))
    said = node.unavailable()
    assert said is not None and "Host key verification failed" in said and "\n" not in said
    with pytest.raises(TransportError, match="Host key verification failed"):
        node.run(["true"])
    with pytest.raises(TransportError, match="Host key verification failed"):
        node.fetch("/etc/hostname")
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    said = SshTransport("wrk-1", "127.0.0.1", port, "deploy", str(key), str(empty)).unavailable()
    assert said is not None and "Host key verification failed" in said


def test_unreachable_port_is_one_line(key, tmp_path, server):
    _container, _port, line = server

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    known = tmp_path / "known_hosts"
    known.write_text(line)
    said = SshTransport("wrk-1", "127.0.0.1", free, "deploy", str(key), str(known)).unavailable()
    assert said is not None and "Connection refused" in said and "\n" not in said


def test_docker_transport_on_the_same_container(engine, server, capfd, tmp_path):
    container, _, _ = server
    node = DockerTransport(container.name, engine)
    assert node.unavailable() is None
    assert node.run(["id", "-un"]) == (0, b"root\n")
    assert node.run(["cat"], stdin=b"via docker\x00") == (0, b"via docker\x00")
    code, out = node.run(["sh", "-c", 'echo "$A"; id -un'], user="trainstack", env={"A": "1"})
    assert (code, out) == (0, b"1\ntrainstack\n")
    code, stdout = node.stream(
        ["sh", "-c", "echo o; echo e >&2; exit 2"], env={"A": "1"}, user="trainstack"
    )
    assert (code, stdout) == (2, "o\n")
    assert "e" in capfd.readouterr().err
    node.run(["install", "-d", "-o", "trainstack", "/srv/d"])
    node.put("/srv/d/f.bin", b"\x00\x01", mode=0o600, user="trainstack")
    stat = container.exec_run(["stat", "-c", "%U %a", "/srv/d/f.bin"]).output
    assert stat.decode().split() == ["trainstack", "600"]
    assert node.fetch("/srv/d/f.bin") == b"\x00\x01"
    big = tmp_path / "wheels.tar"  # put_file: a tar streamed in chunks (3 MiB and 263 bytes)
    big.write_bytes(bytes(range(256)) * (3 * 4096 + 1) + b"7 bytes")
    node.put_file("/srv/d/wheels.tar", big, mode=0o640, user="trainstack")
    stat = container.exec_run(["stat", "-c", "%U %a", "/srv/d/wheels.tar"]).output
    assert stat.decode().split() == ["trainstack", "640"]
    assert node.fetch("/srv/d/wheels.tar") == big.read_bytes()
    with pytest.raises(TransportError, match=f"{container.name}: cannot read /srv/d/gone"):
        node.fetch("/srv/d/gone")
    assert DockerTransport("tssshd-none", engine).unavailable().startswith("not on the engine")
