"""What `trainstack status` and `trainstack list` print for job records."""

from __future__ import annotations

import json
import time
from typing import Any

from trainstack_training.queue.admission import held
from trainstack_training.rundir import FINAL_STATES


def _age(record: dict[str, Any]) -> str:
    start = record.get("started_at") or record.get("submitted_at") or 0
    end = record.get("ended_at") or time.time()
    return f"{max(0.0, float(end) - float(start)):.0f}s"


def shown_state(record: dict[str, Any]) -> str:
    """The record's state, with a note when its runner has stopped beating."""
    state = str(record.get("state", "?"))
    if state not in FINAL_STATES and time.time() - float(record.get("heartbeat") or 0) > 30:
        return f"{state} (lost: no heartbeat for 30 s)"
    return state


def result_metrics(result: dict[str, Any]) -> str:
    """A result's final metrics, the headline first: `val_mae 0.41, val_loss 0.29, mae 0.38`.
    A classifier's still starts with `validation accuracy`."""
    final = result.get("final")
    if not isinstance(final, dict):  # a job run before results carried their metrics
        return f"validation accuracy {result.get('final_val_accuracy')}"
    first = result.get("metric")
    names = sorted(final, key=lambda k: (k != first, not k.startswith("val_")))
    shown = ", ".join(f"{k} {_number(final[k])}" for k in names)
    if result.get("final_val_accuracy") is not None:
        return f"validation accuracy {_number(result['final_val_accuracy'])} ({shown})"
    return shown or "no metrics"


def _number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, int | float) else str(value)


def _framework(record: dict[str, Any]) -> str:
    """ "torch, " for a torch job; nothing for TensorFlow's (the default, and older records)."""
    framework = record.get("framework", "tensorflow")
    return "" if framework == "tensorflow" else f"{framework}, "


def print_status(record: dict[str, Any]) -> None:
    result = record.get("result") or {}
    lines = [
        f"job {record.get('id')}: {shown_state(record)}",
        f"  code {str(record.get('code_sha', ''))[:12]} ({_framework(record)}{record.get('mode')} "
        "mode) from "
        f"{record.get('job')}",
        f"  params {json.dumps(record.get('params', {}), sort_keys=True)}",
        f"  node {record.get('node')}, {_age(record)}",
    ]
    if record.get("waiting_for"):  # its Spark application waits for another's cores
        lines.append(f"  {record['waiting_for']}")
    if result:
        task = f"{result['task']}: " if result.get("task") else ""  # absent in older results
        lines.append(
            f"  {task}{result_metrics(result)} after {result.get('epochs')} epochs; model "
            f"{result.get('model_path')}"
        )
    if record.get("error"):
        lines.append(f"  error: {record['error']}")
    lines += tracking_lines(record.get("tracking") or {})
    print("\n".join(lines))


def tracking_lines(tracking: dict[str, Any]) -> list[str]:
    """The job's MLflow run, from its tracking.json (nothing when it has none)."""
    if not tracking.get("run_id"):
        return []
    synced = "" if tracking.get("complete") else " (not complete yet: `trainstack sync`)"
    where = f" {tracking['url']}" if tracking.get("url") else ""
    return [f"  mlflow run {tracking['run_id']}{synced}{where}"]


def final_metric(record: dict[str, Any], metric: str) -> str:
    """The job's final value of `metric` (its result's `final`: metrics.json's), or "-"."""
    final = (record.get("result") or {}).get("final")
    value = final.get(metric) if isinstance(final, dict) else None
    return _number(value) if value is not None else "-"


def held_slots(record: dict[str, Any]) -> int:
    """The training slots a job holds now (trainstack_training.admission): from its admission
    until it ends, while its queue process beats."""
    return held(record, time.time())


def slots_column(record: dict[str, Any]) -> str:
    """A running job's slots; a waiting job's in parentheses (what it needs); else "-"."""
    if held_slots(record):
        return str(held_slots(record))
    if record.get("state") in ("queued", "installing") and not record.get("slots"):
        return f"({int(record.get('workers') or 1)})"
    return "-"


def print_list(records: list[dict[str, Any]], metric: str = "", capacity: int = 0) -> None:
    """One line a job, oldest first, under a header: its slots (held, or needed while it
    waits); with `metric`, a column of its final value; with the cluster's `capacity`, the
    free slots under the table."""
    width = max(len(metric), 8)
    column = f"{metric.upper():>{width}}  " if metric else ""
    print(f"{'JOB ID':<28} {'STATE':<10} {'AGE':>6} {'SLOTS':>5}  {column}CODE          JOB")
    for r in records:
        value = f"{final_metric(r, metric):>{width}}  " if metric else ""
        print(
            f"{r.get('id', ''):<28} {shown_state(r):<10} {_age(r):>6} {slots_column(r):>5}  "
            f"{value}{str(r.get('code_sha', ''))[:12]:<12}  {r.get('job', '')}"
        )
    if capacity:
        free = capacity - sum(held_slots(r) for r in records)
        print(f"free slots: {free} of {capacity}")
