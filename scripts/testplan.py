#!/usr/bin/env python3
"""How the test suite runs: which streams run side by side, and the CI time table.

    testplan.py speed             the machine-speed index (a fixed CPU workload, timed)
    testplan.py fast              lint beside the unit tests
    testplan.py engine            the engine tier: each stream starts when those it needs passed
    testplan.py record NAME SECS  one timed step of CI (setup, clean, total)
    testplan.py table             the CI time table of what was recorded

Streams print their lines prefixed with `[name]` and keep a whole log and a JSON record each
in $TRAINSTACK_TIMES_DIR (default .test-times/). tests/conftest.py writes each pytest run's
per-module wall times and counts into the file named by $TRAINSTACK_TIMES_FILE, which a stream
sets. PYTEST_ARGS (the Makefile's) is passed to every pytest a stream runs; a `-m EXPR` in it is
combined with the tier's own marker.

Standard library only: CI runs `speed` before setup has made the virtual environment.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / ".ci" / "speed-reference.json"
NOT_UNIT = "not unit"


@dataclass(frozen=True)
class Stream:
    """One command run beside others; `paths` are the test paths its pytest runs, in order.
    It starts as soon as every stream named in `after` (listed before it) has passed."""

    name: str
    paths: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    after: tuple[str, ...] = ()


# Lint and the unit tests share no state (the unit tests start no engine): side by side.
FAST = (
    Stream("lint", command=("scripts/lint.sh",)),
    Stream("unit", paths=("tests",)),
)

# The engine tier: each stream starts as soon as the streams it needs (`after`) have passed,
# not when every stream started before it has ended. These needs let no more than two run at
# once: on this 2-core machine two streams keep the cores busy (the table's CPU column), and a
# third would only share them.
#   newcomer+images (about 9 min): the newcomer test bakes this tree's node image that every
#       later stack reuses; the images module checks that bake. Needs nothing.
#   training (about 13 min): the training tier, local Spark, no engine, no image. Needs
#       nothing: it runs beside the bake.
#   platform (about 38 min, the critical path): the shared platform stack. Needs only the
#       image, so it starts when the bake passed, beside training's last minutes.
#   stacks+ssh (about 20 min): the modules that build small stacks of their own from the node
#       image: integration, the engine tests that live among the unit tests, provisioning, and
#       the ssh target. Needs the image, and waits for training too, so that it is not a third
#       CPU-heavy stream beside training and platform.
# Every test directory is in exactly one stream, and each engine test among the unit tests is
# named (tests/unit/test_testplan.py checks both); a new module in one of these directories
# runs in its stream without an edit here.
ENGINE = (
    Stream("newcomer+images", paths=("tests/newcomer", "tests/images")),
    Stream("training", paths=("tests/training",)),
    Stream("platform", paths=("tests/platform",), after=("newcomer+images",)),
    Stream(
        "stacks+ssh",
        paths=(
            "tests/integration",
            "tests/unit/test_cancelled_program.py",
            "tests/provisioning",
            "tests/ssh",
        ),
        after=("newcomer+images", "training"),
    ),
)

# Run by the stacks' own tests (testinfra against an inventory), never by a tier directly.
NESTED = ("tests/hosts",)


def times_dir() -> Path:
    path = Path(os.environ.get("TRAINSTACK_TIMES_DIR") or ROOT / ".test-times")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_record(name: str, **fields: object) -> None:
    (times_dir() / f"{name}.json").write_text(json.dumps({"name": name, **fields}, indent=1))


def read_records() -> dict[str, dict]:
    found = {}
    for path in sorted(times_dir().glob("*.json")):
        try:
            found[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a run killed while writing: its step shows as missing
    return found


# ---------------------------------------------------------------------------------------- speed

SPEED_JAVA = """
public class Speed {
    public static void main(String[] args) {
        long sum = 0;
        for (int i = 0; i < 20_000_000; i++) { sum += i % 7; }
        System.out.println(sum);
    }
}
"""
PYTHON_STEPS = 200_000_000
JAVA_STARTS = 3


def python_workload(steps: int) -> int:
    total = 0
    for i in range(steps):
        total += i % 7
    return total


def speed(out: Path | None) -> int:
    """Times a fixed workload: pure Python in one process and three JVM starts that compile
    and run a small class (what Spark, ZooKeeper and pytest's subprocesses do all day)."""
    started = time.monotonic()
    python_workload(PYTHON_STEPS)
    python_s = time.monotonic() - started
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "Speed.java"
        source.write_text(SPEED_JAVA)
        started = time.monotonic()
        for _ in range(JAVA_STARTS):
            subprocess.run(["java", str(source)], check=True, capture_output=True)
        java_s = time.monotonic() - started
    seconds = python_s + java_s
    reference = json.loads(REFERENCE.read_text())["seconds"]
    index = seconds / reference
    write_record(
        "speed",
        seconds=round(seconds, 2),
        python_seconds=round(python_s, 2),
        java_seconds=round(java_s, 2),
        reference_seconds=reference,
        index=round(index, 2),
    )
    print(
        f"speed: {seconds:.1f} s (Python {python_s:.1f} s, {JAVA_STARTS} JVM starts {java_s:.1f} s)"
        f"; reference {reference} s; index {index:.2f} (above 1: a slower machine than the "
        "reference day)"
    )
    if out:
        out.write_text(json.dumps({"seconds": round(seconds, 2), "index": round(index, 2)}))
    return 0


# -------------------------------------------------------------------------------------- streams


def pytest_command(paths: tuple[str, ...], marker: str, user_args: list[str]) -> list[str]:
    """pytest over `paths` with `marker`, combined with a `-m` of the user's own."""
    args = list(user_args)
    for i, arg in enumerate(args):
        if arg == "-m" and i + 1 < len(args):
            marker = f"({marker}) and ({args[i + 1]})"
            del args[i : i + 2]
            break
        if arg.startswith("-m") and len(arg) > 2:
            marker = f"({marker}) and ({arg[2:]})"
            del args[i]
            break
    return [sys.executable, "-m", "pytest", "-m", marker, *args, *paths]


def stream_command(stream: Stream, marker: str) -> list[str]:
    if stream.command:
        return list(stream.command)
    user = shlex.split(os.environ.get("PYTEST_ARGS", ""))
    extra = ["-q"] if marker == "unit" else ["--durations=15"]
    return pytest_command(stream.paths, marker, extra + user)


def wait_with_usage(proc: subprocess.Popen) -> tuple[int, float]:
    """Wait for `proc`: its exit code, and the CPU seconds it and every descendant it waited
    for used on the host (the stream's pytest, Pulumi, Ansible, local Spark...; not the
    containers, which the engine runs)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def check_graph(streams: tuple[Stream, ...]) -> None:
    """Names are unique and each stream needs only streams listed before it (so no cycle)."""
    seen: set[str] = set()
    for stream in streams:
        if stream.name in seen:
            raise ValueError(f"two streams named {stream.name}")
        unknown = [n for n in stream.after if n not in seen]
        if unknown:
            raise ValueError(f"{stream.name} needs {unknown}, which no stream before it is")
        seen.add(stream.name)


def describe(streams: tuple[Stream, ...]) -> str:
    """`a beside b; c after a; d after a, b`: what starts at once, then what waits for what."""
    parts = [" beside ".join(s.name for s in streams if not s.after)]
    parts += [f"{s.name} after {', '.join(s.after)}" for s in streams if s.after]
    return "; ".join(parts)


class Streams:
    """Runs a graph of streams: each starts as soon as the streams it needs have passed, beside
    whatever else runs, its lines prefixed with its name. Once a stream failed no other starts
    (those not started are not run, their code None); the ones running are left to finish."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.codes: dict[str, int | None] = {}
        self.ended: queue.Queue[str] = queue.Queue()
        self.origin = time.monotonic()

    def _follow(self, name: str, proc: subprocess.Popen, log, started: float) -> None:
        """Prints and logs the stream's lines; at its end, records its exit, wall time (of
        this stream alone: streams end in any order) and start since the tier's."""
        try:
            assert proc.stdout is not None
            with log:
                for line in proc.stdout:
                    log.write(line)
                    with self.lock:
                        sys.stdout.write(f"[{name}] {line}")
                        sys.stdout.flush()
            code, cpu_s = wait_with_usage(proc)
            seconds = time.monotonic() - started
            write_record(
                f"stream-{name}",
                seconds=round(seconds, 1),
                exit=code,
                cpu_s=round(cpu_s, 1),
                started_s=round(started - self.origin, 1),
            )
            with self.lock:
                self.codes[name] = code
                print(f"[{name}] finished: exit {code} after {clock(seconds)}", flush=True)
        finally:
            self.ended.put(name)  # a follower that broke leaves no code: -1, a failure

    def _start(self, stream: Stream, marker: str) -> subprocess.Popen:
        directory = times_dir()
        command = stream_command(stream, marker)
        env = dict(os.environ, TRAINSTACK_TIMES_FILE=str(directory / f"pytest-{stream.name}.json"))
        log = (directory / f"{stream.name}.log").open("w")
        started = time.monotonic()
        with self.lock:
            if stream.after:
                print(
                    f"testplan: {stream.name} starts at +{clock(started - self.origin)}, "
                    f"after {', '.join(stream.after)}",
                    flush=True,
                )
            print(f"[{stream.name}] $ {shlex.join(command)}", flush=True)
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        threading.Thread(
            target=self._follow, args=(stream.name, proc, log, started), daemon=True
        ).start()
        return proc

    def _not_run(self, stream: Stream) -> None:
        self.codes[stream.name] = None
        write_record(f"stream-{stream.name}", not_run=True)
        for stale in (f"pytest-{stream.name}.json", f"{stream.name}.log"):  # an earlier run's
            (times_dir() / stale).unlink(missing_ok=True)

    def run(self, streams: tuple[Stream, ...], marker: str) -> dict[str, int | None]:
        check_graph(streams)
        self.origin = time.monotonic()
        pending = list(streams)
        running: dict[str, subprocess.Popen] = {}
        try:
            while pending or running:
                with self.lock:
                    ready = [s for s in pending if all(ok(self.codes.get(n)) for n in s.after)]
                for stream in ready:
                    pending.remove(stream)
                    running[stream.name] = self._start(stream, marker)
                if not running:
                    break  # cannot happen with needs listed first: nothing left could start
                try:
                    name = self.ended.get(timeout=1.0)  # a timeout, so that Ctrl-C reaches here
                except queue.Empty:
                    continue
                del running[name]
                code = self.codes.setdefault(name, -1)
                if not ok(code) and pending:
                    waiting = ", ".join(s.name for s in pending)
                    print(
                        f"testplan: {name} failed; not starting {waiting}"
                        + (f"; {', '.join(running)} left to finish" if running else ""),
                        flush=True,
                    )
                    for stream in pending:
                        self._not_run(stream)
                    pending = []
        except BaseException:  # Ctrl-C, or a stream that could not start: stop the others
            for proc in running.values():
                proc.terminate()
            raise
        for stream in pending:
            self._not_run(stream)
        return {s.name: self.codes.get(s.name) for s in streams}


def ok(code: int | None) -> bool:
    """A stream passed. 5: pytest collected nothing, which only a narrowing PYTEST_ARGS (-k,
    -m) may cause. None: not run."""
    narrowed = bool(os.environ.get("PYTEST_ARGS", "").strip())
    return code == 0 or (code == 5 and narrowed)


def passed(codes: dict[str, int | None]) -> bool:
    return all(ok(code) for code in codes.values())


def report_failures(codes: dict[str, int | None]) -> None:
    for name, code in codes.items():
        if code is None:
            print(f"testplan: stream {name} not run: a stream failed before it started", flush=True)
        elif code not in (0, 5):
            print(
                f"testplan: stream {name} failed (exit {code}); its whole log: "
                f"{times_dir() / (name + '.log')}",
                flush=True,
            )


# ------------------------------------------------------------------------------------ machine


def cpu_times() -> tuple[int, int]:
    """The host's (busy, all) CPU time in clock ticks since boot, every core (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = fields[3] + fields[4]  # idle and iowait
    return sum(fields) - idle, sum(fields)


def container_cpu_s() -> float | None:
    """CPU seconds used by every container the engine ran since it started (the `docker`
    cgroup, which keeps the time of removed containers), or None where it cannot be read."""
    try:
        return int(Path("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        pass
    try:  # cgroup v2 with the cgroupfs driver
        for line in Path("/sys/fs/cgroup/docker/cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except (OSError, ValueError):
        pass
    return None


def memory_used_gib() -> float:
    """MemTotal - MemAvailable (/proc/meminfo), GiB."""
    info = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info[key] = int(value.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) / 2**20


class Load:
    """How busy the machine was while a tier ran: the share of all cores busy over the whole
    tier (1.0: every core all the time; then another stream beside these gains nothing), the
    share of its 10-second samples with every core above 90 % busy, and the peak memory used.
    """

    INTERVAL = 10.0

    def __init__(self) -> None:
        self.cores = os.cpu_count() or 1
        self.start = cpu_times()
        self.containers_start = container_cpu_s()
        self.peak_gib = memory_used_gib()
        self.samples = self.saturated = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        last = self.start
        while not self._stop.wait(self.INTERVAL):
            now = cpu_times()
            busy, total = now[0] - last[0], now[1] - last[1]
            last = now
            self.samples += 1
            self.saturated += bool(total and busy / total > 0.9)
            self.peak_gib = max(self.peak_gib, memory_used_gib())

    def fields(self) -> dict[str, object]:
        self._stop.set()
        self._thread.join()
        end = cpu_times()
        busy, total = end[0] - self.start[0], end[1] - self.start[1]
        containers_end = container_cpu_s()
        containers = (
            round(containers_end - self.containers_start, 1)
            if containers_end is not None and self.containers_start is not None
            else None
        )
        return {
            "cores": self.cores,
            "containers_cpu_s": containers,
            "cpu_busy": round(busy / total, 3) if total else None,
            "saturated": round(self.saturated / self.samples, 3) if self.samples else None,
            "memory_peak_gib": round(self.peak_gib, 1),
        }


def cpu_minutes(record: dict) -> float | None:
    """A tier's CPU work in CPU-minutes: its share of all cores busy x the cores x its
    length (what CI's wall time is bound by on a machine whose cores it keeps busy)."""
    if record.get("cpu_busy") is None or record.get("seconds") is None:
        return None
    return record["cpu_busy"] * record["cores"] * record["seconds"] / 60


def load_note(record: dict) -> str:
    if record.get("cpu_busy") is None:
        return ""
    note = f"CPU {record['cpu_busy']:.0%} of {record['cores']} cores"
    minutes = cpu_minutes(record)
    if minutes is not None:
        note += f" = {minutes:.1f} CPU-min"
    if record.get("saturated") is not None:
        note += f" ({record['saturated']:.0%} of the time all busy)"
    if record.get("containers_cpu_s") is not None:
        note += f", containers' CPU {clock(record['containers_cpu_s'])}"
    return note + f", memory peak {record['memory_peak_gib']} GiB"


def run_tier(tier: str, streams: tuple[Stream, ...], marker: str) -> int:
    """Runs the tier's graph of streams; its record `tier-NAME` holds its wall time, its exit
    and the machine's load over the whole tier (the streams overlap: no stage of its own)."""
    started = time.monotonic()
    print(f"testplan: {tier} tier: {describe(streams)}", flush=True)
    load = Load()
    codes = Streams().run(streams, marker)
    failed = not passed(codes)
    write_record(
        f"tier-{tier}",
        seconds=round(time.monotonic() - started, 1),
        exit=int(failed),
        **load.fields(),
    )
    if failed:
        report_failures(codes)
        print(f"testplan: {tier} tier failed", flush=True)
    return int(failed)


# ---------------------------------------------------------------------------------------- table


def clock(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def table_lines(records: dict[str, dict]) -> list[str]:
    lines = ["", "CI time table (min:s)"]
    speed_record = records.get("speed")
    index = speed_record["index"] if speed_record else None
    if speed_record:
        lines.append(
            f"  {'machine-speed index':<44}{index:>8.2f}  ({speed_record['seconds']} s against "
            f"the reference {speed_record['reference_seconds']} s)"
        )

    def row(label: str, seconds: float | None, note: str = "", depth: int = 1) -> None:
        text = clock(seconds) if seconds is not None else "-"
        lines.append(f"{'  ' * depth}{label:<{54 - 2 * depth}}{text:>8}  {note}".rstrip())

    def seconds_of(name: str) -> float | None:
        return records[name]["seconds"] if name in records else None

    row("setup", seconds_of("setup"))
    tiers = (("fast", FAST), ("engine", ENGINE))
    totals = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for tier, streams in tiers:
        if f"tier-{tier}" not in records and not any(
            f"stream-{s.name}" in records for s in streams
        ):
            continue
        # The tier's load over its whole length: its streams overlap, no part is theirs alone.
        record = records.get(f"tier-{tier}", {})
        row(f"{tier} tier", record.get("seconds"), load_note(record))
        for stream in streams:
            record = records.get(f"stream-{stream.name}", {})
            result = records.get(f"pytest-{stream.name}", {})
            counts = result.get("counts", {})
            for key in totals:
                totals[key] += counts.get(key, 0)
            notes = []
            if record.get("exit") not in (0, None):
                notes.append(f"exit {record['exit']}")
            if record.get("not_run"):
                notes.append("not run")
            if record.get("started_s") is not None:  # since the tier's start: the overlap
                notes.append(f"started +{clock(record['started_s'])}")
            if record.get("cpu_s") is not None:
                notes.append(f"host CPU {clock(record['cpu_s'])}")
            notes.append(", ".join(f"{n} {k}" for k, n in counts.items() if n))
            row(stream.name, record.get("seconds"), "; ".join(n for n in notes if n), depth=2)
            if tier == "engine":  # the unit tier's 30 modules would drown the table
                for module, seconds in result.get("modules", {}).items():
                    row(module, seconds, depth=3)
    row("clean (leftover stacks, old images)", seconds_of("clean"))
    total = seconds_of("total")
    if total is not None:
        note = f"at reference speed {clock(total / index)}" if index else ""
        row("total", total, note)
    lines.append(
        f"tests: {totals['passed']} passed, {totals['failed']} failed, {totals['error']} errors, "
        f"{totals['skipped']} skipped"
    )
    return lines


# ----------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    speed_parser = commands.add_parser("speed")
    speed_parser.add_argument("--out", type=Path)
    commands.add_parser("fast")
    commands.add_parser("engine")
    record_parser = commands.add_parser("record")
    record_parser.add_argument("name")
    record_parser.add_argument("seconds", type=float)
    commands.add_parser("table")
    args = parser.parse_args(argv)
    if args.command == "speed":
        return speed(args.out)
    if args.command == "fast":
        return run_tier("fast", FAST, "unit")
    if args.command == "engine":
        return run_tier("engine", ENGINE, NOT_UNIT)
    if args.command == "record":
        write_record(args.name, seconds=round(args.seconds, 1))
        return 0
    print("\n".join(table_lines(read_records())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
