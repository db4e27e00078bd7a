"""The object store's node (roles/object_store) and s3a on every Spark node (roles/spark)."""

import pytest

from infra.nodes import NODE_PATHS

pytestmark = pytest.mark.hosts

PROGRAM = "object-store"
IDENTITIES = "/etc/trainstack/objectstore/s3.json"
S3_PORT = 8333
# SeaweedFS's master, volume server and filer (the role's defaults), and their gRPC ports.
INTERNAL_PORTS = (9333, 9334, 9335, 19333, 19334, 19335)
JARS_DIR = f"{NODE_PATHS.install_dir}/spark-jars"
SPARK_DEFAULTS = f"{NODE_PATHS.spark_conf_dir}/spark-defaults.conf"


@pytest.mark.group("object_store")
def test_object_store_supervised_and_running(host):
    assert " RUNNING " in host.check_output(f"supervisorctl status {PROGRAM}")


@pytest.mark.group("object_store")
def test_object_store_identities_are_private(host):
    f = host.file(IDENTITIES)
    assert f.exists and f.mode == 0o600 and f.user == "trainstack"


@pytest.mark.group("object_store")
def test_object_store_listens_for_s3_on_the_cluster_and_keeps_the_rest_local(host):
    s3 = [s for s in _listening(host) if s.endswith(f":{S3_PORT}")]
    assert s3 and not any("127.0.0.1" in s for s in s3), s3
    for port in INTERNAL_PORTS:
        bound = [s for s in _listening(host) if s.endswith(f":{port}")]
        assert bound and all("127.0.0.1" in s for s in bound), (port, bound)


@pytest.mark.group("object_store")
def test_object_store_data_is_on_the_nodes_own_disk(host):
    data = host.file(NODE_PATHS.object_store_data_dir)
    assert data.is_directory and data.user == "trainstack" and data.mode == 0o750


@pytest.mark.group("spark_worker", "spark_master")
def test_s3a_jars_are_on_the_class_path(host):
    jars = host.check_output(f"ls {JARS_DIR}").split()
    assert any(j.startswith("hadoop-aws-3.4.1") for j in jars), jars
    assert any(j.startswith("bundle-2.") for j in jars), jars
    conf = host.file(SPARK_DEFAULTS).content_string
    assert f"spark.executor.extraClassPath {JARS_DIR}/*" in " ".join(conf.split()), conf[:200]


def _listening(host) -> list[str]:
    return [str(s) for s in host.socket.get_listening_sockets()]
