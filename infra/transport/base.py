"""The interface every node transport implements (`Transport`), and its error.

The implementations: `infra.transport.docker` and `infra.transport.ssh`; `infra.transport`
makes one from a node record.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

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


def open_local(node: str, path: str, local_path: str | Path) -> BinaryIO:
    """The local file `local_path` open for reading, to be written to `path` on `node`;
    TransportError naming both when it cannot be opened."""
    try:
        return open(local_path, "rb")  # the caller closes it
    except OSError as exc:
        raise TransportError(
            f"{node}: cannot write {path} (cannot read {local_path}: {exc.strerror})"
        ) from None


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

    def put_file(
        self, path: str, local_path: str | Path, mode: int = 0o644, user: str | None = None
    ) -> None:
        """Copy the local file `local_path` to `path` on the node, like `put`, without
        holding it in memory: for large files (a job's wheels). This default reads the file
        and calls `put`; the docker and ssh transports stream it from disk instead."""
        self.put(path, Path(local_path).read_bytes(), mode=mode, user=user)

    @abstractmethod
    def copy_command(self, path: str) -> str:
        """What a user types to copy `path` (a file or directory) from the node into the
        current directory of their machine."""

    @abstractmethod
    def unavailable(self) -> str | None:
        """Why the node cannot run commands right now, in one short line; None when it can.
        Raises TransportError when nothing can be reached at all (no Docker engine)."""
