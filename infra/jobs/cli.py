"""`trainstack`: submit your own training code to a running stack and follow it (docs/jobs.md).

    trainstack [-s STACK] submit DIR [-p name=value ...] [--epochs N] [--json]
    trainstack [-s STACK] status [JOB_ID] [--json]
    trainstack [-s STACK] logs [-f] [--rank N] JOB_ID
    trainstack [-s STACK] cancel JOB_ID
    trainstack [-s STACK] list [--metric NAME] [--json]
    trainstack [-s STACK] sync [JOB_ID]
    trainstack [-s STACK] data put SRC s3://BUCKET/PREFIX
    trainstack [-s STACK] data ls [s3://BUCKET/PREFIX]

The stack is picked as Pulumi picks it: `--stack`/`-s`, or the selected stack. Everything goes
over the stack's own transports (`docker exec` on the local stack, SSH on the ssh target):
no new port. Job records live on the cluster's shared storage beside the runs
(`<models dir>/<job id>/job.json`, `NODE_PATHS.models_dir` of infra/nodes.py), so any node,
and any machine with the stack, sees the same jobs.

`data` uploads to and lists the stack's object store (infra.jobs.objectstore), from this
machine, at the port the stack publishes for it.

Exit codes: 0 done; 1 the job failed or was cancelled (`status`, `logs -f`); 2 bad input (a bad
job directory, an unknown job, a missing file or bucket); 3 the stack, its nodes or its object
store cannot be reached (or refuse its keys).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infra.jobs.commands import (
    EXIT_FAILED,
    EXIT_INPUT,
    EXIT_UNREACHABLE,
    CliError,
    Jobs,
    follow_logs,
    stack_outputs,
)
from infra.jobs.objectstore import data_command
from infra.jobs.show import print_list, print_status, shown_state
from infra.transport import TransportError


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


def _data(value: str) -> str:
    """--data, checked: what the cluster reads as it is (a path here means nothing there)."""
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainstack", description="Submit training code to a running trainstack stack."
    )
    parser.add_argument("-s", "--stack", help="the stack (default: the selected stack)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("submit", help="ship a job directory and queue it; prints its id")
    p.add_argument("directory", type=Path)
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
    p = sub.add_parser("data", help="the stack's object store: upload (put) and list (ls)")
    data = p.add_subparsers(dest="action", required=True)
    p = data.add_parser("put", help="upload a file, or a directory's files, to the store")
    p.add_argument("src", help="a local file or directory")
    p.add_argument("url", metavar="dest", help="s3://BUCKET/PREFIX (or s3a://)")
    p = data.add_parser("ls", help="the objects under a URL with their sizes (s3:// = buckets)")
    p.add_argument("url", nargs="?", help="default: the stack's bucket, s3://trainstack/")
    return parser


def run(args: argparse.Namespace) -> int:
    if args.command == "data":
        return data_command(args.stack, args.action, getattr(args, "src", ""), args.url)
    jobs = Jobs(stack_outputs(args.stack))
    if args.command == "submit":
        overrides: dict[str, Any] = {"epochs": args.epochs} if args.epochs else {}
        if args.epochs is not None and args.epochs < 1:
            raise CliError(f"--epochs {args.epochs}: must be >= 1", EXIT_INPUT)
        if args.workers is not None:
            overrides["workers"] = args.workers
        if args.data is not None:
            overrides["data"] = _data(args.data)
        if args.data_stream is not None:
            overrides["data_stream"] = args.data_stream
        job_id = jobs.submit(args.directory, _params(args.param), overrides, args.priority)
        print(json.dumps({"job_id": job_id}) if args.json else job_id)
        return 0
    if args.command == "status":
        job_id = args.job_id
        if not job_id:
            records = jobs.records()
            if not records:
                raise CliError("no jobs on this stack yet", EXIT_INPUT)
            job_id = records[-1]["id"]
        record = jobs.record(job_id)
        tracking = jobs.tracking(job_id)
        record = {**record, **({"tracking": tracking} if tracking else {})}
        if args.json:
            print(json.dumps({**record, "state": shown_state(record)}, sort_keys=True))
        else:
            print_status(record)
        return EXIT_FAILED if record.get("state") in ("failed", "cancelled") else 0
    if args.command == "list":
        records = jobs.records()
        if args.json:
            print(json.dumps(records, sort_keys=True))
            return 0
        print_list(records, args.metric, int(jobs.defaults.get("slots") or 0))
        return 0
    if args.command == "sync":
        return sync(jobs, args.job_id)
    if args.command == "cancel":
        record = jobs.cancel(args.job_id)
        print(f"job {args.job_id}: {record.get('state')}")
        return 0
    if args.command == "logs":
        return follow_logs(jobs, args.job_id, args.follow, args.rank)
    raise CliError(f"unknown command {args.command!r}", EXIT_INPUT)


def sync(jobs: Jobs, job_id: str) -> int:
    """`trainstack sync`: one line per job synced (or why not)."""
    if not jobs.tracking_setup.get("node"):
        print("tracking is off on this stack (trainstack:tracking): nothing to sync")
        return 0
    if job_id:
        jobs.record(job_id)  # an unknown job: exit 2, as for the other commands
    synced = jobs.sync(job_id).get("synced") or []
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except CliError as exc:
        print(f"trainstack: error: {exc}", file=sys.stderr)
        return exc.code
    except TransportError as exc:
        print(f"trainstack: error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
