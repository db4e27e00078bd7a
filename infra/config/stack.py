"""`StackValues`: every key of the `trainstack:` namespace with its default, and the values
derived from them. Plain data: reading the keys and checking them is `infra.config`'s
`StackConfig` (this class with `from_mapping` and `validate`), the checks are
`infra.config.checks`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.config.servers import Server
from infra.config.values import PROJECT_DIR, parse_duration, parse_size

if TYPE_CHECKING:
    from trainstack_training.manifest import JobSpec

# trainstack:monitoringPort -1 (the default) puts Prometheus's UI at uiPortBase + this: 19090.
MONITORING_PORT_OFFSET = 1010
# trainstack:trackingPort -1 (the default) puts the MLflow UI at uiPortBase + this: 19100.
TRACKING_PORT_OFFSET = 1020
# trainstack:objectStorePort -1 (the default) puts the object store's S3 endpoint at
# uiPortBase + this: 19110.
OBJECT_STORE_PORT_OFFSET = 1030


@dataclass(frozen=True)
class StackValues:
    """Every key of the `trainstack:` namespace, with its default (`StackConfig` reads them
    from the stack and checks them).

    The nodes' own defaults fit 2 cores and 8 GiB: 3 x (0.3 CPU, 1 GiB) control nodes and
    2 x (0.55 CPU, 2 GiB) workers. The shares of the services some nodes host come on top
    (tracking 1 GiB, object store 512 MiB, the job drivers 1 GiB and 0.3 CPU): 9.5 GiB and
    2.3 CPUs of limits in all, which are caps, not reservations.
    """

    control_nodes: int = 3
    masters: int = 2
    workers: int = 2
    control_cpus: float = 0.3
    control_memory: str = "1g"
    worker_cpus: float = 0.55
    worker_memory: str = "2g"
    worker_spark_cores: int = 1
    worker_spark_memory: str = "1g"
    base_image: str = "debian:bookworm"
    bake_image: bool = True
    image_repository: str = "trainstack-node"
    name_prefix: str = "trainstack"
    bind_address: str = "127.0.0.1"
    ui_port_base: int = 18080
    retain_data: bool = False
    wheelhouse: str = "~/.cache/trainstack/wheelhouse"
    provision: bool = True
    provision_cpu_boost: bool = True
    provision_mitogen: bool = True
    train: bool = True
    # The job (docs/jobs.md): a directory with trainstack.toml and the user's code, relative to
    # the project directory or absolute, and a JSON object of parameters over its [params].
    job: str = "examples/digits"
    job_params: str = ""
    train_epochs: int = 10
    train_workers: int = 0
    train_batch_size: int = 32
    # "" (not set): the job's manifest names the data set, else the digits (program.job_data).
    train_data: str = ""
    train_rows: int = 0
    train_strategy: str = "multi-worker"
    # GPUs (docs/targets.md, GPUs): each training worker's barrier task asks Spark for this
    # many (trainstack-train --gpus-per-worker); 0 = CPU only. The workers offer them: the ssh
    # target's servers by their entries' `gpus`, the docker target's containers by dockerGpus.
    gpus_per_worker: int = 0
    retrain: str = ""
    # The warm runner (docs/jobs.md): a Spark application that outlives a job on the submitting
    # node and gives the cluster's cores back after this long without a job; "0" = each job
    # starts and stops its own.
    runner_keep_alive: str = "10m"
    # While no job runs in it, the warm runner stops as soon as another Spark application waits
    # for the cores it holds; False keeps them for the whole keep-alive.
    runner_yield: bool = True
    # Jobs whose ranks fit the training slots run at once (docs/jobs.md, "The queue"); False:
    # one job at a time, whatever its size.
    concurrent_jobs: bool = True
    # Monitoring (docs/monitoring.md): Prometheus on the first control node.
    monitoring: bool = True
    monitoring_port: int = -1  # -1: uiPortBase + 1010 (19090), or 0 when uiPortBase is 0
    monitoring_retention: str = "2d"
    monitoring_scrape_interval: str = "5s"
    monitoring_alert_for: str = "1m"
    monitoring_progress_timeout: str = "10m"
    # Tracking (docs/monitoring.md, "Tracking server"): an MLflow server on the first control
    # node, every job a run.
    tracking: bool = True
    tracking_port: int = -1  # -1: uiPortBase + 1020 (19100), or 0 when uiPortBase is 0
    # What the tracking server (about 600 MiB resident) and its sync add to their node's limit.
    tracking_memory: str = "1g"
    # The object store (docs/jobs.md, "Data on the object store"): SeaweedFS's S3 gateway on
    # the first control node, its data on a volume of its own, s3a:// on every node.
    object_store: bool = True
    object_store_port: int = -1  # -1: uiPortBase + 1030 (19110), or 0 when uiPortBase is 0
    # What the object store (about 130 MiB resident idle, more while it takes uploads) adds
    # to its node's limit.
    object_store_memory: str = "512m"
    # The job drivers' node (the docker target's last control node; docs/jobs.md, "Where the
    # drivers run"): the memory and CPUs that each job's queue process and `trainstack-train`,
    # the warm runner (its PySpark driver) and a sweep's driver add to that node's limits, so
    # that a worker's limits are its executor's and ranks' alone.
    driver_memory: str = "1g"
    driver_cpus: float = 0.3
    # An external S3-compatible endpoint (AWS or another) for s3a:// and the data stage's
    # pyarrow reads on every node, instead of the stack's store: its URL, keys (the secret one
    # a Pulumi secret: `pulumi config set --secret trainstack:s3SecretKey ...`), region and
    # addressing. "" (the default): the stack's object store, when trainstack:objectStore is on.
    s3_endpoint: str = ""
    s3_access_key: str = ""
    s3_secret_key: str = field(default="", repr=False)
    s3_region: str = "us-east-1"
    s3_path_style: bool = True
    # Targets (docs/targets.md): only docker is selectable.
    target: str = "docker"
    servers: tuple[Server, ...] = ()  # the ssh target's server list
    # The docker target's worker containers get the workstation's NVIDIA GPUs: "" (none),
    # "all" (every worker sees every GPU) or device ids ("0,1": dealt out in order, each worker
    # as many).
    docker_gpus: str = ""
    # The aws target, on paper: tested under Pulumi's mocks only.
    aws_region: str = "us-east-1"
    aws_operator_cidr: str = ""
    aws_control_instance_type: str = "t3.medium"
    aws_worker_instance_type: str = "m6i.xlarge"
    aws_public_key: str = ""
    aws_private_key_file: str = ""
    aws_data_volume_gb: int = 50
    # Security (docs/security.md).
    spark_network_crypto: bool = True  # AES-based RPC and block transfer encryption
    spark_io_encryption: bool = False  # encrypt shuffle and spill files on the nodes' disks
    rotate_secrets: str = ""  # a new token makes new cluster secrets on the next `up`

    # Derived values -------------------------------------------------------------

    @property
    def control_memory_bytes(self) -> int:
        return parse_size(self.control_memory)

    @property
    def tracking_memory_bytes(self) -> int:
        return parse_size(self.tracking_memory)

    @property
    def object_store_memory_bytes(self) -> int:
        return parse_size(self.object_store_memory)

    @property
    def driver_memory_bytes(self) -> int:
        return parse_size(self.driver_memory)

    @property
    def worker_memory_bytes(self) -> int:
        return parse_size(self.worker_memory)

    @property
    def monitoring_host_port(self) -> int:
        """Host port of Prometheus's UI: as set, or next to the Spark UIs' (engine-picked
        with them), so stacks that let the engine pick their ports never collide."""
        if self.monitoring_port != -1:
            return self.monitoring_port
        return self.ui_port_base + MONITORING_PORT_OFFSET if self.ui_port_base else 0

    @property
    def tracking_host_port(self) -> int:
        """Host port of the MLflow UI: as set, or next to the Spark UIs' (engine-picked with
        them), so stacks that let the engine pick their ports never collide."""
        if self.tracking_port != -1:
            return self.tracking_port
        return self.ui_port_base + TRACKING_PORT_OFFSET if self.ui_port_base else 0

    @property
    def object_store_host_port(self) -> int:
        """Host port of the object store's S3 endpoint: as set, or next to the Spark UIs'."""
        if self.object_store_port != -1:
            return self.object_store_port
        return self.ui_port_base + OBJECT_STORE_PORT_OFFSET if self.ui_port_base else 0

    @property
    def monitoring_progress_timeout_seconds(self) -> int:
        return int(parse_duration(self.monitoring_progress_timeout))

    @property
    def runner_keep_alive_seconds(self) -> float:
        """The warm runner's keep-alive in seconds; 0 = no warm runner (ValueError when it is
        not a duration)."""
        text = str(self.runner_keep_alive).strip()
        return 0.0 if text in ("0", "0s") else parse_duration(text)

    @property
    def job_path(self) -> Path:
        """The job directory: `job` as an absolute path, or relative to the project."""
        path = Path(self.job).expanduser()
        return path if path.is_absolute() else PROJECT_DIR / path

    @property
    def job_params_dict(self) -> dict[str, Any]:
        """`job_params` as a dict; ValueError naming the problem when it is not a JSON
        object."""
        if isinstance(self.job_params, dict):
            return dict(self.job_params)
        text = str(self.job_params or "").strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{text[:80]!r} is not a JSON object ({exc})") from None
        if not isinstance(value, dict):
            raise ValueError(
                f"{text[:80]!r} is not a JSON object; give name/value pairs, e.g. "
                '{"learning_rate": 0.01}'
            )
        return value

    @cached_property
    def job_spec(self) -> JobSpec:
        """The declared job's checked spec, `job_params` over its [params]: its manifest is
        read here, once for the program's run (the config's check, checks._job, and the
        program, infra.program, share it). JobError when the directory cannot run; ValueError
        when `job_params` is not a JSON object."""
        from trainstack_training.manifest import load_spec

        return load_spec(self.job_path, self.job_params_dict)

    @property
    def docker_gpu_devices(self) -> tuple[str, ...]:
        """dockerGpus's device ids, in order; () for "" and "all"."""
        text = str(self.docker_gpus).strip()
        if text.lower() in ("", "all"):
            return ()
        return tuple(part.strip() for part in text.split(","))

    def docker_worker_gpus(self, index: int) -> tuple[str, int]:
        """The GPUs of the docker target's worker `index` (1-based): the container's `gpus`
        ("" = none, "all", or "device=<ids>") and how many its Spark worker must find (0: no
        GPU scheduling). With "all", gpusPerWorker and at least 1: a Spark worker offers every
        GPU its discovery script finds, and fails to start with fewer than this."""
        text = str(self.docker_gpus).strip()
        if not text:
            return "", 0
        if text.lower() == "all":
            return "all", max(self.gpus_per_worker, 1)
        devices = self.docker_gpu_devices
        each = max(len(devices) // max(self.workers, 1), 1)
        mine = devices[(index - 1) * each : index * each]
        return ("device=" + ",".join(mine), len(mine)) if mine else ("", 0)

    @property
    def training_slots(self) -> int:
        """The cluster's training slots, the most ranks a job can have, and what the queue
        shares between jobs (one rank a slot): Spark's task slots on the nodes that train (the
        worker nodes; on the ssh target the servers with the `tensorflow` role), one per
        `workerSparkCores`; one per node with the `single` strategy (a rank takes them all)."""
        if self.target == "ssh":
            nodes = sum("tensorflow" in s.roles for s in self.servers)
        else:
            nodes = self.workers
        return nodes if self.train_strategy == "single" else nodes * self.worker_spark_cores

    @property
    def training_workers(self) -> int:
        """TensorFlow workers of a run: as configured, or one per worker node; one with the
        `single` strategy."""
        if self.train_strategy == "single":
            return 1
        if self.train_workers:
            return self.train_workers
        if self.target == "ssh":
            return sum("tensorflow" in s.roles for s in self.servers)
        return self.workers
