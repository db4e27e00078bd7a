"""Where a sweep's Optuna study lives, side by side: JournalStorage on a file (what the sweep's
driver uses, on the cluster's shared storage) against RDBStorage on SQLite, for the calls a
driver makes: ask a trial, report each epoch, tell its end, read every trial (each poll), and
open the study again (a resume).

    python -m bench.bench_sweep_storage [--trials 40] [--epochs 10] [--out FILE]

MLflow 3's Optuna storage (the third candidate) keeps the study as runs on the tracking server:
every call a REST request through the server's login, and the driver would depend on the
server being up, which the sweep must not (the tracking server down loses nothing). It is not
measured here; docs/performance.md says why.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import emit


def storages(root: Path) -> dict[str, Any]:
    from optuna.storages import JournalStorage, RDBStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    journal = str(root / "study.journal")
    return {
        "journal_file": lambda: JournalStorage(
            JournalFileBackend(journal, lock_obj=JournalFileOpenLock(journal))
        ),
        "sqlite": lambda: RDBStorage(f"sqlite:///{root / 'study.db'}"),
    }


def one(name: str, make: Any, root: Path, trials: int, epochs: int) -> dict[str, Any]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.perf_counter()
    study = optuna.create_study(
        study_name="bench", storage=make(), direction="maximize", load_if_exists=True
    )
    create_s = time.perf_counter() - start
    dist = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    asks = reports = tells = reads = 0.0
    for _ in range(trials):
        t0 = time.perf_counter()
        trial = study.ask(dist)
        t1 = time.perf_counter()
        for epoch in range(1, epochs + 1):
            trial.report(trial.params["x"] * epoch, epoch)
            trial.should_prune()
        t2 = time.perf_counter()
        study.tell(trial, trial.params["x"])
        t3 = time.perf_counter()
        study.get_trials(deepcopy=False)
        t4 = time.perf_counter()
        asks, reports, tells, reads = (
            asks + t1 - t0,
            reports + t2 - t1,
            tells + t3 - t2,
            reads + t4 - t3,
        )
    start = time.perf_counter()
    again = optuna.load_study(study_name="bench", storage=make())
    loaded = len(again.get_trials(deepcopy=False))
    reopen_s = time.perf_counter() - start
    size = sum(p.stat().st_size for p in root.iterdir() if p.is_file())
    return {
        "storage": name,
        "trials": trials,
        "epochs": epochs,
        "create_ms": round(create_s * 1000, 1),
        "ask_ms": round(asks / trials * 1000, 2),
        "report_and_prune_check_ms": round(reports / (trials * epochs) * 1000, 2),
        "tell_ms": round(tells / trials * 1000, 2),
        "read_all_trials_ms": round(reads / trials * 1000, 2),
        "reopen_ms": round(reopen_s * 1000, 1),
        "reopened_trials": loaded,
        "bytes_on_disk": size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("bench/results/bench_sweep_storage.json"))
    args = parser.parse_args()
    results = []
    for name in ("journal_file", "sqlite"):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            results.append(one(name, storages(root)[name], root, args.trials, args.epochs))
    emit(
        {
            "bench": "sweep_storage",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "results": results,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
