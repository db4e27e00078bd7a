"""`trainstack sweep ...` (infra.jobs.cli over infra.jobs.client) with a fake Sweeps in place of
infra.jobs.sweeps: the parsing and its dispatch (a sweep command or a job directory), the status
table, the list, the other commands, and the one-line errors with their exit codes."""

from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from infra.jobs import cli
from infra.jobs import client as client_mod
from infra.jobs.cli import SWEEP_RUN, parse_args, sweep_list_text, sweep_status_text
from infra.jobs.client import Client, TrainstackError
from infra.jobs.commands import EXIT_INPUT, CliError

pytestmark = pytest.mark.unit

SWEEP = "sweep-20261206-083000-ab12"
OUTPUTS = {"jobNodes": [{"name": "worker-1"}], "jobDefaults": {"stack": "dev", "slots": 2}}
DEFINITION = {
    "metric": "val_accuracy", "goal": "max", "method": "tpe", "trials": 6, "parallel": 2,
    "early_stop": "median", "min_epochs": 1, "seed": None,
    "params": [{"name": "dropout", "distribution": "uniform", "low": 0.1, "high": 0.5},
               {"name": "lr", "distribution": "loguniform", "low": 1e-4, "high": 1e-2}],
}  # fmt: skip
TRIALS = [
    {"number": 0, "job_id": f"{SWEEP}-t0", "state": "succeeded", "value": 0.9512, "epochs": 5,
     "params": {"dropout": 0.3, "lr": 0.001}, "model": f"/srv/models/{SWEEP}-t0/model.keras"},
    {"number": 1, "job_id": f"{SWEEP}-t1", "state": "pruned", "value": 0.712, "epochs": 2,
     "params": {"dropout": 0.5, "lr": 0.0123456}, "model": ""},
    {"number": 2, "job_id": f"{SWEEP}-t2", "state": "running", "value": None, "epochs": 1,
     "params": {"dropout": 0.1, "lr": 0.0003}, "model": ""},
]  # fmt: skip
BEST = {k: TRIALS[0][k] for k in ("number", "job_id", "value", "params", "model")}
RECORD = {
    "id": SWEEP, "state": "running", "node": "ts-worker-1", "submitted_at": 1796545800.0,
    "job": "/work/examples/digits", "definition": DEFINITION, "trials": TRIALS, "best": BEST,
    "error": "",
}  # fmt: skip


class FakeSweeps:
    """infra.jobs.sweeps.Sweeps over records kept here; `calls`: what it was asked."""

    records_by_id: dict[str, dict[str, Any]] = {}
    calls: list[tuple[Any, ...]] = []
    later: list[str] = []  # the states the record has on each later read (the last one stays)
    output = b""

    def __init__(self, jobs: Any) -> None:
        self.jobs = jobs

    def submit(self, directory: Path, params: dict, overrides: dict, **kw: Any) -> str:
        self.calls.append(("submit", directory, params, overrides, kw))
        return SWEEP

    def record(self, sweep_id: str) -> dict[str, Any]:
        if sweep_id not in self.records_by_id:
            raise CliError(f"no sweep {sweep_id!r} on this stack", EXIT_INPUT)
        self.calls.append(("record", sweep_id))
        record = self.records_by_id[sweep_id]
        if sum(c[0] == "record" for c in self.calls) > 1 and self.later:
            record["state"] = self.later.pop(0) if len(self.later) > 1 else self.later[0]
        return dict(record)

    def records(self) -> list[dict[str, Any]]:
        return [
            {**{k: v for k, v in r.items() if k != "trials"}, "trials_done": 2}
            for r in self.records_by_id.values()
        ]

    def cancel(self, sweep_id: str) -> dict[str, Any]:
        return {**self.record(sweep_id), "state": "cancelled"}

    def resume(self, sweep_id: str) -> dict[str, Any]:
        record = self.record(sweep_id)
        if record["state"] == "running":
            raise CliError(f"sweep {sweep_id}'s driver runs: nothing to resume", EXIT_INPUT)
        return {**record, "state": "starting"}

    def output_from(self, sweep_id: str, offset: int) -> bytes:
        return self.output[offset : offset + 16]


@pytest.fixture
def sweeps(monkeypatch: pytest.MonkeyPatch) -> type[FakeSweeps]:
    """FakeSweeps as infra.jobs.sweeps (imported on the first sweep call), a fake stack."""
    module = types.ModuleType("infra.jobs.sweeps")
    module.Sweeps = FakeSweeps  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "infra.jobs.sweeps", module)
    monkeypatch.setattr(client_mod, "stack_outputs", lambda stack: OUTPUTS)
    monkeypatch.setattr(client_mod, "Jobs", lambda outputs: object())
    monkeypatch.setattr(client_mod, "time", types.SimpleNamespace(sleep=lambda s: None))
    monkeypatch.setattr(FakeSweeps, "records_by_id", {SWEEP: json.loads(json.dumps(RECORD))})
    monkeypatch.setattr(FakeSweeps, "calls", [])
    monkeypatch.setattr(FakeSweeps, "later", [])
    return FakeSweeps


# --- parsing and dispatch ----------------------------------------------------------------------


def test_a_job_directory_after_sweep_starts_a_sweep() -> None:
    args = parse_args(["-s", "dev", "sweep", "examples/digits", "--trials", "8", "--parallel",
                       "2", "-p", "units=64", "--epochs", "3", "--priority", "1"])  # fmt: skip
    assert (args.stack, args.command, args.sweep_command) == ("dev", "sweep", SWEEP_RUN)
    assert (args.directory, args.trials, args.parallel) == (Path("examples/digits"), 8, 2)
    assert (args.param, args.epochs, args.priority, args.file) == (["units=64"], 3, 1, None)
    # Options first, and a directory named like a command given as ./status.
    assert parse_args(["--stack=dev", "sweep", "--trials", "4", "d"]).directory == Path("d")
    args = parse_args(["sweep", "./status", "--file", "s.toml"])
    assert (args.sweep_command, args.directory, args.file) == (SWEEP_RUN, Path("status"),
                                                              Path("s.toml"))  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "command", "sweep_id"),
    [
        (["sweep", "status", SWEEP, "--json"], "status", SWEEP),
        (["sweep", "status"], "status", None),
        (["-s", "dev", "sweep", "list"], "list", None),
        (["sweep", "cancel", SWEEP], "cancel", SWEEP),
        (["sweep", "resume", SWEEP], "resume", SWEEP),
        (["sweep", "logs", "-f", SWEEP], "logs", SWEEP),
    ],
)
def test_a_sweep_command_after_sweep_is_that_command(
    argv: list[str], command: str, sweep_id: str | None
) -> None:
    args = parse_args(argv)
    assert args.sweep_command == command
    assert getattr(args, "sweep_id", None) == sweep_id


def test_the_sweep_help_shows_both_forms(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        parse_args(["sweep", "--help"])
    assert raised.value.code == 0
    out = capsys.readouterr().out
    assert "trainstack sweep JOB_DIR [--file F] [--trials N]" in out
    assert "trainstack sweep {status,list,cancel,resume,logs} ..." in out
    assert "./status" in out and SWEEP_RUN not in out
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    assert "run a hyperparameter sweep" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv", [["sweep"], ["sweep", "d", "--trials", "many"], ["sweep", "logs"], ["sweep", "d", "x"]]
)
def test_bad_sweep_usage_is_argparses_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        parse_args(argv)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: trainstack") and SWEEP_RUN not in err


# --- the commands ------------------------------------------------------------------------------


def test_sweep_prints_its_id_and_passes_everything_through(
    sweeps: type[FakeSweeps], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["sweep", "examples/digits", "--file", "s.toml", "--trials", "8", "--parallel", "2",
            "-p", "units=64", "--epochs", "3", "--workers", "1", "--data", "digits",
            "--priority", "1"]  # fmt: skip
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == f"{SWEEP}\n"
    assert sweeps.calls == [
        ("submit", Path("examples/digits"), {"units": 64},
         {"epochs": 3, "workers": 1, "data": "digits"},
         {"sweep_file": Path("s.toml"), "trials": 8, "parallel": 2, "priority": 1}),
    ]  # fmt: skip
    assert cli.main(["sweep", "examples/digits", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"sweep_id": SWEEP}


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--trials", "0"], "--trials 0: a sweep runs at least 1 trial"),
        (["--parallel", "-1"], "--parallel -1: give the trials run at once, at least 1"),
        (["--epochs", "0"], "--epochs 0: must be >= 1"),
        (["-p", "lr"], "-p 'lr': expected name=value"),
    ],
)
def test_bad_sweep_arguments_are_one_sentence_and_exit_2(
    sweeps: type[FakeSweeps], capsys: pytest.CaptureFixture[str], options: list[str], said: str
) -> None:
    assert cli.main(["sweep", "examples/digits", *options]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"trainstack: error: {said}\n" and captured.out == ""
    assert sweeps.calls == []  # nothing was started


def test_the_status_table(sweeps: type[FakeSweeps], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sweep", "status", SWEEP]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"sweep {SWEEP}: running, 2 of 6 trials done, 1 running"
    assert lines[1] == (
        "  tpe search, maximize val_accuracy, 2 trials at a time, early stop median, "
        "of /work/examples/digits"
    )
    header, *rows = lines[2:6]
    assert header.split() == ["TRIAL", "JOB", "STATE", "EPOCHS", "VAL_ACCURACY", "DROPOUT", "LR"]
    assert [row.split() for row in rows] == [
        ["0", f"{SWEEP}-t0", "succeeded", "5", "0.9512", "0.3", "0.001"],
        ["1", f"{SWEEP}-t1", "pruned", "2", "0.7120", "0.5", "0.01235"],
        ["2", f"{SWEEP}-t2", "running", "1", "-", "0.1", "0.0003"],
    ]
    # The columns line up: text to the left, numbers to the right.
    start, end = header.index("DROPOUT"), header.index("VAL_ACCURACY") + len("VAL_ACCURACY")
    assert [row[start : start + 3] for row in rows] == ["0.3", "0.5", "0.1"]
    assert [row[end - 6 : end] for row in rows] == ["0.9512", "0.7120", "     -"]
    assert lines[6:] == [
        f"best: trial 0 ({SWEEP}-t0), val_accuracy 0.9512",
        '  params {"dropout": 0.3, "lr": 0.001}',
        f"  model /srv/models/{SWEEP}-t0/model.keras",
    ]


def test_status_without_trials_and_with_an_error() -> None:
    text = sweep_status_text({**RECORD, "state": "failed", "trials": [], "best": None,
                              "error": "3 trials failed ([sweep] max_failed = 3)"})  # fmt: skip
    assert text.splitlines()[2:] == [
        "no trials yet",
        "best: none yet",
        "error: 3 trials failed ([sweep] max_failed = 3)",
    ]


@pytest.mark.parametrize(("state", "code"), [("failed", 1), ("cancelled", 1), ("succeeded", 0)])
def test_status_exits_1_for_a_failed_or_cancelled_sweep(
    sweeps: type[FakeSweeps], capsys: pytest.CaptureFixture[str], state: str, code: int
) -> None:
    sweeps.records_by_id[SWEEP]["state"] = state
    assert cli.main(["sweep", "status", "--json"]) == code  # the latest sweep
    shown = json.loads(capsys.readouterr().out)
    assert (shown["id"], shown["state"], shown["trials"]) == (SWEEP, state, TRIALS)


def test_the_list(sweeps: type[FakeSweeps], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sweep", "list"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["SWEEP", "ID", "STATE", "TRIALS", "BEST", "METRIC", "SUBMITTED"]
    submitted = time.strftime("%Y-%m-%d %H:%M", time.localtime(RECORD["submitted_at"]))
    assert row.split() == [SWEEP, "running", "2/6", "0.9512", "val_accuracy", *submitted.split()]
    assert cli.main(["sweep", "list", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert "trials" not in listed and listed["trials_done"] == 2
    assert sweep_list_text([]) == "no sweeps on this stack yet"


def test_cancel_resume_and_their_errors(
    sweeps: type[FakeSweeps], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["sweep", "cancel", SWEEP]) == 0
    assert capsys.readouterr().out == f"sweep {SWEEP}: cancelled\n"
    assert cli.main(["sweep", "resume", SWEEP]) == 2  # its driver runs
    captured = capsys.readouterr()
    assert captured.err == f"trainstack: error: sweep {SWEEP}'s driver runs: nothing to resume\n"
    sweeps.records_by_id[SWEEP]["state"] = "stopped"
    assert cli.main(["sweep", "resume", SWEEP]) == 0
    assert capsys.readouterr().out == f"sweep {SWEEP}: starting\n"
    assert cli.main(["sweep", "status", "sweep-nope"]) == 2
    assert "no sweep 'sweep-nope'" in capsys.readouterr().err


@pytest.mark.parametrize(("end", "code"), [("succeeded", 0), ("failed", 1), ("stopped", 1)])
def test_logs_follow_until_the_sweep_ends(
    sweeps: type[FakeSweeps],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    end: str,
    code: int,
) -> None:
    output = b"sweep: 6 trials, 2 at once\ntrial 0 succeeded: val_accuracy 0.9512\n"
    monkeypatch.setattr(FakeSweeps, "output", output)
    monkeypatch.setattr(FakeSweeps, "later", ["running", end])
    assert cli.main(["sweep", "logs", "-f", SWEEP]) == code
    assert capsys.readouterr().out == output.decode()
    assert cli.main(["sweep", "logs", SWEEP]) == 0  # what there is, at once
    assert capsys.readouterr().out == output[:16].decode()


def test_without_the_sweeps_module_it_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "infra.jobs.sweeps", None)  # an import of it fails
    monkeypatch.setattr(client_mod, "stack_outputs", lambda stack: OUTPUTS)
    monkeypatch.setattr(client_mod, "Jobs", lambda outputs: object())
    assert cli.main(["sweep", "list"]) == 1
    assert capsys.readouterr().err == (
        "trainstack: error: this trainstack has no sweeps (infra/jobs/sweeps.py is missing)\n"
    )


# --- the Client's sweeps -----------------------------------------------------------------------


def test_the_clients_sweeps(sweeps: type[FakeSweeps]) -> None:
    c = Client("dev")
    assert c.sweep("examples/digits", trials=4, params={"units": 64}, epochs=2) == SWEEP
    assert sweeps.calls[-1] == (
        "submit", Path("examples/digits"), {"units": 64}, {"epochs": 2},
        {"sweep_file": None, "trials": 4, "parallel": None, "priority": 0},
    )  # fmt: skip
    assert [s["id"] for s in c.sweeps()] == [SWEEP]
    assert c.sweep_status(SWEEP)["best"] == BEST
    assert c.sweep_cancel(SWEEP)["state"] == "cancelled"
    sweeps.later[:] = ["running", "succeeded"]
    assert c.sweep_wait(SWEEP)["state"] == "succeeded"
    with pytest.raises(TrainstackError) as raised:
        c.sweep("examples/digits", trials=0)
    assert raised.value.code == EXIT_INPUT


def test_sweep_wait_stops_at_a_stopped_driver(sweeps: type[FakeSweeps]) -> None:
    sweeps.later[:] = ["running", "stopped"]
    with pytest.raises(TrainstackError) as raised:
        Client().sweep_wait(SWEEP)
    assert raised.value.code == 1
    assert str(raised.value) == (
        f"sweep {SWEEP} stopped: its driver no longer runs (resume it: "
        f"`trainstack sweep resume {SWEEP}`)"
    )
