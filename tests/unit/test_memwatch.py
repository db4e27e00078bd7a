"""A rank's memory record (trainstack_training.memwatch) with real processes: a rank that
allocates and then exits, is SIGKILLed, or is SIGKILLed as its cgroup counts an OOM kill
(a cgroup of files in a temporary directory: the test writes `oom_kill`, as the kernel would);
its watcher never outlives it; the job's error sentence built from the records; the launcher's
choice of that sentence over Spark's text."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from trainstack_training import memwatch
from trainstack_training.config import TrainConfig
from trainstack_training.context import record_error
from trainstack_training.data import DataInfo
from trainstack_training.launcher import JobCodeError, RankMemoryError, TrainingError, run_barrier
from trainstack_training.manifest import JobSpec
from trainstack_training.memwatch import (
    ADVICE,
    cgroup_of,
    killed_for_memory,
    memory_failure,
    read_records,
)
from trainstack_training.rundir import ATTEMPTS_LOG

pytestmark = pytest.mark.unit

GIB = 1024**3
ALLOCATE = "blob = b'x' * (120 << 20)  # 120 MiB, every page written\ntime.sleep(0.4)\n"


def fake_cgroup(root: Path, limit: str = str(GIB), kills: int = 0) -> Path:
    """A cgroup v2 directory of files: what the watcher reads of /sys/fs/cgroup."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "memory.max").write_text(f"{limit}\n")
    (root / "memory.events").write_text(f"low 0\nhigh 0\nmax 4\noom 1\noom_kill {kills}\n")
    return root


def rank_process(tmp_path: Path, body: str, **watch: Any) -> tuple[int, int, int]:
    """A rank (rank 1, attempt 2, on wrk-9) that runs `body` under MemoryWatch; its exit
    code, its pid and its watcher's pid."""
    code = textwrap.dedent(
        """
        import os, signal, sys, time
        from pathlib import Path
        from trainstack_training.memwatch import MemoryWatch
        settings = eval(sys.argv[2])
        with MemoryWatch(Path(sys.argv[1]), 1, 2, "wrk-9", poll=0.1, **settings) as watch:
            print(os.getpid(), watch.process.pid, flush=True)
        {body}
        """
    ).format(body=textwrap.indent(body, "    "))
    settings = "{" + ", ".join(f"{k!r}: Path({str(v)!r})" for k, v in watch.items()) + "}"
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), settings],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    rank, watcher = map(int, proc.stdout.split())
    return proc.returncode, rank, watcher


def record_of(tmp_path: Path) -> dict[str, Any]:
    """The rank's one record, once its watcher has written it."""
    path = tmp_path / "rank-1.memory.jsonl"
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    (record,) = read_records(tmp_path)
    return record


def gone(pid: int, within: float = 5.0) -> bool:
    """Whether process `pid` has ended (a zombie waiting for its reaper counts as ended)."""
    deadline = time.monotonic() + within
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def test_a_rank_that_exits_leaves_its_peak_and_the_limit(tmp_path):
    cgroup = fake_cgroup(tmp_path / "cgroup")
    rc, rank, watcher = rank_process(tmp_path, ALLOCATE, cgroup_root=cgroup)
    assert rc == 0
    record = record_of(tmp_path)
    assert record["peak_mb"] >= 120, record
    assert {k: record[k] for k in ("rank", "attempt", "host", "pid", "ended")} == {
        "rank": 1, "attempt": 2, "host": "wrk-9", "pid": rank, "ended": "exited",
    }  # fmt: skip
    assert (record["limit_mb"], record["limit_source"]) == (1024.0, "cgroup")
    assert record["oom_kills_during"] == 0 and not killed_for_memory(record)
    assert gone(watcher, within=0)  # the rank waited for it


def test_a_sigkilled_rank_is_recorded_by_its_watcher_which_then_ends(tmp_path):
    cgroup = fake_cgroup(tmp_path / "cgroup")
    rc, _, watcher = rank_process(
        tmp_path, ALLOCATE + "os.kill(os.getpid(), signal.SIGKILL)\n", cgroup_root=cgroup
    )
    assert rc == -9
    record = record_of(tmp_path)
    assert record["ended"] == "killed" and record["peak_mb"] >= 120, record
    assert record["oom_kills_during"] == 0 and not killed_for_memory(record)
    assert memory_failure(tmp_path) is None  # a kill, but not for memory: Spark's error stays
    assert gone(watcher)


def test_a_rank_killed_as_its_cgroup_counts_an_oom_kill_is_named(tmp_path):
    cgroup = fake_cgroup(tmp_path / "cgroup")
    oom = (
        f"Path({str(cgroup / 'memory.events')!r}).write_text('oom 1\\noom_kill 1\\n')\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    rc, _, watcher = rank_process(tmp_path, ALLOCATE + oom, cgroup_root=cgroup)
    assert rc == -9 and gone(watcher)
    record = record_of(tmp_path)
    assert (record["oom_kills_during"], record["oom_kills_survived"]) == (1, 0), record
    assert killed_for_memory(record)
    peak = f"{record['peak_mb']:.0f} MiB"
    assert memory_failure(tmp_path) == (
        f"rank 1 on wrk-9 was killed for memory: its peak was {peak} of the container's "
        f"1.0 GiB limit (attempt 2); {ADVICE}"
    )


def test_an_oom_kill_the_rank_outlived_was_another_process(tmp_path):
    cgroup = fake_cgroup(tmp_path / "cgroup")
    later = (
        f"Path({str(cgroup / 'memory.events')!r}).write_text('oom_kill 1\\n')\n"
        f"time.sleep({memwatch.SURVIVE_SECONDS + 0.5})\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    rc, _, _ = rank_process(tmp_path, later, cgroup_root=cgroup)
    assert rc == -9
    record = record_of(tmp_path)
    assert (record["oom_kills_during"], record["oom_kills_survived"]) == (1, 1), record
    assert not killed_for_memory(record) and memory_failure(tmp_path) is None


def test_no_proc_and_no_cgroup_files_still_give_a_record_and_a_working_rank(tmp_path):
    rc, rank, _ = rank_process(
        tmp_path, ALLOCATE, cgroup_root=tmp_path / "no-cgroup", proc=tmp_path / "no-proc"
    )
    assert rc == 0
    record = record_of(tmp_path)
    assert record["pid"] == rank and record["ended"] == "exited"
    assert record["peak_mb"] is None and record["limit_mb"] is None
    assert record["oom_kills_during"] is None and record["limit_source"] == ""


def test_the_limit_is_the_smallest_of_the_cgroups_above_the_process_else_the_machines(
    tmp_path,
):
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:        8388608 kB\nMemFree: 1 kB\n")
    # cgroup v2, the limit set on the pod, the OOM kills counted in the process's own cgroup
    (proc / "7" / "cgroup").write_text("0::/kubepods/pod1/c1\n")
    v2 = tmp_path / "v2"
    fake_cgroup(v2 / "kubepods" / "pod1", limit=str(2 * GIB))
    fake_cgroup(v2 / "kubepods" / "pod1" / "c1", limit="max", kills=3)
    group = cgroup_of(7, v2, proc)
    assert (group.limit_bytes, group.limit_source, group.oom_kills()) == (2 * GIB, "cgroup", 3)
    # cgroup v1: memory.limit_in_bytes and memory.oom_control; its "no limit" is a huge number
    (proc / "7" / "cgroup").write_text("4:memory:/docker/abc\n0::/\n")
    own = tmp_path / "v1" / "memory" / "docker" / "abc"
    own.mkdir(parents=True)
    (own / "memory.limit_in_bytes").write_text(f"{GIB}\n")
    (own / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    group = cgroup_of(7, tmp_path / "v1", proc)
    assert (group.limit_bytes, group.limit_source, group.oom_kills()) == (GIB, "cgroup", 2)
    (own / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    group = cgroup_of(7, tmp_path / "v1", proc)
    assert (group.limit_bytes, group.limit_source) == (8 * GIB, "machine")
    # no cgroup files at all; a limit above the machine's memory is the machine's
    group = cgroup_of(7, tmp_path / "none", proc)
    assert (group.limit_bytes, group.limit_source, group.oom_kills()) == (8 * GIB, "machine", None)
    (proc / "7" / "cgroup").write_text("0::/\n")
    group = cgroup_of(7, fake_cgroup(tmp_path / "big", limit=str(64 * GIB)), proc)
    assert (group.limit_bytes, group.limit_source) == (8 * GIB, "machine")


def write_records(run_dir: Path, *records: dict[str, Any]) -> None:
    for r in records:
        base = {"pid": 1, "limit_source": "cgroup", "oom_kills_survived": 0, "ended": "killed"}
        with (run_dir / f"rank-{r['rank']}.memory.jsonl").open("a") as fh:
            fh.write(json.dumps({**base, **r}) + "\n")


def oom(rank: int, host: str, attempt: int, peak: float, ended_at: float = 0.0) -> dict[str, Any]:
    return {"rank": rank, "host": host, "attempt": attempt, "peak_mb": peak,
            "limit_mb": 2048.0, "oom_kills_during": 1, "ended_at": ended_at}  # fmt: skip


def test_the_sentence_names_every_rank_killed_for_memory_in_the_latest_attempt(tmp_path):
    write_records(
        tmp_path,
        oom(1, "wrk-2", 1, 1900.0),
        oom(1, "wrk-2", 2, 1900.0),
        oom(0, "wrk-1", 3, 1945.6),
        oom(1, "wrk-2", 3, 1843.2),
        {
            "rank": 1,
            "host": "wrk-2",
            "attempt": 4,
            "peak_mb": 900.0,
            "limit_mb": 2048.0,
            "oom_kills_during": 0,
            "ended": "exited",
        },
    )
    assert memory_failure(tmp_path) == (
        "ranks 0 on wrk-1 and 1 on wrk-2 were killed for memory: their peaks were 1.9 GiB and "
        f"1.8 GiB of the containers' 2.0 GiB limit (attempt 3; also in attempts 1 and 2); {ADVICE}"
    )
    assert memory_failure(tmp_path, in_attempt=4) is None  # the last attempt ended otherwise
    assert memory_failure(tmp_path, in_attempt=3) == memory_failure(tmp_path)


def test_a_peer_ended_by_spark_after_the_oom_kill_in_its_container_is_not_named(tmp_path):
    # Both ranks on wrk-2, one OOM kill counted: the rank that ended first was its victim.
    write_records(tmp_path, oom(0, "wrk-2", 1, 300.0, ended_at=11.0), oom(1, "wrk-2", 1, 1945.6))
    (victim,) = [r for r in read_records(tmp_path) if r["rank"] == 1]
    assert memory_failure(tmp_path) == (
        "rank 1 on wrk-2 was killed for memory: its peak was 1.9 GiB of the container's 2.0 GiB "
        f"limit (attempt 1); {ADVICE}"
    )
    assert killed_for_memory(victim)


def test_no_sentence_without_an_oom_kill_the_rank_did_not_outlive(tmp_path):
    write_records(
        tmp_path,
        {**oom(0, "wrk-1", 1, 500.0), "oom_kills_during": 0},  # a plain SIGKILL
        {**oom(1, "wrk-2", 1, 500.0), "ended": "exited"},  # its task ended by itself
        {**oom(2, "wrk-3", 1, 500.0), "oom_kills_survived": 1},  # another process was killed
    )
    (tmp_path / "rank-3.memory.jsonl").write_text("{half a line\n")
    assert memory_failure(tmp_path) is None
    assert len(read_records(tmp_path)) == 3


class _FailedStage:
    """What run_barrier calls of a SparkContext, whose barrier stage fails with `text`."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __getattr__(self, name: str) -> Any:
        if name == "collect":
            return self.fail
        return lambda *args, **kwargs: self

    def fail(self) -> None:
        raise RuntimeError(self.text)


SPARK = (
    "An error occurred while calling o91.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Stage failed "
    "because barrier task ShuffleMapTask(10, 1) finished unsuccessfully.\n"
    "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed)"
)
INFO = DataInfo("t", "v", 4, 1, ["a", "b", "c", "d"], [50, 50], 20, 120, 0.5)
SPEC = JobSpec(directory="/j", entry="m", entry_file="m.py", mode="full", has_datasets=False)


def barrier_error(tmp_path: Path) -> BaseException:
    cfg = TrainConfig(workers=2, output=str(tmp_path), max_attempts=2)
    with pytest.raises(TrainingError) as caught:
        run_barrier(_FailedStage(SPARK), cfg, INFO, SPEC)  # type: ignore[arg-type]
    return caught.value


def test_the_job_fails_with_the_memory_sentence_and_spark_s_text_goes_to_the_log(tmp_path, capsys):
    (tmp_path / ATTEMPTS_LOG).write_text("1 wrk-1\n2 wrk-1\n")
    write_records(
        tmp_path, oom(0, "wrk-1", 2, 700.0), {**oom(1, "wrk-2", 2, 1945.6), "ended_at": 9.0}
    )
    record_error(tmp_path, "your code failed: DistBackendError: Connection closed by peer", 0)
    error = barrier_error(tmp_path)
    assert isinstance(error, RankMemoryError)
    assert str(error) == memory_failure(tmp_path)
    assert str(error).startswith("ranks 0 on wrk-1 and 1 on wrk-2 were killed for memory")
    assert error.__cause__ is None and error.__suppress_context__
    assert "ShuffleMapTask(10, 1) finished unsuccessfully" in capsys.readouterr().err


def test_without_an_oom_kill_the_error_is_as_before(tmp_path):
    (tmp_path / ATTEMPTS_LOG).write_text("1 wrk-1\n2 wrk-1\n")
    write_records(tmp_path, {**oom(1, "wrk-2", 2, 500.0), "oom_kills_during": 0})
    write_records(tmp_path, {**oom(0, "wrk-1", 2, 500.0), "ended": "exited"})
    error = barrier_error(tmp_path)
    assert type(error) is TrainingError
    assert str(error).startswith("training failed after 2 barrier-stage attempt(s)")
    assert str(error).endswith("Spark: : org.apache.spark.SparkException: Job aborted due to "
                               "stage failure: Stage failed because barrier task "
                               "ShuffleMapTask(10, 1) finished unsuccessfully.")  # fmt: skip
    # An OOM kill in an earlier attempt only, and the job's code raised since: its error.
    write_records(tmp_path, oom(1, "wrk-2", 1, 1945.6))
    record_error(tmp_path, "your code failed: KeyError: 'width' (at net.py:2)", 0)
    error = barrier_error(tmp_path)
    assert isinstance(error, JobCodeError) and "KeyError" in str(error)
