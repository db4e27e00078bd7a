"""`trainstack`: submit your own training code to a running stack and follow it (docs/jobs.md).

    trainstack [-s STACK] submit DIR [-p name=value ...] [--epochs N] [--json]
    trainstack [-s STACK] status [JOB_ID] [--json]
    trainstack [-s STACK] logs [-f] [--rank N] JOB_ID
    trainstack [-s STACK] cancel JOB_ID
    trainstack [-s STACK] list [--metric NAME] [--json]
    trainstack [-s STACK] sync [JOB_ID]
    trainstack [-s STACK] sweep DIR [--file F] [--trials N] [--parallel N] [-p name=value ...]
    trainstack [-s STACK] sweep status [SWEEP_ID] [--json]
    trainstack [-s STACK] sweep list [--json]
    trainstack [-s STACK] sweep cancel|resume SWEEP_ID
    trainstack [-s STACK] sweep logs [-f] SWEEP_ID
    trainstack [-s STACK] data put SRC s3://BUCKET/PREFIX
    trainstack [-s STACK] data ls [s3://BUCKET/PREFIX]

The stack is picked as Pulumi picks it: `--stack`/`-s`, or the selected stack. Everything goes
over the stack's own transports (`docker exec` on the local stack, SSH on the ssh target):
no new port. Job records live on the cluster's shared storage beside the runs
(`<models dir>/<job id>/job.json`, `NODE_PATHS.models_dir` of infra/nodes.py), so any node,
and any machine with the stack, sees the same jobs. The commands are a thin layer over
infra.jobs.client.Client, the same API from Python (`from trainstack import Client`).

`sweep` followed by status, list, cancel, resume or logs is that command; anything else is a
job directory to sweep (a directory named `status` is `./status`). Its trials are jobs.

`data` uploads to and lists the stack's object store (infra.jobs.objectstore), from this
machine, at the port the stack publishes for it.

Exit codes: 0 done; 1 the job (or sweep) failed or was cancelled (`status`, `logs -f`); 2 bad
input (a bad job directory, an unknown job, a missing file or bucket); 3 the stack, its nodes
or its object store cannot be reached (or refuse its keys).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import Any

from trainstack_training.rundir import FINAL_STATES

from infra.jobs.client import Client, TrainstackError, checked_data, status_view
from infra.jobs.commands import EXIT_FAILED, EXIT_INPUT, EXIT_UNREACHABLE, CliError, Jobs
from infra.jobs.objectstore import data_command
from infra.jobs.show import print_list, print_status, tracking_lines
from infra.transport import TransportError

SWEEP_COMMANDS = ("status", "list", "cancel", "resume", "logs")
# A trial's end: a job's final state, or `lost` (its node went; the driver ran its params again).
TRIAL_ENDS = (*FINAL_STATES, "lost")
GOALS = {"max": "maximize", "min": "minimize"}
# The parser of `sweep JOB_DIR`: sweep_argv puts its name before a job directory (never typed).
SWEEP_RUN = ":dir"
# --data's check (infra.jobs.client, which submit and sweep run it), under its older name here.
_data = checked_data


def _params(pairs: Sequence[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or not name.strip():
            raise CliError(f"-p {pair!r}: expected name=value", EXIT_INPUT)
        try:
            params[name.strip()] = json.loads(raw)
        except ValueError:
            params[name.strip()] = raw
    return params


def _job_options(p: argparse.ArgumentParser) -> None:
    """What submit and sweep take beside the directory: params and the training overrides."""
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--epochs", type=int)
    p.add_argument(
        "--priority",
        type=int,
        default=0,
        help="the queue's order: a higher priority starts before lower ones (default 0); it "
        "never stops a running job",
    )
    p.add_argument(
        "--workers",
        type=int,
        help="the job's ranks, one per worker slot (default: the stack's, every slot)",
    )
    p.add_argument(
        "--data",
        metavar="DATA",
        help="the data set: digits, or an absolute path or URL the cluster reads "
        "(default: the manifest's data, else the stack's trainData)",
    )
    p.add_argument(
        "--data-stream",
        choices=("auto", "on", "off"),
        help="how each rank reads its data: on = streamed in row groups, off = whole in "
        "memory, auto (default) = streamed when it would take over a quarter of the rank's "
        "memory limit",
    )
    p.add_argument("--json", action="store_true")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainstack", description="Submit training code to a running trainstack stack."
    )
    parser.add_argument("-s", "--stack", help="the stack (default: the selected stack)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("submit", help="ship a job directory and queue it; prints its id")
    p.add_argument("directory", type=Path)
    _job_options(p)
    p = sub.add_parser("status", help="a job's state (default: the latest job)")
    p.add_argument("job_id", nargs="?")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("logs", help="a job's output, one line per finished epoch")
    p.add_argument("job_id")
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument(
        "--rank", type=int, metavar="N", help="one TensorFlow worker's own output (0 = chief)"
    )
    p = sub.add_parser("cancel", help="stop a job: no process of it is left on any node")
    p.add_argument("job_id")
    p = sub.add_parser("list", help="the stack's jobs, oldest first")
    p.add_argument("--metric", default="", help="a column with this metric's final value")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("sync", help="sync the job's MLflow run now (default: every job's)")
    p.add_argument("job_id", nargs="?", default="")
    _sweep_parser(sub)
    p = sub.add_parser("data", help="the stack's object store: upload (put) and list (ls)")
    data = p.add_subparsers(dest="action", required=True)
    p = data.add_parser("put", help="upload a file, or a directory's files, to the store")
    p.add_argument("src", help="a local file or directory")
    p.add_argument("url", metavar="dest", help="s3://BUCKET/PREFIX (or s3a://)")
    p = data.add_parser("ls", help="the objects under a URL with their sizes (s3:// = buckets)")
    p.add_argument("url", nargs="?", help="default: the stack's bucket, s3://trainstack/")
    return parser


def _sweep_parser(sub: Any) -> None:
    """`sweep JOB_DIR ...` and `sweep status|list|cancel|resume|logs ...` (sweep_argv names
    the first form's parser)."""
    indent = "\n" + " " * len("usage: trainstack sweep ")
    run_usage = (
        "trainstack sweep JOB_DIR [--file F] [--trials N] [--parallel N] [-p NAME=VALUE]"
        f"{indent}[--epochs N] [--workers N] [--data DATA] [--data-stream {{auto,on,off}}]"
        f"{indent}[--priority P] [--json]"
    )
    p = sub.add_parser(
        "sweep",
        help="run a hyperparameter sweep of a job directory, or see and manage sweeps",
        usage=f"{run_usage}\n       trainstack sweep {{{','.join(SWEEP_COMMANDS)}}} ...",
        description="`trainstack sweep JOB_DIR` starts a sweep of the job directory (its "
        "manifest's [sweep], or --file): its trials are jobs, run a few at a time by the "
        "sweep's driver on the cluster; it prints the sweep's id. A job directory named "
        "like one of the commands below is given as ./status (./list, ...).",
    )
    sweeps = p.add_subparsers(
        dest="sweep_command", required=True, metavar=f"{{{','.join(SWEEP_COMMANDS)}}}"
    )
    # No help=: not listed among the commands (its form is the usage's first line).
    s = sweeps.add_parser(SWEEP_RUN, prog="trainstack sweep", usage=run_usage)
    s.add_argument(
        "directory",
        type=Path,
        metavar="JOB_DIR",
        help="the job directory to sweep (one named like a sweep command: ./status)",
    )
    s.add_argument(
        "--file",
        type=Path,
        metavar="F",
        help="the sweep's definition, a TOML file with a [sweep] table (default: the job's "
        "manifest's [sweep])",
    )
    s.add_argument("--trials", type=int, metavar="N", help="how many trials in all")
    s.add_argument("--parallel", type=int, metavar="N", help="how many trials run at once")
    _job_options(s)
    s = sweeps.add_parser("status", help="a sweep's trials and best trial (default: the latest)")
    s.add_argument("sweep_id", nargs="?")
    s.add_argument("--json", action="store_true")
    s = sweeps.add_parser("list", help="the stack's sweeps, oldest first")
    s.add_argument("--json", action="store_true")
    s = sweeps.add_parser("cancel", help="stop a sweep's driver and every running trial")
    s.add_argument("sweep_id")
    s = sweeps.add_parser("resume", help="start a stopped sweep's driver again")
    s.add_argument("sweep_id")
    s = sweeps.add_parser("logs", help="a sweep driver's output")
    s.add_argument("sweep_id")
    s.add_argument("-f", "--follow", action="store_true")


def sweep_argv(argv: Sequence[str]) -> list[str]:
    """argv with SWEEP_RUN after `sweep` when a job directory (not a sweep command) follows."""
    argv = list(argv)
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in ("-s", "--stack") else 1
    if argv[i : i + 1] == ["sweep"]:
        following = argv[i + 1] if i + 1 < len(argv) else ""
        if following not in (*SWEEP_COMMANDS, "-h", "--help"):
            argv.insert(i + 1, SWEEP_RUN)
    return argv


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(sweep_argv(sys.argv[1:] if argv is None else argv))


def run(args: argparse.Namespace) -> int:
    if args.command == "data":
        return data_command(args.stack, args.action, getattr(args, "src", ""), args.url)
    client = Client(args.stack).load()  # an unreachable stack is exit 3 before all else
    if args.command == "sweep":
        return sweep(client, args)
    if args.command == "submit":
        job_id = client.submit(
            args.directory,
            _params(args.param),
            epochs=args.epochs,
            workers=args.workers,
            priority=args.priority,
            data=args.data,
            data_stream=args.data_stream,
        )
        print(json.dumps({"job_id": job_id}) if args.json else job_id)
        return 0
    if args.command == "status":
        record = dict(client.record(args.job_id))
        if args.json:
            print(json.dumps(status_view(record), sort_keys=True))
        else:
            print_status(record)
        return EXIT_FAILED if record.get("state") in ("failed", "cancelled") else 0
    if args.command == "list":
        records = [dict(r) for r in client.jobs()]
        if args.json:
            print(json.dumps(records, sort_keys=True))
            return 0
        print_list(records, args.metric, int(client.defaults.get("slots") or 0))
        return 0
    if args.command == "sync":
        return sync(client, args.job_id)
    if args.command == "cancel":
        ended = client.cancel(args.job_id)
        print(f"job {args.job_id}: {ended.get('state')}")
        return 0
    if args.command == "logs":
        state = _write(client.output(args.job_id, follow=args.follow, rank=args.rank))
        return 0 if not args.follow or state == "succeeded" else EXIT_FAILED
    raise CliError(f"unknown command {args.command!r}", EXIT_INPUT)


def _write(chunks: Generator[str, None, str]) -> str:
    """Print the chunks as they come: what the generator returns at its end."""
    while True:
        try:
            chunk = next(chunks)
        except StopIteration as end:
            return str(end.value or "")
        sys.stdout.write(chunk)
        sys.stdout.flush()


def sync(jobs: Jobs | Client, job_id: str) -> int:
    """`trainstack sync`: one line per job synced (or why not)."""
    client = jobs if isinstance(jobs, Client) else Client.over(jobs)
    if not client.tracking.get("node"):
        print("tracking is off on this stack (trainstack:tracking): nothing to sync")
        return 0
    synced = client.sync(job_id).get("synced") or []
    for s in synced:
        if s.get("error"):
            print(f"{s.get('job_id')}: not synced: {s['error']}")
        elif s.get("skipped"):
            print(f"{s.get('job_id')}: up to date")
        else:
            where = s.get("url") or f"run {s.get('run_id')}"
            print(f"{s.get('job_id')}: {s.get('status')}, {s.get('metrics')} metric points, "
                  f"{len(s.get('artifacts') or [])} artifacts: {where}")  # fmt: skip
    return EXIT_FAILED if any(s.get("error") for s in synced) else 0


# -- sweeps -------------------------------------------------------------------------------
def sweep(client: Client, args: argparse.Namespace) -> int:
    """`trainstack sweep ...`: the sweep's id, status, list, cancel, resume or logs."""
    command = args.sweep_command
    if command == SWEEP_RUN:
        sweep_id = client.sweep(
            args.directory,
            file=args.file,
            trials=args.trials,
            parallel=args.parallel,
            params=_params(args.param),
            epochs=args.epochs,
            workers=args.workers,
            priority=args.priority,
            data=args.data,
            data_stream=args.data_stream,
        )
        print(json.dumps({"sweep_id": sweep_id}) if args.json else sweep_id)
        return 0
    if command == "status":
        record = dict(client.sweep_status(args.sweep_id))
        print(json.dumps(record, sort_keys=True) if args.json else sweep_status_text(record))
        return EXIT_FAILED if record.get("state") in ("failed", "cancelled") else 0
    if command == "list":
        found = [dict(r) for r in client.sweeps()]
        if args.json:
            print(json.dumps(found, sort_keys=True))
        else:
            print(sweep_list_text(found))
        return 0
    if command in ("cancel", "resume"):
        now = client.sweep_cancel(args.sweep_id) if command == "cancel" else (
            client.sweep_resume(args.sweep_id)
        )  # fmt: skip
        print(f"sweep {args.sweep_id}: {now.get('state')}")
        return 0
    if command == "logs":
        state = _write(client.sweep_output(args.sweep_id, follow=args.follow))
        return 0 if not args.follow or state == "succeeded" else EXIT_FAILED
    raise CliError(f"unknown sweep command {command!r}", EXIT_INPUT)


def _value(value: Any) -> str:
    """A metric's value: 4 decimals (as `status` shows a job's), "-" when there is none."""
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _param(value: Any) -> str:
    """A param's value in a column: 4 significant digits for a float, JSON for a list."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, str) else json.dumps(value)


def _table(header: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """Columns two spaces apart, each as wide as its widest cell; `right`: right-aligned."""
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(header), *(line(row) for row in rows)]


def swept_params(definition: dict[str, Any], trials: list[dict[str, Any]]) -> list[str]:
    """The swept params' names: the definition's order, else as the trials have them."""
    declared = definition.get("params") or []
    if isinstance(declared, dict):
        declared = list(declared)
    names = [str(p.get("name")) if isinstance(p, dict) else str(p) for p in declared]
    for trial in trials:
        names += [n for n in (trial.get("params") or {}) if n not in names]
    return names


def sweep_status_text(record: dict[str, Any]) -> str:
    """`sweep status`: the sweep's state and settings, its trials' table (a column per swept
    param), the best trial (its value, params and model) and any error."""
    definition = record.get("definition") or {}
    metric = str(definition.get("metric") or "value")
    trials = list(record.get("trials") or [])
    states = [t.get("state") for t in trials]
    done, running = sum(s in TRIAL_ENDS for s in states), states.count("running")
    lines = [
        f"sweep {record.get('id')}: {record.get('state')}, {done} of "
        f"{definition.get('trials', '?')} trials done" + (f", {running} running" if running else "")
    ]
    how = [f"{definition['method']} search" if definition.get("method") else ""]
    goal = str(definition.get("goal") or "")
    how.append(f"{GOALS.get(goal, goal or 'best')} {metric}")
    if definition.get("parallel"):
        how.append(f"{definition['parallel']} trials at a time")
    if definition.get("early_stop") not in (None, "", "off"):
        how.append(f"early stop {definition['early_stop']}")
    if record.get("job"):
        how.append(f"of {record['job']}")
    lines.append("  " + ", ".join(h for h in how if h))
    names = swept_params(definition, trials)
    header = ["TRIAL", "JOB", "STATE", "EPOCHS", metric.upper(), *(n.upper() for n in names)]
    rows = [
        [str(t.get("number", "?")), str(t.get("job_id") or "-"), str(t.get("state") or "?"),
         _value(t.get("epochs")), _value(t.get("value")),
         *(_param((t.get("params") or {}).get(n)) for n in names)]
        for t in trials
    ]  # fmt: skip
    lines += _table(header, rows, {0, 3, 4}) if trials else ["no trials yet"]
    best = record.get("best")
    if best:
        lines += [
            f"best: trial {best.get('number')} ({best.get('job_id')}), {metric} "
            f"{_value(best.get('value'))}",
            f"  params {json.dumps(best.get('params') or {}, sort_keys=True)}",
            f"  model {best.get('model') or '-'}",
        ]
    else:
        lines.append("best: none yet")
    if record.get("error"):
        lines.append(f"error: {record['error']}")
    lines += tracking_lines(record.get("tracking") or {})
    return "\n".join(lines)


def _done(record: dict[str, Any]) -> int:
    """The sweep's trials that ended: its records()'s count, else its trials' table's."""
    if isinstance(record.get("trials_done"), int):
        return int(record["trials_done"])
    return sum(t.get("state") in TRIAL_ENDS for t in record.get("trials") or [])


def sweep_list_text(records: list[dict[str, Any]]) -> str:
    """`sweep list`: one line a sweep, oldest first."""
    if not records:
        return "no sweeps on this stack yet"
    rows = []
    for r in records:
        definition = r.get("definition") or {}
        submitted = r.get("submitted_at")
        rows.append([
            str(r.get("id", "")),
            str(r.get("state", "?")),
            f"{_done(r)}/{definition.get('trials', '?')}",
            _value((r.get("best") or {}).get("value")),
            str(definition.get("metric") or "-"),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(float(submitted)))
            if submitted else "-",
        ])  # fmt: skip
    return "\n".join(
        _table(["SWEEP ID", "STATE", "TRIALS", "BEST", "METRIC", "SUBMITTED"], rows, {2, 3})
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return run(args)
    except (TrainstackError, CliError) as exc:
        print(f"trainstack: error: {exc}", file=sys.stderr)
        return exc.code
    except TransportError as exc:
        print(f"trainstack: error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
