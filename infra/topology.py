"""The cluster's shape as plain data: which nodes, with which roles, names and mounts.

Pure functions of the config and the stack name, so the unit tests check the topology
without Pulumi, and the components only turn this plan into resources.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infra.config import StackConfig
from infra.config.servers import ROLES, Server
from infra.nodes import NODE_PATHS

SPARK_MASTER_PORT = 7077
SPARK_MASTER_UI_PORT = 8080
ZOOKEEPER_CLIENT_PORT = 2181
PROMETHEUS_PORT = 9090
PUSHGATEWAY_PORT = 9091
# The MLflow tracking server's port on its node (the mlflow role's mlflow_port, through the
# inventory's trainstack_tracking_port).
MLFLOW_PORT = 5000
# The object store's S3 endpoint on its node (roles/object_store's object_store_port, through
# the inventory's trainstack_object_store_port).
OBJECT_STORE_PORT = 8333
# Its access key id (not a secret: the secret key is derived from the cluster secret,
# infra.components.secret.derived_secret), and the bucket it starts with.
OBJECT_STORE_ACCESS_KEY = "trainstack"
OBJECT_STORE_BUCKET = "trainstack"
MONITORING_ROLE = "monitoring"
# The node of the MLflow tracking server (roles/mlflow): the first control node, on every
# target; not a role a server of the ssh target lists.
TRACKING_ROLE = "tracking"
# The node of the object store (roles/object_store): the first control node, as tracking's.
OBJECT_STORE_ROLE = "object_store"
# The node of the job drivers (a job's queue process, its `trainstack-train` and the warm
# runner): the docker target's last control node, with trainstack:driverMemory and driverCpus
# on top of its limits, so that a worker's memory limit holds only its executor and ranks.
# `trainstack submit` and `pulumi up` submit there first, on a worker when it is down (the
# stack output `jobNodes`). Not a role a server of the ssh target lists: there the workers
# submit, as before.
DRIVER_ROLE = "driver"
GROUPS = ("control", "workers", *ROLES, TRACKING_ROLE, OBJECT_STORE_ROLE, DRIVER_ROLE)

# Where each volume is mounted: the node layout (infra/nodes.py), which the inventory hands the
# roles (docs/provisioning.md is the contract).
SHARED_MOUNTS = NODE_PATHS.shared_dirs
ZOOKEEPER_MOUNT = NODE_PATHS.zookeeper_data_dir
SPARK_RECOVERY_MOUNT = NODE_PATHS.spark_recovery_dir
TRACKING_MOUNT = NODE_PATHS.mlflow_data_dir
OBJECT_STORE_MOUNT = NODE_PATHS.object_store_data_dir

LABEL_PROJECT = "org.trainstack.project"
LABEL_STACK = "org.trainstack.stack"
LABEL_ROLES = "org.trainstack.roles"
LABEL_NODE = "org.trainstack.node"
LABEL_DATA = "org.trainstack.data"
# On every engine object a stack makes; older versions (home-made resources) lack it.
LABEL_MANAGED_BY = "org.trainstack.managed-by"
MANAGED_BY = "pulumi-docker"


@dataclass(frozen=True)
class NodeSpec:
    """One server of the cluster. `key` is its hostname and inventory name."""

    key: str
    group: str  # "control" or "workers"
    roles: tuple[str, ...]
    cpus: float
    memory: str
    zookeeper_id: int | None = None
    ui_port: int | None = None  # host port for the Spark master UI; 0: the engine picks
    monitoring_port: int | None = None  # host port for Prometheus's UI; 0: the engine picks
    tracking_port: int | None = None  # host port for the MLflow UI; 0: the engine picks
    object_store_port: int | None = None  # host port for the S3 endpoint; 0: the engine picks
    volumes: dict[str, str] = field(default_factory=dict)  # volume suffix -> mount path
    # GPUs: how many its Spark worker must find (0: no GPU scheduling, nothing in its
    # config), and the docker target's container `gpus` ("" = none, "all", "device=0,1").
    gpus: int = 0
    container_gpus: str = ""

    @property
    def is_master(self) -> bool:
        return "spark_master" in self.roles

    @property
    def is_monitoring(self) -> bool:
        return MONITORING_ROLE in self.roles

    @property
    def is_tracking(self) -> bool:
        return TRACKING_ROLE in self.roles

    @property
    def is_object_store(self) -> bool:
        return OBJECT_STORE_ROLE in self.roles

    @property
    def is_driver(self) -> bool:
        return DRIVER_ROLE in self.roles


def plan(config: StackConfig) -> list[NodeSpec]:
    nodes: list[NodeSpec] = []
    for i in range(1, config.control_nodes + 1):
        master = i <= config.masters
        volumes = {f"zookeeper-control-{i}": ZOOKEEPER_MOUNT}
        if master:
            volumes[f"spark-recovery-control-{i}"] = SPARK_RECOVERY_MOUNT
        roles: tuple[str, ...] = ("zookeeper", "spark_master") if master else ("zookeeper",)
        # Prometheus lives on the first control node: it is never scaled away (workers come
        # and go with trainstack:workers, taking their targets with them), and it keeps the
        # scraping off the workers whose CPU and memory the utilisation picture measures.
        monitoring = config.monitoring and i == 1
        if monitoring:
            roles += (MONITORING_ROLE,)
        # The tracking server too, for the same reasons; its SQLite stores get a volume of
        # their own, so a replaced container keeps the runs.
        tracking = config.tracking and i == 1
        if tracking:
            roles += (TRACKING_ROLE,)
            volumes[f"mlflow-control-{i}"] = TRACKING_MOUNT
        # The object store too; its data gets a volume of its own, which outlives a replaced
        # container and goes with `pulumi destroy` (unless trainstack:retainData).
        object_store = config.object_store and i == 1
        if object_store:
            roles += (OBJECT_STORE_ROLE,)
            volumes[f"objectstore-control-{i}"] = OBJECT_STORE_MOUNT
        # The job drivers on the last control node: the one with the fewest services (no
        # master, tracking or object store on the default stack's control-3).
        driver = i == config.control_nodes
        if driver:
            roles += (DRIVER_ROLE,)
        nodes.append(
            NodeSpec(
                key=f"control-{i}",
                group="control",
                roles=roles,
                cpus=config.control_cpus + (config.driver_cpus if driver else 0.0),
                memory=config.control_memory,
                zookeeper_id=i,
                ui_port=(config.ui_port_base + i - 1 if config.ui_port_base else 0)
                if master
                else None,
                monitoring_port=config.monitoring_host_port if monitoring else None,
                tracking_port=config.tracking_host_port if tracking else None,
                object_store_port=config.object_store_host_port if object_store else None,
                volumes=volumes,
            )
        )
    for i in range(1, config.workers + 1):
        container_gpus, gpus = config.docker_worker_gpus(i)
        nodes.append(
            NodeSpec(
                key=f"worker-{i}",
                group="workers",
                roles=("spark_worker", "tensorflow"),
                cpus=config.worker_cpus,
                memory=config.worker_memory,
                gpus=gpus,
                container_gpus=container_gpus,
            )
        )
    return nodes


def service_memory(config: StackConfig, spec: NodeSpec) -> int:
    """What the services a node hosts beyond its group's add to its memory limit, in bytes:
    the tracking server's, the object store's and the job drivers' shares."""
    return (
        (config.tracking_memory_bytes if spec.is_tracking else 0)
        + (config.object_store_memory_bytes if spec.is_object_store else 0)
        + (config.driver_memory_bytes if spec.is_driver else 0)
    )


def memory_limit(config: StackConfig, spec: NodeSpec) -> int:
    """A node's memory limit in bytes (the docker target enforces it): its group's, plus its
    services' shares."""
    base = config.control_memory_bytes if spec.group == "control" else config.worker_memory_bytes
    return base + service_memory(config, spec)


def submit_nodes(nodes: Sequence[NodeSpec]) -> list[NodeSpec]:
    """Where jobs are submitted, in order of preference: the drivers' node, then the workers
    (the first one reachable with its venv submits; a worker only when the drivers' node is
    down, or on a target without one)."""
    return [n for n in nodes if n.is_driver] + [n for n in nodes if "spark_worker" in n.roles]


def server_plan(config: StackConfig, servers: Sequence[Server]) -> list[NodeSpec]:
    """The nodes of a server list (the ssh target): each server as it was listed, with its
    own roles; ZooKeeper ids in list order. Sizes are the servers' own, so `cpus` and
    `memory` are the config's per group (only the docker target enforces them)."""
    nodes: list[NodeSpec] = []
    zookeeper_id = 0
    # The tracking server and the object store on the first control server, as on the docker
    # target.
    tracker = next((s.name for s in servers if s.group == "control"), None)
    for server in servers:
        if "zookeeper" in server.roles:
            zookeeper_id += 1
        control = server.group == "control"
        first = server.name == tracker
        extra: tuple[str, ...] = (TRACKING_ROLE,) if config.tracking and first else ()
        extra += (OBJECT_STORE_ROLE,) if config.object_store and first else ()
        nodes.append(
            NodeSpec(
                key=server.name,
                group=server.group,
                roles=(*server.roles, *extra),
                cpus=config.control_cpus if control else config.worker_cpus,
                memory=config.control_memory if control else config.worker_memory,
                zookeeper_id=zookeeper_id if "zookeeper" in server.roles else None,
                gpus=server.gpus,
            )
        )
    return nodes


def resource_prefix(config: StackConfig, stack: str) -> str:
    """Engine-side names start with this, so stacks live side by side on one engine."""
    return f"{config.name_prefix}-{stack}"


def master_url(nodes: list[NodeSpec], reach: Mapping[str, str] | None = None) -> str:
    """`reach`: node key -> the address other nodes use (default: the key, a hostname)."""
    reach = reach or {}
    masters = [reach.get(n.key, n.key) for n in nodes if n.is_master]
    return "spark://" + ",".join(f"{m}:{SPARK_MASTER_PORT}" for m in masters)


def zookeeper_connect(nodes: list[NodeSpec], reach: Mapping[str, str] | None = None) -> str:
    reach = reach or {}
    return ",".join(
        f"{reach.get(n.key, n.key)}:{ZOOKEEPER_CLIENT_PORT}" for n in nodes if n.zookeeper_id
    )


def monitoring_node(nodes: list[NodeSpec]) -> NodeSpec | None:
    return next((n for n in nodes if n.is_monitoring), None)


def monitoring_vars(
    config: StackConfig, nodes: list[NodeSpec], reach: Mapping[str, str] | None = None
) -> dict:
    """Inventory variables of the monitoring roles (docs/monitoring.md)."""
    reach = reach or {}
    node = monitoring_node(nodes)
    if node is None:
        return {"trainstack_monitoring_enabled": False}
    submitters = [reach.get(n.key, n.key) for n in submit_nodes(nodes)]
    return {
        "trainstack_monitoring_enabled": True,
        "trainstack_monitoring_scrape_interval": config.monitoring_scrape_interval,
        "trainstack_monitoring_retention": config.monitoring_retention,
        "trainstack_monitoring_alert_for": config.monitoring_alert_for,
        "trainstack_monitoring_progress_timeout_seconds": (
            config.monitoring_progress_timeout_seconds
        ),
        "trainstack_pushgateway_url": f"http://{reach.get(node.key, node.key)}:{PUSHGATEWAY_PORT}",
        # The training job's driver runs on the first submit node (the drivers' node, else the
        # first worker): its UI has the executors' metrics.
        "trainstack_spark_driver_host": submitters[0] if submitters else "",
    }


def tracking_node(nodes: list[NodeSpec]) -> NodeSpec | None:
    return next((n for n in nodes if n.is_tracking), None)


def tracking_uri(nodes: list[NodeSpec], reach: Mapping[str, str] | None = None) -> str | None:
    """The tracking server's URL on the cluster network (what nodes log to); None: off."""
    node = tracking_node(nodes)
    if node is None:
        return None
    return f"http://{(reach or {}).get(node.key, node.key)}:{MLFLOW_PORT}"


def tracking_vars(nodes: list[NodeSpec], reach: Mapping[str, str] | None = None) -> dict:
    """Inventory variables of the tracking server and its sync (roles/mlflow): its URL on the
    cluster network. Not the UI's URL as the operator reaches it: on the local stack that can
    be a port the engine picks, which changes when a container restarts, and the inventory
    must not (it is provisioning's trigger); `trainstack status` and the stack's `training`
    output compose a run's URL from the stack output `mlflowUiUrl`."""
    uri = tracking_uri(nodes, reach)
    if uri is None:
        return {"trainstack_tracking_enabled": False}
    return {
        "trainstack_tracking_enabled": True,
        "trainstack_tracking_port": MLFLOW_PORT,
        "trainstack_tracking_uri": uri,
    }


def object_store_node(nodes: list[NodeSpec]) -> NodeSpec | None:
    return next((n for n in nodes if n.is_object_store), None)


def object_store_vars(
    config: StackConfig, nodes: list[NodeSpec], reach: Mapping[str, str] | None = None
) -> dict:
    """Inventory variables of the object store (roles/object_store) and of s3a on every node
    (the spark role): the S3 endpoint the nodes use, which is trainstack:s3Endpoint when set
    (with its access key, region and addressing), else the stack's store on the cluster
    network. No secret key is here: the store's is derived from the cluster secret
    (playbooks/group_vars/all.yml), an external endpoint's reaches Ansible as a secret extra
    variable (infra.provisioning.inventory.SECRET_VARS), never an inventory."""
    node = object_store_node(nodes)
    found: dict = {"trainstack_object_store_enabled": node is not None}
    if node is not None:
        address = (reach or {}).get(node.key, node.key)
        found.update(
            {
                "trainstack_object_store_port": OBJECT_STORE_PORT,
                "trainstack_object_store_access_key": OBJECT_STORE_ACCESS_KEY,
                "trainstack_object_store_bucket": OBJECT_STORE_BUCKET,
                "trainstack_s3_endpoint": f"http://{address}:{OBJECT_STORE_PORT}",
            }
        )
    if config.s3_endpoint:
        found.update(
            {
                "trainstack_s3_endpoint": config.s3_endpoint.rstrip("/"),
                "trainstack_s3_access_key": config.s3_access_key,
                "trainstack_s3_region": config.s3_region,
                "trainstack_s3_path_style": config.s3_path_style,
            }
        )
    return found


def labels(project: str, prefix: str, **extra: str) -> dict[str, str]:
    return {LABEL_PROJECT: project, LABEL_STACK: prefix, LABEL_MANAGED_BY: MANAGED_BY, **extra}


def inventory(
    config: StackConfig,
    prefix: str,
    nodes: list[NodeSpec],
    addresses: dict[str, str] | None = None,
    node_image: str | None = None,
    servers: Sequence[Server] | None = None,
    known_hosts: str | None = None,
) -> dict:
    """An Ansible YAML inventory (as a dict) for the stack's nodes.

    Docker target (`servers` None): Ansible reaches the containers by name, and nodes reach
    each other by hostname (the network alias), which stays the same when a container is
    recreated; `trainstack_ip_address` is informational.
    Server list (`servers`, one per node, by name): Ansible connects over ssh to each
    server's address, port and user (the playbooks become root for a non-root user), and
    nodes reach each other at the servers' node addresses. `known_hosts` is the file of
    host keys the ssh target recorded; every connection is checked against it.
    """
    addresses = addresses or {}
    by_name = {s.name: s for s in servers or ()}
    if servers is not None and set(by_name) != {n.key for n in nodes}:
        raise ValueError(
            f"servers {sorted(by_name)} do not match the nodes {sorted(n.key for n in nodes)}"
        )
    reach = {name: s.reach for name, s in by_name.items()}
    groups: dict[str, dict] = {name: {"hosts": {}} for name in GROUPS}
    for node in nodes:
        server = by_name.get(node.key)
        host: dict = (
            _ssh_host(server)
            if server
            else {
                "ansible_host": f"{prefix}-{node.key}",
                "trainstack_node_address": node.key,
                "trainstack_ip_address": addresses.get(node.key, ""),
            }
        )
        if node.zookeeper_id is not None:
            host["trainstack_zookeeper_id"] = node.zookeeper_id
        if "spark_worker" in node.roles:
            host["trainstack_spark_worker_cores"] = config.worker_spark_cores
            host["trainstack_spark_worker_memory"] = config.worker_spark_memory
            if node.gpus:  # only then: a node without GPUs keeps its inventory as it was
                host["trainstack_spark_worker_gpus"] = node.gpus
        groups[node.group]["hosts"][node.key] = host
        for role in node.roles:
            groups[role]["hosts"][node.key] = {}
    all_vars: dict = {
        "ansible_connection": "ssh" if servers is not None else "docker",
        "ansible_python_interpreter": "/usr/bin/python3",
        "trainstack_stack": prefix,
        "trainstack_spark_master_url": master_url(nodes, reach),
        "trainstack_zookeeper_connect": zookeeper_connect(nodes, reach),
        "trainstack_spark_network_crypto": config.spark_network_crypto,
        "trainstack_spark_io_encryption": config.spark_io_encryption,
        # The node layout, which playbooks/group_vars/all.yml hands the roles.
        **NODE_PATHS.inventory_vars(),
    }
    if servers is not None:
        all_vars.update(_ssh_vars(known_hosts))
        # Data, checkpoints and models are on a file system the operator mounts on every
        # server; the common role checks that every node sees the same one.
        all_vars["trainstack_shared_storage_check"] = True
    all_vars.update(monitoring_vars(config, nodes, reach))
    all_vars.update(tracking_vars(nodes, reach))
    all_vars.update(object_store_vars(config, nodes, reach))
    if node_image:
        # The nodes start from this baked image: every install is already done.
        all_vars["trainstack_node_image"] = node_image
    return {"all": {"vars": all_vars, "children": groups}}


def _ssh_host(server: Server) -> dict:
    """Host variables of a server Ansible reaches over ssh (host keys are checked)."""
    host: dict = {
        "ansible_host": server.address,
        "ansible_port": server.port,
        "ansible_user": server.user,
        "trainstack_node_address": server.reach,
        "trainstack_ip_address": server.reach,
        # Spark's daemons and UIs on the cluster address only, not on a public one
        # (docs/security.md); drivers advertise it to the executors.
        "spark_local_ip": server.reach,
        # A login user other than root works through sudo: the playbooks and testinfra's
        # ansible backend (tests/hosts) both follow this.
        "ansible_become": server.user != "root",
    }
    if server.private_key_file:
        host["ansible_ssh_private_key_file"] = server.private_key_file
    return host


def _ssh_vars(known_hosts: str | None) -> dict:
    """Connection variables for servers Ansible reaches over ssh: host keys are checked.

    Host key checking is on (ansible.cfg too; set here so that no other config turns it
    off), and with `known_hosts` (the ssh target's record of what `up` saw) ssh reads only
    that file.
    """
    # Ansible's default ssh_args without `-C`: the large transfers (the wheel sets, through
    # rsync over this ssh) are compressed wheels, which ssh's compression only slows down:
    # 415 MB took 13.3 s with -C, 1.8 s without (docs/provisioning.md).
    found: dict = {
        "ansible_host_key_checking": True,
        "ansible_ssh_args": "-o ControlMaster=auto -o ControlPersist=60s",
    }
    if known_hosts:
        found["ansible_ssh_common_args"] = (
            f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes"
        )
    return found


def teardown_inventory(servers: Sequence[Server], known_hosts: str | Path) -> dict:
    """The inventory of servers whose trainstack install is to be removed (teardown.yml)."""
    return {
        "all": {
            "vars": {
                "ansible_connection": "ssh",
                "ansible_python_interpreter": "/usr/bin/python3",
                **_ssh_vars(str(known_hosts)),
                # The roles' teardown tasks remove the paths of the node layout.
                **NODE_PATHS.inventory_vars(),
            },
            "hosts": {server.name: _ssh_host(server) for server in servers},
        }
    }
