"""The `trainstack-train` console script."""

from __future__ import annotations

import json
import sys

from trainstack_training.config import ConfigError, parse_args


def main(argv: list[str] | None = None) -> int:
    """Run the whole job; the last stdout line is a one-line JSON summary (also on failure)."""
    from trainstack_training.data import DataError
    from trainstack_training.launcher import ClusterError, run
    from trainstack_training.report import summary

    try:
        cfg = parse_args(argv)
        metrics = run(cfg)
    except (ConfigError, DataError, ClusterError) as exc:
        print(f"trainstack-train: error: {exc}", file=sys.stderr)
        print(json.dumps({"ok": False, "error": str(exc), "kind": type(exc).__name__}),
              flush=True)
        return 2
    result = {"ok": True, **summary(metrics)}
    print(f"validation accuracy {result['final_val_accuracy']:.4f} after {result['epochs']} "
          f"epochs on {result['workers']} worker(s) in {result['attempts']} attempt(s); "
          f"{result['samples_per_second']:.0f} samples/s; model {result['model_path']}",
          file=sys.stderr)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
