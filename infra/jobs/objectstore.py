"""`trainstack data put|ls`: the stack's object store (S3-compatible), from this machine.

The store is reached with pyarrow's S3FileSystem at the stack's `objectStoreUrl` output (the
port it publishes on this host) with its `objectStoreAccessKey` and `objectStoreSecretKey`
outputs; the secret is a Pulumi secret, read with `--show-secrets` when a command needs it
and never printed or kept (the outputs' cache holds `"[secret]"`). The cluster reads the same
data as `s3a://bucket/prefix` (docs/jobs.md, Data on the object store).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from trainstack_training.data.sources import (
    DENIED,
    NO_BUCKET,
    NOT_FOUND,
    UNKNOWN_HOST,
    UNREACHABLE,
    s3_problem,
)

from infra.config.values import PROJECT_DIR
from infra.jobs.commands import EXIT_INPUT, EXIT_UNREACHABLE, CliError, _pulumi_env, stack_outputs

if TYPE_CHECKING:
    from pyarrow import fs as pafs

DEFAULT_BUCKET = "trainstack"  # the stack's bucket when its outputs name none
DEFAULT_URL = f"s3://{DEFAULT_BUCKET}/"
CHUNK_BYTES = 8 * 1024**2  # read and written a chunk at a time: memory stays bounded
PROGRESS_SECONDS = 5.0  # a progress line this often when stderr is not a terminal
_CLEAR = "\033[K"  # a terminal's "erase to the end of the line": no shorter line's leftovers
SECRET = "[secret]"  # a secret output, as `pulumi stack output --json` prints it
URL_OUTPUT, ACCESS_OUTPUT, SECRET_OUTPUT, BUCKET_OUTPUT = (
    "objectStoreUrl", "objectStoreAccessKey", "objectStoreSecretKey", "objectStoreBucket",
)  # fmt: skip


@dataclass(frozen=True)
class StoreAccess:
    """Where the stack's object store answers on this machine, and its keys."""

    url: str  # e.g. http://127.0.0.1:19110
    access_key: str
    secret_key: str = field(repr=False)


def store_access(outputs: Mapping[str, Any], reveal: Callable[[str], str]) -> StoreAccess:
    """The object store of a stack's outputs; `reveal(name)` reads a secret output's value
    (`pulumi stack output --show-secrets`), asked only for outputs the cache shows as
    `"[secret]"`. CliError when the stack has no object store."""
    url = str(outputs.get(URL_OUTPUT) or "")
    if not url:
        raise CliError(
            "this stack has no object store (trainstack:objectStore is off): turn it on and "
            "run `pulumi up`",
            EXIT_INPUT,
        )
    keys = []
    for name in (ACCESS_OUTPUT, SECRET_OUTPUT):
        value = outputs.get(name)
        value = reveal(name) if value == SECRET else str(value or "")
        if not value:
            raise CliError(
                f"the stack's {name} output is missing: run `pulumi up` with this version",
                EXIT_UNREACHABLE,
            )
        keys.append(value)
    return StoreAccess(url.rstrip("/"), keys[0], keys[1])


def filesystem_options(access: StoreAccess) -> dict[str, Any]:
    """pyarrow.fs.S3FileSystem's keyword arguments for the store: its URL's scheme and
    host:port, path-style addressing (the bucket in the path, as the nodes' S3A reads it)."""
    parsed = urllib.parse.urlparse(access.url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise CliError(
            f"the stack's {URL_OUTPUT} output {access.url!r} is not an http(s) URL",
            EXIT_UNREACHABLE,
        )
    return {
        "endpoint_override": parsed.netloc,
        "scheme": parsed.scheme,
        "access_key": access.access_key,
        "secret_key": access.secret_key,
        "region": "us-east-1",  # S3's default; the store ignores it
        "force_virtual_addressing": False,
        "allow_bucket_creation": True,  # `put` to a new bucket makes it
        "connect_timeout": 5.0,
    }


def open_store(access: StoreAccess) -> pafs.S3FileSystem:
    from pyarrow import fs as pafs

    return pafs.S3FileSystem(**filesystem_options(access))


def secret_output(stack: str | None, name: str) -> str:
    """One output's value, secrets shown (`pulumi stack output NAME --show-secrets`): read
    when needed, never cached or printed."""
    cmd = ["pulumi", "stack", "output", name, "--show-secrets", "--non-interactive"]
    if stack:
        cmd += ["--stack", stack]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=_pulumi_env(), cwd=PROJECT_DIR, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CliError(f"cannot run `pulumi`: {exc}", EXIT_UNREACHABLE) from None
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().splitlines()
        raise CliError(
            f"cannot read the stack's {name} output ({said[-1] if said else 'pulumi failed'})",
            EXIT_UNREACHABLE,
        )
    return proc.stdout.strip()


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, key) of `s3://bucket/key` or `s3a://bucket/key`; the key has no leading
    slash and keeps a trailing one. ("", "") for `s3://` (every bucket)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("s3", "s3a"):
        raise CliError(
            f"{url!r}: give an object store URL, s3://BUCKET/PREFIX (or s3a://)", EXIT_INPUT
        )
    bucket, _, key = rest.partition("/")
    if not bucket and key:
        raise CliError(f"{url!r}: the bucket is missing (s3://BUCKET/PREFIX)", EXIT_INPUT)
    return bucket, key


def store_error(url: str, exc: Exception, access: StoreAccess) -> CliError:
    """A store failure as one sentence naming the URL and the fix."""
    text = str(exc)
    problem = s3_problem(text)
    if problem in (NO_BUCKET, NOT_FOUND):
        return not_there(url, no_bucket=problem == NO_BUCKET)
    if problem == DENIED:
        return CliError(
            f"the object store at {access.url} refused the stack's keys (access denied): the "
            f"{ACCESS_OUTPUT}/{SECRET_OUTPUT} outputs do not match the store; run `pulumi up`",
            EXIT_UNREACHABLE,
        )
    if problem in (UNREACHABLE, UNKNOWN_HOST):
        cause = "its host does not resolve" if problem == UNKNOWN_HOST else "connection refused"
        return CliError(
            f"the object store at {access.url} is unreachable ({cause}): is the stack up "
            "(`pulumi up`)?",
            EXIT_UNREACHABLE,
        )
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return CliError(f"{url}: {first}", EXIT_UNREACHABLE)


def not_there(url: str, no_bucket: bool) -> CliError:
    """Nothing at `url`: its bucket is missing (`no_bucket`), or nothing is under its key."""
    bucket = parse_url(url)[0]
    if no_bucket:
        return CliError(
            f"{url}: the object store has no bucket {bucket!r} (`trainstack data ls s3://` "
            "lists the buckets)",
            EXIT_INPUT,
        )
    return CliError(
        f"{url}: nothing is stored there (`trainstack data ls s3://{bucket}/` lists the bucket)",
        EXIT_INPUT,
    )


class Progress:
    """A progress line on stderr (bytes done / total, MB/s): redrawn in place on a terminal,
    else a line every PROGRESS_SECONDS and one at the end."""

    def __init__(
        self,
        total: int,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.done = total, 0
        self.stream = stream or sys.stderr
        self.clock = clock
        self.start = self.last = clock()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def line(self) -> str:
        seconds = max(self.clock() - self.start, 1e-9)
        mb = 1024**2
        share = 100 * self.done // self.total if self.total else 100
        return (
            f"{self.done / mb:.1f}/{self.total / mb:.1f} MB ({share}%), "
            f"{self.done / mb / seconds:.1f} MB/s"
        )

    def add(self, count: int) -> None:
        self.done += count
        now = self.clock()
        if self.tty:
            print(f"\r{self.line()}{_CLEAR}", end="", file=self.stream, flush=True)
        elif now - self.last >= PROGRESS_SECONDS:
            print(self.line(), file=self.stream, flush=True)
            self.last = now

    def finish(self) -> None:
        line = f"\r{self.line()}{_CLEAR}" if self.tty else self.line()
        print(line, file=self.stream, flush=True)


def upload_plan(src: Path, dest: str) -> list[tuple[Path, str]]:
    """(local file, `bucket/key`) for each file `put` uploads: a file goes to DEST's key, or
    under it when DEST ends with "/" or names only the bucket; a directory's files go under
    DEST with their paths relative to it."""
    bucket, key = parse_url(dest)
    if not bucket:
        raise CliError(f"{dest!r}: give the bucket to upload to (s3://BUCKET/PREFIX)", EXIT_INPUT)
    if not src.exists():
        raise CliError(f"{str(src)!r} does not exist: give a local file or directory", EXIT_INPUT)
    if src.is_file():
        name = f"{key}{src.name}" if not key or key.endswith("/") else key
        return [(src, f"{bucket}/{name}")]
    prefix = f"{key.rstrip('/')}/" if key.strip("/") else ""
    plan = [(f, f"{bucket}/{prefix}{f.relative_to(src).as_posix()}") for f in _files(src)]
    if not plan:
        raise CliError(f"{str(src)!r} has no files to upload", EXIT_INPUT)
    return plan


def _files(directory: Path) -> Iterator[Path]:
    """The regular files under `directory`, sorted, symbolic links to folders not followed."""
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            path = Path(root, name)
            if path.is_file():
                yield path


def put(fs: pafs.FileSystem, plan: list[tuple[Path, str]], progress: Progress | None = None) -> int:
    """Upload each file of `plan` (upload_plan) in CHUNK_BYTES chunks, the bucket made when
    it is new; returns the bytes uploaded."""
    from pyarrow import fs as pafs

    progress = progress or Progress(sum(f.stat().st_size for f, _ in plan))
    for bucket in sorted({target.split("/", 1)[0] for _, target in plan}):
        if fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            fs.create_dir(bucket)
    for local, target in plan:
        try:
            source = local.open("rb")
        except OSError as exc:  # this machine's file, not the store
            raise CliError(f"cannot read {str(local)!r}: {exc.strerror}", EXIT_INPUT) from None
        with source, fs.open_output_stream(target) as out:
            while chunk := source.read(CHUNK_BYTES):
                out.write(chunk)
                progress.add(len(chunk))
    progress.finish()
    return progress.done


def listing(fs: pafs.FileSystem, url: str) -> list[str]:
    """`ls`'s lines: each object's size and URL under `url` (its buckets for `s3://`)."""
    from pyarrow import fs as pafs

    bucket, key = parse_url(url)
    scheme = url.split("://", 1)[0]
    if not bucket:
        found = fs.get_file_info(pafs.FileSelector("", recursive=False))
        return [f"{scheme}://{info.path}/" for info in sorted(found, key=lambda i: i.path)]
    path = f"{bucket}/{key}".rstrip("/")
    top = fs.get_file_info(path)
    if top.type == pafs.FileType.NotFound:
        raise not_there(url, no_bucket=fs.get_file_info(bucket).type == pafs.FileType.NotFound)
    if top.type == pafs.FileType.File:
        infos = [top]
    else:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
    files = sorted((i for i in infos if i.type == pafs.FileType.File), key=lambda i: i.path)
    total = sum(i.size or 0 for i in files)
    lines = [f"{i.size or 0:>14,}  {scheme}://{i.path}" for i in files]
    return [*lines, f"{len(files)} objects, {total:,} bytes"]


def data_command(stack: str | None, action: str, src: str, url: str | None) -> int:
    """`trainstack data put SRC URL` / `trainstack data ls [URL]`: arguments checked first,
    then the stack's object store read (its outputs) and used. `ls` without a URL lists the
    stack's bucket (its objectStoreBucket output, else DEFAULT_BUCKET)."""
    plan = upload_plan(Path(src), url or "") if action == "put" else []
    if url:
        parse_url(url)
    outputs = stack_outputs(stack)
    access = store_access(outputs, lambda name: secret_output(stack, name))
    url = url or f"s3://{outputs.get(BUCKET_OUTPUT) or DEFAULT_BUCKET}/"
    try:
        fs = open_store(access)
        if action == "put":
            sent = put(fs, plan)
            scheme = url.split("://", 1)[0]
            where = f"{scheme}://{plan[0][1]}" if len(plan) == 1 else url
            files = f"{len(plan)} file{'s' if len(plan) > 1 else ''}"
            print(f"uploaded {files}, {sent:,} bytes to {where}")
        else:
            for line in listing(fs, url):
                print(line)
    except OSError as exc:
        raise store_error(url, exc, access) from None
    return 0
