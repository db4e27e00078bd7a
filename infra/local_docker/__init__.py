"""Docker networks, volumes and containers as Pulumi resources (dynamic providers).

The pulumi-docker provider plugin cannot be built from the module proxy this project
uses, so these dynamic providers over the Docker SDK for Python stand in for it, with
the same resource shapes and real create/read/update/delete/diff.
"""

from infra.local_docker.resources import (
    Container,
    ContainerArgs,
    Network,
    PortBinding,
    RandomSecret,
    Volume,
    VolumeMount,
)

__all__ = [
    "Container",
    "ContainerArgs",
    "Network",
    "PortBinding",
    "RandomSecret",
    "Volume",
    "VolumeMount",
]
