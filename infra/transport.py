"""How the control machine reaches a node: run a command, stream one, read or write a file.

One interface, two transports:

* `DockerTransport`: a container on the local Docker engine (the docker target), through
  the docker SDK (`docker exec`, `get_archive`, `put_archive`).
* `SshTransport`: an existing server (the ssh target), through the OpenSSH client. Host
  keys are checked against the known_hosts file the target wrote (`StrictHostKeyChecking=yes`,
  never `no`); there is no password prompt (`BatchMode=yes`); other users are reached with
  `sudo -n` (the login user has passwordless sudo).

`transport_for` makes one from a node record as the Pulumi program passes it to a provider:
``{"name": "worker-1", "transport": "docker", "container": "ts-dev-worker-1"}`` or
``{"name": "wrk-1", "transport": "ssh", "host": "10.0.0.5", "port": 22, "user": "deploy",
"private_key_file": "/path/key", "known_hosts_file": "/path/known_hosts"}``. A bare string
is a container name (the state of stacks made before node records holds those).
"""

from __future__ import annotations

import codecs
import io
import shlex
import subprocess
import sys
import tarfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import IO, Any

from infra.errors import UserFacingError


class TransportError(UserFacingError):
    """A node could not be reached, or a file on it could not be read or written; the message
    names the node. `reason`: what the client said, in one line."""

    reason: str = ""


def one_line(text: str, limit: int = 160) -> str:
    """The last non-empty line of an error text (where ssh and sudo put the reason), cut."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


class Transport(ABC):
    """One node, as the control machine reaches it."""

    #: The node's name in messages (the container's name for the docker transport).
    name: str
    #: What to do when no node of this kind can run the job (ends "... and run `pulumi up`
    #: again").
    remedy: str = "bring one back"

    @abstractmethod
    def run(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> tuple[int, bytes]:
        """Run `argv` on the node (as `user`; None: the transport's default, root for
        docker, the login user for ssh) and wait. Returns the exit code and the command's
        output (stdout, with stderr as the command interleaved it). Raises TransportError
        when the command could not be started at all."""

    @abstractmethod
    def stream(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> tuple[int, str]:
        """Run `argv`, echoing its stdout and stderr live to our stderr. Returns the exit
        code and the stdout text."""

    @abstractmethod
    def fetch(self, path: str) -> bytes:
        """The content of one file on the node; TransportError naming node and path when it
        cannot be read (missing)."""

    @abstractmethod
    def put(self, path: str, data: bytes, mode: int = 0o644, user: str | None = None) -> None:
        """Write `data` to `path` on the node, with `mode`, owned by `user` (None: root).
        The directory must exist."""

    @abstractmethod
    def copy_command(self, path: str) -> str:
        """What a user types to copy `path` (a file or directory) from the node into the
        current directory of their machine."""

    @abstractmethod
    def unavailable(self) -> str | None:
        """Why the node cannot run commands right now, in one short line; None when it can.
        Raises TransportError when nothing can be reached at all (no Docker engine)."""


# --- docker -----------------------------------------------------------------------------


class _Engine:
    """A client to the local Docker engine, connected on first use; the docker transports
    made by one `transports_for` share it."""

    def __init__(self, client: Any = None) -> None:
        self._client = client

    def client(self) -> Any:
        if self._client is None:
            from infra import engine

            try:
                self._client = engine.docker_client()
            except engine.EngineError as exc:
                raise TransportError(str(exc)) from None
        return self._client


class DockerTransport(Transport):
    """A container on the local Docker engine."""

    remedy = "start one (`docker start <name>`)"

    def __init__(self, container_name: str, client: Any = None, *, engine: Any = None) -> None:
        self.name = container_name
        self._engine = engine if engine is not None else _Engine(client)

    def __repr__(self) -> str:
        return f"DockerTransport({self.name!r})"

    def _container(self) -> Any:
        client = self._engine.client()
        try:
            return client.containers.get(self.name)
        except Exception as exc:
            raise TransportError(
                f"{self.name}: not on the engine ({one_line(str(exc), 120)})"
            ) from None

    def unavailable(self) -> str | None:
        client = self._engine.client()
        try:
            container = client.containers.get(self.name)
        except Exception as exc:
            return f"not on the engine ({str(exc).splitlines()[0][:120]})"
        if container.status != "running":
            return str(container.status)
        return None

    def run(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> tuple[int, bytes]:
        container = self._container()
        try:
            if stdin is not None:
                return self._run_with_stdin(container, argv, user, env, stdin)
            # Only the options given: `docker exec`'s defaults otherwise (root, no env).
            options: dict[str, Any] = {}
            if user is not None:
                options["user"] = user
            if env:
                options["environment"] = dict(env)
            code, out = container.exec_run(argv, **options)
        except TransportError:
            raise
        except Exception as exc:
            raise TransportError(
                f"{self.name}: cannot run a command ({one_line(str(exc), 120)})"
            ) from None
        return int(code if code is not None else -1), out or b""

    @staticmethod
    def _run_with_stdin(
        container: Any,
        argv: list[str],
        user: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes,
    ) -> tuple[int, bytes]:
        """`docker exec -i`: the input on the exec's socket, closed for writing after it."""
        import socket as socket_module

        from docker.utils.socket import frames_iter

        api = container.client.api
        exec_id = api.exec_create(
            container.id,
            argv,
            stdin=True,
            user=user or "",
            environment=dict(env) if env else None,
        )["Id"]
        sock = api.exec_start(exec_id, socket=True)
        raw = getattr(sock, "_sock", sock)  # the SocketIO docker-py hands back wraps it
        try:
            raw.sendall(stdin)
            raw.shutdown(socket_module.SHUT_WR)
            out = b"".join(data for _, data in frames_iter(sock, tty=False))
        finally:
            sock.close()
        return int(api.exec_inspect(exec_id)["ExitCode"]), out or b""

    def stream(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> tuple[int, str]:
        container = self._container()
        api = container.client.api
        exec_id = api.exec_create(
            container.id, argv, environment=dict(env) if env else None, user=user or ""
        )["Id"]
        stdout = io.StringIO()
        for out, err in api.exec_start(exec_id, stream=True, demux=True):
            if err:
                sys.stderr.write(err.decode(errors="replace"))
                sys.stderr.flush()
            if out:
                text = out.decode(errors="replace")
                stdout.write(text)
                sys.stderr.write(text)
                sys.stderr.flush()
        return int(api.exec_inspect(exec_id)["ExitCode"]), stdout.getvalue()

    def fetch(self, path: str) -> bytes:
        container = self._container()
        try:
            chunks, _ = container.get_archive(path)
            archive = b"".join(chunks)
        except Exception as exc:
            raise TransportError(
                f"{self.name}: cannot read {path} ({one_line(str(exc), 160)})"
            ) from None
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            member = tar.getmember(PurePosixPath(path).name)
            extracted = tar.extractfile(member) if member.isfile() else None
            if extracted is None:
                raise TransportError(f"{self.name}: cannot read {path} (not a regular file)")
            return extracted.read()

    def put(self, path: str, data: bytes, mode: int = 0o644, user: str | None = None) -> None:
        container = self._container()
        target = PurePosixPath(path)
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(target.name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        try:
            ok = container.put_archive(str(target.parent), archive.getvalue())
        except Exception as exc:
            raise TransportError(
                f"{self.name}: cannot write {path} ({one_line(str(exc), 160)})"
            ) from None
        if not ok:
            raise TransportError(f"{self.name}: cannot write {path}")
        if user is not None:
            code, out = self.run(["chown", user, path])
            if code != 0:
                raise TransportError(
                    f"{self.name}: cannot give {path} to {user} ({one_line(out.decode())})"
                )

    def copy_command(self, path: str) -> str:
        return f"docker cp {self.name}:{path} ."


# --- ssh --------------------------------------------------------------------------------

SSH_CONNECT_TIMEOUT_S = 10
SSH_EXIT_CONNECTION = 255  # what ssh exits with when it failed itself (connection, host key)


class SshTransport(Transport):
    """An existing server, through the OpenSSH client (`ssh`), host keys checked."""

    remedy = "make one reachable (`ssh` with the key and without a password, and `sudo -n` there)"

    def __init__(
        self,
        name: str,
        host: str,
        port: int = 22,
        user: str = "root",
        private_key_file: str | None = None,
        known_hosts_file: str | None = None,
        *,
        ssh: str = "ssh",
        first_contact: bool = False,
    ) -> None:
        """`first_contact`: a server not in known_hosts yet is accepted and its key recorded
        there (`accept-new`, the ssh target's facts on `up`); a changed key is refused."""
        self.name = name
        self.first_contact = first_contact
        self.host = host
        self.port = int(port)
        self.user = user
        self.private_key_file = (
            str(Path(private_key_file).expanduser()) if private_key_file else None
        )
        self.known_hosts_file = known_hosts_file or None
        self._ssh = ssh

    def __repr__(self) -> str:
        return f"SshTransport({self.name!r}, {self.user}@{self.host}:{self.port})"

    # Command building (pure; the unit tests check it).

    def ssh_options(self) -> list[str]:
        """The client's options: no prompt, host keys checked against our known_hosts."""
        options = ["-p", str(self.port)]
        if self.private_key_file:
            options += ["-i", self.private_key_file, "-o", "IdentitiesOnly=yes"]
        checking = "accept-new" if self.first_contact else "yes"
        options += ["-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={checking}"]
        if self.known_hosts_file:
            # Recorded keys stay readable (and comparable) in known_hosts and the state.
            options += ["-o", f"UserKnownHostsFile={self.known_hosts_file}"]
            options += ["-o", "HashKnownHosts=no"]
        options += [
            "-o",
            f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}",
            "-o",
            "ServerAliveInterval=15",
        ]
        return options

    @staticmethod
    def remote_command(
        argv: Sequence[str], *, user: str | None = None, env: Mapping[str, str] | None = None
    ) -> str:
        """One shell command line for the remote login shell: `argv` quoted, as `user` with
        `sudo -n -H -u USER` (None: the login user), with `env K=V` when there is an env."""
        words: list[str] = []
        if user is not None:
            words += ["sudo", "-n", "-H", "-u", user]
        if env:
            words += ["env", *(f"{k}={v}" for k, v in env.items())]
        words += list(argv)
        return shlex.join(words)

    def ssh_argv(self, remote: str) -> list[str]:
        """The local command that runs the shell command line `remote` on the node."""
        return [self._ssh, *self.ssh_options(), f"{self.user}@{self.host}", "--", remote]

    # Running.

    def _call(
        self, remote: str, stdin: bytes | None = None, *, merge: bool = False
    ) -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run(
                self.ssh_argv(remote),
                input=stdin if stdin is not None else None,
                stdin=subprocess.DEVNULL if stdin is None else None,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                check=False,
            )
        except OSError as exc:
            raise TransportError(
                f"{self.name}: cannot start the OpenSSH client `{self._ssh}` ({exc})"
            ) from None

    def _connection_failed(self, proc: subprocess.CompletedProcess[bytes], what: str) -> None:
        if proc.returncode == SSH_EXIT_CONNECTION:
            said = (proc.stderr if proc.stderr is not None else proc.stdout) or b""
            reason = one_line(said.decode(errors="replace")) or "exit 255"
            error = TransportError(
                f"{self.name}: {what}: ssh {self.user}@{self.host} port {self.port} failed "
                f"({reason})"
            )
            error.reason = reason
            raise error

    def unavailable(self) -> str | None:
        try:
            proc = self._call(self.remote_command(["sudo", "-n", "true"]))
        except TransportError as exc:
            return str(exc).split(": ", 1)[-1]
        said = one_line((proc.stderr or b"").decode(errors="replace"))
        if proc.returncode == SSH_EXIT_CONNECTION:
            return f"ssh {self.user}@{self.host} port {self.port}: {said or 'exit 255'}"
        if proc.returncode != 0:
            return f"`sudo -n` does not work for {self.user} ({said or f'exit {proc.returncode}'})"
        return None

    def run(
        self,
        argv: list[str],
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
    ) -> tuple[int, bytes]:
        proc = self._call(self.remote_command(argv, user=user, env=env), stdin, merge=True)
        self._connection_failed(proc, f"cannot run `{shlex.join(argv)[:80]}`")
        return proc.returncode, proc.stdout or b""

    def stream(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
    ) -> tuple[int, str]:
        try:
            proc = subprocess.Popen(
                self.ssh_argv(self.remote_command(argv, user=user, env=env)),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise TransportError(
                f"{self.name}: cannot start the OpenSSH client `{self._ssh}` ({exc})"
            ) from None
        assert proc.stdout is not None and proc.stderr is not None
        stdout = io.StringIO()
        echo_err = threading.Thread(
            target=_pump, args=(proc.stderr, None), name=f"ssh-stderr-{self.name}", daemon=True
        )
        echo_err.start()
        try:
            _pump(proc.stdout, stdout)
            code = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            echo_err.join(timeout=5)
        return code, stdout.getvalue()

    def fetch(self, path: str) -> bytes:
        proc = self._call(self.remote_command(["sudo", "-n", "cat", "--", path]))
        self._connection_failed(proc, f"cannot read {path}")
        if proc.returncode != 0:
            said = one_line((proc.stderr or b"").decode(errors="replace"))
            raise TransportError(
                f"{self.name}: cannot read {path} ({said or f'exit {proc.returncode}'})"
            )
        return proc.stdout or b""

    def put(self, path: str, data: bytes, mode: int = 0o644, user: str | None = None) -> None:
        as_user = ["-u", user] if user is not None else []
        remote = (
            shlex.join(["sudo", "-n", *as_user, "tee", "--", path])
            + " >/dev/null && "
            + shlex.join(["sudo", "-n", *as_user, "chmod", f"{mode:04o}", "--", path])
        )
        proc = self._call(remote, data)
        self._connection_failed(proc, f"cannot write {path}")
        if proc.returncode != 0:
            said = one_line((proc.stderr or b"").decode(errors="replace"))
            raise TransportError(
                f"{self.name}: cannot write {path} ({said or f'exit {proc.returncode}'})"
            )

    def copy_command(self, path: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        words = ["scp", "-r", "-P", str(self.port)]
        if self.private_key_file:
            words += ["-i", self.private_key_file]
        return shlex.join([*words, f"{self.user}@{host}:{path}", "."])


def _pump(source: IO[bytes], capture: io.StringIO | None) -> None:
    """Echo what `source` gives to our stderr as it comes (and into `capture`)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    read = getattr(source, "read1", source.read)
    while True:
        chunk = read(65536)
        text = decoder.decode(chunk or b"", final=not chunk)
        if text:
            if capture is not None:
                capture.write(text)
            sys.stderr.write(text)
            sys.stderr.flush()
        if not chunk:
            return


# --- node records -----------------------------------------------------------------------


def _require(node: Mapping[str, Any], key: str) -> Any:
    value = node.get(key)
    if value in (None, ""):
        raise TransportError(f"node record {dict(node)!r}: `{key}` is missing")
    return value


def transport_for(node: Mapping[str, Any] | str, *, engine: Any = None) -> Transport:
    """The transport of one node record (a bare string: a container name)."""
    if isinstance(node, str):
        return DockerTransport(node, engine=engine)
    kind = node.get("transport") or "docker"
    if kind == "docker":
        return DockerTransport(str(_require(node, "container")), engine=engine)
    if kind == "ssh":
        return SshTransport(
            name=str(node.get("name") or _require(node, "host")),
            host=str(_require(node, "host")),
            # Numbers come back from Pulumi's engine as floats.
            port=int(node.get("port") or 22),
            user=str(_require(node, "user")),
            private_key_file=node.get("private_key_file") or None,
            known_hosts_file=node.get("known_hosts_file") or None,
        )
    raise TransportError(f"node record {dict(node)!r}: unknown transport {kind!r} (docker or ssh)")


def transports_for(nodes: Sequence[Mapping[str, Any] | str]) -> list[Transport]:
    """The transports of a list of node records; the docker ones share one engine client."""
    engine = _Engine()
    return [transport_for(node, engine=engine) for node in nodes]
