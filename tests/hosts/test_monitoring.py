import pytest

pytestmark = pytest.mark.hosts


@pytest.mark.group("monitoring")
@pytest.mark.parametrize("program", ["prometheus", "pushgateway", "blackbox-exporter"])
def test_monitoring_daemons_supervised_and_running(host, program):
    assert " RUNNING " in host.check_output(f"supervisorctl status {program}")


@pytest.mark.group("monitoring")
def test_prometheus_is_ready_and_its_config_is_the_roles(host):
    ready = host.run(
        'python3 -c "import urllib.request as u; '
        "print(u.urlopen('http://localhost:9090/-/ready', timeout=5).status)\""
    )
    assert ready.rc == 0 and ready.stdout.strip() == "200", ready.stderr
    config = host.file("/etc/trainstack/prometheus/prometheus.yml")
    assert config.exists and "job_name: spark_worker" in config.content_string
