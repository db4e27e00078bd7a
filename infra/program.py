"""The stack's program: validate the config, check the engine, declare the cluster."""

from __future__ import annotations

import pulumi

from infra import config as stack_config
from infra.components import Cluster, ClusterArgs
from infra.local_docker.resources import EngineError, docker_client


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

    cluster = Cluster(
        "cluster",
        ClusterArgs(config=config, project=pulumi.get_project(), stack=pulumi.get_stack()),
    )
    pulumi.export("sparkMasterUrl", cluster.spark_master_url)
    pulumi.export("uiUrls", cluster.ui_urls)
    pulumi.export("nodes", cluster.nodes)
    pulumi.export("network", cluster.network_name)
    pulumi.export("inventory", cluster.inventory)
