"""The toolchain setup installs: the CLI, the Python language host, a smoke stack."""

import json
import re
import subprocess
import textwrap

import pytest

from tests.pulumi_cli import ROOT, project_env

pytestmark = pytest.mark.engine


def run(args, env, cwd=ROOT, check=True):
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert not check or proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_pulumi_cli_version(tmp_path):
    versions = dict(
        line.split("=", 1)
        for line in (ROOT / "versions.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    out = run(["pulumi", "version"], project_env(tmp_path)).stdout.strip()
    assert out == f"v{versions['PULUMI_VERSION']}"


def test_python_language_host_is_found(tmp_path):
    """`pulumi about` loads the language host and reports the project's interpreter."""
    env = project_env(tmp_path)
    about = run(["pulumi", "about"], env).stdout
    version = run(["pulumi", "version"], env).stdout.strip().lstrip("v")
    assert re.search(rf"language\s+python\s+{re.escape(version)}", about), about
    assert f"executable='{ROOT}/.venv/bin/python'" in about, about


def test_smoke_stack_network_and_container_up_and_destroy(tmp_path, engine):
    """A one-container stack from the base image, through the CLI and the engine."""
    project = tmp_path / "smoke"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: smoke\nruntime: python\n")
    (project / "__main__.py").write_text(
        textwrap.dedent(
            """
            import pulumi
            from infra.local_docker import Container, ContainerArgs, Network

            label = {"org.trainstack.stack": "smoke-" + pulumi.get_stack()}
            net = Network("net", name="smoke-" + pulumi.get_stack(), labels=label)
            box = Container(
                "box",
                ContainerArgs(
                    name="smoke-" + pulumi.get_stack() + "-box",
                    image="debian:bookworm",
                    hostname="box",
                    network="smoke-" + pulumi.get_stack(),
                    labels=label,
                    cpus=0.2,
                    memory="256m",
                ),
                network_id=net.network_id,
            )
            pulumi.export("id", box.container_id)
            """
        )
    )
    env = project_env(tmp_path / "state")
    (tmp_path / "state").mkdir()
    stack = "s" + tmp_path.name[-6:].replace("_", "")
    run(["pulumi", "stack", "init", stack], env, cwd=project)
    try:
        run(["pulumi", "up", "--yes", "--stack", stack], env, cwd=project)
        outputs = json.loads(run(["pulumi", "stack", "output", "--json"], env, cwd=project).stdout)
        container = engine.containers.get(outputs["id"])
        assert container.status == "running"
        assert f"smoke-{stack}" in container.attrs["NetworkSettings"]["Networks"]
        assert container.attrs["HostConfig"]["Memory"] == 256 * 1024**2
        run(["pulumi", "destroy", "--yes", "--stack", stack], env, cwd=project)
        assert not engine.containers.list(all=True, filters={"id": outputs["id"]})
        assert not engine.networks.list(names=[f"smoke-{stack}"])
    finally:
        run(["pulumi", "destroy", "--yes", "--stack", stack], env, cwd=project, check=False)
