"""The checks of the stack's values: each takes the values and returns what is wrong with
one key (naming the key, the value and what is allowed) or None. `StackValues.validate`
runs them all and reports every problem together, before any resource is declared.

The server list's own rules are in `infra.config.servers`, the aws keys' in
`infra.config.aws`; both run from here, in the order of `CHECKS`.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable

from infra.config import aws
from infra.config.servers import server_list_errors
from infra.config.stack import StackValues
from infra.config.values import config_key as _key
from infra.config.values import parse_duration, parse_size

# Targets: how the nodes come to exist (docs/targets.md). `aws` exists on paper only.
TARGETS = ("docker", "ssh", "aws")
SELECTABLE_TARGETS = ("docker", "ssh")
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,30}$")


def _size_check(attr: str) -> Callable[[StackValues], str | None]:
    def check(c: StackValues) -> str | None:
        value = getattr(c, attr)
        try:
            size = parse_size(value)
        except ValueError:
            return f"{_key(attr)}: {value!r} is not a size; use a number with k, m or g (e.g. 2g)"
        if size < 256 * 1024**2:
            return f"{_key(attr)}: {value!r} is below the minimum of 256m"
        return None

    return check


def _min(attr: str, low: float) -> Callable[[StackValues], str | None]:
    def check(c: StackValues) -> str | None:
        value = getattr(c, attr)
        if value < low:
            return f"{_key(attr)}: {value!r} is below the minimum of {low}"
        return None

    return check


def _odd_ensemble(c: StackValues) -> str | None:
    if c.control_nodes % 2 == 0:
        return (
            f"{_key('control_nodes')}: {c.control_nodes} makes an even ZooKeeper ensemble, "
            "which tolerates no more failures than one node fewer; use an odd number (1, 3, 5)"
        )
    return None


def _masters_fit(c: StackValues) -> str | None:
    if c.masters > c.control_nodes:
        return (
            f"{_key('masters')}: {c.masters} is more than {_key('control_nodes')} "
            f"({c.control_nodes}); masters run on control nodes, so allowed is 1..{c.control_nodes}"
        )
    return None


def _spark_memory_fits(c: StackValues) -> str | None:
    try:
        spark, node = parse_size(c.worker_spark_memory), parse_size(c.worker_memory)
    except ValueError:
        return None  # reported by the size checks
    if spark > node:
        return (
            f"{_key('worker_spark_memory')}: {c.worker_spark_memory!r} is more than the "
            f"worker's memory {_key('worker_memory')}={c.worker_memory!r}"
        )
    return None


def _name_prefix(c: StackValues) -> str | None:
    if not _NAME.match(c.name_prefix):
        return (
            f"{_key('name_prefix')}: {c.name_prefix!r} is not allowed; use lowercase letters, "
            "digits and '-', starting with a letter or digit, at most 31 characters"
        )
    return None


def _image_repository(c: StackValues) -> str | None:
    if not re.match(
        r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$", c.image_repository
    ):
        return (
            f"{_key('image_repository')}: {c.image_repository!r} is not a Docker repository "
            "name; use lowercase letters, digits and '.', '_', '-' or '/' between them "
            "(e.g. trainstack-node)"
        )
    return None


def _port_base(c: StackValues) -> str | None:
    if c.ui_port_base != 0 and not 1024 <= c.ui_port_base <= 65535 - c.masters:
        return (
            f"{_key('ui_port_base')}: {c.ui_port_base} is out of range; allowed is 0 (the "
            f"engine picks free ports) or 1024..{65535 - c.masters}"
        )
    return None


def _bind_address(c: StackValues) -> str | None:
    parts = c.bind_address.split(".")
    if len(parts) != 4 or not all(p.isdigit() and int(p) <= 255 for p in parts):
        return f"{_key('bind_address')}: {c.bind_address!r} is not an IPv4 address (e.g. 127.0.0.1)"
    return None


def _training_slots(c: StackValues) -> str | None:
    slots = c.workers * c.worker_spark_cores
    if c.train_workers > slots:
        return (
            f"{_key('train_workers')}: {c.train_workers} TensorFlow workers need as many Spark "
            f"slots, but {_key('workers')} x {_key('worker_spark_cores')} offer {slots}; "
            f"allowed is 0 (one per worker node) or 1..{slots}"
        )
    return None


TRAIN_STRATEGIES = ("multi-worker", "single")


def _job_params(c: StackValues) -> str | None:
    try:
        _ = c.job_params_dict
    except ValueError as exc:
        return f"{_key('job_params')}: {exc}"
    return None


def _job(c: StackValues) -> str | None:
    """The job directory, checked as the nodes will load it (manifest, entry module and
    function, requirements), before anything is created."""
    if not c.train:
        return None
    from trainstack_training.jobsettings import chosen_data
    from trainstack_training.manifest import JobError

    try:
        _ = c.job_params_dict
    except ValueError:
        return None  # reported by _job_params
    try:
        spec = c.job_spec  # read once: the program takes the same (infra.program.load_job)
    except JobError as exc:
        return f"{_key('job')}: {exc}"
    try:  # a job that reads its own data (data = "none") takes no trainData
        chosen_data(spec, "", c.train_data, _key("train_data"))
    except JobError as exc:
        return str(exc)
    if spec.workers > c.training_slots and not c.train_workers:
        return (
            f"{_key('job')}: its manifest's [job] workers = {spec.workers}, but this cluster "
            f"has {c.training_slots} training slots (one rank each); ask for at most "
            f"{c.training_slots}, or set {_key('train_workers')}"
        )
    return None


def _train_strategy(c: StackValues) -> str | None:
    if c.train_strategy not in TRAIN_STRATEGIES:
        return (
            f"{_key('train_strategy')}: {c.train_strategy!r} is not a training strategy; "
            f"allowed: {', '.join(TRAIN_STRATEGIES)}"
        )
    return None


def _training_needs_provisioning(c: StackValues) -> str | None:
    if c.train and not c.provision:
        return (
            f"{_key('train')}: true needs {_key('provision')}: true (the job runs on "
            "provisioned nodes); set trainstack:train false too"
        )
    return None


def _duration_check(attr: str, low: float) -> Callable[[StackValues], str | None]:
    def check(c: StackValues) -> str | None:
        value = getattr(c, attr)
        try:
            seconds = parse_duration(value)
        except ValueError:
            return (
                f"{_key(attr)}: {value!r} is not a duration; use a number with one unit "
                "of ms, s, m, h, d, w, y (e.g. 30s, 5m, 2d)"
            )
        if seconds < low:
            return f"{_key(attr)}: {value!r} is below the minimum of {low:g}s"
        return None

    return check


def _runner_keep_alive(c: StackValues) -> str | None:
    try:
        seconds = c.runner_keep_alive_seconds
    except ValueError:
        return (
            f"{_key('runner_keep_alive')}: {c.runner_keep_alive!r} is not a duration; use 0 "
            "(off) or a number with one unit of s, m, h (e.g. 10m)"
        )
    if 0 < seconds < 1:
        return f"{_key('runner_keep_alive')}: {c.runner_keep_alive!r} is below the minimum of 1s"
    return None


def _published_port(attr: str, offset: int) -> Callable[[StackValues], str | None]:
    """A UI's host port (`monitoring_port`, `tracking_port`): -1 (uiPortBase + `offset`), 0 or
    1024..65535, and none of the Spark master UI ports."""

    def check(c: StackValues) -> str | None:
        port = getattr(c, f"{attr.removesuffix('_port')}_host_port")
        value = getattr(c, attr)
        if value < -1 or (port != 0 and not 1024 <= port <= 65535):
            return (
                f"{_key(attr)}: {value} gives port {port}, out of range; allowed is -1 "
                f"(uiPortBase + {offset}, or engine-picked when uiPortBase is 0), 0 (the "
                "engine picks a free port) or 1024..65535"
            )
        if port and c.ui_port_base and c.ui_port_base <= port < c.ui_port_base + c.masters:
            return (
                f"{_key(attr)}: {port} is one of the Spark master UI ports "
                f"({_key('ui_port_base')} {c.ui_port_base} and the next {c.masters - 1}); "
                "choose another port"
            )
        return None

    return check


def _tracking_port(c: StackValues) -> str | None:
    """The MLflow UI's port: as Prometheus's (when tracking is on), and not Prometheus's."""
    if not c.tracking:
        return None
    said = _published_port("tracking_port", 1020)(c)
    if said is None and c.monitoring and c.tracking_host_port == c.monitoring_host_port != 0:
        return (
            f"{_key('tracking_port')}: {c.tracking_host_port} is Prometheus's UI port "
            f"({_key('monitoring_port')}); choose another port"
        )
    return said


def _object_store_port(c: StackValues) -> str | None:
    """The object store's S3 port: as the other UIs', and none of theirs."""
    if not c.object_store:
        return None
    said = _published_port("object_store_port", 1030)(c)
    if said is not None or not c.object_store_host_port:
        return said
    taken = {
        "monitoring_port": c.monitoring_host_port if c.monitoring else 0,
        "tracking_port": c.tracking_host_port if c.tracking else 0,
    }
    for attr, port in taken.items():
        if port == c.object_store_host_port:
            return (
                f"{_key('object_store_port')}: {port} is already {_key(attr)}'s port; "
                "choose another port"
            )
    return None


def _s3_endpoint(c: StackValues) -> str | None:
    """An external S3 endpoint: an http(s) URL with a host, given with both keys; keys
    without an endpoint are a mistake (the stack's store has its own)."""
    if not c.s3_endpoint:
        if c.s3_access_key or c.s3_secret_key:
            return (
                f"{_key('s3_access_key')}/{_key('s3_secret_key')}: set without "
                f"{_key('s3_endpoint')}; give the endpoint's URL too (the stack's own object "
                "store has keys of its own)"
            )
        return None
    url = urllib.parse.urlparse(c.s3_endpoint)
    if url.scheme not in ("http", "https") or not url.hostname or url.path not in ("", "/"):
        return (
            f"{_key('s3_endpoint')}: {c.s3_endpoint!r} is not an endpoint URL; give "
            "http(s)://HOST[:PORT], e.g. https://s3.eu-west-1.amazonaws.com"
        )
    if not c.s3_access_key or not c.s3_secret_key:
        missing = _key("s3_access_key") if not c.s3_access_key else _key("s3_secret_key")
        return f"{_key('s3_endpoint')}: {c.s3_endpoint!r} needs {missing} too"
    return None


def _target(c: StackValues) -> str | None:
    if c.target == "ssh" and not c.servers:
        return (
            f"{_key('target')}: 'ssh' provisions the servers of {_key('servers')}, which is "
            "empty; list your servers (docs/targets.md)"
        )
    if c.target == "aws":
        return (
            f"{_key('target')}: 'aws' has only run under Pulumi's mocks, never against a real "
            "account; use docker, or ssh with the instances you made (docs/targets.md)"
        )
    if c.target not in SELECTABLE_TARGETS:
        return (
            f"{_key('target')}: {c.target!r} is not a target; allowed: "
            f"{', '.join(SELECTABLE_TARGETS)} (aws exists on paper only; docs/targets.md)"
        )
    return None


# A GPU as Docker names it: an index (0) or a UUID (GPU-3a23c669-..., MIG-...).
_GPU_DEVICE = re.compile(r"^(?:[0-9]+|(?:GPU|MIG)-[0-9a-fA-F][0-9a-fA-F-]*)$")


def _gpus_per_worker(c: StackValues) -> str | None:
    """GPUs a training worker asks for, and where the workers offer them."""
    n = c.gpus_per_worker
    if n < 0:
        return (
            f"{_key('gpus_per_worker')}: {n} is not a GPU count; allowed is 0 (CPU only) or "
            "the number of GPUs each training worker uses (1 or more)"
        )
    if n == 0:
        return None
    if c.target == "docker" and not _docker_gpus(c) and c.workers >= 1:
        gpus, found = c.docker_worker_gpus(1)
        if not gpus:
            return (
                f"{_key('gpus_per_worker')}: {n} needs GPUs in the worker containers, but "
                f"{_key('docker_gpus')} is not set; set it to all or to device ids (e.g. 0,1), "
                "or set gpusPerWorker 0"
            )
        if found < n:
            return (
                f"{_key('gpus_per_worker')}: {n} is more than the {found} GPU(s) "
                f"{_key('docker_gpus')} {c.docker_gpus!r} gives each of the {c.workers} "
                f"workers; allowed is 0..{found}"
            )
    if c.target == "ssh":
        trainers = [s for s in c.servers if "tensorflow" in s.roles]
        short = [f"{s.name} ({s.gpus})" for s in trainers if s.gpus < n]
        if short:
            return (
                f"{_key('gpus_per_worker')}: {n} GPU(s) per training worker is more than the "
                f"tensorflow server(s) {', '.join(short)} declare in their entries' gpus; "
                f"give each tensorflow server gpus {n} or more, or lower gpusPerWorker"
            )
    return None


def _docker_gpus(c: StackValues) -> str | None:
    text = str(c.docker_gpus).strip()
    if not text:
        return None
    if c.target != "docker":
        return (
            f"{_key('docker_gpus')}: {c.docker_gpus!r} is for the docker target's containers; "
            f"{_key('target')} is {c.target!r} (on ssh, give a server entry gpus)"
        )
    if text.lower() == "all" or c.workers < 1:  # workers < 1: reported by its own check
        return None
    devices = c.docker_gpu_devices
    if not all(_GPU_DEVICE.match(d) for d in devices) or len(set(devices)) != len(devices):
        return (
            f"{_key('docker_gpus')}: {c.docker_gpus!r} is not a GPU list; allowed is all or "
            "distinct device indices or UUIDs separated by commas (e.g. 0,1)"
        )
    if len(devices) % c.workers:
        return (
            f"{_key('docker_gpus')}: {c.docker_gpus!r} lists {len(devices)} GPU(s) for "
            f"{c.workers} workers; allowed is all or a multiple of {_key('workers')} "
            "(each worker gets as many, in order)"
        )
    return None


def _rotate_token(c: StackValues) -> str | None:
    if c.rotate_secrets and not re.match(r"^[A-Za-z0-9._:-]{1,64}$", c.rotate_secrets):
        return (
            f"{_key('rotate_secrets')}: {c.rotate_secrets!r} is not a token; use 1..64 letters, "
            "digits and '.', '_', ':', '-' (e.g. a date: 2026-11-30)"
        )
    return None


def _server_list(c: StackValues) -> str | None:
    if not c.servers:
        return None
    if c.target != "ssh":
        return (
            f"{_key('servers')}: only the ssh target takes a server list; "
            f"{_key('target')} is {c.target!r}, which makes its own nodes"
        )
    return "\n  ".join(server_list_errors(c.servers)) or None


# Every check, in the order of their messages.
CHECKS: list[Callable[[StackValues], str | None]] = [
    _min("control_nodes", 1),
    _min("masters", 1),
    _min("workers", 1),
    _min("control_cpus", 0.1),
    _min("worker_cpus", 0.1),
    _min("driver_cpus", 0.0),
    _min("worker_spark_cores", 1),
    _odd_ensemble,
    _masters_fit,
    _size_check("control_memory"),
    _size_check("tracking_memory"),
    _size_check("object_store_memory"),
    _size_check("driver_memory"),
    _size_check("worker_memory"),
    _size_check("worker_spark_memory"),
    _spark_memory_fits,
    _name_prefix,
    _image_repository,
    _port_base,
    _bind_address,
    _min("train_epochs", 1),
    _min("train_workers", 0),
    _min("train_batch_size", 1),
    _min("train_rows", 0),
    _training_slots,
    _train_strategy,
    _job_params,
    _job,
    _training_needs_provisioning,
    _published_port("monitoring_port", 1010),
    _duration_check("monitoring_retention", 3600),
    _duration_check("monitoring_scrape_interval", 1),
    _duration_check("monitoring_alert_for", 0),
    _duration_check("monitoring_progress_timeout", 60),
    _tracking_port,
    _object_store_port,
    _s3_endpoint,
    _runner_keep_alive,
    _target,
    _server_list,
    _docker_gpus,
    _gpus_per_worker,
    *aws.CHECKS,
    _rotate_token,
]


def errors(c: StackValues) -> list[str]:
    """What is wrong with `c`, one message per failed check, in the order of `CHECKS`."""
    return [msg for check in CHECKS if (msg := check(c))]
