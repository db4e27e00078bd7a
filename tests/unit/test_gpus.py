"""The GPU path's declaration side (issue 39): `trainstack:gpusPerWorker`, a server's `gpus`,
`trainstack:dockerGpus`; what reaches the inventory, the containers, the launch's command line
and the spark role's configuration. A stack without GPUs declares and renders what it did.

No GPU runs here (none on this machine, none in CI): these check what is declared.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jinja2
import pulumi
import pytest
import yaml

from infra import topology
from infra.config import ConfigError, StackConfig
from infra.config.servers import Server, parse_servers
from infra.jobs.launch import LaunchSettings, train_command
from infra.program import training_settings, training_trigger
from infra.targets.ssh.facts import fit_errors, parse_facts
from tests.unit.test_cluster_program import CONTAINER, Mocks, build

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SPARK_ROLE = REPO / "roles" / "spark"
MASTER = "spark://control-1:7077"


def _entry(name: str, address: str, *roles: str, **more) -> dict:
    return {"name": name, "address": address, "user": "deploy", "roles": list(roles), **more}


def _servers(*worker_gpus: int) -> list[dict]:
    """One control server and a worker with each of `worker_gpus` (0: no `gpus` field)."""
    workers = [
        _entry(f"w-{i}", f"192.0.2.{20 + i}", "spark_worker", "tensorflow", **extra)
        for i, gpus in enumerate(worker_gpus, 1)
        for extra in [{"gpus": gpus} if gpus else {}]
    ]
    return [_entry("ctl", "192.0.2.10", "zookeeper", "spark_master"), *workers]


def _ssh(*worker_gpus: int, **raw: object) -> StackConfig:
    return StackConfig.from_mapping(
        {"target": "ssh", "servers": json.dumps(_servers(*worker_gpus)), **raw}
    )


def _error(raw: dict) -> str:
    with pytest.raises(ConfigError) as err:
        StackConfig.from_mapping(raw)
    return str(err.value)


# --- the config ----------------------------------------------------------------------------------


def test_the_keys_default_to_no_gpus():
    config = StackConfig.from_mapping({})
    assert config.gpus_per_worker == 0 and config.docker_gpus == ""
    assert {"gpusPerWorker", "dockerGpus"} <= set(StackConfig.config_keys())


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ({"gpusPerWorker": "-1"}, "trainstack:gpusPerWorker: -1 is not a GPU count; allowed is 0"),
        ({"gpusPerWorker": "one"}, "trainstack:gpusPerWorker: 'one' is not a int"),
        ({"gpusPerWorker": "1"}, "trainstack:dockerGpus is not set; set it to all or to device"),
        (
            {"gpusPerWorker": "2", "dockerGpus": "0,1"},
            "trainstack:gpusPerWorker: 2 is more than the 1 GPU(s) trainstack:dockerGpus '0,1' "
            "gives each of the 2 workers; allowed is 0..1",
        ),
        (
            {"dockerGpus": "0,1,2"},
            "trainstack:dockerGpus: '0,1,2' lists 3 GPU(s) for 2 workers; allowed is all or a "
            "multiple of trainstack:workers",
        ),
        ({"dockerGpus": "0,0"}, "trainstack:dockerGpus: '0,0' is not a GPU list; allowed is all"),
        ({"dockerGpus": "two"}, "'two' is not a GPU list"),
        ({"dockerGpus": "0;1"}, "'0;1' is not a GPU list"),
    ],
)
def test_bad_gpu_values_are_named_with_what_is_allowed(raw, fragment):
    assert fragment in _error(raw)


def test_docker_gpus_alone_or_with_a_fitting_count_are_valid():
    config = StackConfig.from_mapping({"dockerGpus": "all", "gpusPerWorker": "2"})
    assert config.gpus_per_worker == 2
    config = StackConfig.from_mapping({"dockerGpus": "0,1,2,3", "gpusPerWorker": "2"})
    assert config.docker_gpu_devices == ("0", "1", "2", "3")


def test_docker_gpus_needs_the_docker_target():
    text = _error({"target": "ssh", "servers": json.dumps(_servers(1)), "dockerGpus": "all"})
    assert "trainstack:dockerGpus: 'all' is for the docker target's containers" in text


def test_a_server_entry_declares_its_gpus():
    servers, errors = parse_servers(_servers(2, 0))
    assert not errors
    assert [s.gpus for s in servers] == [0, 2, 0]
    # The record keeps its old shape without GPUs (it is an input of the server's probe).
    assert "gpus" not in servers[2].as_dict() and servers[1].as_dict()["gpus"] == 2
    assert parse_servers([servers[1].as_dict()])[0] == (servers[1],)


@pytest.mark.parametrize(
    "gpus, fragment",
    [
        (-1, "trainstack:servers[0].gpus: -1 is not a GPU count; allowed is 0 or more"),
        ("many", "'many' is not a GPU count"),
        (True, "True is not a GPU count"),
        (1, "trainstack:servers[0].gpus: 1 on a server without the role spark_worker"),
    ],
)
def test_a_bad_server_gpus_is_named(gpus, fragment):
    _, errors = parse_servers([_entry("ctl", "192.0.2.10", "zookeeper", gpus=gpus)])
    assert any(fragment in e for e in errors), errors


def test_gpus_per_worker_on_ssh_needs_gpus_on_every_tensorflow_server():
    assert _ssh(2, 1, gpusPerWorker="1").gpus_per_worker == 1
    text = _error({"target": "ssh", "servers": json.dumps(_servers(2, 0)), "gpusPerWorker": "2"})
    assert (
        "trainstack:gpusPerWorker: 2 GPU(s) per training worker is more than the tensorflow "
        "server(s) w-2 (0) declare in their entries' gpus" in text
    )


# --- the inventory and the containers ------------------------------------------------------------


def test_without_gpus_the_inventory_is_as_it_was():
    for config in (StackConfig(), _ssh(0, 0)):
        servers = config.servers or None
        nodes = topology.server_plan(config, config.servers) if servers else topology.plan(config)
        inventory = topology.inventory(config, "t", nodes, servers=servers)
        assert "trainstack_spark_worker_gpus" not in json.dumps(inventory)


def test_a_gpu_server_gets_its_count_in_the_inventory():
    config = _ssh(2, 0)
    nodes = topology.server_plan(config, config.servers)
    hosts = topology.inventory(config, "t", nodes, servers=config.servers)["all"]["children"]
    workers = hosts["workers"]["hosts"]
    assert workers["w-1"]["trainstack_spark_worker_gpus"] == 2
    assert "trainstack_spark_worker_gpus" not in workers["w-2"]


@pytest.mark.parametrize(
    "docker_gpus, expected",
    [
        ("all", [("all", 1), ("all", 1)]),
        ("0,1", [("device=0", 1), ("device=1", 1)]),
        ("0,1,GPU-3a23c669,3", [("device=0,1", 2), ("device=GPU-3a23c669,3", 2)]),
    ],
)
def test_docker_gpus_are_dealt_to_the_workers(docker_gpus, expected):
    config = StackConfig.from_mapping({"dockerGpus": docker_gpus})
    workers = [n for n in topology.plan(config) if n.group == "workers"]
    assert [(n.container_gpus, n.gpus) for n in workers] == expected
    assert all(n.gpus == 0 and not n.container_gpus for n in topology.plan(config)[:3])
    hosts = topology.inventory(config, "t", topology.plan(config))["all"]["children"]
    assert hosts["workers"]["hosts"]["worker-1"]["trainstack_spark_worker_gpus"] == expected[0][1]
    assert "trainstack_spark_worker_gpus" not in hosts["control"]["hosts"]["control-1"]


def test_with_all_a_worker_must_find_what_a_task_asks_for():
    config = StackConfig.from_mapping({"dockerGpus": "all", "gpusPerWorker": "2"})
    assert config.docker_worker_gpus(1) == ("all", 2)


@pytest.fixture
def mocks() -> Mocks:
    m = Mocks()
    pulumi.runtime.set_mocks(m, project="trainstack", stack="unit", preview=False)
    return m


@pulumi.runtime.test
def test_worker_containers_get_their_gpus(mocks):
    cluster = build(StackConfig.from_mapping({"dockerGpus": "0,1"}))

    def check(_):
        by_host = {c.inputs["hostname"]: c.inputs for c in mocks.of_type(CONTAINER)}
        assert by_host["worker-1"]["gpus"] == "device=0"
        assert by_host["worker-2"]["gpus"] == "device=1"
        assert all("gpus" not in by_host[f"control-{i}"] for i in (1, 2, 3))

    return cluster.nodes.apply(check)


@pulumi.runtime.test
def test_without_gpus_the_containers_have_no_gpus_input(mocks):
    cluster = build(StackConfig())

    def check(_):
        assert all("gpus" not in c.inputs for c in mocks.of_type(CONTAINER))

    return cluster.nodes.apply(check)


# --- the launch ----------------------------------------------------------------------------------


def test_the_declared_job_passes_gpus_per_worker_only_when_asked():
    cpu = training_settings(StackConfig(train=False))
    assert "gpus_per_worker" not in cpu  # the settings, and so the trigger, as before
    assert "--gpus-per-worker" not in train_command(LaunchSettings.declared(cpu, MASTER), "/r")
    gpu_config = StackConfig(train=False, docker_gpus="all", gpus_per_worker=1)
    gpu = training_settings(gpu_config)
    command = train_command(LaunchSettings.declared(gpu, MASTER), "/r")
    assert command[command.index("--gpus-per-worker") + 1] == "1"
    assert command[-2:] == ["--output", "/r"]
    assert training_trigger(gpu_config, gpu) != training_trigger(gpu_config, cpu)


def test_a_submitted_job_gets_gpus_per_worker_from_the_job_defaults():
    defaults = {
        **training_settings(StackConfig(train=False, docker_gpus="all", gpus_per_worker=2)),
        "master_url": MASTER,
    }
    launch = LaunchSettings.submitted(defaults, job_sha="e" * 64, job_params="{}", job_env="")
    assert launch.gpus_per_worker == 2
    command = train_command(launch, "/r")
    assert command[command.index("--gpus-per-worker") + 1] == "2"
    # jobDefaults of a stack from before the key: CPU only, no flag.
    del defaults["gpus_per_worker"]
    launch = LaunchSettings.submitted(defaults, job_sha="e" * 64, job_params="{}", job_env="")
    assert "--gpus-per-worker" not in train_command(launch, "/r")


# --- the ssh target's probe ---------------------------------------------------------------------


def test_the_probe_refuses_a_server_with_fewer_gpus_than_its_entry_declares():
    facts = "os_id=debian\nos_version=12\nmemory_kb=99999999\ndisk_free_kb=99999999\n"
    facts += "python3=/usr/bin/python3\nbecome=yes\n"
    server = Server(name="w", address="192.0.2.5", user="root", roles=("spark_worker",), gpus=2)
    assert fit_errors(server, parse_facts(facts + "gpus=2\n"), 0) == []
    (error,) = fit_errors(server, parse_facts(facts + "gpus=0\n"), 0)
    assert "declares gpus 2, but nvidia-smi lists 0 GPU(s) there" in error
    cpu = Server(name="w", address="192.0.2.5", user="root", roles=("spark_worker",))
    assert fit_errors(cpu, parse_facts(facts), 0) == []


# --- the spark role ------------------------------------------------------------------------------


def _bool(value: object) -> bool:
    return str(value).strip().lower() in ("true", "yes", "1", "on")


def _render(template: str, source: str | None = None, **more: object) -> str:
    """A role template as Ansible renders it (trim_blocks, the last newline kept), over the
    literal values of the role's defaults."""
    env = jinja2.Environment(
        trim_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined
    )
    env.filters["bool"] = _bool
    text = source if source is not None else (SPARK_ROLE / "templates" / template).read_text()
    defaults = yaml.safe_load((SPARK_ROLE / "defaults" / "main.yml").read_text())
    values = {k: v for k, v in defaults.items() if not (isinstance(v, str) and "{{" in v)}
    values.update(
        ansible_managed="managed",
        spark_master_url=MASTER,
        spark_zookeeper_url="control-1:2181",
        spark_auth_secret="s" * 16,
        spark_gpu_discovery_script="/etc/trainstack/spark/gpu-discovery.sh",
        **more,
    )
    return env.from_string(text).render(values)


@pytest.mark.parametrize("template", ["spark-defaults.conf.j2", "spark-env.sh.j2"])
def test_without_gpus_the_spark_config_renders_as_before(template):
    """The GPU lines are one block each, which adds nothing at 0: the template without it
    renders the same (so a stack without GPUs gets the files it had)."""
    text = (SPARK_ROLE / "templates" / template).read_text()
    block = re.compile(r"^{% if spark_gpu_amount \| int > 0 %}\n.*?^{% endif %}\n", re.M | re.S)
    assert len(block.findall(text)) == 1, "one GPU block"
    assert "gpu" not in block.sub("", text).lower()
    assert _render(template) == _render(template, block.sub("", text))
    assert _render(template, spark_gpu_amount="0") == _render(template)


def test_a_worker_with_gpus_gets_spark_gpu_scheduling():
    conf = _render("spark-defaults.conf.j2", spark_gpu_amount="2")
    lines = dict(line.split(None, 1) for line in conf.splitlines() if not line.startswith("#"))
    assert lines["spark.worker.resource.gpu.amount"] == "2"
    assert (
        lines["spark.worker.resource.gpu.discoveryScript"]
        == "/etc/trainstack/spark/gpu-discovery.sh"
    )
    env = _render("spark-env.sh.j2", spark_gpu_amount=2)
    assert 'export CUDA_DEVICE_ORDER="PCI_BUS_ID"' in env


# A fake nvidia-smi that answers only the query the discovery script must make (the GPUs'
# indices, one a line, without a header), as the real one prints it; any other arguments fail
# naming them. Each call's arguments go to calls.log beside it.
FAKE_NVIDIA_SMI = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls.log"
if [ "$*" != "--query-gpu=index --format=csv,noheader" ]; then
  echo "fake nvidia-smi: unexpected arguments: $*" >&2
  exit 2
fi
printf "0\\n 1\\n"
"""


def test_the_discovery_script_prints_what_spark_reads(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text(FAKE_NVIDIA_SMI)
    fake.chmod(0o755)
    # The fake itself refuses a query other than the indices' (e.g. names, with a header).
    other = subprocess.run([str(fake), "--query-gpu=name", "--format=csv"], capture_output=True)
    assert other.returncode == 2 and b"unexpected arguments: --query-gpu=name" in other.stderr
    (tmp_path / "calls.log").unlink()
    script = SPARK_ROLE / "files" / "gpu-discovery.sh"
    found = subprocess.run(
        ["sh", str(script)], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, capture_output=True
    )
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == {"name": "gpu", "addresses": ["0", "1"]}
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls == ["--query-gpu=index --format=csv,noheader"], calls
    fake.unlink()
    missing = subprocess.run(
        ["sh", str(script)], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, capture_output=True
    )
    assert missing.returncode != 0 and b"no nvidia-smi" in missing.stderr


def test_group_vars_map_the_inventory_count_onto_the_role():
    group_vars = yaml.safe_load((REPO / "playbooks/group_vars/all.yml").read_text())
    assert group_vars["spark_gpu_amount"] == "{{ trainstack_spark_worker_gpus | default(0) }}"


# --- the trainer's side --------------------------------------------------------------------------


def test_a_job_with_gpus_asks_spark_for_them_per_task_and_per_executor():
    from trainstack_training.config import TrainConfig
    from trainstack_training.spark import context_settings

    settings = context_settings(TrainConfig(master="local[2]", gpus_per_worker=2))
    assert settings["spark.task.resource.gpu.amount"] == "2"
    assert settings["spark.executor.resource.gpu.amount"] == "2"
    cpu = context_settings(TrainConfig(master="local[2]"))
    assert not [k for k in cpu if "gpu" in k], cpu


class _Device:
    def __init__(self, name: str) -> None:
        self.type, _, index = name.partition(":")
        self.index = int(index) if index else None

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


class _ProcessGroupStartedError(Exception):
    """Raised by the fake torch's init_process_group: the test stops the rank there."""


def _fake_torch(cuda: bool) -> SimpleNamespace:
    """As much of torch as TorchBackend.run uses up to its process group; the calls made."""
    calls: dict[str, list] = {"set_device": [], "init_process_group": []}

    def init_process_group(**kwargs: object) -> None:
        calls["init_process_group"].append(kwargs)
        raise _ProcessGroupStartedError

    return SimpleNamespace(
        calls=calls,
        manual_seed=lambda seed: None,
        device=_Device,
        cuda=SimpleNamespace(
            is_available=lambda: cuda, set_device=lambda d: calls["set_device"].append(str(d))
        ),
        distributed=SimpleNamespace(init_process_group=init_process_group),
    )


def _rank(gpus: list[str]) -> Any:
    """As much of a RankRun as TorchBackend.run reads up to its process group."""
    cfg = SimpleNamespace(seed=42, workers=2)
    return SimpleNamespace(cfg=cfg, rank=1, gpus=gpus, host="192.0.2.21", peers=[], marks={})


@pytest.mark.parametrize(
    "gpus, backend, device", [(["1", "2"], "nccl", "cuda:1"), ([], "gloo", None)]
)
def test_a_torch_rank_given_a_gpu_runs_nccl_on_it_else_gloo(gpus, backend, device):
    from trainstack_training.frameworks.torch import TorchBackend

    torch = _fake_torch(cuda=True)
    with pytest.raises(_ProcessGroupStartedError):
        TorchBackend().run(_rank(gpus), module=None, framework=torch)
    (call,) = torch.calls["init_process_group"]
    assert call["backend"] == backend, call
    assert torch.calls["set_device"] == ([device] if device else [])


def test_a_torch_rank_given_a_gpu_that_torch_cannot_see_says_so():
    from trainstack_training.frameworks.torch import TorchBackend

    torch = _fake_torch(cuda=False)
    with pytest.raises(RuntimeError) as err:
        TorchBackend().run(_rank(["0"]), module=None, framework=torch)
    assert str(err.value).startswith(
        "Spark gave rank 1 GPU 0 on 192.0.2.21, but torch sees no CUDA device there"
    )
    assert torch.calls["init_process_group"] == []


def test_a_tensorflow_job_with_gpus_is_refused_before_spark_starts(tmp_path):
    from trainstack_training.config import TrainConfig
    from trainstack_training.launcher import _prepare_run
    from trainstack_training.spark import ClusterError

    def prepare(example: str, out: str) -> None:
        _prepare_run(
            TrainConfig(
                output=str(tmp_path / out),
                master="local[2]",
                job_dir=str(REPO / "examples" / example),
                gpus_per_worker=1,
                job_env=str(tmp_path / "site"),  # torch's overlay (the torch job lists it)
            )
        )

    with pytest.raises(ClusterError) as err:
        prepare("digits", "tf")
    assert str(err.value) == (
        "gpus_per_worker=1: GPUs train torch jobs only; the nodes run TensorFlow's CPU build "
        "(set gpus_per_worker=0 for this job)"
    )
    prepare("digits-torch", "torch")  # the same request for a torch job is taken
