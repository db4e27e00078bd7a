"""Run a playbook against an inventory file: `python -m infra.provisioning --help`.

The Pulumi program's provisioning resource runs this in a child process instead of calling
`run_playbook` in its own: ansible-runner forks through pexpect, and a fork of a process that
serves gRPC (the dynamic-provider host) can crash before it execs (seen: SIGSEGV). It is also
a plain way to provision any inventory by hand.

The Spark auth secret comes from the environment variable TRAINSTACK_SPARK_AUTH_SECRET, never
from the command line. The last line on stdout is the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from infra.provisioning.runner import run_playbook
from infra.provisioning.wheelhouse import WheelhouseError, build_node_wheelhouse

SECRET_ENV = "TRAINSTACK_SPARK_AUTH_SECRET"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.provisioning", description=__doc__)
    parser.add_argument("--inventory", type=Path, required=True, help="inventory (JSON or YAML)")
    parser.add_argument("--playbook", default="site.yml", help="a name in playbooks/ or a path")
    parser.add_argument("--wheelhouse", type=Path, required=True, help="wheelhouse root")
    parser.add_argument("--artifacts-dir", type=Path, required=True, help="runner's data dir")
    parser.add_argument("--limit", default=None, help="Ansible host pattern to limit the run")
    parser.add_argument(
        "--no-mitogen",
        action="store_true",
        help="run with Ansible's own `free` strategy instead of Mitogen's `mitogen_free`",
    )
    args = parser.parse_args(argv)

    import yaml  # JSON is YAML too

    inventory = yaml.safe_load(args.inventory.read_text())
    print(f"wheelhouse: {args.wheelhouse} (downloads only what is missing)", file=sys.stderr)
    try:
        build_node_wheelhouse(args.wheelhouse)
    except (WheelhouseError, OSError) as exc:
        # One sentence naming the path and the cause; the caller shows it as the failure.
        reason = f"the wheelhouse {args.wheelhouse} could not be made or filled: {exc}"
        print(
            json.dumps(
                {
                    "ok": False,
                    "stats": {},
                    "duration_s": 0.0,
                    "failures": [reason],
                    "artifacts_dir": str(args.artifacts_dir),
                }
            ),
            flush=True,
        )
        return 1
    extravars = {"trainstack_wheelhouse_dir": str(args.wheelhouse)}
    # Out of the environment before ansible-runner starts: it records the whole environment
    # of the run in artifacts/<ident>/command (the secret goes through the 0600 extravars file).
    secret = os.environ.pop(SECRET_ENV, "")
    if secret:
        extravars["trainstack_spark_auth_secret"] = secret

    def show(event: object) -> None:
        print(str(event), file=sys.stderr, flush=True)

    result = run_playbook(
        inventory,
        args.playbook,
        extravars=extravars,
        on_event=show,
        artifacts_dir=args.artifacts_dir,
        limit=args.limit,
        mitogen=not args.no_mitogen,
    )
    print(result.summary(), file=sys.stderr, flush=True)
    print(
        json.dumps(
            {
                "ok": result.ok,
                "stats": result.stats,
                "duration_s": round(result.duration_s, 1),
                "failures": [str(f) for f in result.failures],
                "artifacts_dir": str(result.artifacts_dir),
            }
        ),
        flush=True,
    )
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
