"""Pulumi components: one per concept of the cluster."""

from infra.components.cluster import Cluster, ClusterArgs
from infra.components.node import Node, NodeArgs

__all__ = ["Cluster", "ClusterArgs", "Node", "NodeArgs"]
