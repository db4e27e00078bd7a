"""Provisioning of trainstack nodes with Ansible (roles/, playbooks/) through ansible-runner."""

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
    "ProvisionResult",
    "ProvisioningError",
    "TaskEvent",
    "build_node_wheelhouse",
    "build_training_wheel",
    "build_wheelhouse",
    "print_event",
    "run_playbook",
]
