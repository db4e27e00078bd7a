"""The node transport: ssh command building, node records, the docker transport on fakes, and
the training provider through a transport. The real sshd test is tests/integration/
test_transport.py."""

from __future__ import annotations

import io
import shlex
import subprocess
import tarfile

import pytest

from infra.transport import (
    DockerTransport,
    SshTransport,
    Transport,
    TransportError,
    transport_for,
    transports_for,
)

pytestmark = pytest.mark.unit


def ssh_node(**more) -> SshTransport:
    fields = {
        "name": "wrk-1",
        "host": "10.0.0.5",
        "port": 2222,
        "user": "deploy",
        "private_key_file": "/keys/id ed25519",
        "known_hosts_file": "/state/known_hosts",
        **more,
    }
    return SshTransport(**fields)


def option_values(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == "-o"]


# --- ssh: command building --------------------------------------------------------------


def test_ssh_argv_checks_host_keys_and_never_prompts():
    argv = ssh_node().ssh_argv("true")
    assert argv[0] == "ssh"
    assert argv[argv.index("-p") + 1] == "2222"
    assert argv[argv.index("-i") + 1] == "/keys/id ed25519"
    options = option_values(argv)
    for wanted in (
        "BatchMode=yes",
        "StrictHostKeyChecking=yes",
        "UserKnownHostsFile=/state/known_hosts",
        "ConnectTimeout=10",
        "ServerAliveInterval=15",
    ):
        assert wanted in options, argv
    assert not any("StrictHostKeyChecking=no" in w or "accept-new" in w for w in argv)
    assert not any(w.startswith("UserKnownHostsFile=/dev/null") for w in options)
    # The destination, then `--` and exactly one remote command line.
    assert argv[-3:] == ["deploy@10.0.0.5", "--", "true"]


def test_ssh_argv_without_key_or_known_hosts_leaves_them_to_ssh_but_still_checks():
    argv = SshTransport("n", "h.example.org", 22, "deploy").ssh_argv("true")
    assert "-i" not in argv
    assert not any(o.startswith("UserKnownHostsFile") for o in option_values(argv))
    assert "StrictHostKeyChecking=yes" in option_values(argv)
    assert argv[argv.index("-p") + 1] == "22"


def test_remote_command_quotes_every_word():
    argv = ["printf", "%s\\n", "a b", "it's", "$HOME", "`id`", "x;rm -rf /", ""]
    remote = SshTransport.remote_command(argv)
    assert shlex.split(remote) == argv
    assert "$HOME" not in remote.replace("'$HOME'", "")  # only ever inside single quotes


def test_remote_command_as_another_user_uses_sudo_and_env():
    remote = SshTransport.remote_command(
        ["/opt/venv/bin/train", "--output", "/srv/m/run 1"],
        user="trainstack",
        env={"SPARK_CONF_DIR": "/etc/spark", "ODD": "a b'c"},
    )
    assert shlex.split(remote) == [
        "sudo",
        "-n",
        "-H",
        "-u",
        "trainstack",
        "env",
        "SPARK_CONF_DIR=/etc/spark",
        "ODD=a b'c",
        "/opt/venv/bin/train",
        "--output",
        "/srv/m/run 1",
    ]
    assert shlex.split(SshTransport.remote_command(["id"], env={"A": "1"})) == ["env", "A=1", "id"]


def test_copy_command_is_scp_of_the_directory():
    assert ssh_node().copy_command("/srv/m/run-1") == (
        "scp -r -P 2222 -i '/keys/id ed25519' deploy@10.0.0.5:/srv/m/run-1 ."
    )
    node = SshTransport("n", "2001:db8::5", 22, "root")
    assert node.copy_command("/srv/m/run-1") == "scp -r -P 22 'root@[2001:db8::5]:/srv/m/run-1' ."


class FakeSsh:
    """Stands in for subprocess.run: records the ssh command lines, answers one result."""

    def __init__(self, code: int = 0, stdout: bytes = b"", stderr: bytes = b"") -> None:
        self.code, self.stdout, self.stderr = code, stdout, stderr
        self.calls: list[tuple[list[str], bytes | None]] = []
        self.stdin_files: list[tuple[str, bytes]] = []  # (name, content) of a file as stdin

    def __call__(self, argv, *, input=None, stderr=None, stdin=None, **_):
        self.calls.append((argv, input))
        if hasattr(stdin, "read"):
            self.stdin_files.append((stdin.name, stdin.read()))
        merged = stderr == subprocess.STDOUT
        out = self.stdout + (self.stderr if merged else b"")
        return subprocess.CompletedProcess(argv, self.code, out, None if merged else self.stderr)

    def remote(self, i: int = -1) -> list[str]:
        return shlex.split(self.calls[i][0][-1])


def test_fetch_is_sudo_cat_and_names_node_and_path_when_missing(monkeypatch):
    fake = FakeSsh(stdout=b"\x00model")
    monkeypatch.setattr(subprocess, "run", fake)
    assert ssh_node().fetch("/srv/m/run 1/model.keras") == b"\x00model"
    assert fake.remote() == ["sudo", "-n", "cat", "--", "/srv/m/run 1/model.keras"]
    fake.code, fake.stderr = 1, b"cat: /srv/m/x: No such file or directory\n"
    with pytest.raises(TransportError, match=r"wrk-1: cannot read /srv/m/x \(cat: .*No such file"):
        ssh_node().fetch("/srv/m/x")


def test_put_is_sudo_tee_with_stdin_then_chmod(monkeypatch):
    fake = FakeSsh()
    monkeypatch.setattr(subprocess, "run", fake)
    ssh_node().put("/srv/m/run-1/plot.png", b"PNG", mode=0o600, user="trainstack")
    argv, stdin = fake.calls[-1]
    assert stdin == b"PNG"
    assert argv[-1] == (
        "sudo -n -u trainstack tee -- /srv/m/run-1/plot.png >/dev/null && "
        "sudo -n -u trainstack chmod 0600 -- /srv/m/run-1/plot.png"
    )
    ssh_node().put("/tmp/f", b"x")
    assert (
        fake.calls[-1][0][-1] == "sudo -n tee -- /tmp/f >/dev/null && sudo -n chmod 0644 -- /tmp/f"
    )
    fake.code, fake.stderr = 1, b"tee: /nope/f: No such file or directory\n"
    with pytest.raises(TransportError, match=r"wrk-1: cannot write /nope/f \(tee: "):
        ssh_node().put("/nope/f", b"x")


def test_put_file_streams_the_file_as_ssh_input_with_puts_command(monkeypatch, tmp_path):
    fake = FakeSsh()
    monkeypatch.setattr(subprocess, "run", fake)
    local = tmp_path / "wheels.tar"
    local.write_bytes(b"TAR" * 1000)
    ssh_node().put_file("/srv/m/envs/.x.tar", local, mode=0o644, user="trainstack")
    argv, stdin = fake.calls[-1]
    assert stdin is None  # nothing read into this process: ssh reads the file itself
    assert fake.stdin_files == [(str(local), b"TAR" * 1000)]
    assert argv[-1] == SshTransport.put_command("/srv/m/envs/.x.tar", 0o644, "trainstack")
    assert argv[-1] == (
        "sudo -n -u trainstack tee -- /srv/m/envs/.x.tar >/dev/null && "
        "sudo -n -u trainstack chmod 0644 -- /srv/m/envs/.x.tar"
    )
    fake.code, fake.stderr = 1, b"tee: /nope/f: No space left on device\n"
    with pytest.raises(TransportError, match=r"wrk-1: cannot write /nope/f \(tee: .*No space"):
        ssh_node().put_file("/nope/f", local)
    fake.code, fake.stderr = 255, b"ssh: connect to host 10.0.0.5 port 2222: Connection refused\n"
    with pytest.raises(TransportError, match=r"cannot write /nope/f: ssh deploy@10.0.0.5 port"):
        ssh_node().put_file("/nope/f", local)


def test_run_returns_the_code_and_raises_when_ssh_itself_failed(monkeypatch):
    fake = FakeSsh(code=3, stdout=b"out\n")
    monkeypatch.setattr(subprocess, "run", fake)
    assert ssh_node().run(["pgrep", "-f", "a b"], user="root") == (3, b"out\n")
    assert fake.remote() == ["sudo", "-n", "-H", "-u", "root", "pgrep", "-f", "a b"]
    fake.code, fake.stdout = 255, b""
    fake.stderr = b"ssh: connect to host 10.0.0.5 port 2222: Connection refused\r\n"
    with pytest.raises(TransportError, match=r"wrk-1: .*Connection refused"):
        ssh_node().run(["true"])


def test_unavailable_is_one_short_line(monkeypatch):
    fake = FakeSsh()
    monkeypatch.setattr(subprocess, "run", fake)
    assert ssh_node().unavailable() is None
    assert fake.remote() == ["sudo", "-n", "true"]
    fake.code = 255
    fake.stderr = b"debug noise\nssh: connect to host 10.0.0.5 port 2222: Connection timed out\r\n"
    said = ssh_node().unavailable()
    assert said == (
        "ssh deploy@10.0.0.5 port 2222: ssh: connect to host 10.0.0.5 port 2222: "
        "Connection timed out"
    )
    fake.code, fake.stderr = 1, b"sudo: a password is required\n"
    assert (
        ssh_node().unavailable()
        == "`sudo -n` does not work for deploy (sudo: a password is required)"
    )


def test_unavailable_without_an_ssh_client():
    node = SshTransport("n", "h", 22, "u", ssh="/nonexistent/ssh")
    said = node.unavailable()
    assert said is not None and "cannot start the OpenSSH client" in said


# --- node records -----------------------------------------------------------------------


def test_transport_for_records_and_bare_names():
    docker_node = transport_for(
        {"name": "worker-1", "transport": "docker", "container": "ts-dev-worker-1"}
    )
    assert isinstance(docker_node, DockerTransport)
    assert docker_node.name == "ts-dev-worker-1"  # as submitted_on always said
    bare = transport_for("ts-old-worker-2")  # state written before node records
    assert isinstance(bare, DockerTransport) and bare.name == "ts-old-worker-2"
    ssh = transport_for(
        {
            "name": "wrk-1",
            "transport": "ssh",
            "host": "10.0.0.5",
            "port": 22.0,  # numbers come back from the engine as floats
            "user": "deploy",
            "private_key_file": "/path/key",
            "known_hosts_file": "/path/known_hosts",
        }
    )
    assert isinstance(ssh, SshTransport)
    assert (ssh.name, ssh.host, ssh.port, ssh.user) == ("wrk-1", "10.0.0.5", 22, "deploy")
    assert (ssh.private_key_file, ssh.known_hosts_file) == ("/path/key", "/path/known_hosts")
    empty_key = transport_for(
        {"name": "w", "transport": "ssh", "host": "h", "user": "u", "private_key_file": ""}
    )
    assert isinstance(empty_key, SshTransport)
    assert empty_key.port == 22 and empty_key.private_key_file is None


def test_transport_for_rejects_bad_records():
    with pytest.raises(TransportError, match="unknown transport 'telnet'"):
        transport_for({"name": "x", "transport": "telnet"})
    with pytest.raises(TransportError, match="`host` is missing"):
        transport_for({"name": "x", "transport": "ssh", "user": "u"})
    with pytest.raises(TransportError, match="`container` is missing"):
        transport_for({"name": "x", "transport": "docker"})


def test_docker_transports_of_one_list_share_one_engine_client(monkeypatch):
    from infra import engine

    made = []
    monkeypatch.setattr(engine, "docker_client", lambda: made.append(1) or FakeClient())
    nodes = transports_for(["a", "b", {"name": "c", "transport": "docker", "container": "c"}])
    assert [n.unavailable() for n in nodes] == [
        f"not on the engine (No such container: {name})" for name in "abc"
    ]
    assert made == [1]


def test_no_engine_is_a_transport_error(monkeypatch):
    from infra import engine

    def no_engine():
        raise engine.EngineError("the Docker engine does not answer (boom)")

    monkeypatch.setattr(engine, "docker_client", no_engine)
    with pytest.raises(TransportError, match="the Docker engine does not answer"):
        DockerTransport("w1").unavailable()


# --- docker, on a fake engine -----------------------------------------------------------


class FakeContainer:
    def __init__(self, name: str, status: str = "running", files: dict | None = None) -> None:
        self.name, self.status, self.id = name, status, f"id-{name}"
        self.files: dict[str, bytes] = dict(files or {})
        self.execs: list[tuple[list[str], dict]] = []
        self.modes: dict[str, int] = {}
        self.sent: list = []

    def exec_run(self, argv, **options):
        self.execs.append((argv, options))
        return 0, b"4242\n"

    def get_archive(self, path):
        if path not in self.files:
            raise LookupError(f"Could not find the file {path} in container {self.name}")
        data = self.files[path]
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(path.rsplit("/", 1)[-1])
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        return iter([archive.getvalue()]), {}

    def put_archive(self, directory, data):
        self.sent.append(data)
        if not isinstance(data, bytes):  # a stream, as docker-py takes it: read it in pieces
            data = b"".join(data)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar.getmembers():
                extracted = tar.extractfile(member)
                assert extracted is not None
                self.files[f"{directory}/{member.name}"] = extracted.read()
                self.modes[f"{directory}/{member.name}"] = member.mode
        return True


class FakeClient:
    def __init__(self, *containers: FakeContainer) -> None:
        self.by_name = {c.name: c for c in containers}
        self.containers = self

    def get(self, name):
        if name not in self.by_name:
            raise LookupError(f"No such container: {name}")
        return self.by_name[name]


def test_docker_transport_on_a_fake_engine():
    box = FakeContainer("ts-w1", files={"/srv/m/r/model.keras": b"\x00\x01"})
    stopped = FakeContainer("ts-w2", status="exited")
    client = FakeClient(box, stopped)
    node = DockerTransport("ts-w1", client)
    assert node.unavailable() is None
    assert DockerTransport("ts-w2", client).unavailable() == "exited"
    assert DockerTransport("ts-w3", client).unavailable() == (
        "not on the engine (No such container: ts-w3)"
    )
    # `docker exec` with its own defaults unless asked otherwise.
    assert node.run(["pgrep", "-f", "x"]) == (0, b"4242\n")
    assert box.execs[-1] == (["pgrep", "-f", "x"], {})
    node.run(["sh", "-c", "kill 1"], user="root", env={"A": "1"})
    assert box.execs[-1] == (["sh", "-c", "kill 1"], {"user": "root", "environment": {"A": "1"}})
    assert node.fetch("/srv/m/r/model.keras") == b"\x00\x01"
    with pytest.raises(TransportError, match=r"ts-w1: cannot read /srv/m/r/gone.png"):
        node.fetch("/srv/m/r/gone.png")
    node.put("/srv/m/r/utilisation.png", b"PNG", mode=0o640)
    assert box.files["/srv/m/r/utilisation.png"] == b"PNG"
    assert box.modes["/srv/m/r/utilisation.png"] == 0o640
    assert node.copy_command("/srv/m/r") == "docker cp ts-w1:/srv/m/r ."
    with pytest.raises(TransportError, match="ts-w3: not on the engine"):
        DockerTransport("ts-w3", client).run(["true"])


class TornContainer(FakeContainer):
    """Its first `torn` archives stop mid-file, as the engine's do for a file that is
    replaced or grows while it is tarred."""

    def __init__(self, name: str, torn: int, files: dict) -> None:
        super().__init__(name, files=files)
        self.torn, self.reads = torn, 0

    def get_archive(self, path):
        chunks, stat = super().get_archive(path)
        self.reads += 1
        whole = b"".join(chunks)
        return iter([whole[:600] if self.reads <= self.torn else whole]), stat


@pytest.mark.parametrize("torn", [1, 3])
def test_docker_fetch_reads_a_torn_archive_again(monkeypatch, torn):
    from infra.transport import docker as docker_transport

    monkeypatch.setattr(docker_transport.time, "sleep", lambda _s: None)
    box = TornContainer("ts-w1", torn, {"/srv/m/j/record.json": b"{}" * 400})
    assert DockerTransport("ts-w1", FakeClient(box)).fetch("/srv/m/j/record.json") == b"{}" * 400
    assert box.reads == torn + 1


def test_docker_fetch_of_a_file_torn_every_time_is_one_transport_error(monkeypatch):
    from infra.transport import docker as docker_transport

    monkeypatch.setattr(docker_transport.time, "sleep", lambda _s: None)
    box = TornContainer("ts-w1", 99, {"/srv/m/j/out.log": b"x" * 2000})
    with pytest.raises(TransportError, match=r"ts-w1: cannot read /srv/m/j/out.log \(it changed"):
        DockerTransport("ts-w1", FakeClient(box)).fetch("/srv/m/j/out.log")
    assert box.reads == docker_transport.FETCH_ATTEMPTS


@pytest.mark.parametrize("size", [0, 1, 512, 513, 3 * 4096 + 7])
def test_docker_put_file_streams_a_one_member_tar_read_in_chunks(monkeypatch, tmp_path, size):
    from infra.transport import docker as docker_transport

    monkeypatch.setattr(docker_transport, "STREAM_CHUNK", 4096)
    local = tmp_path / "wheels.tar"
    content = bytes(i % 251 for i in range(size))
    local.write_bytes(content)
    box = FakeContainer("ts-w1")
    node = DockerTransport("ts-w1", FakeClient(box))
    node.put_file("/srv/m/envs/.x.tar", local, mode=0o640, user="trainstack")
    assert box.files["/srv/m/envs/.x.tar"] == content
    assert box.modes["/srv/m/envs/.x.tar"] == 0o640
    assert not isinstance(box.sent[-1], bytes)  # a stream, not the file in memory
    assert box.execs[-1] == (["chown", "trainstack", "/srv/m/envs/.x.tar"], {})
    # The stream: a header, the file in chunks of at most STREAM_CHUNK, the tar's end.
    with local.open("rb") as source:
        pieces = list(docker_transport._tar_of_one_file("x.tar", source, 0o644))
    assert all(len(p) <= 4096 for p in pieces[1:-1]) and len(pieces) == 2 + -(-size // 4096)
    assert sum(len(p) for p in pieces) % tarfile.BLOCKSIZE == 0


def test_docker_put_file_of_a_missing_file_names_it(tmp_path):
    node = DockerTransport("ts-w1", FakeClient(FakeContainer("ts-w1")))
    with pytest.raises(TransportError, match=r"ts-w1: cannot write /srv/x \(cannot read .*nope"):
        node.put_file("/srv/x", tmp_path / "nope.tar")


def test_ssh_put_file_of_a_missing_file_names_it(monkeypatch, tmp_path):
    fake = FakeSsh()
    monkeypatch.setattr(subprocess, "run", fake)
    with pytest.raises(TransportError, match=r"wrk-1: cannot write /srv/x \(cannot read .*nope"):
        ssh_node().put_file("/srv/x", tmp_path / "nope.tar")
    assert fake.calls == []  # nothing started


def test_put_file_of_a_transport_without_its_own_puts_the_bytes(tmp_path):
    local = tmp_path / "f"
    local.write_bytes(b"abc")
    node = FakeNode("w1")
    node.put_file("/srv/f", local, mode=0o600, user="u")
    assert node.files == {"/srv/f": b"abc"}


# --- the training provider through a transport ------------------------------------------


class FakeNode(Transport):
    remedy = "fix it"

    def __init__(self, name, why=None, installed=True, files=None, pids=b""):
        self.name, self.why, self.installed = name, why, installed
        self.files = dict(files or {})
        self.pids = pids
        self.ran: list[tuple[list[str], str | None]] = []

    def unavailable(self):
        return self.why

    def run(self, argv, *, user=None, env=None, stdin=None):
        self.ran.append((argv, user))
        if argv[0] == "test":
            return (0 if self.installed else 1), b""
        if argv[0] == "pgrep":
            return (0 if self.pids else 1), self.pids
        return 0, b""

    def stream(self, argv, *, env=None, user=None):
        raise AssertionError("not here")

    def fetch(self, path):
        if path not in self.files:
            raise TransportError(f"{self.name}: cannot read {path} (missing)")
        return self.files[path]

    def put(self, path, data, mode=0o644, user=None):
        self.files[path] = data

    def copy_command(self, path):
        return f"fetch {self.name}:{path}"


def test_submitter_reports_every_node_with_its_transport_remedy(monkeypatch):
    from infra.components.training import TrainingError, _submitter

    nodes = [FakeNode("a", why="ssh deploy@a port 22: Connection refused"), FakeNode("b")]
    assert _submitter(nodes).name == "b"
    with pytest.raises(TrainingError) as caught:
        _submitter([FakeNode("a", why="gone"), FakeNode("c", installed=False)])
    said = str(caught.value)
    assert said.startswith("training job: no node can submit the job (a: gone; c: ")
    assert "trainstack-train is missing (not provisioned)" in said
    assert said.endswith("); fix it and run `pulumi up` again")


def test_submitter_says_docker_start_for_containers():
    from infra.components.training import TrainingError, _submitter

    client = FakeClient(FakeContainer("w1", status="exited"))
    with pytest.raises(TrainingError) as caught:
        _submitter([DockerTransport("w1", client)])
    assert str(caught.value) == (
        "training job: no node can submit the job (w1: exited); start one "
        "(`docker start <name>`) and run `pulumi up` again"
    )


def test_results_come_back_through_the_transport(tmp_path):
    from infra.components.training import TrainingError, _results
    from infra.components.training import _copy_files as copy

    def _copy_results(node, run, dest):
        wanted, required = _results("tensorflow")
        return copy(node, run, dest, wanted, required)

    run = "/srv/trainstack/models/run-1"
    node = FakeNode("n", files={f"{run}/model.keras": b"M", f"{run}/metrics.json": b"{}"})
    copied = _copy_results(node, run, tmp_path / "out")
    assert copied == [str(tmp_path / "out" / "model.keras"), str(tmp_path / "out" / "metrics.json")]
    assert (tmp_path / "out" / "model.keras").read_bytes() == b"M"  # curves.png is optional
    with pytest.raises(TrainingError, match=r"run-1/model.keras was not written by the job: n: "):
        _copy_results(FakeNode("n"), run, tmp_path / "none")


def test_earlier_launches_are_stopped_as_root(capsys):
    from infra.components.training import _stop_earlier_launches

    busy, idle, gone = FakeNode("busy", pids=b"12\n34\n"), FakeNode("idle"), FakeNode("g", "off")
    _stop_earlier_launches([gone, idle, busy], "/srv/trainstack/models/run-1", grace_s=5)
    assert gone.ran == []
    assert [argv[0] for argv, _ in idle.ran] == ["pgrep"]
    (pgrep, _), (kill, user) = busy.ran
    assert pgrep[:2] == ["pgrep", "-f"] and pgrep[2] == (
        "(trainstack_training.queue /srv/trainstack/models/run-1 "
        "|trainstack-train .*--output /srv/trainstack/models/run-1( |$))"
    )
    assert kill[:2] == ["sh", "-c"] and "kill -TERM 12 34" in kill[2] and user == "root"
    assert "an earlier launch of this run still runs on busy (pid 12 34;" in capsys.readouterr().err


def test_training_has_no_docker_specific_code():
    from pathlib import Path

    from infra.components import training

    source = Path(training.__file__).read_text()
    for word in ("exec_run", "exec_create", "get_archive", "put_archive", "docker_client"):
        assert word not in source


def test_a_run_goes_through_the_first_healthy_node(monkeypatch, tmp_path):
    from infra.components import training

    run_dir = "/srv/trainstack/models/run-abc"

    class Worker(FakeNode):
        def stream(self, argv, *, env=None, user=None):
            self.streamed = (argv, env, user)
            self.files[f"{run_dir}/model.keras"] = b"M"
            self.files[f"{run_dir}/metrics.json"] = b"{}"
            return 0, 'progress\n{"ok": true, "accuracy": 0.9}\n'

    down, worker = FakeNode("w1", why="exited"), Worker("w2")
    seen = []
    monkeypatch.setattr(
        training, "transports_for", lambda nodes: seen.append(nodes) or [down, worker]
    )
    nodes = [
        {"name": "worker-1", "transport": "docker", "container": "w1"},
        {"name": "worker-2", "transport": "docker", "container": "w2"},
    ]
    props = {
        "run_id": "run-abc",
        "master_url": "spark://c:7077",
        "submit_candidates": nodes,
        "settings": {**SETTINGS_FOR_RUN},
        "host_artifacts_dir": str(tmp_path),
    }
    out = training._TrainingJobProvider()._run(props)["result"]
    assert seen == [nodes]
    argv, env, user = worker.streamed
    assert user == "trainstack" and env == training.remote.NODE_ENV
    assert argv[argv.index("--output") + 1] == run_dir
    assert out["submitted_on"] == "w2"
    assert out["copy_command"] == f"fetch w2:{run_dir}"
    assert out["accuracy"] == 0.9
    assert (tmp_path / "run-abc" / "model.keras").read_bytes() == b"M"


SETTINGS_FOR_RUN = {
    "workers": 2,
    "epochs": 1,
    "batch_size": 32,
    "data": "digits",
    "rows": 0,
    "spark_conf": "spark.driver.memory=512m",
}
