"""Run a playbook against an inventory file: `python -m infra.provisioning --help`.

The Pulumi program's provisioning resource runs this in a child process instead of calling
`run_playbook` in its own: ansible-runner forks through pexpect, and a fork of a process that
serves gRPC (the dynamic-provider host) can crash before it execs (seen: SIGSEGV). It is also
a plain way to provision any inventory by hand.

The Spark auth secret comes from the environment variable TRAINSTACK_SPARK_AUTH_SECRET, never
from the command line. The last line on stdout is the result as JSON.

SIGTERM or SIGINT, or the death of the process that started this one (the provider, killed by
a second Ctrl-C to `pulumi up`), stops the run: Ansible and its helpers are killed and the CPU
limits lifted by `--cpu-boost` are given back, so nothing keeps changing the servers unseen.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from infra.engine import EngineError, cpu_boost
from infra.provisioning.inventory import S3_SECRET_ENV, SECRET_ENV, docker_containers
from infra.provisioning.runner import run_playbook
from infra.provisioning.wheelhouse import WheelhouseError, build_node_wheelhouse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.provisioning", description=__doc__)
    parser.add_argument("--inventory", type=Path, required=True, help="inventory (JSON or YAML)")
    parser.add_argument("--playbook", default="site.yml", help="a name in playbooks/ or a path")
    parser.add_argument("--wheelhouse", type=Path, required=True, help="wheelhouse root")
    parser.add_argument("--artifacts-dir", type=Path, required=True, help="runner's data dir")
    parser.add_argument("--limit", default=None, help="Ansible host pattern to limit the run")
    parser.add_argument(
        "--cpu-boost",
        action="store_true",
        help="lift the CPU limits of the inventory's Docker nodes while the playbook runs",
    )
    parser.add_argument(
        "--no-mitogen",
        action="store_true",
        help="run with Ansible's own `free` strategy instead of Mitogen's `mitogen_free`",
    )
    args = parser.parse_args(argv)

    import yaml  # JSON is YAML too

    inventory = yaml.safe_load(args.inventory.read_text())
    stop = _stop_on_signal_or_orphaning()
    print(f"wheelhouse: {args.wheelhouse} (downloads only what is missing)", file=sys.stderr)
    try:
        build_node_wheelhouse(args.wheelhouse)
    except (WheelhouseError, OSError) as exc:
        # One sentence naming the path and the cause; the caller shows it as the failure.
        _report_failure(
            f"the wheelhouse {args.wheelhouse} could not be made or filled: {exc}",
            args.artifacts_dir,
        )
        return 1
    extravars = {"trainstack_wheelhouse_dir": str(args.wheelhouse)}
    # Out of the environment before ansible-runner starts: it records the whole environment
    # of the run in artifacts/<ident>/command (the secret goes through the 0600 extravars file).
    secret = os.environ.pop(SECRET_ENV, "")
    if secret:
        extravars["trainstack_spark_auth_secret"] = secret
    s3_secret = os.environ.pop(S3_SECRET_ENV, "")
    if s3_secret:
        extravars["trainstack_s3_secret_key"] = s3_secret

    def show(event: object) -> None:
        _say(str(event))

    boosted = docker_containers(inventory) if args.cpu_boost else []
    try:
        with cpu_boost(boosted) as limits:
            if limits:
                print(
                    "CPU limits lifted while provisioning: " + ", ".join(sorted(limits)),
                    file=sys.stderr,
                    flush=True,
                )
            result = run_playbook(
                inventory,
                args.playbook,
                extravars=extravars,
                on_event=show,
                artifacts_dir=args.artifacts_dir,
                limit=args.limit,
                mitogen=not args.no_mitogen,
                cancel=stop.is_set,
            )
    except EngineError as exc:
        reason = f"the CPU limits could not be lifted or restored: {exc}"
        _report_failure(reason, args.artifacts_dir)
        return 1
    _say(result.summary())
    line = {
        "ok": result.ok,
        "stats": result.stats,
        "duration_s": round(result.duration_s, 1),
        "failures": [str(f) for f in result.failures],
        "artifacts_dir": str(result.artifacts_dir),
    }
    with contextlib.suppress(OSError):  # a provider that died reads no result
        print(json.dumps(line), flush=True)
    return 0 if result.ok else 1


def _say(text: str) -> None:
    """A progress line on stderr; nobody may be reading any more (the provider died)."""
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr, flush=True)


def _report_failure(reason: str, artifacts_dir: Path) -> None:
    """The result line of a run that could not start: one sentence, for the caller to show."""
    result = {
        "ok": False,
        "stats": {},
        "duration_s": 0.0,
        "failures": [reason],
        "artifacts_dir": str(artifacts_dir),
    }
    with contextlib.suppress(OSError):
        print(json.dumps(result), flush=True)


def _stop_on_signal_or_orphaning() -> threading.Event:
    """An event set by SIGTERM, SIGINT or the death of the parent process.

    The parent is watched by polling (a parent that dies makes this process an orphan,
    adopted by another one): prctl's parent-death signal would fire when the *thread* that
    started this process ends, and the provider starts it from a thread of a pool.
    """
    stop = threading.Event()
    parent = os.getppid()

    def on_signal(signum: int, _frame: Any) -> None:
        # Pulumi stops a plugin with SIGINT to the plugin's process group, this process
        # included, and SIGKILL to the group 5 s later if the plugin is still there. Out of
        # the group, the stop finishes: a SIGKILL while the CPU limits were being given back
        # left most nodes boosted (failure drill 4, in CI).
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
        _say(f"{signal.Signals(signum).name} received: stopping the run")
        stop.set()

    def watch() -> None:
        while not stop.wait(1.0):
            if os.getppid() != parent:
                _say("the process that started provisioning is gone: stopping the run")
                stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    return stop


if __name__ == "__main__":
    sys.exit(main())
