"""The ssh transport: an existing server (the ssh target), through the OpenSSH client.

Host keys are checked against the known_hosts file the target wrote
(`StrictHostKeyChecking=yes`, never `no`); there is no password prompt (`BatchMode=yes`);
other users are reached with `sudo -n` (the login user has passwordless sudo).
"""

from __future__ import annotations

import codecs
import io
import shlex
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from infra.transport.base import Transport, TransportError, one_line, open_local

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
        self,
        remote: str,
        stdin: bytes | None = None,
        *,
        merge: bool = False,
        stdin_file: IO[bytes] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run `remote` through ssh; its input: `stdin` (bytes), or `stdin_file` (an open
        file, which ssh reads itself: nothing of it passes through this process), or none."""
        if stdin_file is not None:
            feed: IO[bytes] | int | None = stdin_file
        else:
            feed = subprocess.DEVNULL if stdin is None else None
        try:
            return subprocess.run(
                self.ssh_argv(remote),
                input=stdin if stdin is not None else None,
                stdin=feed,
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

    @staticmethod
    def put_command(path: str, mode: int = 0o644, user: str | None = None) -> str:
        """The remote command line that writes its input to `path` (as `user` through sudo,
        else root) and sets its mode."""
        as_user = ["-u", user] if user is not None else []
        return (
            shlex.join(["sudo", "-n", *as_user, "tee", "--", path])
            + " >/dev/null && "
            + shlex.join(["sudo", "-n", *as_user, "chmod", f"{mode:04o}", "--", path])
        )

    def put(self, path: str, data: bytes, mode: int = 0o644, user: str | None = None) -> None:
        self._wrote(path, self._call(self.put_command(path, mode, user), data))

    def put_file(
        self, path: str, local_path: str | Path, mode: int = 0o644, user: str | None = None
    ) -> None:
        # The same command as `put`, its input the file itself (ssh streams it from disk).
        with open_local(self.name, path, local_path) as source:
            self._wrote(path, self._call(self.put_command(path, mode, user), stdin_file=source))

    def _wrote(self, path: str, proc: subprocess.CompletedProcess[bytes]) -> None:
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
