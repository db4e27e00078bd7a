"""The training job's configuration: one typed dataclass, loadable from a file or CLI flags."""

from __future__ import annotations

import argparse
import dataclasses
import json
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

DIGITS = "digits"  # the offline default data set (scikit-learn's handwritten digits)
# A full-mode job that reads its own data (its manifest's `data = "none"`): no data stage
OWN_DATA = "none"
STRATEGIES = ("multi-worker", "single")  # see TrainConfig.train_strategy
COLLECTIVES = ("auto", "ring")  # tf.distribute.experimental.CommunicationImplementation
CLASSIFICATION, REGRESSION = "classification", "regression"
TASKS = (CLASSIFICATION, REGRESSION)  # what a job trains (the manifest's `task`)
AUTO_TASK = "auto"  # the task inferred from the label column (trainstack_training.data.task)
# The job's framework: its manifest's `framework` (trainstack_training.manifest.FRAMEWORKS).
FRAMEWORK_NAMES = ("tensorflow", "torch")
MAX_CLASSES = 2**16  # the most classes a classification takes


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the value and what is allowed."""


@dataclass
class TrainConfig:
    """Everything one training run needs. Field docs double as the CLI's help text."""

    master: str = field(
        default="local[2]",
        metadata={
            "help": "Spark master URL "
            "(spark://m1:7077,m2:7077 for standby masters, local[N] for one machine)"
        },
    )
    workers: int = field(
        default=2,
        metadata={
            "help": "number of TensorFlow workers "
            "(= barrier tasks); 1 is the single-machine baseline"
        },
    )
    job_dir: str = field(
        default="",
        metadata={
            "help": "the job: a directory with trainstack.toml and its Python code, on a path "
            "every worker sees (docs/jobs.md; e.g. examples/digits)"
        },
    )
    job_params: str = field(
        default="{}",
        metadata={"help": "JSON object of job parameters over the manifest's [params]"},
    )
    job_env: str = field(
        default="",
        metadata={
            "help": "the site directory of the job's packages, installed from its "
            "requirements by `trainstack submit` or `pulumi up` (docs/jobs.md, Packages)"
        },
    )
    epochs: int = field(default=5, metadata={"help": "training epochs"})
    batch_size: int = field(
        default=32,
        metadata={"help": "per-worker batch size; the global batch is batch_size x workers"},
    )
    learning_rate: float = field(default=1e-3, metadata={"help": "Adam learning rate"})
    train_strategy: str = field(
        default="multi-worker",
        metadata={
            "help": "multi-worker: `workers` TensorFlow workers with MultiWorkerMirroredStrategy; "
            "single: one TensorFlow worker (workers is taken as 1) using cores_per_worker cores, "
            "no collectives"
        },
    )
    gpus_per_worker: int = field(
        default=0,
        metadata={
            "help": "GPUs each worker's barrier task asks Spark for (spark.task.resource.gpu."
            "amount); a torch job trains on them with NCCL. 0 = CPU only"
        },
    )
    steps_per_execution: int = field(
        default=1,
        metadata={"help": "training steps per tf.function call (Keras steps_per_execution)"},
    )
    collective: str = field(
        default="auto",
        metadata={"help": "all-reduce implementation of the multi-worker strategy: auto or ring"},
    )
    bytes_per_pack: int = field(
        default=0,
        metadata={"help": "split the gradient all-reduce into packs of this many bytes (0 = one)"},
    )
    data: str = field(
        default=DIGITS,
        metadata={
            "help": "'digits' (built in), or a Parquet/CSV "
            "path or URL the cluster can read (file://, hdfs://, s3a://, http(s)://); 'none' "
            'for a job whose manifest says data = "none" (it reads its own data)'
        },
    )
    data_format: str = field(default="auto", metadata={"help": "auto, parquet or csv"})
    rows: int = field(
        default=0,
        metadata={
            "help": "with --data digits: scale the set to this "
            "many rows with deterministic augmented copies (0 = the 1797 originals)"
        },
    )
    label_col: str = field(
        default="label",
        metadata={"help": "the label column (a job's manifest sets it with `label`)"},
    )
    framework: str = field(
        default="",
        metadata={
            "help": "tensorflow or torch: the job's manifest's `framework` decides it (empty = "
            "the manifest's; another value given is refused); it picks the warm runner's "
            "executors' preloaded framework"
        },
    )
    task: str = field(
        default=AUTO_TASK,
        metadata={
            "help": "classification, regression, or auto: a job's manifest's `task`, else "
            "inferred from the label column (integers: classification, floats: regression)"
        },
    )
    feature_cols: str = field(
        default="",
        metadata={
            "help": "comma-separated feature columns (empty = every column except the label)"
        },
    )
    n_classes: int = field(
        default=10,
        metadata={"help": "a classification's labels must be integers in [0, n_classes)"},
    )
    val_fraction: float = field(default=0.2, metadata={"help": "validation share of the rows"})
    seed: int = field(default=42, metadata={"help": "seed for split, shuffling and weights"})
    output: str = field(
        default="./trainstack-output",
        metadata={
            "help": "run directory on "
            "storage shared by all workers (model, metrics, plot, shards, backup)"
        },
    )
    cores_per_worker: int = field(
        default=1,
        metadata={
            "help": "cores per TensorFlow worker "
            "(spark.task.cpus); TensorFlow's threads are limited to it"
        },
    )
    pin_cores: bool = field(
        default=False,
        metadata={
            "help": "pin each worker's process to its own cores (one machine, benchmarks): "
            "worker i gets cores [i*c, (i+1)*c) of those the process may use"
        },
    )
    max_attempts: int = field(
        default=4,
        metadata={
            "help": "barrier stage attempts before the "
            "job fails (spark.stage.maxConsecutiveAttempts)"
        },
    )
    slot_wait_seconds: int = field(
        default=10,
        metadata={
            "help": "how long to wait for enough free slots for the barrier stage before failing"
        },
    )
    app_name: str = field(default="trainstack-train", metadata={"help": "Spark application name"})
    runner_keep_alive: int = field(
        default=0,
        metadata={
            "help": "run the job in the node's warm runner, a Spark application that outlives "
            "the job and stops after this many idle seconds (trainstack_training.warm); "
            "0 = the job's own Spark application, stopped at its end"
        },
    )
    runner_yield: bool = field(
        default=True,
        metadata={
            "help": "the warm runner, while no job runs in it, stops as soon as another Spark "
            "application waits for the cores it holds (the ALIVE master's JSON page says so); "
            "--no-runner-yield keeps the cores for the whole keep-alive"
        },
    )
    master_ui_port: int = field(
        default=8080,
        metadata={
            "help": "the Spark masters' web UI port on the cluster network, whose JSON page "
            "says which applications hold or wait for cores"
        },
    )
    spark_conf: str = field(
        default="",
        metadata={
            "help": "extra Spark settings, comma-separated key=value "
            "(e.g. spark.driver.memory=4g,spark.executor.memory=4g)"
        },
    )
    local_prep_mb: int = field(
        default=32,
        metadata={
            "help": "inputs up to this size (MiB, Spark's estimate of the read) are prepared in "
            "the driver after one Spark read job; larger ones by the distributed Spark stage "
            "(0 = always distributed)"
        },
    )
    data_stream: str = field(
        default="auto",
        metadata={
            "help": "how each rank reads its shard and the validation set: on = streamed a "
            "row group at a time (memory bounded by the read-ahead), off = whole in memory, "
            "auto = streamed when the arrays would take more than a quarter of the rank's "
            "memory limit (docs/training.md, Streaming)"
        },
    )
    plot: bool = field(default=True, metadata={"help": "write the training-curve PNG"})
    # Test-only fault hook: the worker with this index SIGKILLs its own Python process halfway
    # through this epoch (once: a marker file in the run directory records it). -1 = off.
    fault_kill_epoch: int = field(
        default=-1,
        metadata={
            "help": "TEST ONLY: SIGKILL a worker halfway through this epoch (1-based), once; "
            "Spark retries and training resumes from the backup (-1 = off)"
        },
    )
    fault_kill_worker: int = field(
        default=1, metadata={"help": "TEST ONLY: index of the worker that --fault-kill-epoch kills"}
    )
    # Test-only hold hook: at each epoch end but the last, every worker waits while this file
    # exists (bounded), so a failure drill strikes the run at a known epoch boundary.
    hold_file: str = field(
        default="",
        metadata={
            "help": "TEST ONLY: at the end of every epoch but the last, each worker waits while "
            "this file exists (a path every worker sees: shared storage), up to 900 s once, "
            "after the epoch's backup and epochs.jsonl row are written (empty = off)"
        },
    )

    def feature_list(self) -> list[str]:
        return [c.strip() for c in self.feature_cols.split(",") if c.strip()]

    def spark_settings(self) -> dict[str, str]:
        settings = {}
        for item in (i.strip() for i in self.spark_conf.split(",")):
            if not item:
                continue
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"spark_conf item {item!r}: expected key=value")
            settings[key.strip()] = value.strip()
        return settings

    def validate(self) -> TrainConfig:
        """Raise ConfigError naming the bad value and what is allowed."""
        checks: list[tuple[bool, str]] = [
            (self.workers >= 1, f"workers={self.workers}: must be >= 1"),
            (self.epochs >= 1, f"epochs={self.epochs}: must be >= 1"),
            (
                self.framework in ("", *FRAMEWORK_NAMES),
                f"framework={self.framework!r}: allowed are {', '.join(FRAMEWORK_NAMES)}, or "
                "none (the job's manifest decides)",
            ),
            (
                self.gpus_per_worker >= 0,
                f"gpus_per_worker={self.gpus_per_worker}: must be >= 0 (0 = CPU only)",
            ),
            (self.batch_size >= 1, f"batch_size={self.batch_size}: must be >= 1"),
            (self.learning_rate > 0, f"learning_rate={self.learning_rate}: must be > 0"),
            (self.rows >= 0, f"rows={self.rows}: must be >= 0 (0 = the data set as it is)"),
            (
                2 <= self.n_classes <= MAX_CLASSES,
                f"n_classes={self.n_classes}: must be in [2, {MAX_CLASSES}]",
            ),
            (
                self.task in (AUTO_TASK, *TASKS),
                f"task={self.task!r}: allowed are {AUTO_TASK}, {', '.join(TASKS)}",
            ),
            (0 < self.val_fraction < 1, f"val_fraction={self.val_fraction}: must be in (0, 1)"),
            (self.cores_per_worker >= 1, f"cores_per_worker={self.cores_per_worker}: must be >= 1"),
            (self.max_attempts >= 1, f"max_attempts={self.max_attempts}: must be >= 1"),
            (self.slot_wait_seconds >= 1, f"slot_wait_seconds={self.slot_wait_seconds}: >= 1"),
            (
                self.runner_keep_alive >= 0,
                f"runner_keep_alive={self.runner_keep_alive}: must be >= 0 (0 = off)",
            ),
            (
                self.data_format in ("auto", "parquet", "csv"),
                f"data_format={self.data_format!r}: allowed are auto, parquet, csv",
            ),
            (
                self.train_strategy in STRATEGIES,
                f"train_strategy={self.train_strategy!r}: allowed are {', '.join(STRATEGIES)}",
            ),
            (
                self.collective in COLLECTIVES,
                f"collective={self.collective!r}: allowed are {', '.join(COLLECTIVES)}",
            ),
            (
                self.steps_per_execution >= 1,
                f"steps_per_execution={self.steps_per_execution}: must be >= 1",
            ),
            (self.bytes_per_pack >= 0, f"bytes_per_pack={self.bytes_per_pack}: must be >= 0"),
            (
                0 < self.master_ui_port < 65536,
                f"master_ui_port={self.master_ui_port}: must be a port in 1-65535",
            ),
            (self.local_prep_mb >= 0, f"local_prep_mb={self.local_prep_mb}: must be >= 0"),
            (
                self.data_stream in ("auto", "on", "off"),
                f"data_stream={self.data_stream!r}: allowed are auto, on, off",
            ),
            (bool(self.master), "master is empty: give a Spark master URL"),
            (bool(self.output), "output is empty: give a directory on shared storage"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        self.spark_settings()
        if self.train_strategy == "single":
            self.workers = 1  # one TensorFlow process; its cores are cores_per_worker
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; allowed: {sorted(known)}")
        return cls(**values)

    @classmethod
    def from_file(cls, path: str | Path) -> TrainConfig:
        """Load a .json or .toml file whose keys are the field names."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        text = p.read_text()
        if p.suffix == ".toml":
            values = tomllib.loads(text)
        elif p.suffix == ".json":
            values = json.loads(text)
        else:
            raise ConfigError(f"config file {str(p)!r}: allowed suffixes are .json and .toml")
        return cls.from_dict(values)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    """One flag per TrainConfig field, plus --config FILE (flags override the file)."""
    parser = argparse.ArgumentParser(
        prog="trainstack-train",
        description="Prepare data with Spark and train a TensorFlow model on a Spark cluster.",
    )
    parser.add_argument("--config", help="JSON or TOML file with config keys (flags override)")
    for f in fields(TrainConfig):
        help_text = f.metadata.get("help", "")
        if f.type in ("bool", bool):
            parser.add_argument(
                _flag(f.name),
                dest=f.name,
                default=None,
                action=argparse.BooleanOptionalAction,
                help=help_text,
            )
            continue
        kind = {"int": int, "float": float}.get(str(f.type), str)
        parser.add_argument(
            _flag(f.name),
            dest=f.name,
            type=kind,
            default=None,
            help=f"{help_text} (default: {f.default})",
        )
    return parser


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    args = build_parser().parse_args(argv)
    base = TrainConfig.from_file(args.config).to_dict() if args.config else {}
    for f in fields(TrainConfig):
        value = getattr(args, f.name)
        if value is not None:
            base[f.name] = value
    return TrainConfig.from_dict(base).validate()
