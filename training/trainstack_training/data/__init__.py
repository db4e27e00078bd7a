"""The data stage, split by concern:

- ``sources``: the offline digits and their generator; resolving, checking and reading a
  named data set;
- ``xxhash``: Spark SQL's xxhash64 in NumPy (the split of small sets without Spark);
- ``task``: the job's task (classification or regression), declared or inferred, and the
  checks of its labels;
- ``stage``: ``prepare`` (its three paths, the checks, the shards) and ``load_arrays``;
- ``info``: ``DataInfo``, what the stage gives every training task, and ``DataError``.
"""

from trainstack_training.data.info import DataError, DataInfo
from trainstack_training.data.sources import (
    DIGITS_ROWS,
    check_files,
    digits_arrays,
    generate_digits,
    read_source,
    resolve_source,
)
from trainstack_training.data.stage import load_arrays, prepare
from trainstack_training.data.task import check_labels, infer_task
from trainstack_training.data.xxhash import spark_xxhash64

__all__ = [
    "DIGITS_ROWS",
    "DataError",
    "DataInfo",
    "check_files",
    "check_labels",
    "digits_arrays",
    "generate_digits",
    "infer_task",
    "load_arrays",
    "prepare",
    "read_source",
    "resolve_source",
    "spark_xxhash64",
]
