"""Wall time of `pulumi up` of the servers from nothing (default topology), a no-change `up`
and `destroy`; with `--baseline REF`, the same for another commit, side by side in one run.

python bench/bench_stack.py --out bench/results/bench_stack.json [--baseline 36ef61a]

Servers only (`provision`/`train` off). The node image is baked beforehand (`make images`)
so that `up_from_nothing_s` is the servers' time; the bake has its own figure in
bench_images. A baseline commit runs in a temporary git worktree that shares this
checkout's virtual environment and the per-user cache of Pulumi binaries.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit, timed
from tests.support.stacks import ROOT, Stack


def measure(workers: int) -> dict:
    with tempfile.TemporaryDirectory() as state:
        stack = Stack(Path(state), prefix="tsbench")
        stack.init(uiPortBase="0", workers=str(workers), provision="false", train="false")
        try:
            return {
                "up_from_nothing_s": timed(stack.up),
                "up_no_change_s": timed(stack.up),
                "destroy_s": timed(lambda: stack.run("destroy", "--yes")),
            }
        finally:
            stack.destroy_and_remove()


def measure_baseline(ref: str, workers: int) -> dict:
    """Run the baseline commit's own bench_stack.py in a worktree; returns its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(tree), ref], cwd=ROOT, check=True
        )
        try:
            (tree / ".venv").symlink_to(ROOT / ".venv")
            env = {k: v for k, v in os.environ.items() if not k.startswith("PULUMI_")}
            env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if str(ROOT) not in p)
            subprocess.run(
                [
                    str(tree / "scripts" / "setup.sh"),
                    "pulumi_cli",
                    "pulumi_python_host",
                    "pulumi_backend",
                ],
                cwd=tree,
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
            )
            # The baseline's program must import its own `infra`, not this checkout's.
            env["PYTHONPATH"] = str(tree)
            proc = subprocess.run(
                [
                    str(ROOT / ".venv" / "bin" / "python"),
                    str(tree / "bench" / "bench_stack.py"),
                    "--workers",
                    str(workers),
                ],
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise SystemExit(
                    f"baseline {ref} failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
                )
            result = json.loads(proc.stdout[proc.stdout.index("{") :])
            return {k: result[k] for k in ("up_from_nothing_s", "up_no_change_s", "destroy_s")}
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--baseline", help="a git ref to measure side by side (e.g. 36ef61a)")
    args = parser.parse_args()

    result: dict = {
        "benchmark": "stack",
        "topology": {"control_nodes": 3, "masters": 2, "workers": args.workers},
        **measure(args.workers),
    }
    if args.baseline:
        result["baseline"] = {"ref": args.baseline, **measure_baseline(args.baseline, args.workers)}
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    emit(result, args.out)


if __name__ == "__main__":
    main()
