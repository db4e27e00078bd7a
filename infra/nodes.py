"""The node layout: where trainstack puts things on a node. Its one definition.

Python reads the paths here: the jobs CLI and the stack's declared job (infra.jobs), the
targets' mounts (infra.topology), the image bake (infra.images). The roles get them through
the inventory: `NODE_PATHS.inventory_vars()` renders each as a `trainstack_<field>` variable,
which every inventory the project builds carries in `all.vars` (infra.topology's `inventory()`
and `teardown_inventory()`, the bake's in infra/images/bake.py), and
playbooks/group_vars/all.yml maps the roles' own variables onto them
(`common_venv_dir: "{{ trainstack_venv_dir }}"`). So a path changes here and nowhere else.

The roles' defaults keep the same values as literals, so that a role also runs alone, without
trainstack's inventory. tests/unit/test_node_layout.py checks that both agree, that group_vars
maps every role variable that holds one of these paths, and that no other module under infra/
writes one. Imports nothing: every layer may read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# The roots: installed software, configuration, per-node state, logs, shared storage.
INSTALL_ROOT = "/opt/trainstack"
CONF_ROOT = "/etc/trainstack"
STATE_ROOT = "/var/lib/trainstack"
LOG_ROOT = "/var/log/trainstack"
SHARED_ROOT = "/srv/trainstack"
PROFILE_FILE = "/etc/profile.d/trainstack.sh"
MOUNT_ROOT = "/mnt/trainstack"
# Where the image bake's builder container has the control machine's wheelhouse (read-only
# bind mount). Only the bake's inventory names it (trainstack_wheelhouse_mount): a stack's
# nodes have no such mount.
WHEELHOUSE_MOUNT = f"{MOUNT_ROOT}/wheelhouse"
# Every top-level place above (tests/unit/test_node_layout.py greps for them).
ROOTS = (INSTALL_ROOT, CONF_ROOT, STATE_ROOT, LOG_ROOT, SHARED_ROOT, PROFILE_FILE, MOUNT_ROOT)
INVENTORY_PREFIX = "trainstack_"
# The runs' shared directory (models_dir), which the tracking artifacts live under.
_MODELS_DIR = f"{SHARED_ROOT}/models"


@dataclass(frozen=True)
class NodePaths:
    """The paths of a node, each one the inventory variable `trainstack_<field>`."""

    # Installed software: the virtual environment every Python package goes into, the wheel
    # sets copied from the control machine, a Spark binary distribution (when one is used).
    install_dir: str = INSTALL_ROOT
    venv_dir: str = f"{INSTALL_ROOT}/venv"
    node_wheelhouse_dir: str = f"{INSTALL_ROOT}/wheelhouse"
    spark_distribution_dir: str = f"{INSTALL_ROOT}/spark"
    # MLflow's own venv on the tracking node, layered on venv_dir (a .pth file names its
    # site-packages), so the training package and its numpy/pandas/pyarrow serve both.
    mlflow_venv_dir: str = f"{INSTALL_ROOT}/mlflow"
    # Configuration the roles write; spark_conf_dir is SPARK_CONF_DIR.
    conf_dir: str = CONF_ROOT
    spark_conf_dir: str = f"{CONF_ROOT}/spark"
    zookeeper_conf_dir: str = f"{CONF_ROOT}/zookeeper"
    prometheus_conf_dir: str = f"{CONF_ROOT}/prometheus"
    process_exporter_config_file: str = f"{CONF_ROOT}/process-exporter.yml"
    blackbox_exporter_config_file: str = f"{CONF_ROOT}/blackbox.yml"
    # The tracking server's configuration; mlflow_auth_file (mode 0600, owner trainstack) is
    # MLflow's basic-auth ini and the one place its admin login is on the node: the server, the
    # sync daemon and `trainstack` commands on that node read it ([mlflow] admin_username,
    # admin_password).
    mlflow_conf_dir: str = f"{CONF_ROOT}/mlflow"
    mlflow_auth_file: str = f"{CONF_ROOT}/mlflow/auth.ini"
    # Environment of login shells (PATH with the venv, SPARK_CONF_DIR, PYSPARK_PYTHON).
    profile_file: str = PROFILE_FILE
    # Per-node state: the trainstack user's home; the ZooKeeper data and Spark recovery
    # directories are a volume of their own on the local stack's control nodes.
    home_dir: str = STATE_ROOT
    zookeeper_data_dir: str = f"{STATE_ROOT}/zookeeper"
    spark_recovery_dir: str = f"{STATE_ROOT}/spark-recovery"
    spark_worker_dir: str = f"{STATE_ROOT}/spark-work"
    prometheus_storage_dir: str = f"{STATE_ROOT}/prometheus"
    pushgateway_data_dir: str = f"{STATE_ROOT}/pushgateway"
    # The tracking server's SQLite stores (runs; its users), on the node's own disk (SQLite on
    # shared storage is unsafe): a volume of its own on the local stack's tracking node.
    mlflow_data_dir: str = f"{STATE_ROOT}/mlflow"
    # The object store's data (roles/object_store: SeaweedFS's volumes and filer store), on
    # the node's own disk: a volume of its own on the local stack's object store node.
    object_store_data_dir: str = f"{STATE_ROOT}/objectstore"
    # The daemons' logs.
    log_dir: str = LOG_ROOT
    # Shared storage every node mounts (volumes on the local stack, the operator's mount on
    # servers): data sets, checkpoints, the runs (and the jobs' code and packages under it).
    data_dir: str = f"{SHARED_ROOT}/data"
    checkpoints_dir: str = f"{SHARED_ROOT}/checkpoints"
    models_dir: str = _MODELS_DIR
    # The tracking server's artifacts (each run's model, curves, logs), which it serves over
    # HTTP: on the models' shared storage, a dot-directory that `trainstack list` (job-*/)
    # never shows.
    tracking_artifacts_dir: str = f"{_MODELS_DIR}/.mlflow"

    @property
    def shared_dirs(self) -> dict[str, str]:
        """The shared directories by name (the docker target's volume suffixes)."""
        return {
            "data": self.data_dir,
            "checkpoints": self.checkpoints_dir,
            "models": self.models_dir,
        }

    def inventory_vars(self) -> dict[str, str]:
        """The layout as inventory variables: `trainstack_<field>` -> path."""
        return {INVENTORY_PREFIX + name: path for name, path in asdict(self).items()}


NODE_PATHS = NodePaths()
