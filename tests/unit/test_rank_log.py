"""A rank's own log (`trainstack logs --rank N`): real processes write to their descriptors 1
and 2 (Python, C-level writes, a child process, a rank stuck and ended by the watchdog); the
rank's log gets it all and the executor's stderr still does."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infra.jobs.commands import CliError, check_rank

pytestmark = pytest.mark.unit


def rank_process(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    """A process that runs `body` inside RankLog(tmp_path, rank 1, attempt 2), as a task does."""
    code = textwrap.dedent(
        """
        import os, subprocess, sys
        from pathlib import Path
        from trainstack_training.ranklog import RankLog
        print("before the rank", flush=True)
        with RankLog(Path(sys.argv[1]), 1, 2, "worker-9"):
        {body}
        print("after the rank", flush=True)
        """
    ).format(body=textwrap.indent(textwrap.dedent(body), "    "))
    return subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_everything_the_rank_writes_reaches_its_log_and_the_executor_log(tmp_path):
    proc = rank_process(
        tmp_path,
        """
        print("python stdout")
        print("python stderr", file=sys.stderr)
        os.write(1, b"c-level fd 1\\n")
        os.write(2, b"c-level fd 2\\n")
        subprocess.run(["sh", "-c", "echo from a child"], check=True)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "rank-1.log").read_text()
    assert log.startswith("--- rank 1, attempt 2, on worker-9, ")
    for line in ("python stdout", "python stderr", "c-level fd 1", "c-level fd 2", "from a child"):
        assert line in log, log
        assert line in proc.stderr, proc.stderr  # the executor's log keeps it too
    assert "before the rank" not in log and "after the rank" not in log
    assert "after the rank" in proc.stdout  # descriptor 1 is the process's own again


def test_a_retried_attempt_appends_under_its_own_header(tmp_path):
    (tmp_path / "rank-1.log").write_text("--- rank 1, attempt 1, on worker-8 ---\nfirst try\n")
    proc = rank_process(tmp_path, 'print("second try")')
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "rank-1.log").read_text()
    assert log.index("first try") < log.index("attempt 2") < log.index("second try")


def test_a_rank_ended_by_the_watchdog_leaves_its_last_words_in_the_log(tmp_path):
    proc = rank_process(
        tmp_path,
        """
        from trainstack_training.watchdog import exit_rank
        print("stuck in my code")
        exit_rank("no progress for 1 s on rank 1")
        """,
    )
    assert proc.returncode == 1
    log = (tmp_path / "rank-1.log").read_text()
    assert "stuck in my code" in log
    assert "trainstack: no progress for 1 s on rank 1" in log
    assert "Current thread" in log or "Thread 0x" in log  # faulthandler's stacks


def test_a_run_directory_that_cannot_be_written_does_not_fail_the_rank(tmp_path):
    proc = rank_process(tmp_path / "absent", 'print("trained anyway")')
    assert proc.returncode == 0, proc.stderr
    assert "trained anyway" in proc.stdout
    assert "trainstack: no rank log at" in proc.stderr


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_the_job_has_is_accepted(rank):
    check_rank({"id": "job-1", "workers": 2}, rank)


@pytest.mark.parametrize(
    ("rank", "message"),
    [
        (2, "--rank 2: job job-1 has 2 TensorFlow worker(s), ranks 0-1"),
        (-1, "--rank -1: job job-1 has 2 TensorFlow worker(s), ranks 0-1"),
    ],
)
def test_a_rank_the_job_does_not_have_is_refused_by_number(rank, message):
    with pytest.raises(CliError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        check_rank({"id": "job-1", "workers": 2}, rank)
