"""A full-mode job that reads its own data (its manifest's `data = "none"`): no data stage runs,
ctx has no shard (touching it is one sentence), a simple-mode job or a data set given with it
is refused before anything runs, and its result carries the manifest's task or none."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from trainstack_training import report
from trainstack_training.config import TrainConfig
from trainstack_training.context import JobContext, NoDataError, UserCodeError, call_user
from trainstack_training.data.rank import NoRankData
from trainstack_training.frameworks.base import RankRun
from trainstack_training.jobsettings import apply_manifest, chosen_data, data_location
from trainstack_training.launcher import no_data_stage
from trainstack_training.manifest import JobError, load_spec
from trainstack_training.rundir import ATTEMPTS_LOG, EPOCH_LOG
from trainstack_training.tracking import RunFiles

from infra.config import ConfigError, StackConfig
from infra.jobs import commands
from infra.jobs.cli import CliError, _data
from infra.jobs.commands import Jobs
from infra.jobs.show import print_status
from tests.support.fakes import SubmittingNode

pytestmark = pytest.mark.unit

OWN = '[job]\nentry = "m"\ndata = "none"\n'
TRAIN = "def train(ctx):\n    return ctx.x\n"


def _job(root: Path, manifest: str = OWN, code: str = TRAIN) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "trainstack.toml").write_text(manifest)
    (root / "m.py").write_text(code)
    return root


# --- the manifest -------------------------------------------------------------------------------


def test_data_none_declares_a_job_that_reads_its_own_data(tmp_path):
    spec = load_spec(_job(tmp_path))
    assert spec.reads_own_data and spec.mode == "full" and spec.data == "none"
    assert data_location(spec, "/srv/jobs/sha") == "none"
    assert chosen_data(spec, "/srv/jobs/sha") == "none"
    assert not load_spec(_job(tmp_path / "other", '[job]\nentry = "m"\n')).reads_own_data


def test_a_simple_mode_job_cannot_read_its_own_data(tmp_path):
    job = _job(tmp_path, code="def build_model(ctx): ...\n")
    with pytest.raises(JobError) as raised:
        load_spec(job)
    assert str(raised.value) == (
        f'job directory {str(job)!r}: trainstack.toml: [job] data = "none" (the job reads its '
        "own data) is for full mode, but m.py defines build_model(ctx): simple mode trains on "
        "the data stage's shard; define train(ctx) instead, or name a data set (data = "
        '"digits", a path in the job directory, or an absolute path or URL)'
    )


def test_a_data_set_given_with_data_none_is_refused(tmp_path):
    spec = load_spec(_job(tmp_path))
    with pytest.raises(JobError) as raised:
        chosen_data(spec, "/srv/jobs/sha", "/srv/trainstack/data/t.parquet", "--data")
    assert str(raised.value) == (
        "--data '/srv/trainstack/data/t.parquet': the job's manifest "
        f'({tmp_path}/trainstack.toml) says data = "none": it reads its own data and no data '
        "stage runs; leave --data out, or name the data set in the manifest's data instead"
    )
    # A job that names a data set: what is given wins over the manifest, as before.
    other = load_spec(_job(tmp_path / "other", '[job]\nentry = "m"\ndata = "digits"\n'))
    assert chosen_data(other, "/j", "/srv/d.csv", "--data") == "/srv/d.csv"
    assert chosen_data(other, "/j") == "digits"


def test_the_stack_refuses_train_data_with_a_job_that_reads_its_own_data(tmp_path):
    job = _job(tmp_path)
    with pytest.raises(ConfigError, match=r"trainstack:trainData '/srv/d.csv': the job's"):
        StackConfig.from_mapping({"job": str(job), "trainData": "/srv/d.csv"})
    config = StackConfig.from_mapping({"job": str(job)})
    from infra.program import job_data

    assert job_data(config, load_spec(job), "sha1") == "none"


def test_the_runs_data_must_agree_with_the_manifest(tmp_path):
    spec = load_spec(_job(tmp_path))
    cfg = TrainConfig()  # trainstack-train's default data: the digits
    apply_manifest(cfg, spec)
    assert cfg.data == "none"
    with pytest.raises(JobError, match=r"the run's data='/srv/d.csv' contradicts the job's"):
        apply_manifest(TrainConfig(data="/srv/d.csv"), spec)
    digits = load_spec(_job(tmp_path / "other", '[job]\nentry = "m"\n'))
    with pytest.raises(JobError, match=r'does not say so; add data = "none" to its \[job\]'):
        apply_manifest(TrainConfig(data="none"), digits)


def test_submit_passes_data_none_and_refuses_data_with_it(monkeypatch, tmp_path):
    node = SubmittingNode()
    monkeypatch.setattr(commands, "transports_for", lambda records: [node])
    monkeypatch.setattr(commands, "submitter", lambda nodes, check_venv=True: node)
    monkeypatch.setattr(commands, "ship", lambda node, packed: None)
    job = _job(tmp_path / "job")
    defaults = {"workers": 2, "epochs": 3, "batch_size": 32, "data": "/srv/stack.parquet",
                "rows": 0, "spark_conf": "", "strategy": "multi-worker", "cores_per_worker": 1,
                "master_url": "spark://m:7077"}  # fmt: skip
    jobs = Jobs({"jobDefaults": defaults, "jobNodes": ["ts-worker-1"]})
    jobs.submit(job, {}, {})
    (detached,) = [argv[2] for argv in node.ran if argv[:2] == ["sh", "-c"]]
    argv = shlex.split(detached.removeprefix("setsid nohup ").split(" >/dev/null")[0])
    assert argv[argv.index("--data") + 1] == "none"  # the manifest's, over the stack's data
    node.ran.clear()
    with pytest.raises(CliError, match=r"--data 'digits': the job's manifest .* data = \"none\""):
        jobs.submit(job, {}, {"data": "digits"})
    assert not node.ran  # refused before anything reached the node


def test_data_none_on_the_command_line_points_at_the_manifest():
    with pytest.raises(CliError) as raised:
        _data("none")
    assert str(raised.value) == (
        '--data none: a job says it reads its own data in its manifest (data = "none" in '
        "[job], full mode), not on the command line"
    )


# --- the run: no data stage, no shard ----------------------------------------------------------


def _ctx() -> JobContext:
    return JobContext(
        params={}, rank=0, world_size=2, is_chief=True, strategy=None, tf=None,
        data=NoRankData(), n_features=0, n_classes=0, batch_size=32, epochs=3,
        learning_rate=1e-3, seed=42, steps_per_execution=1, steps_per_epoch=0, run_dir="/r",
        checkpoint_dir="/r/backup", model_path="/r/model.keras", task="",
    )  # fmt: skip


@pytest.mark.parametrize("task", ["", "regression"])
def test_no_data_stage_gives_an_empty_shard_and_the_manifests_task(tmp_path, task):
    manifest = OWN + (f'task = "{task}"\n' if task else "")
    spec = load_spec(_job(tmp_path / "job", manifest))
    cfg = TrainConfig(workers=2, output=str(tmp_path / "out"))
    info = no_data_stage(cfg, spec)
    assert (info.path, info.task, info.shard_rows, info.total_rows) == ("none", task, [0, 0], 0)
    run = RankRun(cfg, info, spec, 0, [], 1, 1, "w1", {})
    assert run.steps_per_epoch == 0 and isinstance(run.rank_data(), NoRankData)


def test_ctx_has_no_shard_and_says_why():
    ctx = _ctx()
    assert ctx.own_data and ctx.n_features is None and ctx.n_classes is None
    assert not hasattr(ctx, "x") and getattr(ctx, "y_val", "absent") == "absent"
    for name, touch in (("x", lambda: ctx.x), ("batches()", lambda: ctx.batches(0))):
        with pytest.raises(NoDataError) as raised:
            touch()
        assert str(raised.value) == (
            f'ctx.{name} is not available: the job\'s manifest says data = "none" (it reads '
            "its own data, so no data stage ran and there is no shard); load the data in "
            "train(ctx)"
        )
    assert "params={}" in repr(ctx)  # the rest of ctx is there as ever


def test_touching_the_shard_in_train_is_the_users_error_at_their_line(tmp_path):
    spec = load_spec(_job(tmp_path))
    import importlib.util

    loaded = importlib.util.spec_from_file_location("own_data_m", tmp_path / "m.py")
    assert loaded and loaded.loader
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    with pytest.raises(UserCodeError) as raised:
        call_user(spec, module.train, _ctx())
    first = str(raised.value).splitlines()[0]
    assert first.startswith("your code failed: NoDataError: ctx.x is not available: "), first
    assert first.endswith("load the data in train(ctx) (at m.py:2)"), first


# --- the result: the manifest's task, or none ---------------------------------------------------


def _result(tmp_path: Path, task: str) -> dict:
    cfg = TrainConfig(workers=2, output=str(tmp_path))
    spec = load_spec(_job(tmp_path / "job", OWN + (f'task = "{task}"\n' if task else "")))
    row = {"epoch": 1, "attempt": 1, "train_seconds": 1.0, "samples": 0, "val_loss": 0.5}
    (tmp_path / EPOCH_LOG).write_text(json.dumps(row) + "\n")
    (tmp_path / ATTEMPTS_LOG).write_text("1\n")
    chief = {"host": "w1", "peak_rss_mb": 1.0, "model_path": "/m", "returned": {"val_loss": 0.5}}
    info = no_data_stage(cfg, spec)
    return report.build_metrics(cfg, info, [chief], tmp_path, 3.0, 5.0)


def test_a_result_without_a_task_leaves_it_out_everywhere(tmp_path, capsys):
    metrics = _result(tmp_path, "")
    assert "task" not in metrics and metrics["data_path"] == "none"
    assert metrics["samples_per_second"] is None  # nothing counted the job's own samples
    summary = report.summary(metrics)
    assert "task" not in summary
    assert report.summary_line(summary).startswith("val_loss 0.5000 after 1 epochs")
    print_status({"id": "job-1", "state": "succeeded", "result": summary})
    assert "\n  val_loss 0.5000 after 1 epochs" in capsys.readouterr().out
    tags = RunFiles(tmp_path, {}, metrics, []).tags("dev")
    assert "trainstack.task" not in tags


def test_a_result_has_the_manifests_task(tmp_path, capsys):
    metrics = _result(tmp_path, "regression")
    assert metrics["task"] == "regression" and report.summary(metrics)["task"] == "regression"
    print_status({"id": "job-1", "state": "succeeded", "result": report.summary(metrics)})
    assert "  regression: val_loss 0.5000 after 1 epochs" in capsys.readouterr().out
    assert RunFiles(tmp_path, {}, metrics, []).tags("dev")["trainstack.task"] == "regression"


def test_the_examples_do_not_read_their_own_data():
    examples = Path(__file__).resolve().parents[2] / "examples"
    for job in sorted(p for p in examples.iterdir() if (p / "trainstack.toml").exists()):
        assert not load_spec(job).reads_own_data, job
