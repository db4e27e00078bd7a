"""The job API from Python: what the `trainstack` command does, without a shell.

    from trainstack import Client

    c = Client(stack="dev")                       # None: the selected Pulumi stack
    job = c.submit("examples/digits", params={"dropout": 0.3}, epochs=5)
    c.wait(job)                                   # the record once it ended
    print(c.logs(job))

Every method raises `TrainstackError` (its `code` is the exit code the CLI ends with:
infra/jobs/cli.py) on a failure the CLI reports in one sentence; infra.jobs.cli is a thin
layer over this class. The stack's outputs are read on first use, once per Client (and Pulumi
is asked once per state of the stack: infra.jobs.outputs_cache).

Sweeps (infra.jobs.sweeps) are imported on first use of a sweep method.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from trainstack_training.rundir import FINAL_STATES

from infra.jobs.commands import (
    EXIT_FAILED,
    EXIT_INPUT,
    EXIT_UNREACHABLE,
    LOG_POLL_SECONDS,
    CliError,
    Jobs,
    check_rank,
    stack_outputs,
)
from infra.jobs.records import JobRecord, SweepRecord
from infra.jobs.show import shown_state
from infra.transport import TransportError

if TYPE_CHECKING:
    from infra.jobs.sweeps import Sweeps

# wait()'s polls start at its `poll` and grow by this factor up to MAX_POLL_SECONDS (or `poll`
# when that is longer).
POLL_BACKOFF = 1.5
MAX_POLL_SECONDS = 15.0
DATA_STREAMS = ("auto", "on", "off")
# A sweep's driver that no longer beats: infra.jobs.sweeps shows its sweep so (not final:
# `sweep resume` starts the driver again).
SWEEP_STOPPED = "stopped"


class TrainstackError(Exception):
    """A failure the CLI reports in one sentence: `message`, and `code`, its exit code
    (1 failed, 2 bad input, 3 the stack cannot be reached)."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message, code)  # both in args: a pickled copy keeps the code
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return self.message


@contextmanager
def _errors() -> Iterator[None]:
    """CliError (infra.jobs.commands) and an unreachable node as TrainstackError."""
    try:
        yield
    except CliError as exc:
        raise TrainstackError(str(exc), exc.code) from None
    except TransportError as exc:
        raise TrainstackError(str(exc), EXIT_UNREACHABLE) from None


def checked_data(value: str) -> str:
    """--data, checked: what the cluster reads as it is (a path here means nothing there).
    Raises CliError."""
    from trainstack_training.config import OWN_DATA
    from trainstack_training.manifest import DATA_SCHEMES, read_where_it_is

    if value.startswith("s3://"):  # the object store's data, as the nodes' Spark reads it
        value = "s3a://" + value.removeprefix("s3://")
    if read_where_it_is(value):
        return value
    if value == OWN_DATA:
        raise CliError(
            '--data none: a job says it reads its own data in its manifest (data = "none" in '
            "[job], full mode), not on the command line",
            EXIT_INPUT,
        )
    raise CliError(
        f"--data {value!r}: give digits, an absolute path on the cluster's storage, or a URL "
        f"({', '.join(s[:-3] for s in DATA_SCHEMES)}); data inside your job directory is named "
        "by the manifest's data",
        EXIT_INPUT,
    )


def _whole(flag: str, value: Any, least: int | None = None) -> int:
    """An int option (not a bool), at least `least`: else one sentence naming it."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TrainstackError(f"{flag} {value!r}: give a whole number", EXIT_INPUT)
    if least is not None and value < least:
        raise TrainstackError(f"{flag} {value}: must be >= {least}", EXIT_INPUT)
    return value


def training_overrides(
    *,
    epochs: int | None = None,
    workers: int | None = None,
    data: str | None = None,
    data_stream: str | None = None,
) -> dict[str, Any]:
    """What a job (or a sweep's trials) trains with over the stack's defaults, checked as
    `submit` checks --epochs, --workers, --data and --data-stream."""
    overrides: dict[str, Any] = {}
    if epochs is not None:
        overrides["epochs"] = _whole("--epochs", epochs, 1)
    if workers is not None:  # its range is the cluster's: Jobs.check_workers
        overrides["workers"] = _whole("--workers", workers)
    if data is not None:
        with _errors():
            overrides["data"] = checked_data(str(data))
    if data_stream is not None:
        if data_stream not in DATA_STREAMS:
            raise TrainstackError(
                f"--data-stream {data_stream!r}: give auto, on or off", EXIT_INPUT
            )
        overrides["data_stream"] = data_stream
    return overrides


def status_view(record: dict[str, Any]) -> dict[str, Any]:
    """A job's record as `status --json` shows it: its state with a note when its runner
    stopped beating."""
    return {**record, "state": shown_state(record)}


def _stream(
    read: Callable[[int], bytes],
    state: str,
    next_state: Callable[[], str],
    follow: bool,
    ends: Sequence[str] = FINAL_STATES,
) -> Generator[str, None, str]:
    """An output file's text from its start, chunk by chunk; following, until `state` (then
    next_state()'s) is one of `ends` and nothing more came. Returns that state ("" when not
    following)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offset = 0
    while True:
        chunk = read(offset)
        if chunk:
            offset += len(chunk)
            text = decoder.decode(chunk)
            if text:
                yield text
        if not follow or (state in ends and not chunk):
            tail = decoder.decode(b"", final=True)
            if tail:
                yield tail
            return state if follow else ""
        time.sleep(LOG_POLL_SECONDS)
        state = next_state()


def _lines(chunks: Iterator[str]) -> Iterator[str]:
    """Text chunks as lines, without their line ends; the last one even when unended."""
    pending = ""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line.removesuffix("\r")
    if pending:
        yield pending


class Client:
    """A stack's jobs and sweeps (`stack`: a Pulumi stack's name; None: the selected stack)."""

    def __init__(self, stack: str | None = None) -> None:
        self.stack = stack
        self._outputs: dict[str, Any] | None = None
        self._jobs: Jobs | None = None
        self._sweeps: Sweeps | None = None

    @classmethod
    def over(cls, jobs: Jobs, stack: str | None = None) -> Client:
        """A Client over a stack's Jobs already made (its outputs already read)."""
        client = cls(stack)
        client._jobs = jobs
        return client

    def __repr__(self) -> str:
        return f"Client(stack={self.stack!r})"

    # -- the stack ------------------------------------------------------------------------
    @property
    def outputs(self) -> dict[str, Any]:
        """The stack's outputs (`pulumi stack output`), read on first use."""
        if self._outputs is None:
            with _errors():
                self._outputs = stack_outputs(self.stack)
        return self._outputs

    def load(self) -> Client:
        """Read the stack's outputs now (else on the first call that needs them): a stack that
        cannot be reached fails here. The Client itself."""
        self._api()
        return self

    def _api(self) -> Jobs:
        if self._jobs is None:
            outputs = self.outputs
            with _errors():
                self._jobs = Jobs(outputs)
        return self._jobs

    def _sweeps_api(self) -> Sweeps:
        if self._sweeps is None:
            try:
                from infra.jobs.sweeps import Sweeps
            except ModuleNotFoundError as exc:
                if exc.name != "infra.jobs.sweeps":
                    raise
                raise TrainstackError(
                    "this trainstack has no sweeps (infra/jobs/sweeps.py is missing)", EXIT_FAILED
                ) from None
            jobs = self._api()
            with _errors():
                self._sweeps = Sweeps(jobs)
        return self._sweeps

    @property
    def defaults(self) -> dict[str, Any]:
        """What a job trains with unless it says otherwise (the stack's jobDefaults output):
        workers, slots, epochs, data, ..."""
        return dict(self._api().defaults)

    @property
    def tracking(self) -> dict[str, Any]:
        """The stack's tracking (its MLflow server's node, URI, UI's URL), or {} when off."""
        return dict(self._api().tracking_setup)

    # -- jobs -----------------------------------------------------------------------------
    def submit(
        self,
        directory: str | Path,
        params: dict[str, Any] | None = None,
        *,
        epochs: int | None = None,
        workers: int | None = None,
        priority: int = 0,
        data: str | None = None,
        data_stream: str | None = None,
    ) -> str:
        """Ship a job directory and queue it, as `trainstack submit`: its id. `params` over
        the manifest's [params]; `data`: digits, an absolute path or a URL the cluster reads;
        `data_stream`: auto, on or off; a higher `priority` starts before lower ones."""
        overrides = training_overrides(
            epochs=epochs, workers=workers, data=data, data_stream=data_stream
        )
        priority = _whole("--priority", priority)
        jobs = self._api()
        with _errors():
            return jobs.submit(Path(directory), dict(params or {}), overrides, priority)

    def record(self, job: str | None = None) -> JobRecord:
        """The job's record as stored, with its MLflow run as `tracking` when it has one
        (job None: the latest job)."""
        jobs = self._api()
        with _errors():
            if not job:
                records = jobs.records()
                if not records:
                    raise CliError("no jobs on this stack yet", EXIT_INPUT)
                job = str(records[-1]["id"])
            record = jobs.record(job)
            tracking = jobs.tracking(job)
        return cast(JobRecord, {**record, **({"tracking": tracking} if tracking else {})})

    def status(self, job: str | None = None) -> JobRecord:
        """The job's record as `trainstack status --json` shows it (job None: the latest)."""
        return cast(JobRecord, status_view(dict(self.record(job))))

    def wait(self, job: str, timeout: float | None = None, poll: float = 2.0) -> JobRecord:
        """status() once the job ended (succeeded, failed, cancelled or pruned). The record is
        read every `poll` seconds at first, less often as it goes on (up to every
        MAX_POLL_SECONDS). TimeoutError after `timeout` seconds, naming the job and its state."""
        jobs = self._api()

        def state() -> str:
            with _errors():
                return shown_state(jobs.record(job))

        _wait_for(f"job {job}", state, timeout, poll)
        return self.status(job)

    def logs(self, job: str, rank: int | None = None) -> str:
        """The job's output so far (`rank`: one TensorFlow worker's own, 0 = the chief)."""
        return "".join(self.output(job, rank=rank))

    def follow(self, job: str, rank: int | None = None) -> Iterator[str]:
        """The job's output line by line (without line ends) as it comes, until the job
        ended; status() then says how."""
        return _lines(self.output(job, follow=True, rank=rank))

    def output(
        self, job: str, *, follow: bool = False, rank: int | None = None
    ) -> Generator[str, None, str]:
        """The job's output in chunks as they come (`trainstack logs [-f]`); following, it
        returns the job's final state once it ended and its output is all read."""
        jobs = self._api()
        with _errors():
            record = jobs.record(job)
            check_rank(record, rank)
            node = jobs.any_node()
            return (
                yield from _stream(
                    lambda offset: jobs.output_from(job, offset, node, rank),
                    str(record.get("state")),
                    lambda: str(jobs.record(job, node).get("state")),
                    follow,
                )
            )

    def cancel(self, job: str) -> JobRecord:
        """Stop the job (no process of it is left on any node): its final record."""
        jobs = self._api()
        with _errors():
            return cast(JobRecord, jobs.cancel(job))

    def jobs(self) -> list[JobRecord]:
        """Every job's record, oldest first (as `trainstack list --json`)."""
        jobs = self._api()
        with _errors():
            return [cast(JobRecord, r) for r in jobs.records()]

    def sync(self, job: str | None = None) -> dict[str, Any]:
        """Sync the job's MLflow run now (job None: every job's): {"synced": [...]}, one
        entry a job (its run, or its `error`)."""
        jobs = self._api()
        with _errors():
            if job:
                jobs.record(job)  # an unknown job: its own error, whether tracking is on or not
            return jobs.sync(job or "")

    # -- sweeps ---------------------------------------------------------------------------
    def sweep(
        self,
        directory: str | Path,
        file: str | Path | None = None,
        trials: int | None = None,
        parallel: int | None = None,
        params: dict[str, Any] | None = None,
        *,
        epochs: int | None = None,
        workers: int | None = None,
        priority: int = 0,
        data: str | None = None,
        data_stream: str | None = None,
    ) -> str:
        """Start a hyperparameter sweep of a job directory (its manifest's [sweep], or
        `file`), as `trainstack sweep`: its id. `trials` and `parallel` over the definition's;
        `params` and the training overrides (as submit's) hold for every trial."""
        if trials is not None:
            _whole("--trials", trials)
            if trials < 1:
                raise TrainstackError(
                    f"--trials {trials}: a sweep runs at least 1 trial", EXIT_INPUT
                )
        if parallel is not None:
            _whole("--parallel", parallel)
            if parallel < 1:
                raise TrainstackError(
                    f"--parallel {parallel}: give the trials run at once, at least 1", EXIT_INPUT
                )
        overrides = training_overrides(
            epochs=epochs, workers=workers, data=data, data_stream=data_stream
        )
        priority = _whole("--priority", priority)
        sweeps = self._sweeps_api()
        with _errors():
            return sweeps.submit(
                Path(directory),
                dict(params or {}),
                overrides,
                sweep_file=Path(file) if file is not None else None,
                trials=trials,
                parallel=parallel,
                priority=priority,
            )

    def sweep_status(self, sweep: str | None = None) -> SweepRecord:
        """The sweep's record: its definition, state, trials and best trial (sweep None: the
        latest sweep)."""
        sweeps = self._sweeps_api()
        with _errors():
            if not sweep:
                found = self.sweeps()
                if not found:
                    raise CliError("no sweeps on this stack yet", EXIT_INPUT)
                sweep = str(found[-1]["id"])
            return cast(SweepRecord, sweeps.record(sweep))

    def sweeps(self) -> list[SweepRecord]:
        """Every sweep's record without its trials, oldest first."""
        sweeps = self._sweeps_api()
        with _errors():
            found = sweeps.records()
        found = sorted(found, key=lambda r: (r.get("submitted_at") or 0, str(r.get("id", ""))))
        return [cast(SweepRecord, r) for r in found]

    def sweep_cancel(self, sweep: str) -> SweepRecord:
        """Stop the sweep's driver and every running trial: its final record."""
        sweeps = self._sweeps_api()
        with _errors():
            return cast(SweepRecord, sweeps.cancel(sweep))

    def sweep_resume(self, sweep: str) -> SweepRecord:
        """Start the sweep's driver again (it goes on with the trials it has): its record."""
        sweeps = self._sweeps_api()
        with _errors():
            return cast(SweepRecord, sweeps.resume(sweep))

    def sweep_wait(
        self, sweep: str, timeout: float | None = None, poll: float = 5.0
    ) -> SweepRecord:
        """sweep_status() once the sweep ended (succeeded, failed or cancelled), polled as
        wait() polls a job's. TrainstackError when its driver stopped (`sweep_resume`)."""
        sweeps = self._sweeps_api()

        def state() -> str:
            with _errors():
                now = str(sweeps.record(sweep).get("state"))
            if now == SWEEP_STOPPED:
                raise TrainstackError(
                    f"sweep {sweep} stopped: its driver no longer runs (resume it: "
                    f"`trainstack sweep resume {sweep}`)",
                    EXIT_FAILED,
                )
            return now

        _wait_for(f"sweep {sweep}", state, timeout, poll)
        return self.sweep_status(sweep)

    def sweep_logs(self, sweep: str) -> str:
        """The sweep driver's output so far."""
        return "".join(self.sweep_output(sweep))

    def sweep_follow(self, sweep: str) -> Iterator[str]:
        """The sweep driver's output line by line as it comes, until the sweep ended (or its
        driver stopped)."""
        return _lines(self.sweep_output(sweep, follow=True))

    def sweep_output(self, sweep: str, *, follow: bool = False) -> Generator[str, None, str]:
        """The sweep driver's output in chunks (`trainstack sweep logs [-f]`); following, it
        returns the sweep's final state (or `stopped`: its driver no longer runs) once it
        ended and its output is all read."""
        sweeps = self._sweeps_api()
        with _errors():
            record = sweeps.record(sweep)
            return (
                yield from _stream(
                    lambda offset: sweeps.output_from(sweep, offset),
                    str(record.get("state")),
                    lambda: str(sweeps.record(sweep).get("state")),
                    follow,
                    (*FINAL_STATES, SWEEP_STOPPED),
                )
            )


def _wait_for(what: str, state: Callable[[], str], timeout: float | None, poll: float) -> None:
    """Until state() is final, polling with a growing interval; TimeoutError past `timeout`."""
    if poll <= 0:
        raise ValueError(f"poll={poll!r}: give the seconds between reads, more than 0")
    deadline = None if timeout is None else time.monotonic() + timeout
    interval = poll
    while True:
        now = state()
        if now in FINAL_STATES:
            return
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError(f"{what} is still {now} after {timeout:g} s")
        time.sleep(interval if left is None else min(interval, left))
        interval = min(interval * POLL_BACKOFF, max(poll, MAX_POLL_SECONDS))
