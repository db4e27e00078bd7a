"""Processes seen through /proc, for "nothing is left" checks that name what they look for.

A process is identified by its PID and its start time (field 22 of /proc/PID/stat), so a PID
that the kernel hands to a new process later is not taken for the one that was recorded.
A check first records what runs (and shows that it found something), then asserts that those
very processes are gone, whatever their command line became (Mitogen renames its children;
a stuck `sleep` never carries the run directory in its argv).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Proc:
    pid: int
    started: int  # clock ticks since boot
    cmdline: str

    def alive(self) -> bool:
        """Still running: the same PID with the same start time, and not a zombie."""
        stat = _stat(self.pid)
        return stat is not None and stat[19] == str(self.started) and stat[0] != "Z"

    def __str__(self) -> str:
        return f"{self.pid} {self.cmdline}"


def _stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (state first), or None once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone (ENOENT, ESRCH), or hidden from this user
        return None
    return text.rsplit(")", 1)[1].split()


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def proc(pid: int) -> Proc | None:
    """The running process `pid`, or None."""
    stat = _stat(pid)
    if stat is None or stat[0] == "Z":
        return None
    return Proc(pid, int(stat[19]), _cmdline(pid))


def parent(pid: int) -> int | None:
    stat = _stat(pid)
    return None if stat is None else int(stat[1])


def all_procs() -> list[Proc]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (p := proc(int(entry.name))) is not None:
            found.append(p)
    return found


def _below(roots: set[int]) -> list[Proc]:
    """Every running process below one of `roots` (walking parent links), `roots` excluded
    unless one is below another. One pass over /proc: each process's parent is read from the
    same stat as its start time, so a PID reused meanwhile is not walked into."""
    children: dict[int, list[Proc]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _stat(pid)
        if stat is None or stat[0] == "Z":
            continue
        children.setdefault(int(stat[1]), []).append(Proc(pid, int(stat[19]), _cmdline(pid)))
    found: dict[int, Proc] = {}
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child.pid not in found:
                found[child.pid] = child
                todo.append(child.pid)
    return list(found.values())


def descendants(root: int) -> list[Proc]:
    """Every running process below `root` (walking parent links), `root` excluded."""
    return _below({root})


def matching(text: str) -> list[Proc]:
    """Running processes whose command line contains `text` (this process excluded)."""
    me = os.getpid()
    return [p for p in all_procs() if text in p.cmdline and p.pid != me]


class Recorder:
    """Keeps adding the descendants of `root` it sees, for a check after `root` was stopped:
    call `sample()` while the work runs, then `left()` after the stop.

    A process seen once stays followed: what it starts later is recorded too, also after
    `root` (or a process between) has exited and it was reparented out of `root`'s tree."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[tuple[int, int], Proc] = {}

    def sample(self) -> list[Proc]:
        followed = {p.pid for p in self.seen.values() if p.alive()}
        current = [p for p in _below({self.root} | followed) if p.pid != self.root]
        for p in current:
            self.seen[(p.pid, p.started)] = p
        return current

    def left(self) -> list[Proc]:
        return [p for p in self.seen.values() if p.alive()]


def wait_gone(procs: list[Proc], timeout: float = 10.0) -> list[Proc]:
    """The processes of `procs` still alive after up to `timeout` seconds."""
    deadline = time.monotonic() + timeout
    left = [p for p in procs if p.alive()]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if p.alive()]
    return left
