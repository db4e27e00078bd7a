"""Wall time of `pulumi up` from nothing (default topology), a no-change `up`, `destroy`.

python bench/bench_stack.py --out bench/results/bench_stack.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit, timed
from tests.pulumi_cli import Stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as state:
        stack = Stack(Path(state), prefix="tsbench")
        stack.init(uiPortBase="0", workers=str(args.workers), provision="false", train="false")
        try:
            result = {
                "benchmark": "stack",
                "topology": {"control_nodes": 3, "masters": 2, "workers": args.workers},
                "up_from_nothing_s": timed(stack.up),
                "up_no_change_s": timed(stack.up),
                "destroy_s": timed(lambda: stack.run("destroy", "--yes")),
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            }
        finally:
            stack.destroy_and_remove()
    emit(result, args.out)


if __name__ == "__main__":
    main()
