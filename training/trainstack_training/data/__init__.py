"""The data stage, split by concern:

- ``sources``: the offline digits and their generator; resolving, checking and reading a
  named data set;
- ``xxhash``: Spark SQL's xxhash64 in NumPy (the split of small sets without Spark);
- ``task``: the job's task (classification or regression), declared or inferred, and the
  checks of its labels;
- ``stage``: ``prepare``, which picks one of its three paths and runs it;
- ``arrow``: the "arrow" path's read and split of a small Parquet set, without Spark SQL;
- ``spark_jobs``: the stage's Spark jobs (the "driver" path's read; the distributed path's
  one partitioned write, which computes the statistics as it goes);
- ``local_prep``: the small sets' statistics and shard files, in the driver;
- ``scaling``: each feature's range, and the scaling to [0, 1] a rank applies as it reads;
- ``checks``: the checks of the statistics and of the shards, the same on every path;
- ``shards``: ``load_arrays``, a shard read back whole (in a rank);
- ``stream`` and ``rank``: a rank's data, its shard held in memory or streamed;
- ``info``: ``DataInfo``, what the stage gives every training task, and ``DataError``.
"""

from trainstack_training.data.info import DataError, DataInfo
from trainstack_training.data.shards import load_arrays
from trainstack_training.data.sources import (
    DIGITS_ROWS,
    check_files,
    digits_arrays,
    generate_digits,
    read_source,
    resolve_source,
)
from trainstack_training.data.stage import prepare
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
