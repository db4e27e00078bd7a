"""The command line of `python -m trainstack_training.tracking` (the package's docstring):
`watch`, the daemon, and `sync`, one sync printed as one JSON line (every run then every
sweep's parent run, or the one job given); the MLflow client both use, logged in with the auth
file's admin login.

Runs on the tracking node, in the mlflow role's venv: `watch` as the tracking daemon
(supervisor's `trainstack-tracking-sync`), `sync` started over the node's transport by
`trainstack sync` on the control machine and by the declared job's provider
(infra.jobs.remote.sync_tracking).
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import json
import os
import re
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from trainstack_training.tracking.daemon import watch
from trainstack_training.tracking.runfiles import is_run_dir, run_dirs
from trainstack_training.tracking.sweeps import sync_sweeps
from trainstack_training.tracking.sync import sync_all

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

# Against a server that is down, the client must fail at once (the next round retries), not
# after MLflow's own retries with back-off (minutes).
# No usage telemetry: the cluster has no way out, and a user's runs are not reported anywhere.
CLIENT_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}
EXIT_FAILED, EXIT_USAGE = 1, 2

COMMANDS = {
    "watch": "the daemon: sync every run that is not complete",
    "sync": "sync once (one job, or all and the sweeps) and print one JSON line",
}


class UsageError(Exception):
    """A bad argument: one line, exit code 2."""


def read_auth_file(path: str) -> tuple[str, str]:
    """The admin login from the auth file's [mlflow] admin_username and admin_password."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path) as fh:
            parser.read_file(fh)
        section = parser["mlflow"]
        return section["admin_username"], section["admin_password"]
    except OSError as exc:
        raise UsageError(f"--auth-file {path}: cannot read it ({exc.strerror})") from None
    except (configparser.Error, KeyError) as exc:
        raise UsageError(
            f"--auth-file {path}: needs [mlflow] admin_username and admin_password ({exc})"
        ) from None


def make_client(tracking_uri: str, auth_file: str = "") -> MlflowClient:
    """The real MLflow client on `tracking_uri`, logged in with the auth file's login."""
    if not re.match(r"^(https?|file|sqlite)://", tracking_uri):
        raise UsageError(f"--tracking-uri {tracking_uri!r}: give the server's http(s):// URL")
    if auth_file:
        user, password = read_auth_file(auth_file)
        os.environ["MLFLOW_TRACKING_USERNAME"] = user
        os.environ["MLFLOW_TRACKING_PASSWORD"] = password
    for key, value in CLIENT_ENV.items():
        os.environ.setdefault(key, value)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainstack_training.tracking",
        description="Turn trainstack run directories into MLflow runs.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in COMMANDS.items():
        p = sub.add_parser(name, help=text)
        p.add_argument("--models-dir", default="/srv/trainstack/models")
        p.add_argument("--tracking-uri", required=True)
        p.add_argument("--auth-file", default="")
        p.add_argument("--ui-url", default="")
        p.add_argument("--stack", default="", help="the experiment of jobs that name none")
        if name == "watch":
            p.add_argument("--interval", type=float, default=2.0)
        else:
            p.add_argument("--job", default="", help="a run directory, or a job id")
    return parser


def _job_dirs(models_dir: Path, job: str) -> list[Path]:
    if not job:
        return run_dirs(models_dir)
    path = Path(job) if "/" in job else models_dir / job
    if not is_run_dir(path):
        raise UsageError(f"--job {job}: no run directory with job.json or metrics.json there")
    return [path]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    models_dir = Path(args.models_dir)
    stop = threading.Event()
    if args.command == "watch":  # before MLflow's import (seconds): a SIGTERM then ends it too
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        if not models_dir.is_dir():
            raise UsageError(f"--models-dir {models_dir}: no such directory")
        client = make_client(args.tracking_uri, args.auth_file)
        if args.command == "sync":
            dirs = _job_dirs(models_dir, args.job)
            with contextlib.redirect_stdout(sys.stderr):  # MLflow prints "View run ..."
                synced = sync_all(dirs, client, stack=args.stack, ui_url=args.ui_url,
                                  force=bool(args.job))  # fmt: skip
                if not args.job:  # the sweeps' parent runs, after their trials' runs
                    synced += sync_sweeps(models_dir, client, stack=args.stack,
                                          ui_url=args.ui_url)  # fmt: skip
            print(json.dumps({"synced": [vars(s) for s in synced]}, sort_keys=True))
            return EXIT_FAILED if any(s.error for s in synced) else 0
        if args.interval <= 0:
            raise UsageError(f"--interval {args.interval}: must be > 0")
    except UsageError as exc:
        print(f"tracking: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    with contextlib.suppress(KeyboardInterrupt):
        watch(models_dir, client, args.interval, stack=args.stack, ui_url=args.ui_url, stop=stop)
    return 0
