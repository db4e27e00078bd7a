"""The job's task, declared or inferred, and the checks of its labels.

A job is a classification (integer labels in ``[0, n_classes)``) or a regression (numbers).
The manifest may declare it (``task`` in trainstack.toml); otherwise the label column's type
decides: integers are a classification, floats a regression. A label the task cannot use is
refused with one sentence naming the column, a sample value and what was expected.
"""

from __future__ import annotations

from typing import Any

from trainstack_training.config import AUTO_TASK, CLASSIFICATION, MAX_CLASSES, REGRESSION
from trainstack_training.data.info import DataError


def infer_task(declared: str, integral: bool) -> str:
    """The task the data stage prepares for: the declared one, else a classification for an
    integer label column and a regression for a float one."""
    if declared != AUTO_TASK:
        return declared
    return CLASSIFICATION if integral else REGRESSION


def non_numeric_label(
    column: str, type_name: str, sample: Any, declared: str, n_classes: int
) -> DataError:
    """The refusal of a label column that holds no numbers (strings, dates, ...)."""
    if declared == REGRESSION:
        expected = "a regression needs numbers"
    elif declared == CLASSIFICATION:
        expected = f"it must hold integers in [0, {n_classes}) for a classification"
    else:
        expected = (
            f"it must hold integers in [0, {n_classes}) for a classification or numbers for "
            "a regression"
        )
    return DataError(
        f"label column {column!r} has type {type_name}; {expected}, not values such as {sample!r}"
    )


def check_labels(stats: dict[str, Any], task: str, column: str, n_classes: int) -> None:
    """Refuse labels the task cannot use, from the data stage's label statistics: rows
    (``null_labels``), ``min_label``/``max_label``, and for a float column
    ``nonfinite_labels``/``nonfinite_example`` and ``frac_labels``/``frac_example``."""
    if stats["null_labels"]:
        raise DataError(
            f"label column {column!r} has {stats['null_labels']} null "
            "values; every row needs a label"
        )
    if stats.get("nonfinite_labels"):
        raise DataError(
            f"label column {column!r} has {stats['nonfinite_labels']} values that are not "
            f"finite numbers (e.g. {stats['nonfinite_example']}); every label must be a "
            "finite number"
        )
    if task == REGRESSION:
        return
    if stats.get("frac_labels"):
        raise DataError(
            f"label column {column!r} has {stats['frac_labels']} non-integer "
            f"values (e.g. {stats['frac_example']}); labels must be integers in "
            f'[0, {n_classes}) for a classification (task = "regression" trains on them)'
        )
    lo, hi = stats["min_label"], stats["max_label"]
    if hi >= MAX_CLASSES:
        raise DataError(
            f"label column {column!r} holds {hi}, more classes than a classification takes: "
            f"labels must be integers in [0, {MAX_CLASSES}) (declare "
            'task = "regression" for a numeric target)'
        )
    if lo < 0 or hi >= n_classes:
        bad = lo if lo < 0 else hi
        raise DataError(
            f"label {bad} in column {column!r} is out of range; labels must "
            f"be integers in [0, {n_classes}) (set --n-classes)"
        )
