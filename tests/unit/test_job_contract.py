"""The job contract's checks (trainstack_training.manifest.load_spec), run on the host before
anything is launched: each bad job directory is one sentence naming the file and the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from trainstack_training.context import (
    UserCodeError,
    call_user,
    is_cluster_failure,
    user_frames,
    where,
)
from trainstack_training.jobsettings import data_location
from trainstack_training.manifest import JobError, load_spec

from infra.config import ConfigError, StackConfig

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _job(tmp_path: Path, manifest: str, files: dict[str, str]) -> Path:
    (tmp_path / "trainstack.toml").write_text(manifest)
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    ("example", "mode", "entry"),
    [
        ("digits", "simple", "model.py"),
        ("digits-cnn", "full", "cnn.py"),
        ("digits-torch", "simple", "model.py"),
        ("digits-torch-cnn", "full", "cnn.py"),
    ],
)
def test_the_examples_are_valid_jobs(example, mode, entry):
    spec = load_spec(EXAMPLES / example)
    assert (spec.mode, spec.entry_file) == (mode, entry)
    assert spec.params
    assert spec.framework == ("torch" if "torch" in example else "tensorflow")


def test_params_from_the_stack_override_the_manifest():
    spec = load_spec(EXAMPLES / "digits", {"dropout": 0.5, "extra": "x"})
    assert spec.params == {"hidden_units": 128, "dropout": 0.5, "extra": "x"}


def test_a_package_entry_and_datasets_are_found(tmp_path):
    job = _job(
        tmp_path,
        '[job]\nentry = "pkg.train_me"\n',
        {
            "pkg/__init__.py": "",
            "pkg/train_me.py": "def build_model(ctx): ...\ndef datasets(ctx): ...",
        },
    )
    spec = load_spec(job)
    assert (spec.mode, spec.has_datasets, spec.entry_file) == (
        "simple",
        True,
        "pkg/train_me.py",
    )


BAD = [
    ("", {}, "needs a [job] table"),
    ('[job]\nentry = "m"\n[other]\n', {"m.py": "def train(ctx): ..."}, "unknown tables/keys"),
    ('[job]\nentry = "m"\nmain = 1\n', {"m.py": "def train(ctx): ..."}, "unknown [job] keys"),
    ('[job]\nentry = "m.py"\n', {"m.py": "def train(ctx): ..."}, "without .py"),
    ('[job]\nentry = "my-job"\n', {}, "must be a module name"),
    ('[job]\nentry = "nope"\n', {}, "no nope.py or nope/__init__.py"),
    ('[job]\nentry = "m"\n', {"m.py": "def helper(ctx): ..."}, "defines neither build_model"),
    (
        '[job]\nentry = "m"\n',
        {"m.py": "def train(ctx): ...\ndef build_model(ctx): ..."},
        "defines both",
    ),
    ('[job]\nentry = "m"\n', {"m.py": "def train(ctx):\n  return (\n"}, "m.py:2: syntax error"),
    ('[job\nentry = "m"\n', {}, "not valid TOML"),
    ('[job]\nentry = "m"\nrequirements = "r.txt"\n', {"m.py": "def train(c): ..."}, "does not"),
    ('[job]\nentry = "m"\nprogress_timeout = -1\n', {"m.py": "def train(c): ..."}, "-1: give"),
    ('[job]\nentry = "m"\nprogress_timeout = "9"\n', {"m.py": "def train(c): ..."}, ">= 0"),
    ('[job]\nentry = "m"\nprogress_timeout = true\n', {"m.py": "def train(c): ..."}, ">= 0"),
    ('[job]\nentry = "m"\n[params]\nx = 1\n', {"m.py": "def train(c): ..."}, None),
    ('[job]\nentry = "m"\ndata = 3\n', {"m.py": "def train(c): ..."}, "data = 3: give"),
    ('[job]\nentry = "m"\ndata = " "\n', {"m.py": "def train(c): ..."}, "data = ' ': give"),
    ('[job]\nentry = "m"\ndata = "t.csv"\n', {"m.py": "def train(c): ..."}, "does not exist"),
    ('[job]\nentry = "m"\ndata = "../x.csv"\n', {"m.py": "def train(c): ..."}, "leaves the job"),
    ('[job]\nentry = "m"\ndata = "ftp://h/x"\n', {"m.py": "def train(c): ..."}, "URL schemes"),
    (
        '[job]\nentry = "m"\nframework = "jax"\n',
        {"m.py": "def train(c): ..."},
        "framework = 'jax': allowed are 'tensorflow', 'torch'",
    ),
    (
        '[job]\nentry = "m"\nframework = "torch"\n',
        {"m.py": "def train(c): ..."},
        'framework = "torch", but it has no requirements; the nodes install torch',
    ),
    (
        '[job]\nentry = "m"\nframework = "torch"\nrequirements = "r.txt"\n',
        {"m.py": "def train(c): ...", "r.txt": "torchvision\n# torch\n"},
        "r.txt does not list torch; the nodes install torch from the job's packages: add "
        "torch==2.15.0",
    ),
    (
        '[job]\nentry = "m"\nstrategy = "fsdp"\n',
        {"m.py": "def train(c): ..."},
        "strategy = 'fsdp': a TensorFlow job's strategy is the stack's trainstack:trainStrategy",
    ),
    (
        '[job]\nentry = "m"\nframework = "torch"\nstrategy = "zero"\nrequirements = "r.txt"\n',
        {"m.py": "def train(c): ...", "r.txt": "torch==2.15.0\n"},
        "strategy = 'zero': allowed are 'ddp', 'fsdp'",
    ),
]


@pytest.mark.parametrize(("manifest", "files", "message"), BAD)
def test_a_bad_job_directory_is_one_sentence(tmp_path, manifest, files, message):
    job = _job(tmp_path, manifest, files)
    if message is None:
        assert load_spec(job).params == {"x": 1}
        return
    with pytest.raises(JobError) as err:
        load_spec(job)
    text = str(err.value)
    assert message in text and str(job) in text
    assert "\n" not in text


@pytest.mark.parametrize(
    ("data", "files", "location"),
    [
        ("", {}, ""),  # none named: the stack's data set
        ("digits", {}, "digits"),
        ("/srv/trainstack/data/t.parquet", {}, "/srv/trainstack/data/t.parquet"),
        ("https://example.org/t.csv", {}, "https://example.org/t.csv"),
        ("data/t.csv", {"data/t.csv": "a,label\n1,0\n"}, "/jobs/abc/data/t.csv"),
        ("data", {"data/part-0.csv": "a,label\n1,0\n"}, "/jobs/abc/data"),
    ],
)
def test_the_manifests_data_set_is_read_where_the_cluster_has_it(tmp_path, data, files, location):
    """A path inside the job directory is shipped with the code, so the cluster reads it under
    the code's copy; anything else is read as it is."""
    line = f'data = "{data}"\n' if data else ""
    job = _job(tmp_path, f'[job]\nentry = "m"\n{line}', {"m.py": "def train(c): ...", **files})
    spec = load_spec(job)
    assert spec.data == data
    assert data_location(spec, "/jobs/abc/") == location


def test_a_missing_directory_or_manifest_is_named(tmp_path):
    with pytest.raises(JobError, match="does not exist"):
        load_spec(tmp_path / "absent")
    with pytest.raises(JobError, match=r"no trainstack\.toml"):
        load_spec(tmp_path)


def test_user_frames_keep_only_the_users_files(tmp_path):
    job = _job(tmp_path, '[job]\nentry = "m"\n', {"m.py": "def f(d):\n    return d['k']\n"})
    namespace: dict = {}
    exec(compile((job / "m.py").read_text(), str(job / "m.py"), "exec"), namespace)
    try:
        namespace["f"]({})
    except KeyError as exc:
        text = user_frames(exc, str(job))
        assert where(exc, str(job)) == "m.py:2"
    assert 'File "m.py", line 2, in f' in text
    assert "test_job_contract.py" not in text
    assert text.rstrip().endswith("KeyError: 'k'")


def test_the_stack_config_checks_the_job_before_anything(tmp_path):
    with pytest.raises(ConfigError, match=r"trainstack:job: job directory .* does not exist"):
        StackConfig.from_mapping({"job": str(tmp_path / "absent")})
    with pytest.raises(ConfigError, match=r"trainstack:jobParams: .* is not a JSON object"):
        StackConfig.from_mapping({"jobParams": "[1, 2]"})
    config = StackConfig.from_mapping({"job": "examples/digits-cnn", "jobParams": '{"filters": 8}'})
    assert config.job_path == EXAMPLES / "digits-cnn"
    assert config.job_params_dict == {"filters": 8}
    # With training off, the job is not looked at.
    StackConfig.from_mapping({"train": "false", "job": str(tmp_path / "absent")})


def test_a_lost_peer_is_a_cluster_failure_not_the_users_error(tmp_path):
    # TensorFlow's collective errors (a killed worker) go to Spark's retry as they are.
    unavailable = type("UnavailableError", (Exception,), {"__module__": "tensorflow.errors"})
    job = _job(tmp_path, '[job]\nentry = "m"\n', {"m.py": "def train(ctx): ..."})
    spec = load_spec(job)

    raised: list[BaseException] = []

    def fit() -> None:
        try:
            raise unavailable("Collective ops is aborted by: peer down")
        except Exception as exc:
            raised.append(RuntimeError("fit failed: the collective lost a peer"))
            raise raised[0] from exc

    # The very exception the code raised comes through, not a UserCodeError (a RuntimeError
    # too, whose message would also quote the code's): Spark's retry sees the cluster failure.
    with pytest.raises(RuntimeError) as excinfo:
        call_user(spec, fit)
    assert type(excinfo.value) is RuntimeError and not isinstance(excinfo.value, UserCodeError)
    assert excinfo.value is raised[0]
    assert str(excinfo.value) == "fit failed: the collective lost a peer"
    assert type(excinfo.value.__cause__) is unavailable
    assert is_cluster_failure(unavailable("x"))
    # torch.distributed's errors, and gloo's transport errors (a plain RuntimeError in 2.15).
    backend = type("DistBackendError", (RuntimeError,), {"__module__": "torch.distributed"})
    assert is_cluster_failure(backend("store gone"))
    closed = "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection"
    assert is_cluster_failure(RuntimeError(closed + " closed by peer [127.0.0.1]:5005"))
    assert not is_cluster_failure(RuntimeError("shapes do not match"))
    assert not is_cluster_failure(type("UnavailableError", (Exception,), {})("mine"))
    with pytest.raises(UserCodeError, match=r"your code failed: KeyError: 'k'"):
        call_user(spec, lambda: {}["k"])


def test_a_job_that_lists_packages_does_not_run_without_them(tmp_path):
    from trainstack_training.config import TrainConfig
    from trainstack_training.jobsettings import job_spec

    job = _job(
        tmp_path,
        '[job]\nentry = "m"\nrequirements = "r.txt"\n',
        {"m.py": "def train(c): ...", "r.txt": "# pins\nlightgbm==4.0\n"},
    )
    with pytest.raises(JobError, match=r"lists packages in r\.txt but job_env is empty"):
        job_spec(TrainConfig(job_dir=str(job)))
    assert job_spec(TrainConfig(job_dir=str(job), job_env="/srv/envs/x/site")).mode == "full"
    (job / "r.txt").write_text("# nothing yet\n")
    assert job_spec(TrainConfig(job_dir=str(job))).requirements == "r.txt"


def test_the_packages_overlay_is_importable_after_the_jobs_own_code(tmp_path, monkeypatch):
    import sys

    from trainstack_training.context import import_entry

    site = tmp_path / "site"
    (site / "extrapkg").mkdir(parents=True)
    (site / "extrapkg" / "__init__.py").write_text("VALUE = 'from the overlay'\n")
    (site / "m.py").write_text("raise RuntimeError('the overlay shadowed the job')\n")
    (tmp_path / "job").mkdir()
    job = _job(
        tmp_path / "job",
        '[job]\nentry = "m"\n',
        {"m.py": "import extrapkg\nVALUE = extrapkg.VALUE\ndef train(c): ...\n"},
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "m", raising=False)
    monkeypatch.delitem(sys.modules, "extrapkg", raising=False)
    module = import_entry(load_spec(job), str(site))
    assert module.VALUE == "from the overlay"
    assert sys.path[:2] == [str(job.resolve()), str(site)]
    monkeypatch.delitem(sys.modules, "m", raising=False)
    monkeypatch.delitem(sys.modules, "extrapkg", raising=False)


def test_the_declared_jobs_manifest_workers_must_fit_the_cluster(tmp_path):
    job = tmp_path / "sized"
    shutil.copytree(EXAMPLES / "digits", job)
    manifest = job / "trainstack.toml"
    manifest.write_text(manifest.read_text().replace("[job]\n", "[job]\nworkers = 3\n"))
    with pytest.raises(ConfigError) as caught:
        StackConfig.from_mapping({"job": str(job)})
    assert "[job] workers = 3, but this cluster has 2 training slots" in str(caught.value)
    assert StackConfig.from_mapping({"job": str(job), "workers": "3"}).job_spec.workers == 3
