"""Each rank's memory, on file when the rank is gone: ``rank-<N>.memory.jsonl`` in the run
directory, one line per attempt. A rank the kernel's OOM killer ends gets a sentence of its own
as the job's error (`memory_failure`), instead of Spark's "barrier task finished unsuccessfully".

The rank cannot write this itself: SIGKILL leaves it no last word. While a rank runs, a small
watcher process of its own (a fresh interpreter with this module alone, a few MB: the OOM
killer picks the largest process, the rank) polls the rank every POLL_SECONDS (more often
close to the limit): its peak resident memory (VmHWM of /proc/<pid>/status) and the count of
OOM kills in its cgroup (``oom_kill`` of memory.events, cgroup v2; memory.oom_control, v1).
When the rank ends, the watcher appends what it saw: the peak, the container's memory limit
(the cgroup's, else the machine's memory), the OOM kills while the rank ran (and those it
outlived: another process's), and how the rank ended: ``exited`` (its task returned or raised
and said so) or ``killed`` (it vanished without a word). The watcher is the rank's child and
ends with it: it learns of the rank's end from its pipe (closed by the kernel when the rank
dies) or its parent's pid; it never outlives the rank by more than a poll. Missing /proc or
cgroup files never fail the rank: the record says what was known.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainstack_training.rundir import MEMORY_FILE, MEMORY_GLOB

POLL_SECONDS = 0.5
# While the rank holds more than FAST_SHARE of the limit, it is polled every FAST_POLL_SECONDS:
# the last peak seen before an OOM kill is then close to the rank's real one.
FAST_POLL_SECONDS = 0.05
FAST_SHARE = 0.5
# An OOM kill counted this long before a poll that finds the rank still there was another
# process's: the rank outlived it. A killed rank is gone well within it.
SURVIVE_SECONDS = 1.0
EXIT_WAIT_SECONDS = 5.0  # how long a rank that ends waits for its watcher's record
CGROUP = Path("/sys/fs/cgroup")
PROC = Path("/proc")
NO_LIMIT = 2**60  # cgroup v1 writes a huge number for "no limit"
ADVICE = (
    "stream the data (docs/training.md, Streaming), put fewer rows on each worker (more "
    "workers), or give the workers more memory"
)
# The watcher's interpreter: isolated (-I: no environment, no user site) and without site
# packages (-S): the standard library and this module, found from its own directory.
_BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from trainstack_training.memwatch import main; raise SystemExit(main(sys.argv[2:]))"
)


@dataclass(frozen=True)
class Cgroup:
    """What a process's memory cgroup says: its limit and where its OOM kills are counted."""

    limit_bytes: int  # the smallest limit of its cgroup and the cgroups above it; 0: unknown
    limit_source: str  # "cgroup", "machine" (MemTotal: no container limit), "" (unknown)
    events: Path | None  # memory.events (v2) or memory.oom_control (v1)

    def oom_kills(self) -> int | None:
        """The cgroup's OOM kills so far (None: not counted here)."""
        if self.events is None:
            return None
        try:
            for line in self.events.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return None


def _cgroup_paths(text: str) -> tuple[str, str]:
    """The v2 path and the v1 memory controller's path of a /proc/<pid>/cgroup."""
    v2 = v1 = ""
    for line in text.splitlines():
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if line.startswith("0::"):
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _upwards(root: Path, path: str) -> list[Path]:
    """`root/path` and each directory above it up to `root` (only `root` when the process's
    own directory is not mounted here, as in a container with its own cgroup namespace)."""
    own = root / path.strip("/") if path.strip("/") else root
    if not own.is_dir():
        return [root]
    dirs = [own]
    while dirs[-1] != root and root in dirs[-1].parents:
        dirs.append(dirs[-1].parent)
    return dirs


def _number(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() and int(text) < NO_LIMIT else None  # "max": none


def machine_memory(proc: Path = PROC) -> int:
    """MemTotal, in bytes (0: unknown)."""
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def cgroup_of(pid: int, cgroup_root: Path = CGROUP, proc: Path = PROC) -> Cgroup:
    """The memory cgroup of process `pid`: v2 (memory.max, memory.events), else v1
    (memory.limit_in_bytes, memory.oom_control); the machine's memory when it has no limit
    (or a larger one)."""
    try:
        v2, v1 = _cgroup_paths((proc / str(pid) / "cgroup").read_text())
    except OSError:
        v2 = v1 = ""
    limits: list[int] = []
    events: Path | None = None
    v2_dirs = [d for d in _upwards(cgroup_root, v2) if (d / "memory.events").exists()]
    if v2_dirs:
        events = v2_dirs[0] / "memory.events"
        limits = [n for d in v2_dirs if (n := _number(d / "memory.max")) is not None]
    else:
        v1_dirs = _upwards(cgroup_root / "memory", v1)
        if (v1_dirs[0] / "memory.oom_control").exists():
            events = v1_dirs[0] / "memory.oom_control"
        limits = [n for d in v1_dirs if (n := _number(d / "memory.limit_in_bytes")) is not None]
    machine = machine_memory(proc)
    if limits and (not machine or min(limits) <= machine):
        return Cgroup(min(limits), "cgroup", events)
    return Cgroup(machine, "machine" if machine else "", events)


def _status(pid: int | str, proc: Path) -> dict[str, str]:
    try:
        text = (proc / str(pid) / "status").read_text()
    except OSError:
        return {}
    return {k: v.strip() for k, _, v in (ln.partition(":") for ln in text.splitlines())}


def _kb(value: str | None) -> int | None:
    try:
        return int(value.split()[0]) if value else None
    except (ValueError, IndexError):
        return None


def peak_kb(pid: int | str = "self", proc: Path = PROC) -> int | None:
    """Peak resident memory (VmHWM) of process `pid`, in KiB (None: not readable)."""
    return _kb(_status(pid, proc).get("VmHWM"))


def _mib(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


class MemoryWatch:
    """In a rank: its watcher process while active, and its record in
    ``run_dir/rank-<rank>.memory.jsonl`` when the rank ends (or is killed)."""

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        attempt: int,
        host: str,
        *,
        cgroup_root: Path = CGROUP,
        proc: Path = PROC,
        poll: float = POLL_SECONDS,
    ) -> None:
        self.path = Path(run_dir) / MEMORY_FILE.format(rank=rank)
        self.rank, self.attempt, self.host = rank, attempt, host
        self.cgroup_root, self.proc, self.poll = Path(cgroup_root), Path(proc), poll
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> MemoryWatch:
        try:
            group = cgroup_of(os.getpid(), self.cgroup_root, self.proc)
            settings = {
                "pid": os.getpid(),
                "oom_kills": group.oom_kills(),  # when the rank starts, not its watcher
                "path": str(self.path),
                "rank": self.rank,
                "attempt": self.attempt,
                "host": self.host,
                "cgroup_root": str(self.cgroup_root),
                "proc": str(self.proc),
                "poll": self.poll,
            }
            package = str(Path(__file__).resolve().parents[1])
            self.process = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _BOOT, package, json.dumps(settings)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
            )
        except Exception as exc:  # no watcher is no reason to fail the rank
            print(f"trainstack: no memory watcher for rank {self.rank}: {exc}", file=sys.stderr)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """The rank ends: its own last peak to the watcher, which writes the record and ends."""
        process, self.process = self.process, None
        if process is None or process.stdin is None:
            return
        with contextlib.suppress(OSError):
            process.stdin.write(f"exited {peak_kb('self', self.proc) or 0}\n".encode())
        with contextlib.suppress(OSError):
            process.stdin.close()
        try:
            process.wait(EXIT_WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def watch(
    pid: int,
    path: Path,
    fields: dict[str, Any],
    commands: int,
    cgroup_root: Path = CGROUP,
    proc: Path = PROC,
    poll: float = POLL_SECONDS,
    first: int | None = None,
) -> dict[str, Any]:
    """The watcher's loop: poll rank `pid` (this process's parent) until it ends, then append
    its record to `path` and return it. `commands` is the read end of the rank's pipe: an
    ``exited <peak KiB>`` line when the rank's task ends, end of file when the rank dies.
    `first` is the cgroup's OOM kill count when the rank started (None: now)."""
    group = cgroup_of(pid, cgroup_root, proc)
    started_at = time.time()
    first = group.oom_kills() if first is None else first
    survived = first  # the kills that the rank outlived (SURVIVE_SECONDS)
    counted: list[tuple[float, int]] = []  # when each new count was first seen
    status = _status(pid, proc)
    peak, resident = _kb(status.get("VmHWM")), _kb(status.get("VmRSS")) or 0
    ended, pending = "killed", b""
    while True:
        wait = poll
        if group.limit_bytes and resident * 1024 > FAST_SHARE * group.limit_bytes:
            wait = min(poll, FAST_POLL_SECONDS)
        if commands >= 0 and select.select([commands], [], [], wait)[0]:
            chunk = os.read(commands, 256)
            pending += chunk
            if pending.startswith(b"exited"):
                ended = "exited"
                last = _kb(pending.decode(errors="replace").partition(" ")[2])
                peak = max(peak or 0, last or 0) or None
                break
            if not chunk:  # the rank's end of the pipe closed: it is gone (or a child of
                os.close(commands)  # its holds the pipe, and the parent's pid says)
                commands = -1
        elif commands < 0:
            time.sleep(wait)
        kills = group.oom_kills()
        now = time.monotonic()
        if kills is not None and (not counted or kills != counted[-1][1]):
            counted.append((now, kills))
        status = _status(pid, proc)
        if os.getppid() != pid or status.get("State", "")[:1] in ("Z", "X"):
            break
        peak = max(peak or 0, _kb(status.get("VmHWM")) or 0) or None
        resident = _kb(status.get("VmRSS")) or 0
        survived = max((n for t, n in counted if t <= now - SURVIVE_SECONDS), default=first)
    last_kills = group.oom_kills()
    during = None if first is None or last_kills is None else last_kills - first
    record = {
        **fields,
        "pid": pid,
        "peak_mb": _mib(peak / 1024) if peak else None,
        "limit_mb": _mib(group.limit_bytes / 1024**2) if group.limit_bytes else None,
        "limit_source": group.limit_source,
        "oom_kills_during": during,
        # Of those, the kills the rank outlived (another process of its cgroup was killed).
        "oom_kills_survived": None if survived is None or first is None else survived - first,
        "ended": ended,
        "started_at": round(started_at, 3),
        "ended_at": round(time.time(), 3),
    }
    line = (json.dumps(record) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)  # one write: a line of a record or none
        finally:
            os.close(fd)
    except OSError as exc:
        print(f"trainstack: memory record of rank {fields.get('rank')}: {exc}", file=sys.stderr)
    return record


def main(argv: list[str]) -> int:
    """The watcher process (MemoryWatch starts it): argv[0] is its settings, as JSON."""
    # Not the rank's signals: a Ctrl-C or the Spark daemon's SIGHUP to the process group ends
    # the rank, and the watcher then records it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    settings = json.loads(argv[0])
    fields = {k: settings[k] for k in ("rank", "attempt", "host")}
    watch(
        int(settings["pid"]),
        Path(settings["path"]),
        fields,
        sys.stdin.fileno(),
        Path(settings["cgroup_root"]),
        Path(settings["proc"]),
        float(settings["poll"]),
        settings.get("oom_kills"),
    )
    return 0


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """Every rank's memory records in the run directory (each attempt's), unreadable lines
    skipped."""
    records = []
    for path in sorted(Path(run_dir).glob(MEMORY_GLOB)):
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    record = json.loads(line)
                    if isinstance(record, dict):
                        records.append(record)
    return records


def wait_for_records(run_dir: Path, attempt: int, ranks: int, timeout: float = 2.0) -> None:
    """Wait (up to `timeout` s) until each of `ranks` ranks has a record of `attempt`: a
    watcher writes it when its rank is gone, about when Spark learns of the rank's end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = {r.get("rank") for r in read_records(run_dir) if r.get("attempt") == attempt}
        if len(done) >= ranks:
            return
        time.sleep(0.1)


def killed_for_memory(record: dict[str, Any]) -> bool:
    """Whether the OOM killer ended this rank: it vanished without a word while its cgroup
    counted an OOM kill that it did not outlive."""
    during = record.get("oom_kills_during") or 0
    survived = record.get("oom_kills_survived") or 0
    return record.get("ended") == "killed" and during > survived


def _victims(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ranks the OOM killer ended. Ranks of one attempt on one host share a container: a
    rank that Spark ended soon after its peer's OOM kill looks killed for memory too, so of
    those only as many as the kills counted, the first to end."""
    containers: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for record in filter(killed_for_memory, records):
        containers.setdefault((record.get("attempt"), record.get("host")), []).append(record)
    victims = []
    for ranks in containers.values():
        kills = max(
            int(r["oom_kills_during"]) - int(r.get("oom_kills_survived") or 0) for r in ranks
        )
        victims += sorted(ranks, key=lambda r: float(r.get("ended_at") or 0))[:kills]
    return victims


def _size(mib: float) -> str:
    return f"{mib / 1024:.1f} GiB" if mib >= 1024 else f"{mib:.0f} MiB"


def _and(items: Iterable[str]) -> str:
    words = list(items)
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else "".join(words)


def _limit(record: dict[str, Any], shared: bool = False) -> str:
    limit = record.get("limit_mb")
    if not limit:
        return "an unknown limit"
    if record.get("limit_source") == "cgroup":
        owner = "containers'" if shared else "container's"
        return f"the {owner} {_size(limit)} limit"
    return f"the machine's {_size(limit)}"


def _peak(record: dict[str, Any]) -> str:
    peak = record.get("peak_mb")
    return _size(peak) if peak else "unknown"


def memory_failure(run_dir: Path, in_attempt: int | None = None) -> str | None:
    """The job's error when the OOM killer ended a rank in this launch: one sentence naming
    the ranks (of the latest attempt where it happened), their peaks, the limit and what to
    change; None when no record shows an OOM kill (or, with `in_attempt`, none in that
    attempt)."""
    victims = _victims(read_records(run_dir))
    attempts = sorted({int(r.get("attempt") or 0) for r in victims})
    if not attempts or (in_attempt is not None and attempts[-1] != in_attempt):
        return None
    latest = attempts[-1]
    ranks = sorted(
        (r for r in victims if int(r.get("attempt") or 0) == latest),
        key=lambda r: int(r.get("rank") or 0),
    )
    where = [f"{r.get('rank')} on {r.get('host') or 'an unknown host'}" for r in ranks]
    if len(ranks) == 1:
        (one,) = ranks
        what = f"rank {where[0]} was killed for memory: its peak was {_peak(one)} of {_limit(one)}"
    elif len({(r.get("limit_mb"), r.get("limit_source")) for r in ranks}) == 1:
        what = (
            f"ranks {_and(where)} were killed for memory: their peaks were "
            f"{_and(_peak(r) for r in ranks)} of "
            f"{_limit(ranks[0], shared=len({r.get('host') for r in ranks}) > 1)}"
        )
    else:
        what = (
            f"ranks {_and(where)} were killed for memory: their peaks were "
            f"{_and(f'{_peak(r)} of {_limit(r)}' for r in ranks)}"
        )
    earlier = [str(a) for a in attempts[:-1]]
    also = f"; also in attempt{'s' if len(earlier) > 1 else ''} {_and(earlier)}" if earlier else ""
    return f"{what} (attempt {latest}{also}); {ADVICE}"
