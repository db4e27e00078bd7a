"""Provisioning and training as resources, under Pulumi's mocks, and their triggers."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pulumi
import pytest

from infra.components.provisioning import Provisioning, ProvisioningArgs, tree_digest
from infra.components.training import Training, TrainingArgs
from infra.config import StackConfig
from infra.program import job_data, training_settings, training_trigger

pytestmark = pytest.mark.unit

SETTINGS = {"workers": 2, "epochs": 10, "batch_size": 32, "data": "digits", "rows": 0}


class Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        self.resources: dict[str, pulumi.runtime.MockResourceArgs] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources[args.typ] = args
        return [f"{args.name}-id", dict(args.inputs)]

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


@pytest.fixture
def mocks() -> Mocks:
    m = Mocks()
    pulumi.runtime.set_mocks(m, project="trainstack", stack="unit", preview=False)
    return m


@pulumi.runtime.test
def test_provisioning_runs_site_playbook_with_secret_and_content_hash(mocks):
    p = Provisioning(
        "provisioning",
        ProvisioningArgs(
            inventory={"all": {"hosts": {}}},
            spark_auth_secret="s3cr3t",
            wheelhouse="/w",
            artifacts_dir="/a",
        ),
    )

    def check(_):
        run = mocks.resources["pulumi-python:dynamic/ansible:PlaybookRun"]
        assert run.inputs["playbook"] == "site.yml"
        assert run.inputs["content_hash"] == tree_digest()
        assert run.inputs["wheelhouse"] == "/w"

    return p.stats.apply(check)


@pulumi.runtime.test
def test_training_job_is_keyed_by_its_trigger(mocks):
    t = Training(
        "training",
        TrainingArgs(
            master_url="spark://control-1:7077",
            submit_candidates=["trainstack-unit-worker-1", "trainstack-unit-worker-2"],
            settings=SETTINGS,
            trigger="abcdef0123456789",
            host_artifacts_dir="/h",
        ),
    )

    def check(_):
        job = mocks.resources["pulumi-python:dynamic/training:TrainingJob"]
        assert job.inputs["run_id"] == "run-abcdef012345"
        assert job.inputs["master_url"] == "spark://control-1:7077"
        assert job.inputs["settings"]["epochs"] == 10
        assert job.inputs["submit_candidates"] == [
            "trainstack-unit-worker-1",
            "trainstack-unit-worker-2",
        ]

    return t.result.apply(check)


class _FakeContainer:
    def __init__(self, name: str, status: str, installed: bool = True) -> None:
        self.name, self.status, self.installed = name, status, installed

    def exec_run(self, command):
        return (0 if self.installed else 1), b""


class _FakeEngine:
    def __init__(self, *containers: _FakeContainer) -> None:
        self.by_name = {c.name: c for c in containers}
        self.containers = self

    def get(self, name: str) -> _FakeContainer:
        if name not in self.by_name:
            raise LookupError(f"No such container: {name}")
        return self.by_name[name]


def test_submitter_is_the_first_healthy_worker(monkeypatch, capsys):
    from infra import engine
    from infra.components.training import TrainingError, _submitter

    fake = _FakeEngine(
        _FakeContainer("w1", "exited"),
        _FakeContainer("w2", "running", installed=False),
        _FakeContainer("w3", "running"),
    )
    monkeypatch.setattr(engine, "docker_client", lambda: fake)
    assert _submitter(["w0", "w1", "w2", "w3"]).name == "w3"
    said = capsys.readouterr().err
    assert "submitting from w3; skipped w0: not on the engine" in said
    assert (
        "w1: exited" in said and "w2: /opt/trainstack/venv/bin/trainstack-train is missing" in said
    )
    with pytest.raises(TrainingError, match=r"no node can submit the job \(w1: exited\)"):
        _submitter(["w1"])


def test_training_trigger_changes_only_with_settings_or_retrain_token():
    config = StackConfig()
    base = training_trigger(config, SETTINGS)
    assert training_trigger(config, dict(SETTINGS)) == base
    assert training_trigger(replace(config, workers=3), SETTINGS) == base
    assert training_trigger(config, {**SETTINGS, "epochs": 11}) != base
    assert training_trigger(replace(config, retrain="again"), SETTINGS) != base


def test_content_hash_follows_the_roles(tmp_path):
    (tmp_path / "roles" / "r" / "tasks").mkdir(parents=True)
    task = tmp_path / "roles" / "r" / "tasks" / "main.yml"
    task.write_text("---\n- name: A\n")
    first = tree_digest(tmp_path, ("roles",))
    task.write_text("---\n- name: B\n")
    second = tree_digest(tmp_path, ("roles",))
    assert second != first
    # Caches written beside the sources do not count.
    (tmp_path / "roles" / "r" / "__pycache__").mkdir()
    (tmp_path / "roles" / "r" / "__pycache__" / "x.pyc").write_bytes(b"1")
    assert tree_digest(tmp_path, ("roles",)) == second
    # Nor do a role's docs: a README edit re-runs no provisioning.
    (tmp_path / "roles" / "r" / "README.md").write_text("# r\n")
    assert tree_digest(tmp_path, ("roles",)) == second


def test_inventory_numbers_are_ints_again_after_the_engine():
    from infra.components.provisioning import integral

    raw = {"all": {"hosts": {"c": {"trainstack_zookeeper_id": 1.0, "cpus": 0.5}}, "l": [2.0]}}
    assert integral(raw) == {
        "all": {"hosts": {"c": {"trainstack_zookeeper_id": 1, "cpus": 0.5}}, "l": [2]}
    }


def test_job_jvms_compile_with_c1_only_and_the_training_package_parses_it():
    """The launch settings' spark_conf reaches Spark as three settings: the driver's heap and
    C1-only compilation for the job's driver and executors (docs/training.md)."""
    from trainstack_training.config import TrainConfig

    settings = training_settings(StackConfig())
    conf = TrainConfig(spark_conf=settings["spark_conf"]).spark_settings()
    assert conf == {
        "spark.driver.memory": "512m",
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        "spark.executor.extraJavaOptions": "-XX:TieredStopAtLevel=1",
    }


# The whole program under the mocks: which resources it declares (their URNs, with the full
# chain of parent types as the engine writes it) and what it exports, per target.


class ProgramMocks(pulumi.runtime.Mocks):
    """Outputs the program reads: containers' addresses and ports, servers' facts."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        outs = dict(args.inputs)
        if args.typ == "docker:index/container:Container":
            group, number = args.inputs["hostname"].rsplit("-", 1)  # control-1: 10.9.1.1
            subnet = 1 if group == "control" else 2
            outs["networkDatas"] = [{"ipAddress": f"10.9.{subnet}.{number}"}]
            outs["ports"] = [
                {**p, "external": p.get("external") or p["internal"] + 20000 + int(number)}
                for p in outs.get("ports") or []
            ]
        elif args.typ == "command:local:Command":
            facts = {"os": "Debian GNU/Linux 12", "cores": 4, "host_keys": ["k ssh-ed25519 A"]}
            outs["stdout"] = json.dumps(facts)
        elif args.typ == "pulumi-python:dynamic/ssh:ServerProbe":
            outs["facts"] = args.inputs["recorded"]
        return [f"{args.name}-id", outs]

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


class ProgramMonitor(pulumi.runtime.mocks.MockMonitor):
    def make_urn(self, parent: str, type_: str, name: str) -> str:
        # The parent's whole chain of types, as the engine writes it (the stock mock keeps
        # only the parent's last type, and prefixes the root stack's).
        if parent and "::pulumi:pulumi:Stack::" not in parent:
            type_ = parent.split("::")[2] + "$" + type_
        return f"urn:pulumi:unit::trainstack::{type_}::{name}"


def run_program(raw: dict, monkeypatch, tmp_path) -> tuple[dict[str, dict], dict]:
    """Run `infra.program.main` for the config `raw` (the stack's `trainstack:*` keys);
    returns the resources it declared (URN -> state) and its stack outputs, resolved."""
    from infra import config as stack_config
    from infra import engine, program

    monitor = ProgramMonitor(ProgramMocks())
    pulumi.runtime.set_mocks(
        monitor.mocks, project="trainstack", stack="unit", preview=False, monitor=monitor
    )
    monkeypatch.setattr(stack_config, "load", lambda: StackConfig.from_mapping(raw))
    monkeypatch.setattr(program, "ROOT", tmp_path)
    monkeypatch.setattr(engine, "docker_client", lambda: None)
    monkeypatch.setattr(engine, "check_no_legacy_stack", lambda client, prefix: None)
    monkeypatch.setattr(engine, "require_image", lambda client, image, key: "sha256:base")
    monkeypatch.setattr(engine, "check_ports_free", lambda client, ports, **kw: None)
    exports: dict = {}
    monkeypatch.setattr(pulumi, "export", exports.__setitem__)
    resolved: dict = {}

    @pulumi.runtime.test
    def declare():
        program.main()
        return pulumi.Output.from_input(exports).apply(resolved.update)

    declare()
    assert list(resolved) == list(exports)
    states = {urn: dict(r.state) for urn, r in sorted(monitor.resources.items())}
    text = json.dumps([states, resolved], sort_keys=True, default=repr)
    states, resolved = json.loads(text.replace(str(tmp_path), "<root>"))
    return states, resolved


def ssh_servers() -> str:
    def server(name: str, address: str, *roles: str) -> dict:
        return {"name": name, "address": address, "user": "deploy", "roles": list(roles)}

    return json.dumps(
        [
            server("zk-a", "192.0.2.10", "zookeeper", "spark_master", "monitoring"),
            server("zk-b", "192.0.2.11", "zookeeper", "spark_master"),
            server("zk-c", "192.0.2.12", "zookeeper"),
            server("gpu-1", "192.0.2.20", "spark_worker", "tensorflow"),
            server("gpu-2", "192.0.2.21", "spark_worker", "tensorflow"),
        ]
    )


PROGRAM_CASES = {
    "docker": {},
    "docker-unbaked": {"bakeImage": "false", "monitoring": "false", "train": "false"},
    "docker-bare": {"provision": "false", "train": "false", "workers": "1"},
    "ssh": {"target": "ssh", "servers": ssh_servers()},
}

# URNs without "urn:pulumi:unit::trainstack::". They are the identity of every resource in a
# stack's state: one that changes (type, name or parent) is a replace on the next `up`.
CLUSTER = "trainstack:cluster:Cluster"
NODE = f"{CLUSTER}$trainstack:cluster:Node"
SSH = "trainstack:ssh:Cluster"
NODE_IMAGE = [
    "trainstack:image:NodeImage$docker:index/remoteImage:RemoteImage::node-image",
    "trainstack:image:NodeImage$pulumi-python:dynamic/image:Bake::node-image-bake",
    "trainstack:image:NodeImage::node-image",
]
PROVISIONING = [
    "trainstack:cluster:Provisioning$pulumi-python:dynamic/ansible:PlaybookRun::provisioning-site",
    "trainstack:cluster:Provisioning::provisioning",
]
TRAINING = [
    "trainstack:training:Training$pulumi-python:dynamic/training:TrainingJob::training-job",
    "trainstack:training:Training::training",
]


def docker_cluster_urns(workers: int) -> list[str]:
    nodes = ["control-1", "control-2", "control-3"] + [f"worker-{i + 1}" for i in range(workers)]
    return [
        f"{CLUSTER}::cluster",
        f"{CLUSTER}$docker:index/network:Network::network",
        *(f"{CLUSTER}$docker:index/volume:Volume::{v}" for v in ("checkpoints", "data", "models")),
        f"{CLUSTER}$pulumi-python:dynamic/secret:RandomSecret::spark-auth-secret",
        *(f"{NODE}::{n}" for n in nodes),
        *(f"{NODE}$docker:index/container:Container::{n}-container" for n in nodes),
        *(f"{NODE}$docker:index/volume:Volume::zookeeper-control-{i}" for i in (1, 2, 3)),
        *(f"{NODE}$docker:index/volume:Volume::spark-recovery-control-{i}" for i in (1, 2)),
        f"{NODE}$docker:index/volume:Volume::mlflow-control-1",
        f"{NODE}$docker:index/volume:Volume::objectstore-control-1",
    ]


SERVERS = ("zk-a", "zk-b", "zk-c", "gpu-1", "gpu-2")
PROGRAM_URNS = {
    "docker": [*docker_cluster_urns(2), *NODE_IMAGE, *PROVISIONING, *TRAINING],
    "docker-unbaked": [
        *docker_cluster_urns(2),
        "docker:index/remoteImage:RemoteImage::base-image",
        *PROVISIONING,
    ],
    "docker-bare": [*docker_cluster_urns(1), *NODE_IMAGE],
    "ssh": [
        f"{SSH}::servers",
        *(f"{SSH}$command:local:Command::server-{s}" for s in SERVERS),
        *(f"{SSH}$pulumi-python:dynamic/ssh:ServerProbe::probe-{s}" for s in SERVERS),
        f"{SSH}$pulumi-python:dynamic/secret:RandomSecret::spark-auth-secret",
        *PROVISIONING,
        *TRAINING,
    ],
}
DOCKER_OUTPUTS = ["inventory", "network", "nodeImage", "nodes", "sparkMasterUrl", "sparkUiUrls"]
JOB_OUTPUTS = ["jobDefaults", "jobNodes", "training"]
TRACKING = ["mlflowUiUrl", "tracking"]
OBJECT_STORE = [
    "objectStoreUrl",
    "objectStoreBucket",
    "objectStoreAccessKey",
    "objectStoreSecretKey",
]
PROGRAM_OUTPUTS = {
    "docker": [
        *DOCKER_OUTPUTS,
        "monitoringUrl",
        *TRACKING,
        *OBJECT_STORE,
        "provisioning",
        *JOB_OUTPUTS,
    ],
    # No declared job (train false): submitted jobs all the same.
    "docker-unbaked": [
        *DOCKER_OUTPUTS,
        *TRACKING,
        *OBJECT_STORE,
        "provisioning",
        "jobDefaults",
        "jobNodes",
    ],
    "docker-bare": [*DOCKER_OUTPUTS, "monitoringUrl", *TRACKING, *OBJECT_STORE],
    "ssh": [
        "inventory",
        "nodes",
        "sparkMasterUrl",
        "sparkUiUrls",
        "monitoringUrl",
        *TRACKING,
        *OBJECT_STORE,
        "provisioning",
        *JOB_OUTPUTS,
    ],
}


@pytest.mark.parametrize("case", sorted(PROGRAM_CASES))
def test_program_declares_the_same_resources_and_outputs_for_every_target(
    case, monkeypatch, tmp_path
):
    states, outputs = run_program(PROGRAM_CASES[case], monkeypatch, tmp_path)
    prefix = "urn:pulumi:unit::trainstack::"
    assert sorted(states) == sorted(prefix + urn for urn in PROGRAM_URNS[case])
    assert sorted(outputs) == sorted(PROGRAM_OUTPUTS[case])


def test_docker_program_outputs(monkeypatch, tmp_path):
    _, out = run_program(PROGRAM_CASES["docker"], monkeypatch, tmp_path)
    master = "spark://control-1:7077,control-2:7077"
    assert out["sparkMasterUrl"] == master
    assert out["sparkUiUrls"] == {
        "control-1": "http://127.0.0.1:18080",
        "control-2": "http://127.0.0.1:18081",
    }
    assert out["monitoringUrl"] == "http://127.0.0.1:19090"
    assert out["mlflowUiUrl"] == "http://127.0.0.1:19100"
    # The object store's S3 endpoint, published on loopback, and its keys (the secret one
    # derived from the cluster secret, as playbooks/group_vars/all.yml derives it).
    assert out["objectStoreUrl"] == "http://127.0.0.1:19110"
    assert out["objectStoreBucket"] == "trainstack"
    assert out["objectStoreAccessKey"] == "trainstack"
    assert re.fullmatch(r"[0-9a-f]{64}", out["objectStoreSecretKey"])
    all_vars = out["inventory"]["all"]["vars"]
    assert all_vars["trainstack_s3_endpoint"] == "http://control-1:8333"
    assert out["inventory"]["all"]["children"]["object_store"]["hosts"] == {"control-1": {}}
    assert not any("secret" in k for k in all_vars if k.startswith("trainstack_object_store"))
    assert out["network"] == "trainstack-unit-net"
    assert out["nodeImage"]["tag"].startswith("trainstack-node:")
    assert out["nodes"][3] == {
        "name": "worker-1",
        "container": "trainstack-unit-worker-1",
        "roles": ["spark_worker", "tensorflow"],
        "address": "10.9.2.1",
        "container_id": "worker-1-container-id",
    }
    assert [n["name"] for n in out["nodes"]] == [
        "control-1",
        "control-2",
        "control-3",
        "worker-1",
        "worker-2",
    ]
    assert out["inventory"]["all"]["vars"]["trainstack_spark_master_url"] == master
    # The job drivers' node first, then the workers (when it is down).
    assert out["jobNodes"] == [
        {"name": name, "transport": "docker", "container": f"trainstack-unit-{name}"}
        for name in ("control-3", "worker-1", "worker-2")
    ]
    settings = training_settings(StackConfig())
    assert out["jobDefaults"] == {
        **{k: v for k, v in settings.items() if k not in ("job_sha", "job_params")},
        "master_url": master,
        "slots": 2,  # the most ranks a submitted job may ask for: two workers, a core each
        "concurrent": True,  # jobs share them (trainstack:concurrentJobs)
        "stack": "trainstack-unit",  # a submitted job's MLflow experiment when it names none
    }
    # Where `trainstack sync` and the declared job's sync run: the tracking node's record.
    assert out["tracking"] == {
        "node": {
            "name": "control-1",
            "transport": "docker",
            "container": "trainstack-unit-control-1",
        },
        "tracking_uri": "http://control-1:5000",
        "auth_file": "/etc/trainstack/mlflow/auth.ini",
        "ui_url": "http://127.0.0.1:19100",
    }


def test_a_stack_without_a_declared_job_takes_submitted_jobs_with_the_same_defaults(
    monkeypatch, tmp_path
):
    """trainstack:train false declares no job, yet `trainstack submit` needs jobNodes and
    jobDefaults: the same as a stack with the declared job has."""
    _, declared = run_program(PROGRAM_CASES["docker"], monkeypatch, tmp_path / "declared")
    _, none = run_program({"train": "false"}, monkeypatch, tmp_path / "none")
    assert "training" not in none
    assert none["jobNodes"] == declared["jobNodes"]
    assert none["jobDefaults"] == declared["jobDefaults"]


def test_unbaked_docker_program_names_the_base_image_and_no_node_image(monkeypatch, tmp_path):
    """bakeImage false on the docker target: the base image is the nodes' image (a
    RemoteImage of it, no bake: the resource list above), and the inventory names no node
    image, so site.yml runs every install part (the ssh module's bare server and the bake
    prove that install on real machines)."""
    states, out = run_program(PROGRAM_CASES["docker-unbaked"], monkeypatch, tmp_path)
    assert out["nodeImage"] == {"tag": "debian:bookworm", "bake_s": 0.0, "size_bytes": 0}
    assert "trainstack_node_image" not in out["inventory"]["all"]["vars"]
    base = states["urn:pulumi:unit::trainstack::docker:index/remoteImage:RemoteImage::base-image"]
    assert base["name"] == "debian:bookworm", base
    baked, _ = run_program(PROGRAM_CASES["docker"], monkeypatch, tmp_path)
    # The same program with the default bakes: the difference is the flag, not the case.
    assert any(urn.endswith("::node-image-bake") for urn in baked)


def test_ssh_program_outputs(monkeypatch, tmp_path):
    _, out = run_program(PROGRAM_CASES["ssh"], monkeypatch, tmp_path)
    assert out["sparkMasterUrl"] == "spark://192.0.2.10:7077,192.0.2.11:7077"
    assert out["sparkUiUrls"] == {
        "zk-a": "http://192.0.2.10:8080",
        "zk-b": "http://192.0.2.11:8080",
    }
    assert out["monitoringUrl"] == "http://192.0.2.10:9090"
    # The tracking server on the first control server, at its cluster address.
    assert out["mlflowUiUrl"] == "http://192.0.2.10:5000"
    assert out["inventory"]["all"]["vars"]["trainstack_tracking_uri"] == "http://192.0.2.10:5000"
    assert out["inventory"]["all"]["children"]["tracking"]["hosts"] == {"zk-a": {}}
    assert out["tracking"]["node"]["transport"] == "ssh"
    assert out["tracking"]["node"]["host"] == "192.0.2.10"
    # The object store beside it, at the same address (reached there or through `ssh -L`).
    assert out["objectStoreUrl"] == "http://192.0.2.10:8333"
    assert out["nodes"][0] == {
        "name": "zk-a",
        "roles": ["zookeeper", "spark_master", "monitoring", "tracking", "object_store"],
        "address": "192.0.2.10",
        "facts": {"os": "Debian GNU/Linux 12", "cores": 4},
    }
    assert out["jobNodes"] == [
        {
            "name": name,
            "transport": "ssh",
            "host": host,
            "port": 22,
            "user": "deploy",
            "private_key_file": "",
            "known_hosts_file": "<root>/.artifacts/unit/ssh/known_hosts",
        }
        for name, host in (("gpu-1", "192.0.2.20"), ("gpu-2", "192.0.2.21"))
    ]
    assert out["jobDefaults"]["master_url"] == out["sparkMasterUrl"]


@pytest.mark.parametrize(
    ("train_data", "manifest", "expected"),
    [
        ("", "", "digits"),  # nothing named anywhere
        ("", "data/t.csv", "/srv/trainstack/models/jobs/sha1/data/t.csv"),  # shipped with code
        ("", "/srv/trainstack/data/m.parquet", "/srv/trainstack/data/m.parquet"),
        ("/srv/trainstack/data/s.parquet", "data/t.csv", "/srv/trainstack/data/s.parquet"),
    ],
)
def test_the_declared_jobs_data_set_is_the_stacks_then_the_manifests(
    tmp_path, train_data, manifest, expected
):
    """`trainstack:trainData`, set, is the declared job's own setting and wins; unset, the
    manifest's `data` applies, else the digits."""
    from trainstack_training.manifest import load_spec

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.csv").write_text("a,label\n1,0\n")
    (tmp_path / "m.py").write_text("def train(ctx): ...\n")
    line = f'data = "{manifest}"\n' if manifest else ""
    (tmp_path / "trainstack.toml").write_text(f'[job]\nentry = "m"\n{line}')
    config = StackConfig(train_data=train_data)
    data = job_data(config, load_spec(tmp_path), "sha1")
    assert data == expected
    assert training_settings(config, "sha1", data)["data"] == expected
