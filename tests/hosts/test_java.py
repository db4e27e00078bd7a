import pytest

pytestmark = pytest.mark.hosts


@pytest.mark.group("zookeeper", "spark_master", "spark_worker", "tensorflow")
def test_java_17(host):
    assert 'version "17.' in host.run("java -version").stderr
