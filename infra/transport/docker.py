"""The docker transport: a container on the local Docker engine (the docker target), through
the docker SDK (`docker exec`, `get_archive`, `put_archive`)."""

from __future__ import annotations

import io
import os
import sys
import tarfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from infra.transport.base import Transport, TransportError, one_line, open_local

# Reads of one file before a torn archive (the file changed under the engine) is an error.
FETCH_ATTEMPTS = 4


class EngineClient:
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
        self._engine = engine if engine is not None else EngineClient(client)

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
        # The engine tars the file as it reads it, after a stat: a file replaced or growing
        # meanwhile (a job's record, a log) comes back as a torn archive, so read it again.
        torn = ""
        for attempt in range(FETCH_ATTEMPTS):
            if attempt:
                time.sleep(0.1 * attempt)
            archive = self._archive(path)
            try:
                with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                    member = tar.getmember(PurePosixPath(path).name)
                    extracted = tar.extractfile(member) if member.isfile() else None
                    if extracted is None:
                        raise TransportError(
                            f"{self.name}: cannot read {path} (not a regular file)"
                        )
                    return extracted.read()
            except (tarfile.TarError, KeyError) as exc:
                torn = one_line(str(exc), 160)
        raise TransportError(
            f"{self.name}: cannot read {path} (it changed while being read "
            f"{FETCH_ATTEMPTS} times: {torn})"
        )

    def _archive(self, path: str) -> bytes:
        container = self._container()
        try:
            chunks, _ = container.get_archive(path)
            return b"".join(chunks)
        except Exception as exc:
            raise TransportError(
                f"{self.name}: cannot read {path} ({one_line(str(exc), 160)})"
            ) from None

    def put(self, path: str, data: bytes, mode: int = 0o644, user: str | None = None) -> None:
        target = PurePosixPath(path)
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(target.name)
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        self._put_archive(path, archive.getvalue(), user)

    def put_file(
        self, path: str, local_path: str | Path, mode: int = 0o644, user: str | None = None
    ) -> None:
        # put_archive takes a stream: a one-member tar made as it is sent (the file read
        # in chunks, never whole), which the engine unpacks into the directory.
        with open_local(self.name, path, local_path) as source:
            self._put_archive(path, _tar_of_one_file(PurePosixPath(path).name, source, mode), user)

    def _put_archive(self, path: str, archive: bytes | Iterator[bytes], user: str | None) -> None:
        container = self._container()
        try:
            ok = container.put_archive(str(PurePosixPath(path).parent), archive)
        except TransportError:
            raise
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


STREAM_CHUNK = 1 << 20


def _tar_of_one_file(name: str, source: BinaryIO, mode: int) -> Iterator[bytes]:
    """A tar archive holding the open file `source` as `name`, in chunks read as they are
    sent."""
    size = os.fstat(source.fileno()).st_size
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, mode, int(time.time())
    yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    left = size
    while left > 0:
        chunk = source.read(min(STREAM_CHUNK, left))
        if not chunk:
            raise TransportError(f"{source.name} became shorter while it was sent")
        left -= len(chunk)
        yield chunk
    yield b"\0" * (-size % tarfile.BLOCKSIZE) + b"\0" * (2 * tarfile.BLOCKSIZE)
