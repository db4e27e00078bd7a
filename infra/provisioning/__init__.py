"""Provisioning of trainstack nodes with Ansible (roles/, playbooks/) through ansible-runner."""

from .inventory import Node, build_inventory, default_topology, generate_secret
from .runner import (
    Failure,
    ProvisioningError,
    ProvisionResult,
    TaskEvent,
    print_event,
    run_playbook,
)
from .wheelhouse import build_node_wheelhouse, build_training_wheel, build_wheelhouse

__all__ = [
    "Failure",
    "Node",
    "ProvisionResult",
    "ProvisioningError",
    "TaskEvent",
    "build_inventory",
    "build_node_wheelhouse",
    "build_training_wheel",
    "build_wheelhouse",
    "default_topology",
    "generate_secret",
    "print_event",
    "run_playbook",
]
