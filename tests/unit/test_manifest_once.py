"""The framework is decided once and carried: a job's manifest is read once where the job enters
(the stack's program; the driver, once per launch) and never by a rank, and a framework given to
`trainstack-train` that contradicts the manifest's is refused in one sentence. No Spark, no
framework: the driver's launch runs against a fake SparkContext whose barrier tasks run here."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from trainstack_training import cli, launcher, manifest, train
from trainstack_training.config import TrainConfig
from trainstack_training.frameworks.base import WorkerResult
from trainstack_training.jobsettings import apply_manifest
from trainstack_training.manifest import JobError, JobSpec, load_spec

from infra.config import StackConfig

pytestmark = pytest.mark.unit

TORCH_JOB = '[job]\nentry = "once_job"\nframework = "torch"\nrequirements = "r.txt"\n'
TF_JOB = '[job]\nentry = "once_job"\n'


def _job(root: Path, text: str, code: str = "def build_model(ctx): ...\n") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "trainstack.toml").write_text(text)
    (root / "once_job.py").write_text(code)
    (root / "r.txt").write_text("torch==2.15.0\n")
    return root


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every read of a manifest from now on (manifest._read_manifest: the TOML parse)."""
    reads: list[Path] = []
    real = manifest._read_manifest

    def counted(directory: Path) -> Any:
        reads.append(Path(directory))
        return real(directory)

    monkeypatch.setattr(manifest, "_read_manifest", counted)
    return reads


# --- the refusal ---------------------------------------------------------------------------


def test_a_framework_that_contradicts_the_manifest_is_refused_tensorflow_included(tmp_path):
    torch_job = load_spec(_job(tmp_path / "t", TORCH_JOB))
    with pytest.raises(JobError) as refused:
        apply_manifest(TrainConfig(framework="tensorflow"), torch_job)
    assert str(refused.value) == (
        "the run's framework='tensorflow' contradicts the job's manifest, whose framework is "
        f"'torch' ({tmp_path / 't'}/trainstack.toml): a job's framework is its manifest's, so "
        "leave --framework out or give 'torch' (to train with 'tensorflow', set framework in "
        "the manifest)"
    )
    tf_job = load_spec(_job(tmp_path / "f", TF_JOB))
    with pytest.raises(JobError) as refused:
        apply_manifest(TrainConfig(framework="torch"), tf_job)
    assert (
        "the run's framework='torch' contradicts the job's manifest, whose framework is "
        f"'tensorflow' ({tmp_path / 'f'}/trainstack.toml, the default when it names none)"
    ) in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("given", ["", "torch"])
def test_left_out_or_repeated_the_framework_is_the_manifests(tmp_path, given):
    cfg = TrainConfig(framework=given)
    apply_manifest(cfg, load_spec(_job(tmp_path, TORCH_JOB)))
    assert cfg.framework == "torch"
    assert TrainConfig().validate().framework == ""  # nothing decided before the manifest


def test_trainstack_train_prints_the_refusal_without_a_traceback(tmp_path, capsys):
    job = _job(tmp_path / "job", TORCH_JOB)
    code = cli.main(
        ["--job-dir", str(job), "--job-env", str(tmp_path / "site"), "--framework", "tensorflow",
         "--output", str(tmp_path / "out")]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2, err
    assert err.startswith("trainstack-train: error: the run's framework='tensorflow' contradicts")
    assert "Traceback" not in err
    last = json.loads(out.strip().splitlines()[-1])
    assert (last["ok"], last["kind"]) == (False, "JobError")


# --- read once -----------------------------------------------------------------------------


def test_the_spec_travels_to_the_ranks_as_data(tmp_path):
    spec = load_spec(_job(tmp_path, TORCH_JOB), {"lr": 0.1})
    assert JobSpec.from_json(spec.to_json()) == spec


class _Task:
    """What a barrier task asks of pyspark's BarrierTaskContext."""

    def __init__(self, index: int, workers: int) -> None:
        self.index, self.workers = index, workers

    def partitionId(self) -> int:  # noqa: N802 (pyspark's name)
        return self.index

    def getTaskInfos(self) -> list[Any]:  # noqa: N802
        return [SimpleNamespace(address=f"127.0.0.1:{7000 + i}") for i in range(self.workers)]

    def allGather(self, message: str) -> list[str]:  # noqa: N802
        return [f"127.0.0.1:{7100 + i}" for i in range(self.workers)]

    def cpus(self) -> int:
        return 1


class _Spark:
    """A SparkContext whose barrier stage runs its tasks one after the other, here."""

    applicationId = "app-fake"  # noqa: N815

    def __init__(self, current: list[_Task]) -> None:
        self.current = current

    def parallelize(self, items: Any, slices: int) -> _Spark:
        self.slices = slices
        return self

    def barrier(self) -> _Spark:
        return self

    def mapPartitions(self, fn: Any) -> _Spark:  # noqa: N802
        self.fn = fn
        return self

    def repartition(self, n: int) -> _Spark:
        return self

    def collect(self) -> list[str]:
        rows: list[str] = []
        for index in range(self.slices):
            self.current[:] = [_Task(index, self.slices)]
            rows += self.fn(iter([index]))
        return rows

    def stop(self) -> None:
        pass


class _Backend:
    """A framework's backend that trains nothing and remembers what each rank was given."""

    def __init__(self, seen: list[tuple[str, str, str]], framework: str) -> None:
        self.seen, self.framework = seen, framework

    def configure(self, run: Any) -> None:
        pass

    def load(self, run: Any) -> None:
        return None

    def run(self, run: Any, module: Any, framework: Any) -> WorkerResult:
        self.seen.append((self.framework, run.spec.framework, run.cfg.framework))
        return WorkerResult(
            task_index=run.rank, attempt=run.attempt, host=run.host, epochs_run=1,
            train_seconds=0.0, fit_seconds=0.0, samples=0, peak_rss_mb=0.0,
            timings={"task_start_at": time.time()},
        )  # fmt: skip


def test_a_driver_launch_reads_the_manifest_once_and_its_ranks_never(tmp_path, monkeypatch):
    """`trainstack-train`'s whole launch, ranks included: one read of the manifest (the
    driver's, before Spark), the framework decided there and carried to every rank."""
    from contextlib import nullcontext

    import pyspark

    job = _job(tmp_path / "job", TORCH_JOB.replace("requirements", 'data = "none"\nrequirements'),
               "def train(ctx): ...\n")  # fmt: skip
    current: list[_Task] = []
    seen: list[tuple[str, str, str]] = []
    monkeypatch.setattr(pyspark.BarrierTaskContext, "get", lambda: current[0])
    monkeypatch.setattr(launcher, "build_context", lambda cfg: _Spark(current))
    monkeypatch.setattr(launcher, "wait_for_slots", lambda *args: 0.0)
    monkeypatch.setattr(launcher, "MemoryWatch", lambda *args: nullcontext())
    monkeypatch.setattr(launcher, "RankLog", lambda *args: nullcontext())
    monkeypatch.setattr(launcher, "_report", lambda cfg, spec, info, results, *rest: results)
    monkeypatch.setattr(train, "backend_for", lambda framework: _Backend(seen, framework))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "once_job", raising=False)
    reads = _count_reads(monkeypatch)
    cfg = TrainConfig(
        master="spark://fake:7077", workers=2, job_dir=str(job), output=str(tmp_path / "out"),
        job_env=str(tmp_path / "site"),
    )  # fmt: skip
    results: Any = launcher.run(cfg)
    monkeypatch.delitem(sys.modules, "once_job", raising=False)
    assert [r["task_index"] for r in results] == [0, 1]
    assert reads == [job.resolve()]  # the driver's one read; none in either rank
    assert seen == [("torch", "torch", "torch")] * 2  # decided once, carried to both ranks


def test_the_stacks_program_reads_the_declared_jobs_manifest_once(tmp_path, monkeypatch):
    """The config's check (checks._job) and the program (infra.program.load_job) share one
    read of the declared job's manifest."""
    from infra.program import job_data, load_job

    job = _job(tmp_path, TORCH_JOB)
    reads = _count_reads(monkeypatch)
    config = StackConfig.from_mapping({"job": str(job)})
    spec = load_job(config)
    assert (spec.framework, job_data(config, spec, "sha1")) == ("torch", "digits")
    assert load_job(config) is spec
    assert reads == [job]
