import pytest

pytestmark = pytest.mark.hosts


@pytest.mark.group("zookeeper", "spark_master", "spark_worker", "tensorflow")
def test_spark_secret_file_is_private(host):
    f = host.file("/etc/trainstack/spark/spark-defaults.conf")
    assert f.exists
    assert f.mode == 0o600
    assert f.user == "trainstack"


@pytest.mark.group("zookeeper", "spark_master", "spark_worker", "tensorflow")
def test_spark_authentication_enabled(host):
    assert (
        host.check_output(
            "grep -c '^spark.authenticate *true' /etc/trainstack/spark/spark-defaults.conf"
        )
        == "1"
    )


@pytest.mark.group("zookeeper", "spark_master", "spark_worker", "tensorflow")
def test_spark_rpc_encrypted_without_fallback(host):
    conf = host.file("/etc/trainstack/spark/spark-defaults.conf").content_string
    assert "spark.network.crypto.enabled      true" in conf
    assert "spark.network.crypto.saslFallback false" in conf


@pytest.mark.group("spark_master")
def test_zookeeper_client_login_is_private(host):
    f = host.file("/etc/trainstack/spark/zookeeper-client.jaas")
    assert f.mode == 0o600
    assert f.user == "trainstack"


@pytest.mark.group("zookeeper")
def test_zookeeper_logins_are_private_and_enforced(host):
    f = host.file("/etc/trainstack/zookeeper/jaas.conf")
    assert f.mode == 0o600
    assert f.user == "trainstack"
    cfg = host.file("/etc/trainstack/zookeeper/zoo.cfg").content_string
    assert "enforce.auth.enabled=true" in cfg
    assert "quorum.auth.enableSasl=true" in cfg
