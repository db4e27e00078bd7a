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
