"""The job API from Python (infra.jobs.client.Client, `from trainstack import Client`) and the
`trainstack` job commands over it, with a fake stack: its outputs and its Jobs (the records,
the output files) stand in for `pulumi stack output` and the nodes."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.jobs import cli
from infra.jobs import client as client_mod
from infra.jobs.client import Client, TrainstackError
from infra.jobs.commands import EXIT_INPUT, EXIT_UNREACHABLE, CliError
from infra.transport import TransportError

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
JOB = "job-20261206-083000-ab12"
OUTPUTS = {"jobNodes": [{"name": "worker-1"}], "jobDefaults": {"stack": "dev", "slots": 2}}
BEAT = 9e12  # a heartbeat in the future: never `lost`


class FakeJobs:
    """infra.jobs.commands.Jobs over records and output files kept here. `states`: the states
    a job's record has on each read after the first (the last one stays)."""

    def __init__(self, outputs: dict[str, Any]) -> None:
        self.defaults = dict(outputs["jobDefaults"])
        self.tracking_setup = dict(outputs.get("tracking") or {})
        self.submitted: list[tuple[Any, ...]] = []
        self.jobs: dict[str, dict[str, Any]] = {}
        self.states: dict[str, list[str]] = {}
        self.output: dict[str, bytes] = {}
        self.chunk = 1 << 20  # output_from's most bytes a read
        self.reads = 0

    def add(self, state: str, *later: str, job: str = JOB, output: bytes = b"") -> None:
        self.jobs[job] = {"id": job, "state": state, "heartbeat": BEAT, "workers": 1,
                          "params": {}, "submitted_at": 1.0}  # fmt: skip
        self.states[job] = list(later)
        self.output[job] = output

    def any_node(self) -> str:
        return "worker-1"

    def submit(self, directory: Path, params: dict, overrides: dict, priority: int = 0) -> str:
        self.submitted.append((directory, params, overrides, priority))
        return JOB

    def record(self, job_id: str, node: Any = None) -> dict[str, Any]:
        if job_id not in self.jobs:
            raise CliError(f"no job {job_id!r} on this stack", EXIT_INPUT)
        self.reads += 1
        if self.reads > 1 and self.states[job_id]:
            state = self.states[job_id].pop(0) if len(self.states[job_id]) > 1 else (
                self.states[job_id][0]
            )  # fmt: skip
            self.jobs[job_id]["state"] = state
        return dict(self.jobs[job_id])

    def tracking(self, job_id: str, node: Any = None) -> dict[str, Any]:
        return {}

    def records(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.jobs.values()]

    def cancel(self, job_id: str) -> dict[str, Any]:
        self.record(job_id)
        self.jobs[job_id]["state"] = "cancelled"
        return dict(self.jobs[job_id])

    def output_from(self, job_id: str, offset: int, node: Any, rank: int | None = None) -> bytes:
        return self.output[job_id][offset : offset + self.chunk]

    def sync(self, job_id: str) -> dict[str, Any]:
        return {"synced": [{"job_id": job_id, "skipped": True}]}


class Clock:
    """time for infra.jobs.client: monotonic() moves only by sleep()."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def stack(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The fake stack: `jobs` (the FakeJobs the next Client gets), `asked` (the stacks whose
    outputs were read), `clock`."""
    made: dict[str, Any] = {"asked": [], "clock": Clock()}
    jobs = FakeJobs(OUTPUTS)
    made["jobs"] = jobs

    def outputs(name: str | None) -> dict[str, Any]:
        made["asked"].append(name)
        return OUTPUTS

    monkeypatch.setattr(client_mod, "stack_outputs", outputs)
    monkeypatch.setattr(client_mod, "Jobs", lambda outputs: jobs)
    monkeypatch.setattr(client_mod, "time", made["clock"])
    return made


# --- the Client --------------------------------------------------------------------------------


def test_submit_passes_params_and_overrides_through(stack: dict[str, Any]) -> None:
    c = Client(stack="dev")
    assert stack["asked"] == []  # nothing read before it is needed
    job = c.submit(
        "examples/digits", params={"dropout": 0.3}, epochs=5, workers=1, priority=3,
        data="s3://trainstack/t.parquet", data_stream="on",
    )  # fmt: skip
    assert job == JOB
    assert stack["jobs"].submitted == [
        (
            Path("examples/digits"),
            {"dropout": 0.3},
            {"epochs": 5, "workers": 1, "data": "s3a://trainstack/t.parquet", "data_stream": "on"},
            3,
        )
    ]
    c.submit(Path("examples/digits"))
    assert stack["jobs"].submitted[-1] == (Path("examples/digits"), {}, {}, 0)
    assert stack["asked"] == ["dev"]  # once per Client


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"epochs": 0}, "--epochs 0: must be >= 1"),
        ({"epochs": "5"}, "--epochs '5': give a whole number"),
        ({"workers": 1.5}, "--workers 1.5: give a whole number"),
        ({"data": "data/t.csv"}, "--data 'data/t.csv': give digits"),
        ({"data_stream": "sometimes"}, "--data-stream 'sometimes': give auto, on or off"),
    ],
)
def test_bad_arguments_are_one_sentence_before_the_stack_is_read(
    stack: dict[str, Any], kwargs: dict[str, Any], said: str
) -> None:
    with pytest.raises(TrainstackError) as raised:
        Client("dev").submit("examples/digits", **kwargs)
    assert raised.value.code == EXIT_INPUT and str(raised.value).startswith(said)
    assert stack["asked"] == [] and stack["jobs"].submitted == []


def test_wait_polls_with_a_growing_interval_until_the_job_ends(stack: dict[str, Any]) -> None:
    stack["jobs"].add("queued", "running", "running", "running", "succeeded")
    done = Client().wait(JOB, poll=2.0)
    assert done["state"] == "succeeded" and done["id"] == JOB
    assert stack["clock"].slept == [2.0, 3.0, 4.5, 6.75]
    assert stack["asked"] == [None]  # the selected stack


def test_wait_polls_at_most_every_max_poll_seconds(stack: dict[str, Any]) -> None:
    stack["jobs"].add("running", *["running"] * 12, "failed")
    assert Client().wait(JOB, poll=2.0)["state"] == "failed"  # final, whichever way it ended
    assert max(stack["clock"].slept) == client_mod.MAX_POLL_SECONDS


def test_wait_times_out_naming_the_job_and_its_state(stack: dict[str, Any]) -> None:
    stack["jobs"].add("queued", "running")
    with pytest.raises(TimeoutError) as raised:
        Client().wait(JOB, timeout=10, poll=2.0)
    assert str(raised.value) == f"job {JOB} is still running after 10 s"
    assert sum(stack["clock"].slept) == pytest.approx(10.0)  # never sleeps past the deadline


def test_errors_are_trainstack_errors_with_the_exit_code(
    stack: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Client()
    with pytest.raises(TrainstackError) as raised:
        c.status("job-nope")
    assert raised.value.code == EXIT_INPUT and "no job 'job-nope'" in str(raised.value)

    def unreachable() -> list[dict[str, Any]]:
        raise TransportError("worker-1: connection refused")

    monkeypatch.setattr(stack["jobs"], "records", unreachable)
    with pytest.raises(TrainstackError) as raised:
        c.jobs()
    assert raised.value.code == EXIT_UNREACHABLE and "connection refused" in str(raised.value)
    copy = pickle.loads(pickle.dumps(raised.value))
    assert (str(copy), copy.code) == (str(raised.value), EXIT_UNREACHABLE)


def test_a_stack_without_outputs_is_a_trainstack_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def outputs(name: str | None) -> dict[str, Any]:
        raise CliError("cannot read the stack's outputs (no stack named 'nope')", 3)

    monkeypatch.setattr(client_mod, "stack_outputs", outputs)
    with pytest.raises(TrainstackError) as raised:
        Client("nope").jobs()
    assert raised.value.code == 3 and "no stack named 'nope'" in str(raised.value)
    assert isinstance(raised.value, Exception) and not isinstance(raised.value, CliError)


def test_status_is_the_json_view_and_defaults_to_the_latest_job(stack: dict[str, Any]) -> None:
    c = Client()
    with pytest.raises(TrainstackError, match="no jobs on this stack yet"):
        c.status()
    stack["jobs"].add("running")
    stack["jobs"].jobs[JOB]["heartbeat"] = 1.0  # its runner stopped beating long ago
    assert c.status()["state"] == "running (lost: no heartbeat for 30 s)"
    assert c.record(JOB)["state"] == "running"


def test_logs_follow_and_cancel(stack: dict[str, Any]) -> None:
    text = "epoch 1 loss 0.5\nepoch 2 loss 0.4 € é\nlast words"
    stack["jobs"].add("running", "running", "succeeded", output=text.encode())
    stack["jobs"].chunk = 7  # splits the lines, and € and é, across reads
    c = Client()
    assert c.logs(JOB) == text[:7]  # what was there at the one read
    assert list(c.follow(JOB)) == text.split("\n")
    with pytest.raises(TrainstackError) as raised:
        c.logs(JOB, rank=3)
    assert raised.value.code == EXIT_INPUT and "--rank 3" in str(raised.value)
    assert c.cancel(JOB)["state"] == "cancelled"
    assert [r["id"] for r in c.jobs()] == [JOB]


def test_sync_names_an_unknown_job(stack: dict[str, Any]) -> None:
    with pytest.raises(TrainstackError) as raised:
        Client().sync("job-nope")
    assert raised.value.code == EXIT_INPUT
    stack["jobs"].add("succeeded")
    assert Client().sync(JOB) == {"synced": [{"job_id": JOB, "skipped": True}]}


def test_the_import_users_write() -> None:
    import trainstack

    assert trainstack.Client is Client and trainstack.TrainstackError is TrainstackError
    with pytest.raises(AttributeError):
        _ = trainstack.Jobs
    # Importing the package loads nothing of the client until a name is used.
    script = (
        "import sys, trainstack; assert 'infra.jobs.client' not in sys.modules; "
        "from trainstack import Client, TrainstackError; print(Client.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout  # fmt: skip
    assert out.strip() == "infra.jobs.client"


# --- the job commands over the Client: output and exit codes as before -------------------------


def test_submit_prints_the_job_id(stack: dict[str, Any], capsys: pytest.CaptureFixture) -> None:
    argv = ["-s", "dev", "submit", "examples/digits", "-p", "dropout=0.3", "--epochs", "5"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == f"{JOB}\n"
    assert stack["jobs"].submitted == [
        (Path("examples/digits"), {"dropout": 0.3}, {"epochs": 5}, 0)
    ]
    assert cli.main(["submit", "examples/digits", "--json"]) == 0
    assert capsys.readouterr().out == f'{{"job_id": "{JOB}"}}\n'


def test_status_of_a_failed_job_exits_1(
    stack: dict[str, Any], capsys: pytest.CaptureFixture
) -> None:
    stack["jobs"].add("failed")
    assert cli.main(["status", JOB]) == 1
    assert capsys.readouterr().out.startswith(f"job {JOB}: failed\n")
    assert cli.main(["status", "--json"]) == 1
    assert '"state": "failed"' in capsys.readouterr().out


def test_logs_follow_exits_with_the_jobs_end(
    stack: dict[str, Any], capsys: pytest.CaptureFixture
) -> None:
    stack["jobs"].add("running", "running", "cancelled", output=b"epoch 1\n")
    assert cli.main(["logs", "-f", JOB]) == 1
    assert capsys.readouterr().out == "epoch 1\n"
    assert cli.main(["logs", JOB]) == 0
    assert cli.main(["cancel", JOB]) == 0
    assert capsys.readouterr().out == f"epoch 1\njob {JOB}: cancelled\n"


def test_failures_are_one_line_and_their_exit_code(
    stack: dict[str, Any], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli.main(["status", "job-nope"]) == 2
    assert capsys.readouterr().err == (
        "trainstack: error: no job 'job-nope' on this stack\n"
    )  # fmt: skip
    assert cli.main(["submit", "examples/digits", "--epochs", "0"]) == 2
    assert capsys.readouterr().err == "trainstack: error: --epochs 0: must be >= 1\n"

    def outputs(name: str | None) -> dict[str, Any]:
        raise CliError("cannot read the stack's outputs (pulumi failed)", EXIT_UNREACHABLE)

    monkeypatch.setattr(client_mod, "stack_outputs", outputs)
    # The stack first, as before the Client: unreachable is exit 3 even with a bad argument.
    assert cli.main(["submit", "examples/digits", "--epochs", "0"]) == 3
    assert "pulumi failed" in capsys.readouterr().err


def test_the_client_returns_typed_records() -> None:
    """Each record a method returns has a type that names its fields (infra.jobs.records),
    importable from `trainstack` as the client is."""
    import typing

    from trainstack import Client, JobRecord, SweepRecord, Trial

    hints = {name: typing.get_type_hints(getattr(Client, name))["return"] for name in (
        "status", "wait", "cancel", "record", "sweep_status", "sweep_wait", "sweep_cancel",
        "sweep_resume",
    )}  # fmt: skip
    assert hints == {
        "status": JobRecord, "wait": JobRecord, "cancel": JobRecord, "record": JobRecord,
        "sweep_status": SweepRecord, "sweep_wait": SweepRecord, "sweep_cancel": SweepRecord,
        "sweep_resume": SweepRecord,
    }  # fmt: skip
    assert typing.get_type_hints(Client.jobs)["return"] == list[JobRecord]
    assert typing.get_type_hints(Client.sweeps)["return"] == list[SweepRecord]
    assert typing.get_type_hints(SweepRecord)["trials"] == list[Trial]
    assert {"id", "state", "params", "result", "sweep", "trial"} <= set(JobRecord.__annotations__)
