import shlex

import pytest

from infra.nodes import NODE_PATHS

pytestmark = pytest.mark.hosts

# The server answers /health without a login and refuses the API without one (401); it may
# still be starting (a minute on a control node's CPU share): up to 180 s. Plain Python on the
# node, at the address the server's start script binds.
PROBE = """
import sys, time, urllib.error as e, urllib.request as u
base = "http://%s:%s"
deadline = time.time() + 180
while True:
    try:
        print(u.urlopen(base + "/health", timeout=10).status)
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(2)
try:
    u.urlopen(base + "/api/2.0/mlflow/experiments/search?max_results=1", timeout=10)
    print("no login asked")
except e.HTTPError as x:
    print(x.code)
"""
SCRIPT = f"{NODE_PATHS.mlflow_conf_dir}/mlflow-server.sh"


@pytest.mark.group("tracking")
@pytest.mark.parametrize("program", ["mlflow", "trainstack-tracking-sync"])
def test_tracking_programs_supervised_and_running(host, program):
    assert " RUNNING " in host.check_output(f"supervisorctl status {program}")


@pytest.mark.group("tracking")
def test_tracking_login_and_secret_key_are_private(host):
    for path in (NODE_PATHS.mlflow_auth_file, f"{NODE_PATHS.mlflow_conf_dir}/server.env"):
        f = host.file(path)
        assert f.exists and f.mode == 0o600 and f.user == "trainstack", path


@pytest.mark.group("tracking")
def test_tracking_server_answers_and_asks_for_a_login(host):
    words = shlex.split(host.file(SCRIPT).content_string.split("server --app-name", 1)[1])
    address, port = words[words.index("--host") + 1], words[words.index("--port") + 1]
    probe = host.run("python3 -c " + shlex.quote(PROBE % (address, port)))
    assert probe.rc == 0, probe.stderr
    assert probe.stdout.split() == ["200", "401"], probe.stdout


@pytest.mark.group("tracking")
def test_tracking_store_is_on_the_nodes_own_disk(host):
    store = host.file(f"{NODE_PATHS.mlflow_data_dir}/mlflow.db")
    assert store.exists and store.user == "trainstack"
