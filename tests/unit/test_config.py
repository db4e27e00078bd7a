"""Config validation: every bad value is named with what is allowed, before anything runs."""

import pytest

from infra.config import ConfigError, StackConfig
from infra.config.values import parse_size

pytestmark = pytest.mark.unit


def test_defaults_fit_two_cores_and_eight_gib():
    c = StackConfig()
    cpus = c.control_nodes * c.control_cpus + c.workers * c.worker_cpus
    memory = c.control_nodes * c.control_memory_bytes + c.workers * c.worker_memory_bytes
    assert cpus <= 2.0
    assert memory <= 8 * 1024**3


def test_strings_from_pulumi_config_are_typed():
    c = StackConfig.from_mapping(
        {"workers": "3", "retainData": "true", "workerCpus": "0.5", "uiPortBase": "0"}
    )
    assert (c.workers, c.retain_data, c.worker_cpus, c.ui_port_base) == (3, True, 0.5, 0)


@pytest.mark.parametrize(
    ("raw", "fragments"),
    [
        ({"workers": "0"}, ["trainstack:workers", "0", "minimum of 1"]),
        ({"controlNodes": "0"}, ["trainstack:controlNodes", "minimum of 1"]),
        ({"controlNodes": "2", "masters": "1"}, ["trainstack:controlNodes", "even", "odd"]),
        ({"masters": "4"}, ["trainstack:masters", "4", "1..3"]),
        ({"workerMemory": "lots"}, ["trainstack:workerMemory", "'lots'", "not a size"]),
        ({"controlMemory": "100m"}, ["trainstack:controlMemory", "minimum of 256m"]),
        ({"workers": "two"}, ["trainstack:workers", "'two'", "not a int"]),
        ({"retainData": "maybe"}, ["trainstack:retainData", "'maybe'", "not a bool"]),
        ({"wrokers": "3"}, ["trainstack:wrokers", "unknown key", "trainstack:workers"]),
        ({"workerSparkMemory": "4g"}, ["trainstack:workerSparkMemory", "more than"]),
        ({"namePrefix": "Bad_Name"}, ["trainstack:namePrefix", "'Bad_Name'", "lowercase"]),
        ({"uiPortBase": "80"}, ["trainstack:uiPortBase", "80", "1024.."]),
        ({"imageRepository": "Trainstack Node"}, ["trainstack:imageRepository", "lowercase"]),
        ({"bakeImage": "perhaps"}, ["trainstack:bakeImage", "'perhaps'", "not a bool"]),
        ({"bindAddress": "localhost"}, ["trainstack:bindAddress", "'localhost'", "IPv4"]),
        ({"runnerKeepAlive": "soon"}, ["trainstack:runnerKeepAlive", "'soon'", "0 (off)"]),
        ({"runnerKeepAlive": "500ms"}, ["trainstack:runnerKeepAlive", "minimum of 1s"]),
    ],
)
def test_bad_values_are_named_with_what_is_allowed(raw, fragments):
    with pytest.raises(ConfigError) as err:
        StackConfig.from_mapping(raw)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_all_problems_are_reported_together():
    with pytest.raises(ConfigError) as err:
        StackConfig.from_mapping({"workers": "0", "masters": "9"})
    assert "trainstack:workers" in str(err.value)
    assert "trainstack:masters" in str(err.value)


@pytest.mark.parametrize(
    ("text", "size"),
    [("512m", 512 * 1024**2), ("2g", 2 * 1024**3), ("1.5G", int(1.5 * 1024**3)), ("1024", 1024)],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


def test_every_key_is_documented():
    with open("docs/config.md", encoding="utf-8") as doc:
        text = doc.read()
    for key in StackConfig.config_keys():
        assert f"`trainstack:{key}`" in text, f"trainstack:{key} missing from docs/config.md"


def test_train_strategy_is_validated_and_single_means_one_worker():
    with pytest.raises(ConfigError) as err:
        StackConfig.from_mapping({"trainStrategy": "parameter-server"})
    for fragment in ("trainstack:trainStrategy", "'parameter-server'", "multi-worker, single"):
        assert fragment in str(err.value)
    assert StackConfig.from_mapping({"workers": "3"}).training_workers == 3
    single = StackConfig.from_mapping({"workers": "3", "trainStrategy": "single"})
    assert (single.train_strategy, single.training_workers) == ("single", 1)


@pytest.mark.parametrize(
    ("values", "slots"),
    [
        ({}, 2),
        ({"workers": "3", "workerSparkCores": "2"}, 6),
        ({"workers": "3", "workerSparkCores": "2", "trainStrategy": "single"}, 3),
    ],
)
def test_the_training_slots_the_queue_shares(values, slots):
    """One rank a Spark task slot on the nodes that train; a `single` rank takes a node."""
    assert StackConfig.from_mapping(values).training_slots == slots


def test_security_defaults_and_rotation_token():
    c = StackConfig()
    assert (c.spark_network_crypto, c.spark_io_encryption, c.rotate_secrets) == (True, False, "")
    c = StackConfig.from_mapping({"sparkIoEncryption": "true", "rotateSecrets": "2026-11-30"})
    assert (c.spark_io_encryption, c.rotate_secrets) == (True, "2026-11-30")
    with pytest.raises(ConfigError) as err:
        StackConfig.from_mapping({"rotateSecrets": "a b"})
    assert "trainstack:rotateSecrets" in str(err.value) and "'a b'" in str(err.value)


@pytest.mark.parametrize(("raw", "seconds"), [("10m", 600), ("0", 0), ("0s", 0), ("45s", 45)])
def test_runner_keep_alive_in_seconds_and_zero_is_off(raw, seconds):
    assert StackConfig.from_mapping({"runnerKeepAlive": raw}).runner_keep_alive_seconds == seconds
    assert StackConfig().runner_keep_alive_seconds == 600  # on by default (docs/jobs.md)
