#!/usr/bin/env python3
"""How the test suite runs: which streams run side by side, and the CI time table.

    testplan.py speed             the machine-speed index (a fixed CPU workload, timed)
    testplan.py fast              lint beside the unit tests
    testplan.py engine            the engine tier: two stages of two streams each
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
    """One command run beside others; `paths` are the test paths its pytest runs, in order."""

    name: str
    paths: tuple[str, ...] = ()
    command: tuple[str, ...] = ()


# Lint and the unit tests share no state (the unit tests start no engine): side by side.
FAST = (
    Stream("lint", command=("scripts/lint.sh",)),
    Stream("unit", paths=("tests",)),
)

# The engine tier, in two stages whose streams run side by side; a stage starts when the one
# before it passed. The machine's cores are busy through both stages (the table's CPU column):
# the streams are paired so that neither waits long for the other, not to gain idle CPU.
#   stage 1: the newcomer test bakes this tree's node image that every later stack reuses; the
#            images module checks that bake. The training tier (local Spark, no engine) needs
#            no image and runs beside the bake.
#   stage 2: the shared platform stack (the longest module) beside the modules that build
#            small stacks of their own from the node image: integration, the engine tests that
#            live among the unit tests, provisioning, and the ssh target.
# Every test directory is in exactly one stream, and each engine test among the unit tests is
# named (tests/unit/test_testplan.py checks both); a new module in one of these directories
# runs in its stream without an edit here.
ENGINE = (
    (
        Stream("newcomer+images", paths=("tests/newcomer", "tests/images")),
        Stream("training", paths=("tests/training",)),
    ),
    (
        Stream("platform", paths=("tests/platform",)),
        Stream(
            "stacks+ssh",
            paths=(
                "tests/integration",
                "tests/unit/test_cancelled_program.py",
                "tests/provisioning",
                "tests/ssh",
            ),
        ),
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


class Streams:
    """Runs commands side by side, each line prefixed with its stream's name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.codes: dict[str, int] = {}

    def _follow(self, name: str, proc: subprocess.Popen, log, started: float) -> None:
        """Prints and logs the stream's lines; at its end, records its exit and wall time (of
        this stream alone: the streams of a stage end in any order)."""
        assert proc.stdout is not None
        with log:
            for line in proc.stdout:
                log.write(line)
                with self.lock:
                    sys.stdout.write(f"[{name}] {line}")
                    sys.stdout.flush()
        code, cpu_s = wait_with_usage(proc)
        seconds = time.monotonic() - started
        write_record(f"stream-{name}", seconds=round(seconds, 1), exit=code, cpu_s=round(cpu_s, 1))
        with self.lock:
            self.codes[name] = code
            print(f"[{name}] finished: exit {code} after {clock(seconds)}", flush=True)

    def run(self, streams: tuple[Stream, ...], marker: str) -> dict[str, int]:
        directory = times_dir()
        running = []
        for stream in streams:
            command = stream_command(stream, marker)
            env = dict(
                os.environ, TRAINSTACK_TIMES_FILE=str(directory / f"pytest-{stream.name}.json")
            )
            log = (directory / f"{stream.name}.log").open("w")
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
            follow = threading.Thread(
                target=self._follow,
                args=(stream.name, proc, log, time.monotonic()),
                daemon=True,
            )
            follow.start()
            running.append((proc, follow))
        try:
            for _, follow in running:
                while follow.is_alive():
                    follow.join(timeout=1.0)  # a timeout, so that Ctrl-C reaches this thread
        except KeyboardInterrupt:
            for proc, _ in running:
                proc.terminate()
            raise
        return {s.name: self.codes.get(s.name, -1) for s in streams}


def passed(codes: dict[str, int]) -> bool:
    # 5: pytest collected nothing, which only a narrowing PYTEST_ARGS (-k, -m) may cause.
    narrowed = bool(os.environ.get("PYTEST_ARGS", "").strip())
    return all(code == 0 or (code == 5 and narrowed) for code in codes.values())


def report_failures(codes: dict[str, int]) -> None:
    for name, code in codes.items():
        if code not in (0, 5):
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
    """How busy the machine was while a stage ran: the share of all cores busy over the whole
    stage (1.0: every core all the time; then another stream beside these gains nothing), the
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
    """A stage's CPU work in CPU-minutes: its share of all cores busy x the cores x its
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


def run_tier(tier: str, stages: tuple[tuple[Stream, ...], ...], marker: str) -> int:
    started = time.monotonic()
    for number, streams in enumerate(stages, 1):
        stage_started = time.monotonic()
        names = " beside ".join(s.name for s in streams)
        print(f"testplan: {tier} stage {number}/{len(stages)}: {names}", flush=True)
        load = Load()
        codes = Streams().run(streams, marker)
        write_record(
            f"stage-{tier}-{number}",
            seconds=round(time.monotonic() - stage_started, 1),
            **load.fields(),
        )
        if not passed(codes):
            report_failures(codes)
            write_record(f"tier-{tier}", seconds=round(time.monotonic() - started, 1), exit=1)
            print(f"testplan: {tier} tier failed at stage {number}; later stages not run")
            return 1
    write_record(f"tier-{tier}", seconds=round(time.monotonic() - started, 1), exit=0)
    return 0


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
    tiers = (("fast", (FAST,)), ("engine", ENGINE))
    totals = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for tier, stages in tiers:
        if f"tier-{tier}" not in records and not any(
            f"stream-{s.name}" in records for st in stages for s in st
        ):
            continue
        work = [
            cpu_minutes(records.get(f"stage-{tier}-{n}", {})) for n in range(1, len(stages) + 1)
        ]
        known = [m for m in work if m is not None]
        row(
            f"{tier} tier",
            seconds_of(f"tier-{tier}"),
            f"{sum(known):.1f} CPU-min (its stages' CPU share x cores x length)"
            if len(stages) > 1 and known
            else "",
        )
        for number, streams in enumerate(stages, 1):
            stage = records.get(f"stage-{tier}-{number}", {})
            if len(stages) > 1:
                row(f"stage {number}", stage.get("seconds"), load_note(stage), depth=2)
            for stream in streams:
                record = records.get(f"stream-{stream.name}")
                result = records.get(f"pytest-{stream.name}", {})
                counts = result.get("counts", {})
                for key in totals:
                    totals[key] += counts.get(key, 0)
                note = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
                if record and record.get("cpu_s") is not None:
                    note = f"host CPU {clock(record['cpu_s'])}" + (f"; {note}" if note else "")
                if record and record.get("exit") not in (0, None):
                    note = f"exit {record['exit']}" + (f"; {note}" if note else "")
                depth = 3 if len(stages) > 1 else 2
                row(stream.name, record["seconds"] if record else None, note, depth)
                if tier == "engine":  # the unit tier's 30 modules would drown the table
                    for module, seconds in result.get("modules", {}).items():
                        row(module, seconds, depth=depth + 1)
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
        return run_tier("fast", (FAST,), "unit")
    if args.command == "engine":
        return run_tier("engine", ENGINE, NOT_UNIT)
    if args.command == "record":
        write_record(args.name, seconds=round(args.seconds, 1))
        return 0
    print("\n".join(table_lines(read_records())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
