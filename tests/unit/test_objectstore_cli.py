"""`trainstack data put|ls` (infra.jobs.objectstore) without a server: the arguments, the
stack's outputs turned into pyarrow's S3FileSystem, the one-sentence errors over the texts a
real store gave, the progress line, and put/ls over a local stand-in for the store (a folder
per bucket). A round trip against a real store is run by hand (docs/jobs.md)."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pyarrow import fs as pafs

from infra.jobs import cli, objectstore
from infra.jobs.commands import EXIT_INPUT, EXIT_UNREACHABLE, CliError
from infra.jobs.objectstore import (
    CHUNK_BYTES,
    Progress,
    StoreAccess,
    filesystem_options,
    listing,
    parse_url,
    put,
    store_access,
    store_error,
    upload_plan,
)

pytestmark = pytest.mark.unit

SECRET_KEY = "s3cr3t-never-shown"
OUTPUTS = {
    "jobNodes": [{"name": "worker-1"}],
    "jobDefaults": {"stack": "dev"},
    "objectStoreUrl": "http://127.0.0.1:19110",
    "objectStoreAccessKey": "trainstack",
    "objectStoreSecretKey": "[secret]",  # as `pulumi stack output --json` prints a secret
}
ACCESS = StoreAccess("http://127.0.0.1:19110", "trainstack", SECRET_KEY)


def test_the_data_command_parses() -> None:
    parser = cli.build_parser()
    args = parser.parse_args(["-s", "dev", "data", "put", "sets/a", "s3://trainstack/a/"])
    assert (args.command, args.action, args.src, args.url) == (
        "data",
        "put",
        "sets/a",
        "s3://trainstack/a/",
    )
    args = parser.parse_args(["data", "ls"])
    assert (args.action, args.url) == ("ls", None)  # the stack's bucket (data_command)
    for argv in (["data"], ["data", "put", "only-src"], ["data", "cp", "a", "b"]):
        with pytest.raises(SystemExit) as raised:
            parser.parse_args(argv)
        assert raised.value.code == 2


@pytest.mark.parametrize(
    ("url", "parts"),
    [
        ("s3://trainstack/sets/a/", ("trainstack", "sets/a/")),
        ("s3a://trainstack/x.parquet", ("trainstack", "x.parquet")),
        ("s3://trainstack", ("trainstack", "")),
        ("s3://", ("", "")),
    ],
)
def test_object_store_urls(url: str, parts: tuple[str, str]) -> None:
    assert parse_url(url) == parts


@pytest.mark.parametrize("url", ["/srv/data", "http://host/x", "s3:///key", "gs://b/k"])
def test_other_urls_are_refused(url: str) -> None:
    with pytest.raises(CliError) as raised:
        parse_url(url)
    assert raised.value.code == EXIT_INPUT and url in str(raised.value)


def test_upload_plan_keeps_relative_paths(tmp_path: Path) -> None:
    src = tmp_path / "set"
    (src / "day=1").mkdir(parents=True)
    (src / "a.parquet").write_bytes(b"a")
    (src / "day=1" / "b.parquet").write_bytes(b"b")
    assert upload_plan(src, "s3://trainstack/sets/x") == [
        (src / "a.parquet", "trainstack/sets/x/a.parquet"),
        (src / "day=1" / "b.parquet", "trainstack/sets/x/day=1/b.parquet"),
    ]
    assert upload_plan(src, "s3a://trainstack/")[0] == (src / "a.parquet", "trainstack/a.parquet")
    one = src / "a.parquet"
    assert upload_plan(one, "s3://trainstack/sets/") == [(one, "trainstack/sets/a.parquet")]
    assert upload_plan(one, "s3://trainstack/sets/t.parquet") == [
        (one, "trainstack/sets/t.parquet")
    ]
    assert upload_plan(one, "s3://trainstack") == [(one, "trainstack/a.parquet")]


@pytest.mark.parametrize(
    ("src", "dest", "says"),
    [
        ("missing", "s3://trainstack/x/", "does not exist: give a local file or directory"),
        ("empty", "s3://trainstack/x/", "has no files to upload"),
        ("empty", "s3://", "give the bucket to upload to"),
        ("empty", "/srv/data", "give an object store URL"),
    ],
)
def test_upload_arguments_are_checked(tmp_path: Path, src: str, dest: str, says: str) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(CliError) as raised:
        upload_plan(tmp_path / src, dest)
    assert raised.value.code == EXIT_INPUT and says in str(raised.value)


def test_arguments_are_checked_before_the_stack_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_stack(stack: str | None) -> dict[str, Any]:
        raise AssertionError("the stack's outputs were read")

    monkeypatch.setattr(objectstore, "stack_outputs", no_stack)
    assert cli.main(["data", "put", str(tmp_path / "nope"), "s3://trainstack/x/"]) == 2
    assert cli.main(["data", "ls", "http://x/y"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("trainstack: error: ") for line in err)


def test_outputs_become_the_store_and_the_secret_is_revealed_once() -> None:
    asked: list[str] = []

    def reveal(name: str) -> str:
        asked.append(name)
        return SECRET_KEY

    access = store_access(OUTPUTS, reveal)
    assert access == ACCESS and asked == ["objectStoreSecretKey"]
    assert SECRET_KEY not in repr(access)
    assert filesystem_options(access) == {
        "endpoint_override": "127.0.0.1:19110",
        "scheme": "http",
        "access_key": "trainstack",
        "secret_key": SECRET_KEY,
        "region": "us-east-1",
        "force_virtual_addressing": False,
        "allow_bucket_creation": True,
        "connect_timeout": 5.0,
    }
    pafs.S3FileSystem(**filesystem_options(access))  # pyarrow takes them (no request made)


def test_a_stack_without_an_object_store_says_so() -> None:
    outputs = {k: v for k, v in OUTPUTS.items() if not k.startswith("objectStore")}
    with pytest.raises(CliError) as raised:
        store_access(outputs, lambda name: SECRET_KEY)
    assert "trainstack:objectStore is off" in str(raised.value)
    assert raised.value.code == EXIT_INPUT
    with pytest.raises(CliError, match="objectStoreSecretKey output is missing"):
        store_access({**OUTPUTS, "objectStoreSecretKey": ""}, lambda name: "")
    with pytest.raises(CliError, match="is not an http"):
        filesystem_options(StoreAccess("127.0.0.1:19110", "k", "s"))


def test_the_secret_is_read_with_show_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, f"{SECRET_KEY}\n", "")

    monkeypatch.setenv("PULUMI_BACKEND_URL", "file://.pulumi-state")
    monkeypatch.setattr(objectstore.subprocess, "run", run)
    assert objectstore.secret_output("dev", "objectStoreSecretKey") == SECRET_KEY
    assert seen == [
        [
            "pulumi", "stack", "output", "objectStoreSecretKey", "--show-secrets",
            "--non-interactive", "--stack", "dev",
        ]
    ]  # fmt: skip


# What pyarrow's S3FileSystem raised against a local SeaweedFS (request ids shortened).
STORE_TEXTS = [
    (
        "When listing objects under key 'x/' in bucket 'nosuch': AWS Error NO_SUCH_BUCKET during "
        "ListObjectsV2 operation: The specified bucket does not exist (Request ID: 18EE8)",
        EXIT_INPUT,
        "the object store has no bucket 'nosuch'",
    ),
    (
        "Path does not exist 'nosuch/x/'. Detail: [errno 2] No such file or directory",
        EXIT_INPUT,
        "nothing is stored there",
    ),
    (
        "When listing buckets: AWS Error SIGNATURE_DOES_NOT_MATCH during ListBuckets operation: "
        "The request signature we calculated does not match the signature you provided. Check "
        "your key and signing method. (Request ID: 18EE8)",
        EXIT_UNREACHABLE,
        "refused the stack's keys (access denied)",
    ),
    (
        "When initiating multiple part upload for key 'x/y' in bucket 'nosuch': AWS Error "
        "SIGNATURE_DOES_NOT_MATCH during CreateMultipartUpload operation: The request signature "
        "we calculated does not match the signature you provided. (Request ID: 18EE8)",
        EXIT_UNREACHABLE,
        "refused the stack's keys (access denied)",
    ),
    (
        "When listing objects under key 'x/' in bucket 'nosuch': AWS Error NETWORK_CONNECTION "
        "during ListObjectsV2 operation: curlCode: 7, Could not connect to server; Details: "
        "Failed to connect to 127.0.0.1 port 18399 after 0 ms: Could not connect to server",
        EXIT_UNREACHABLE,
        "is unreachable (connection refused)",
    ),
    (
        "When getting information for key 'x' in bucket 'nosuch': AWS Error NETWORK_CONNECTION "
        "during HeadObject operation: curlCode: 6, Could not resolve hostname; Details: Could "
        "not resolve host: nosuchhost.invalid",
        EXIT_UNREACHABLE,
        "is unreachable (its host does not resolve)",
    ),
]


@pytest.mark.parametrize(("text", "code", "says"), STORE_TEXTS)
def test_store_failures_are_one_sentence(text: str, code: int, says: str) -> None:
    error = store_error("s3://nosuch/x/", OSError(text), ACCESS)
    message = str(error)
    assert error.code == code and says in message, message
    assert "\n" not in message and "AWS Error" not in message and SECRET_KEY not in message


def test_progress_on_a_pipe_is_a_line_every_few_seconds() -> None:
    now = [0.0]
    out = io.StringIO()
    progress = Progress(40 * 1024**2, out, lambda: now[0])
    for _ in range(5):
        now[0] += 2.0
        progress.add(8 * 1024**2)
    progress.finish()
    assert out.getvalue().splitlines() == [
        "24.0/40.0 MB (60%), 4.0 MB/s",
        "40.0/40.0 MB (100%), 4.0 MB/s",
    ]


def test_progress_on_a_terminal_is_one_line_redrawn() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    progress = Progress(16 * 1024**2, out, lambda: 1.0)
    progress.add(8 * 1024**2)
    progress.finish()
    assert out.getvalue().count("\r") == 2 and out.getvalue().endswith("\n")
    assert "8.0/16.0 MB (50%)" in out.getvalue()


class LocalStore:
    """A local stand-in for the store: a folder per bucket; as on S3, writing a key needs no
    folder made first."""

    def __init__(self, root: Path) -> None:
        self.fs = pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)

    def open_output_stream(self, path: str) -> Any:
        self.fs.create_dir(path.rsplit("/", 1)[0])
        return self.fs.open_output_stream(path)


@pytest.fixture
def store(tmp_path: Path) -> Any:
    (tmp_path / "store").mkdir()
    return LocalStore(tmp_path / "store")


def test_put_then_ls_round_trip(tmp_path: Path, store: Any) -> None:
    src = tmp_path / "set"
    (src / "sub").mkdir(parents=True)
    big = bytes(range(256)) * (CHUNK_BYTES // 256 * 2 + 3)  # two chunks and a bit
    (src / "big.bin").write_bytes(big)
    (src / "sub" / "a.csv").write_text("f0,label\n1,0\n")
    out = io.StringIO()
    plan = upload_plan(src, "s3://newbucket/sets/x/")
    sent = put(store, plan, Progress(len(big) + 13, out))
    assert sent == len(big) + 13
    with store.open_input_stream("newbucket/sets/x/big.bin") as f:
        assert f.read() == big
    assert listing(store, "s3://newbucket/sets/x") == [
        f"{len(big):>14,}  s3://newbucket/sets/x/big.bin",
        f"{13:>14,}  s3://newbucket/sets/x/sub/a.csv",
        f"2 objects, {len(big) + 13:,} bytes",
    ]
    assert listing(store, "s3://") == ["s3://newbucket/"]
    assert listing(store, "s3a://newbucket/sets/x/sub/a.csv")[0].endswith(
        "s3a://newbucket/sets/x/sub/a.csv"
    )
    for url, says in (
        ("s3://other/", "has no bucket 'other'"),
        ("s3://newbucket/nope/", "nothing is stored there"),
    ):
        with pytest.raises(CliError, match=says):
            listing(store, url)


def test_the_command_never_prints_the_secret(
    tmp_path: Path,
    store: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(objectstore, "stack_outputs", lambda stack: dict(OUTPUTS))
    monkeypatch.setattr(objectstore, "secret_output", lambda stack, name: SECRET_KEY)
    monkeypatch.setattr(objectstore, "open_store", lambda access: store)
    (tmp_path / "t.csv").write_text("f0,label\n1,0\n")
    assert cli.main(["data", "put", str(tmp_path / "t.csv"), "s3://trainstack/sets/"]) == 0
    assert cli.main(["data", "ls"]) == 0  # the default bucket: trainstack
    assert cli.main(["data", "ls", "s3://trainstack/none/"]) == EXIT_INPUT
    out, err = capsys.readouterr()
    assert "uploaded 1 file, 13 bytes to s3://trainstack/sets/t.csv" in out
    assert "s3://trainstack/sets/t.csv" in out.splitlines()[1]
    # The stack's own bucket, when its outputs name one, is `ls`'s default.
    outputs = {**OUTPUTS, "objectStoreBucket": "other"}
    monkeypatch.setattr(objectstore, "stack_outputs", lambda stack: outputs)
    assert cli.main(["data", "put", str(tmp_path / "t.csv"), "s3://other/"]) == 0
    assert cli.main(["data", "ls"]) == 0
    assert "s3://other/t.csv" in capsys.readouterr().out
    assert "trainstack: error: s3://trainstack/none/: nothing is stored there" in err
    assert SECRET_KEY not in out + err
