"""What every target gives the rest of the program (docs/targets.md).

A target is a module of this package with a function `cluster(TargetArgs)` that declares one
ComponentResource holding the nodes and returns it; the program picks the function by
`trainstack:target` and then reads only `ClusterOutputs`: provisioning, the training launch
and the stack outputs are the same for every target.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import pulumi

    from infra.config import StackConfig
    from infra.topology import NodeSpec


@dataclass(frozen=True)
class TargetArgs:
    config: StackConfig
    stack: str
    # `.artifacts/<stack>`: the target's own files (logs, known_hosts) go under it.
    artifacts: Path
    # The wheels the nodes install from (trainstack:wheelhouse, resolved).
    wheelhouse: Path


class ClusterOutputs(Protocol):
    """The cluster as the program sees it, whichever target made the nodes."""

    @property
    def plan(self) -> list[NodeSpec]:
        """The nodes and their roles (infra.topology), planned once for the run."""

    @property
    def nodes(self) -> pulumi.Output[list[dict]]:
        """One record per node (name, roles, address, ...): the `nodes` output."""

    @property
    def inventory(self) -> pulumi.Output[dict]:
        """The Ansible inventory (`topology.inventory`), ready when the nodes are."""

    @property
    def spark_master_url(self) -> str:
        """`spark://` with every master."""

    @property
    def ui_urls(self) -> pulumi.Output[dict[str, str]]:
        """Each master's web UI, as the operator reaches it."""

    @property
    def monitoring_url(self) -> pulumi.Output[str] | None:
        """Prometheus's UI; None when trainstack:monitoring is off."""

    @property
    def tracking_url(self) -> pulumi.Output[str] | None:
        """The MLflow tracking server's UI as the operator reaches it (the `mlflowUiUrl`
        output): the published port on the docker target, the server's cluster address on
        the ssh target; None when trainstack:tracking is off."""

    @property
    def object_store_url(self) -> pulumi.Output[str] | None:
        """The object store's S3 endpoint as the operator reaches it (the `objectStoreUrl`
        output): the published port on the docker target, the server's cluster address on the
        ssh target; None when trainstack:objectStore is off."""

    @property
    def spark_auth_secret(self) -> pulumi.Output[str]:
        """The cluster secret (`components.secret.cluster_secret`), for provisioning."""

    @property
    def secret_id(self) -> pulumi.Output[str]:
        """The secret's id: a new one (trainstack:rotateSecrets) re-runs provisioning."""

    @property
    def submit_candidates(self) -> list[dict]:
        """The nodes that may submit a job, in order of preference (the job drivers' node,
        then the workers: topology.submit_nodes), as transport records (infra.transport)."""

    @property
    def tracking_node(self) -> dict | None:
        """The tracking server's node as a transport record (its sync runs there); None when
        trainstack:tracking is off."""

    @property
    def network_name(self) -> str | None:
        """The docker network the nodes share (the `network` output); None elsewhere."""

    @property
    def cpu_boost(self) -> bool:
        """Whether provisioning lifts the nodes' CPU limits while it runs (local containers
        with trainstack:provisionCpuBoost only)."""
