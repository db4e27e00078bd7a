"""A job's own packages (infra.jobs.envs): requirements read and checked against the nodes'
pins, locks cached, and the overlay installed once per lock, offline, by real pip, with a
local stand-in for a node's transport."""

from __future__ import annotations

import base64
import hashlib
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from infra.jobs import envs
from infra.jobs.envs import Env, EnvError, check_pins, requirement_lines, resolve

pytestmark = pytest.mark.unit

PINS = {"numpy": "2.4.6", "tensorflow-cpu": "2.20.0", "pandas": "3.1.1"}


def reqs(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "requirements.txt"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("-e .", "pip options, includes and editables are not supported"),
        ("--index-url https://example.org/simple", "pip options"),
        ("-r other.txt", "pip options"),
        ("pkg @ https://example.org/pkg.whl", "URLs are not supported"),
        ("tabulate===", "is not a requirement"),
    ],
)
def test_a_line_that_is_not_a_plain_requirement_is_refused_by_file_and_line(tmp_path, line, said):
    with pytest.raises(EnvError) as err:
        requirement_lines(reqs(tmp_path, f"# my packages\ntabulate\n{line}\n"))
    assert str(err.value).startswith("requirements.txt:3: ")
    assert said in str(err.value)


def test_comments_blank_lines_markers_and_extras_are_read(tmp_path):
    found = requirement_lines(
        reqs(
            tmp_path,
            "\n# c\ntabulate==0.9.0  # pretty tables\nrich[jupyter]>=13; python_version >= '3.8'\n",
        )
    )
    assert [r.name for r in found] == ["tabulate", "rich"]


@pytest.mark.parametrize(
    ("line", "nodes_run"),
    [
        ("numpy<1.20", "numpy 2.4.6"),
        ("tensorflow==2.15.*", "tensorflow-cpu 2.20.0"),  # the nodes' TensorFlow is the CPU build
        ("numpy>=3", "numpy 2.4.6"),
    ],
)
def test_a_conflict_with_the_platforms_pins_is_one_sentence(tmp_path, line, nodes_run):
    with pytest.raises(EnvError) as err:
        check_pins(requirement_lines(reqs(tmp_path, line)), PINS, "requirements.txt")
    message = str(err.value)
    assert f"requirements.txt asks for {line}, but the nodes run {nodes_run}" in message
    assert "\n" not in message


def test_what_the_nodes_have_is_not_downloaded_again(tmp_path):
    lines = "numpy\nnumpy>=2\ntensorflow==2.20.0\npandas\ntabulate<1\n"
    left = check_pins(requirement_lines(reqs(tmp_path, lines)), PINS, "requirements.txt")
    # numpy and TensorFlow are the platform's; pandas is resolved under its pin by pip
    assert [str(r) for r in left] == ["pandas", "tabulate<1"]


def test_only_the_nodes_packages_make_an_empty_overlay(tmp_path):
    reqs(tmp_path, "numpy\ntensorflow\n")
    env = resolve(tmp_path, "requirements.txt", cache=tmp_path / "cache")
    assert env is not None and env.lock == () and not env.wheels.exists()


def test_no_requirements_means_no_environment(tmp_path):
    reqs(tmp_path, "# nothing yet\n")
    assert resolve(tmp_path, "") is None
    assert resolve(tmp_path, "requirements.txt", cache=tmp_path / "cache") is None


def test_a_resolved_file_is_not_downloaded_again(tmp_path, monkeypatch):
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("numpy==2.4.6\n")
    reqs(tmp_path, "tabulate==0.9.0\n")
    calls = []

    def download(requirements, where, constraints_, entry):
        calls.append(where)
        (entry / "wheels").mkdir(parents=True)
        (entry / "lock.json").write_text('["tabulate==0.9.0"]')

    monkeypatch.setattr(envs, "_download", download)
    first = resolve(tmp_path, "requirements.txt", constraints=constraints, cache=tmp_path / "c")
    reqs(tmp_path, "# the same packages\ntabulate==0.9.0\n")
    second = resolve(tmp_path, "requirements.txt", constraints=constraints, cache=tmp_path / "c")
    assert calls == ["requirements.txt"]
    assert first == second and first is not None
    assert first.sha == hashlib.sha256(b"tabulate==0.9.0").hexdigest()
    constraints.write_text("numpy==2.4.7\n")  # new pins: resolved again
    resolve(tmp_path, "requirements.txt", constraints=constraints, cache=tmp_path / "c")
    assert len(calls) == 2


# -- the install, for real, on a stand-in node ------------------------------------------


def make_wheel(directory: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel whose module says hello."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"HELLO = 'hello from {name} {version}'\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for arc, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{arc},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(path, "w") as zf:
        for arc, text in files.items():
            zf.writestr(arc, text)
    return path


class LocalNode:
    """A node's transport that runs on this machine (the install's commands are plain
    POSIX tools and pip)."""

    name = "local"

    def __init__(self) -> None:
        self.commands: list[list[str]] = []
        self.shipped: list[str] = []

    def run(self, argv, *, user=None, env=None, stdin=None):
        del user, env, stdin
        self.commands.append(argv)
        done = subprocess.run(argv, capture_output=True, check=False)
        return done.returncode, done.stdout + done.stderr

    def put(self, path, data, mode=0o644, user=None):
        del user
        Path(path).write_bytes(data)
        Path(path).chmod(mode)

    def put_file(self, path, local_path, mode=0o644, user=None):
        del user
        self.shipped.append(path)
        shutil.copyfile(local_path, path)
        Path(path).chmod(mode)


def test_the_overlay_is_installed_once_offline_without_what_the_node_has(tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "ENVS_DIR", str(tmp_path / "envs"))
    wheels = tmp_path / "cache" / "wheels"
    make_wheel(wheels, "hellopkg", "1.0")
    import packaging

    make_wheel(wheels, "packaging", packaging.__version__)  # the "node" has it already
    env = Env("a" * 64, ("hellopkg==1.0", f"packaging=={packaging.__version__}"), wheels)
    node = LocalNode()
    site = envs.install(node, env, sys.executable, user="nobody")
    assert site == f"{tmp_path}/envs/{'a' * 64}/site"
    assert (Path(site) / "hellopkg" / "__init__.py").is_file()
    assert not (Path(site) / "packaging").exists()  # not shadowed: the node's own stays
    hello = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import hellopkg; "
         "print(hellopkg.HELLO)", site],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert hello.stdout.strip() == "hello from hellopkg 1.0"
    assert not list((tmp_path / "envs").glob(".*.tar"))  # the shipped archive is removed
    ran = len(node.commands)
    assert envs.install(node, env, sys.executable, user="nobody") == site
    assert len(node.commands) == ran + 1  # one existence check: no listing, no pip


def test_staging_ships_the_wheels_and_leaves_the_install_to_the_job(tmp_path, monkeypatch):
    """`trainstack submit` stages; the job's runner runs the script in its `installing`
    state. Until then there is no overlay; once it is there, staging ships nothing."""
    monkeypatch.setattr(envs, "ENVS_DIR", str(tmp_path / "envs"))
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "hellopkg", "1.0")
    env = Env("c" * 64, ("hellopkg==1.0",), wheels)
    staged = envs.stage(LocalNode(), env, sys.executable, user="nobody")
    assert staged.site == env.site and staged.script
    assert list((tmp_path / "envs").glob(".*.tar"))  # shipped
    assert not Path(staged.site).exists()  # not installed yet
    subprocess.run(["sh", "-c", staged.script], check=True)
    assert (Path(staged.site) / "hellopkg" / "__init__.py").is_file()
    assert envs.stage(LocalNode(), env, sys.executable, user="nobody").script == ""


def test_the_wheels_ship_as_a_plain_tar_file_of_their_own_per_staging(tmp_path, monkeypatch):
    """Wheels are zip files: no gzip around them. The archive is a file on this machine that
    the transport streams (put_file), and each staging names its own on the node."""
    monkeypatch.setattr(envs, "ENVS_DIR", str(tmp_path / "envs"))
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "hellopkg", "1.0")
    make_wheel(wheels, "otherpkg", "2.0")
    env = Env("e" * 64, ("hellopkg==1.0", "otherpkg==2.0"), wheels)
    node = LocalNode()
    first = envs.stage(node, env, sys.executable, user="nobody")
    second = envs.stage(node, env, sys.executable, user="nobody")
    one, two = node.shipped
    assert one != two and one.endswith(".tar") and Path(one).name.startswith(f".{'e' * 64}.")
    assert Path(one).read_bytes()[:2] != b"\x1f\x8b"  # not gzip
    with tarfile.open(one, mode="r:") as tar:  # "r:": uncompressed only
        assert sorted(tar.getnames()) == ["hellopkg-1.0-py3-none-any.whl",
                                          "otherpkg-2.0-py3-none-any.whl"]  # fmt: skip
        assert tar.extractfile("hellopkg-1.0-py3-none-any.whl").read() == (  # type: ignore[union-attr]
            (wheels / "hellopkg-1.0-py3-none-any.whl").read_bytes()
        )
    assert not list(wheels.parent.glob(".ship-*"))  # the local tar is gone once shipped
    subprocess.run(["sh", "-c", first.script], check=True)
    assert (Path(env.site) / "otherpkg" / "__init__.py").is_file()
    assert Path(two).is_file()  # the other staging's archive is its own
    subprocess.run(["sh", "-c", second.script], check=True)  # installed already: removes it
    assert not Path(two).exists() and not list((tmp_path / "envs").glob(".*.tar"))


def test_a_failed_install_leaves_neither_archive_nor_partial_overlay(tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "ENVS_DIR", str(tmp_path / "envs"))
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "hellopkg", "1.0")
    env = Env("f" * 64, ("hellopkg==1.0",), wheels)
    staged = envs.stage(LocalNode(), env, sys.executable, user="nobody")
    broken = staged.script.replace(f"{shlex.quote(sys.executable)} -m pip install", "false")
    assert broken != staged.script
    assert subprocess.run(["sh", "-c", broken], check=False).returncode != 0
    left = sorted(p.name for p in (tmp_path / "envs").iterdir())
    assert left == [f"{'f' * 64}.lock"]  # no archive, no partial directory, no overlay


def test_a_wheel_at_another_version_than_the_nodes_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(envs, "ENVS_DIR", str(tmp_path / "envs"))
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "packaging", "0.1")
    env = Env("b" * 64, ("packaging==0.1",), wheels)
    with pytest.raises(EnvError) as err:
        envs.install(LocalNode(), env, sys.executable, user="nobody")
    assert "need packaging 0.1, but the nodes run packaging" in str(err.value)
    assert not (tmp_path / "envs" / ("b" * 64)).exists()


def test_a_newer_setuptools_ships_in_the_overlay(tmp_path, monkeypatch):
    # torch's triton needs setuptools>=77; the nodes run Debian's older one: the overlay
    # shadows it (a packaging tool the platform does not import while it runs).
    monkeypatch.setattr(envs, "ENVS_DIR", str(tmp_path / "envs"))
    wheels = tmp_path / "wheels"
    make_wheel(wheels, "setuptools", "999.0")
    env = Env("c" * 64, ("setuptools==999.0",), wheels)
    monkeypatch.setattr(envs, "_node_packages", lambda node, python: {"setuptools": "66.1.1"})
    staged = envs.stage(LocalNode(), env, sys.executable, user="nobody")
    assert staged.script  # shipped, to be installed
    monkeypatch.setattr(envs, "SHADOWABLE", frozenset())
    with pytest.raises(EnvError, match=r"need setuptools 999\.0, but the nodes run setuptools"):
        envs.stage(LocalNode(), env, sys.executable, user="nobody")


def test_the_declared_job_gets_its_overlay_only_when_it_has_packages():
    from infra.components.training import _job_command
    from infra.jobs.launch import LaunchSettings

    settings = {"workers": 2, "epochs": 1, "batch_size": 32, "data": "digits", "rows": 0,
                "spark_conf": "", "job_sha": "c" * 64, "job_params": "{}"}  # fmt: skip
    launch = LaunchSettings.declared(settings, "spark://m:7077")
    assert "--job-env" not in _job_command(launch, "/srv/trainstack/models/run-x")
    launch = LaunchSettings.declared({**settings, "env_sha": "d" * 64}, "spark://m:7077")
    command = _job_command(launch, "/srv/trainstack/models/run-x")
    flag = command.index("--job-env")
    assert command[flag + 1] == f"/srv/trainstack/models/envs/{'d' * 64}/site"
