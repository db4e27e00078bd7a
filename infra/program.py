"""The stack's program: validate the config, declare the target's nodes, the platform on them.

config -> target (infra/targets: the nodes, as ClusterOutputs) -> provisioning -> training
-> outputs
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pulumi
from trainstack_training.config import DIGITS

from infra import config as stack_config
from infra import topology
from infra.components.provisioning import Provisioning, ProvisioningArgs, tree_digest
from infra.components.secret import derived_secret
from infra.components.training import Training, TrainingArgs
from infra.config.values import PROJECT_DIR
from infra.jobs import JobDirError, envs, pack
from infra.jobs.envs import EnvError
from infra.jobs.remote import JOBS_DIR
from infra.nodes import NODE_PATHS
from infra.targets import docker as docker_target
from infra.targets import ssh as ssh_target
from infra.targets.base import ClusterOutputs, TargetArgs

if TYPE_CHECKING:
    from trainstack_training.manifest import JobSpec

ROOT = PROJECT_DIR
# The driver runs beside an executor on the submitting worker: keep its heap small.
DRIVER_MEMORY_CONF = "spark.driver.memory=512m"
# The job's JVMs (driver and executors live only as long as the job) compile with C1 only: on
# the default stack's 0.55-CPU workers C2 compiling the start-up code took the CPU the start-up
# itself needed; C1 only cut the digits job from 110.9 s to 74.2 s (bench/bench_job_jvm.py).
JOB_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"
DRIVER_CONF = ",".join(
    (
        DRIVER_MEMORY_CONF,
        f"spark.driver.extraJavaOptions={JOB_JAVA_OPTIONS}",
        f"spark.executor.extraJavaOptions={JOB_JAVA_OPTIONS}",
    )
)


def training_settings(
    config: stack_config.StackConfig, job_sha: str = "", data: str = ""
) -> dict[str, Any]:
    """The training job's launch settings (what `trainstack-train` gets); `job_sha`: the
    packed job directory's content digest (infra.jobs.pack); `data`: the job's data set
    (job_data), else the stack's. `gpus_per_worker` only when GPUs are asked for: a stack
    without them keeps its settings, and so its trigger, as they were."""
    settings: dict[str, Any] = {
        "job_sha": job_sha,
        "job_params": json.dumps(config.job_params_dict, sort_keys=True),
        "workers": config.training_workers,
        "epochs": config.train_epochs,
        "batch_size": config.train_batch_size,
        "data": data or stack_data(config),
        "rows": config.train_rows,
        "strategy": config.train_strategy,
        # single: the one TensorFlow worker takes all of its executor's cores
        "cores_per_worker": config.worker_spark_cores if config.train_strategy == "single" else 1,
        "spark_conf": DRIVER_CONF,
        "runner_keep_alive": int(config.runner_keep_alive_seconds),
        "runner_yield": bool(config.runner_yield),
    }
    if config.gpus_per_worker > 0:
        settings["gpus_per_worker"] = config.gpus_per_worker
    return settings


# Settings of the declared job alone, not defaults of a submitted one (jobDefaults).
JOB_ONLY_SETTINGS = ("job_sha", "job_params", "env_sha")
# Settings that change how a job runs, not what it trains.
NOT_A_RETRAIN = ("runner_keep_alive", "runner_yield")


def load_job(config: stack_config.StackConfig) -> JobSpec:
    """The declared job's spec: the one the config's check read (`StackValues.job_spec`),
    not a second read of its manifest."""
    return config.job_spec


def stack_data(config: stack_config.StackConfig) -> str:
    """The stack's data set: `trainstack:trainData`, or the digits when it is not set."""
    return config.train_data or DIGITS


def job_data(config: stack_config.StackConfig, spec: JobSpec, job_sha: str) -> str:
    """The declared job's data set: the stack's `trainData` when it is set (it is the declared
    job's own setting), else the manifest's `data`, else the digits (docs/jobs.md, Data);
    "none" for a job that reads its own data (config refuses `trainData` with it)."""
    from trainstack_training.jobsettings import chosen_data

    given = config.train_data
    return chosen_data(spec, f"{JOBS_DIR}/{job_sha}", given, "trainstack:trainData") or DIGITS


def training_trigger(config: stack_config.StackConfig, settings: dict) -> str:
    """What launches a new run: its settings, the package's source, the retrain token."""
    payload = json.dumps(
        {
            # How long the warm runner stays up is not a reason to train again.
            "settings": {k: v for k, v in settings.items() if k not in NOT_A_RETRAIN},
            "package": tree_digest(sources=("training",)),
            "retrain": config.retrain,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def wheelhouse_path(config: stack_config.StackConfig) -> Path:
    path = Path(config.wheelhouse).expanduser()
    return path if path.is_absolute() else ROOT / path


def build_target(target: TargetArgs) -> ClusterOutputs:
    """The cluster of `trainstack:target` (config has checked the name)."""
    targets: dict[str, Callable[[TargetArgs], ClusterOutputs]] = {
        "docker": docker_target.cluster,
        "ssh": ssh_target.cluster,
    }
    return targets[target.config.target](target)


def tracking_setup(cluster: ClusterOutputs) -> pulumi.Output[dict[str, Any]] | None:
    """Where the tracking server's sync runs (roles/mlflow), for `trainstack sync` and the
    declared job's run: the tracking node's transport record, the server's URI on the cluster
    network (the inventory's, which the sync daemon uses), the login file there, the UI's URL.
    None when trainstack:tracking is off."""
    if cluster.tracking_url is None or cluster.tracking_node is None:
        return None
    node = cluster.tracking_node
    return pulumi.Output.all(cluster.inventory, cluster.tracking_url).apply(
        lambda args: {
            "node": node,
            "tracking_uri": args[0]["all"]["vars"]["trainstack_tracking_uri"],
            "auth_file": NODE_PATHS.mlflow_auth_file,
            "ui_url": args[1],
        }
    )


def main() -> None:
    try:
        config = stack_config.load()
    except stack_config.ConfigError as exc:
        # Fails `pulumi preview`/`up` before any resource is declared.
        raise pulumi.RunError(str(exc)) from None
    # The job's code, packed now: a directory over the size cap fails before anything.
    try:
        job = pack(config.job_path) if config.train else None
        spec = load_job(config) if config.train else None
        env = envs.resolve(config.job_path, spec.requirements) if spec else None
    except (JobDirError, EnvError) as exc:
        raise pulumi.RunError(f"trainstack:job: {exc}") from None
    stack = pulumi.get_stack()
    artifacts = ROOT / ".artifacts" / stack
    wheelhouse = wheelhouse_path(config)
    cluster = build_target(TargetArgs(config, stack, artifacts, wheelhouse))
    pulumi.export("sparkMasterUrl", cluster.spark_master_url)
    pulumi.export("sparkUiUrls", cluster.ui_urls)
    if cluster.monitoring_url is not None:
        pulumi.export("monitoringUrl", cluster.monitoring_url)
    tracking = tracking_setup(cluster)
    if cluster.tracking_url is not None:
        pulumi.export("mlflowUiUrl", cluster.tracking_url)
        # What `trainstack sync` and the declared job's sync need (infra.jobs.remote).
        pulumi.export("tracking", tracking)
    if cluster.object_store_url is not None:
        # The stack's S3 endpoint and its keys (docs/jobs.md, "Data on the object store").
        pulumi.export("objectStoreUrl", cluster.object_store_url)
        pulumi.export("objectStoreBucket", topology.OBJECT_STORE_BUCKET)
        pulumi.export("objectStoreAccessKey", topology.OBJECT_STORE_ACCESS_KEY)
        pulumi.export(
            "objectStoreSecretKey",
            pulumi.Output.secret(
                cluster.spark_auth_secret.apply(lambda s: derived_secret(s, "object-store"))
            ),
        )
    pulumi.export("nodes", cluster.nodes)
    if cluster.network_name is not None:
        pulumi.export("network", cluster.network_name)
    pulumi.export("inventory", cluster.inventory)
    if not config.provision:
        return

    provisioning = Provisioning(
        "provisioning",
        ProvisioningArgs(
            inventory=cluster.inventory,
            spark_auth_secret=cluster.spark_auth_secret,
            secret_id=cluster.secret_id,
            s3_secret_key=config.s3_secret_key,
            wheelhouse=str(wheelhouse),
            artifacts_dir=str(artifacts / "ansible"),
            cpu_boost=cluster.cpu_boost,
            mitogen=config.provision_mitogen,
        ),
        # Every target's cluster is one component: provisioning waits for all of it.
        opts=pulumi.ResourceOptions(depends_on=[cast(pulumi.Resource, cluster)]),
    )
    pulumi.export(
        "provisioning", {"hosts": provisioning.stats, "duration_s": provisioning.duration_s}
    )
    experiment = topology.resource_prefix(config, stack)
    # What `trainstack submit` needs (infra/jobs/commands.py): the nodes that may submit, and the
    # stack's training settings as a submitted job's defaults. A stack with no declared job
    # (trainstack:train false) takes submitted jobs all the same.
    defaults = training_settings(config)
    pulumi.export("jobNodes", cluster.submit_candidates)
    pulumi.export(
        "jobDefaults",
        pulumi.Output.from_input(cluster.spark_master_url).apply(
            lambda url: {
                **{k: v for k, v in defaults.items() if k not in JOB_ONLY_SETTINGS},
                # A submitted job's manifest names its own data; else the stack's.
                "data": stack_data(config),
                "master_url": url,
                # The most ranks a submitted job may ask for (`--workers`), and whether jobs
                # share them (the queue's capacity; trainstack:concurrentJobs).
                "slots": config.training_slots,
                "concurrent": config.concurrent_jobs,
                # The experiment of a submitted job's MLflow run that names none (tracking):
                # the stack's name on the engine, as the sync daemon's (roles/mlflow).
                "stack": experiment,
            }
        ),
    )
    if not config.train:
        return

    assert job is not None and spec is not None  # config.train
    settings = training_settings(config, job.sha, job_data(config, spec, job.sha))
    if env is not None:  # only then: an unchanged job without packages keeps its trigger
        settings["env_sha"] = env.sha
    # The declared job's ranks: its manifest's (`[job] workers`) unless the stack's
    # trainWorkers is set; submitted jobs' defaults (jobDefaults) stay the stack's.
    declared = dict(settings)
    if spec.workers and not config.train_workers and config.train_strategy != "single":
        declared["workers"] = spec.workers
    training = Training(
        "training",
        TrainingArgs(
            master_url=cluster.spark_master_url,
            submit_candidates=cluster.submit_candidates,
            settings=declared,
            trigger=training_trigger(config, declared),
            job_source=str(config.job_path),
            env_wheels=str(env.wheels) if env else "",
            host_artifacts_dir=str(artifacts / "training"),
            monitoring=cluster.monitoring_url,
            tracking=tracking,
            stack=experiment,
            slots=config.training_slots if config.concurrent_jobs else 0,
            facts={
                "params": spec.params,
                "mode": spec.mode,
                "framework": spec.framework,
                "experiment": spec.experiment,
            },
            node_cpus={spec.key: spec.cpus for spec in cluster.plan},
            scrape_interval=config.monitoring_scrape_interval,
        ),
        opts=pulumi.ResourceOptions(depends_on=[provisioning]),
    )
    # Last of the outputs (the CLI lists them by name): the training result.
    pulumi.export("training", training.result)
