"""The toolchain setup installs: the CLI, the official Python language host, the official
docker and command provider plugins, and smoke stacks that use them."""

import json
import re
import shutil
import subprocess
import textwrap

import pytest

from tests.support.stacks import ROOT, project_env

pytestmark = pytest.mark.engine


def run(args, env, cwd=ROOT, check=True):
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert not check or proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def versions():
    return dict(
        line.split("=", 1)
        for line in (ROOT / "versions.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )


def test_pulumi_cli_version(tmp_path):
    out = run(["pulumi", "version"], project_env(tmp_path)).stdout.strip()
    assert out == f"v{versions()['PULUMI_VERSION']}"


def test_python_language_host_is_found(tmp_path):
    """`pulumi about` loads the language host and reports the project's interpreter."""
    env = project_env(tmp_path)
    about = run(["pulumi", "about"], env).stdout
    version = run(["pulumi", "version"], env).stdout.strip().lstrip("v")
    assert re.search(rf"language\s+python\s+{re.escape(version)}", about), about
    assert f"executable='{ROOT}/.venv/bin/python'" in about, about


def test_python_language_host_is_the_official_one(tmp_path):
    """The host the CLI finds is the official Go binary, not a script of this project."""
    env = project_env(tmp_path)
    host = shutil.which("pulumi-language-python", path=env["PATH"])
    assert host, "pulumi-language-python is not on the PATH that `make env` gives"
    with open(host, "rb") as binary:
        assert binary.read(4) == b"\x7fELF", f"{host} is not a compiled binary"
    assert run([host, "-version"], env).stdout.strip() == f"v{versions()['PULUMI_VERSION']}"
    assert not (ROOT / "scripts" / "langhost").exists()
    about = run(["pulumi", "about"], env).stdout
    assert "langhost" not in about, about
    # The official host's About names its Python toolchain and the toolchain's version.
    assert "toolchain='" in about, about
    assert "toolchainVersion='" in about, about


def constraint(name):
    """The version constraints.txt pins for the Python package `name`."""
    pins = dict(
        line.split("==", 1)
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    return pins[name]


@pytest.mark.parametrize(
    ("plugin", "setting", "sdk"),
    [
        ("docker", "PULUMI_DOCKER_PROVIDER_VERSION", "pulumi_docker"),
        ("command", "PULUMI_COMMAND_PROVIDER_VERSION", "pulumi_command"),
    ],
)
def test_provider_plugin_is_installed(tmp_path, plugin, setting, sdk):
    """`pulumi plugin ls` lists the official provider at the pinned version, and the
    program's dependencies (the provider's SDK in .venv) ask for that version."""
    env = project_env(tmp_path)
    version = versions()[setting]
    assert constraint(sdk) == version, f"{setting} and the {sdk} pin in constraints.txt differ"
    plugins = run(["pulumi", "plugin", "ls"], env).stdout
    assert re.search(rf"^{plugin}\s+resource\s+{re.escape(version)}\s", plugins, re.M), plugins
    assert not shutil.which(f"pulumi-resource-{plugin}", path=env["PATH"]), "provider on PATH"
    about = run(["pulumi", "about"], env).stdout
    assert re.search(rf"resource\s+{plugin}\s+{re.escape(version)}", about), about


def test_command_smoke_stack_runs_create_update_and_delete(tmp_path):
    """A one-resource stack with the official command provider: `create` runs on `up`, a
    second `up` runs nothing, a changed trigger runs it again, `delete` runs on destroy."""
    project = tmp_path / "cmdsmoke"
    project.mkdir()
    marks = tmp_path / "marks"
    (project / "Pulumi.yaml").write_text("name: cmdsmoke\nruntime: python\n")
    (project / "__main__.py").write_text(
        textwrap.dedent(
            f"""
            import pulumi
            import pulumi_command as command

            config = pulumi.Config()
            run = command.local.Command(
                "hello",
                create="echo created >> {marks}; echo hello-$TRIGGER",
                delete="echo deleted >> {marks}",
                environment={{"TRIGGER": config.get("trigger") or "one"}},
                triggers=[config.get("trigger") or "one"],
            )
            pulumi.export("stdout", run.stdout)
            """
        )
    )
    env = project_env(tmp_path / "state")
    (tmp_path / "state").mkdir()
    stack = "c" + tmp_path.name[-6:].replace("_", "")

    def up():
        run(["pulumi", "up", "--yes", "--stack", stack], env, cwd=project)
        out = run(["pulumi", "stack", "output", "--json", "--stack", stack], env, cwd=project)
        return json.loads(out.stdout)["stdout"]

    run(["pulumi", "stack", "init", stack], env, cwd=project)
    try:
        assert up() == "hello-one"
        assert marks.read_text().splitlines() == ["created"]
        assert up() == "hello-one"
        assert marks.read_text().splitlines() == ["created"], "a second `up` ran the command"
        run(["pulumi", "config", "set", "trigger", "two", "--stack", stack], env, cwd=project)
        assert up() == "hello-two"
        assert marks.read_text().splitlines().count("created") == 2
        run(["pulumi", "destroy", "--yes", "--stack", stack], env, cwd=project)
        assert marks.read_text().splitlines()[-1] == "deleted"
    finally:
        run(["pulumi", "destroy", "--yes", "--stack", stack], env, cwd=project, check=False)
        run(["pulumi", "stack", "rm", "--yes", stack], env, cwd=project, check=False)


def test_smoke_stack_network_and_container_up_and_destroy(tmp_path, engine):
    """A one-container stack from the base image with the official docker provider."""
    project = tmp_path / "smoke"
    project.mkdir()
    (project / "Pulumi.yaml").write_text("name: smoke\nruntime: python\n")
    (project / "__main__.py").write_text(
        textwrap.dedent(
            """
            import pulumi
            import pulumi_docker as docker

            name = "smoke-" + pulumi.get_stack()
            image = docker.RemoteImage("image", name="debian:bookworm", keep_locally=True)
            net = docker.Network(
                "net",
                name=name,
                labels=[docker.NetworkLabelArgs(label="org.trainstack.stack", value=name)],
            )
            box = docker.Container(
                "box",
                name=name + "-box",
                image=image.image_id,
                hostname="box",
                command=["sleep", "infinity"],
                networks_advanced=[
                    docker.ContainerNetworksAdvancedArgs(name=net.name, aliases=["box-alias"])
                ],
                labels=[docker.ContainerLabelArgs(label="org.trainstack.stack", value=name)],
                memory=256,
                memory_swap=256,
                cpus="0.2",
            )
            pulumi.export("id", box.id)
            """
        )
    )
    env = project_env(tmp_path / "state")
    (tmp_path / "state").mkdir()
    stack = "s" + tmp_path.name[-6:].replace("_", "")
    image_id = engine.images.get("debian:bookworm").id
    run(["pulumi", "stack", "init", stack], env, cwd=project)
    try:
        run(["pulumi", "up", "--yes", "--stack", stack], env, cwd=project)
        outputs = json.loads(run(["pulumi", "stack", "output", "--json"], env, cwd=project).stdout)
        container = engine.containers.get(outputs["id"])
        assert container.status == "running"
        networks = container.attrs["NetworkSettings"]["Networks"]
        assert f"smoke-{stack}" in networks
        assert "box-alias" in (networks[f"smoke-{stack}"].get("Aliases") or [])
        assert container.attrs["HostConfig"]["Memory"] == 256 * 1024**2
        assert container.attrs["HostConfig"]["MemorySwap"] == 256 * 1024**2
        assert container.attrs["HostConfig"]["NanoCpus"] == 200_000_000
        # A second `up` changes nothing.
        again = run(["pulumi", "preview", "--stack", stack, "--diff"], env, cwd=project).stdout
        assert "unchanged" in again, again
        assert not re.search(r"to (create|update|replace|delete)", again), again
        run(["pulumi", "destroy", "--yes", "--stack", stack], env, cwd=project)
        assert not engine.containers.list(all=True, filters={"id": outputs["id"]})
        assert not engine.networks.list(names=[f"smoke-{stack}"])
        # keep_locally: the shared base image stays.
        assert engine.images.get("debian:bookworm").id == image_id
    finally:
        run(["pulumi", "destroy", "--yes", "--stack", stack], env, cwd=project, check=False)
        run(["pulumi", "stack", "rm", "--yes", stack], env, cwd=project, check=False)
