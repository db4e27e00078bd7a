"""The stack's program: validate the config, check the engine, declare the platform."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pulumi

from infra import config as stack_config
from infra.components import Cluster, ClusterArgs
from infra.components.provisioning import Provisioning, ProvisioningArgs, tree_digest
from infra.components.training import Training, TrainingArgs
from infra.local_docker.resources import EngineError, docker_client

ROOT = Path(__file__).resolve().parents[1]
# The driver runs beside an executor on the submitting worker: keep its heap small.
DRIVER_CONF = "spark.driver.memory=512m"


def training_trigger(config: stack_config.StackConfig, settings: dict) -> str:
    """What launches a new run: its settings, the package's source, the retrain token."""
    payload = json.dumps(
        {
            "settings": settings,
            "package": tree_digest(sources=("training",)),
            "retrain": config.retrain,
        },
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def main() -> None:
    try:
        config = stack_config.load()
    except stack_config.ConfigError as exc:
        # Fails `pulumi preview`/`up` before any resource is declared.
        raise pulumi.RunError(str(exc)) from None
    try:
        docker_client()
    except EngineError as exc:
        raise pulumi.RunError(str(exc)) from None

    stack = pulumi.get_stack()
    artifacts = ROOT / ".artifacts" / stack
    wheelhouse = Path(config.wheelhouse).expanduser()
    wheelhouse = wheelhouse if wheelhouse.is_absolute() else ROOT / wheelhouse
    cluster = Cluster(
        "cluster",
        ClusterArgs(
            config=config,
            project=pulumi.get_project(),
            stack=stack,
            wheelhouse_dir=str(wheelhouse) if config.provision else None,
        ),
    )
    pulumi.export("sparkMasterUrl", cluster.spark_master_url)
    pulumi.export("sparkUiUrls", cluster.ui_urls)
    pulumi.export("nodes", cluster.nodes)
    pulumi.export("network", cluster.network_name)
    pulumi.export("inventory", cluster.inventory)
    if not config.provision:
        return

    provisioning = Provisioning(
        "provisioning",
        ProvisioningArgs(
            inventory=cluster.inventory,
            spark_auth_secret=cluster.spark_auth_secret,
            wheelhouse=str(wheelhouse),
            artifacts_dir=str(artifacts / "ansible"),
        ),
        opts=pulumi.ResourceOptions(depends_on=[cluster]),
    )
    pulumi.export(
        "provisioning", {"hosts": provisioning.stats, "duration_s": provisioning.duration_s}
    )
    if not config.train:
        return

    settings = {
        "workers": config.training_workers,
        "epochs": config.train_epochs,
        "batch_size": config.train_batch_size,
        "data": config.train_data,
        "rows": config.train_rows,
        "spark_conf": DRIVER_CONF,
    }
    training = Training(
        "training",
        TrainingArgs(
            master_url=cluster.spark_master_url,
            submit_container=f"{cluster.prefix}-worker-1",
            settings=settings,
            trigger=training_trigger(config, settings),
            host_artifacts_dir=str(artifacts / "training"),
        ),
        opts=pulumi.ResourceOptions(depends_on=[provisioning]),
    )
    # Last of the outputs (the CLI lists them by name): the training result.
    pulumi.export("training", training.result)
