"""The `trainstack-train` console script."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from trainstack_training.attempts import EXIT_CANCELLED, record_failure
from trainstack_training.config import ConfigError, TrainConfig, parse_args


def _fail(exc: BaseException, code: int, cfg: TrainConfig | None = None) -> int:
    print(f"trainstack-train: error: {exc}", file=sys.stderr)
    print(json.dumps({"ok": False, "error": str(exc), "kind": type(exc).__name__}), flush=True)
    if cfg is not None and cfg.output:  # the run's own record of it (attempts.py)
        try:
            record_failure(Path(cfg.output), str(exc), type(exc).__name__, code)
        except OSError as err:
            print(f"trainstack-train: could not record the failure: {err}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Run the whole job; the last stdout line is a one-line JSON summary (also on failure)."""
    from trainstack_training.data import DataError
    from trainstack_training.launcher import TrainingError, run
    from trainstack_training.manifest import JobError
    from trainstack_training.report import ReportError, summary, summary_line
    from trainstack_training.spark import ClusterError, JobCancelledError

    try:
        cfg = parse_args(argv)
    except ConfigError as exc:
        return _fail(exc, 2)
    except Exception as exc:  # e.g. an unreadable --config file
        return _fail(exc, 1)
    try:
        metrics = run(cfg)
    except (ConfigError, DataError, ClusterError, JobError) as exc:
        # Bad input or a cluster that cannot run the job: nothing was trained.
        return _fail(exc, 2, cfg)
    except (TrainingError, ReportError) as exc:
        return _fail(exc, 1, cfg)
    except JobCancelledError as exc:  # SIGINT (`trainstack cancel`) once Spark runs
        return _fail(exc, EXIT_CANCELLED, cfg)
    except KeyboardInterrupt:  # SIGINT before Spark ran
        return _fail(JobCancelledError("cancelled before the job started"), EXIT_CANCELLED, cfg)
    except Exception as exc:  # anything else still ends with the JSON line callers parse
        traceback.print_exc()
        return _fail(exc, 1, cfg)
    result = {"ok": True, **summary(metrics)}
    print(summary_line(result))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
