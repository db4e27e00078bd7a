import pytest
from conftest import VENV

pytestmark = pytest.mark.hosts

TENSORFLOW_VERSION = "2.21.0"


@pytest.mark.group("tensorflow")
def test_tensorflow_importable_at_pinned_version(host):
    out = host.check_output(
        f"TF_CPP_MIN_LOG_LEVEL=3 {VENV}/bin/python"
        " -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null"
    )
    assert out.strip().splitlines()[-1] == TENSORFLOW_VERSION


@pytest.mark.group("tensorflow", "driver")
def test_training_package_installed(host):
    assert host.run(f"{VENV}/bin/python -c 'import trainstack_training'").rc == 0
    assert host.run(f"{VENV}/bin/pip show trainstack-training").rc == 0


@pytest.mark.group("tensorflow", "driver")
def test_training_console_script_present(host):
    assert host.file(f"{VENV}/bin/trainstack-train").exists


@pytest.mark.group("zookeeper")
def test_control_only_nodes_have_tensorflow_only_from_the_shared_image(host):
    hv = host.ansible.get_variables()
    if "tensorflow" in hv.get("group_names", []):
        return
    # Whether the package is there, without importing it: an import takes half a minute on a
    # 0.3-CPU control node, and the workers' check above already imports it.
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('tensorflow') is None)"
    installed = host.run(f'{VENV}/bin/python -c "{probe}"').rc == 0
    # One node image serves every node (one bake); provisioned from nothing, a control-only
    # node gets no TensorFlow, except the job drivers' node, which runs what a worker that
    # submits runs.
    driver = "driver" in hv.get("group_names", [])
    assert installed == (bool(hv.get("trainstack_node_image")) or driver), hv.get(
        "trainstack_node_image"
    )
