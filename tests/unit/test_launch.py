"""One launch path (issue 39): the `trainstack-train` command line of the stack's declared job
and of `trainstack submit` come from one builder, infra.jobs.launch's `train_command`, from one
typed `LaunchSettings`. No Pulumi run, no cluster: both callers run against a fake node.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest

from infra.components import training
from infra.components.training import _job_command, _TrainingJobProvider
from infra.jobs import commands
from infra.jobs.commands import Jobs, queued_command
from infra.jobs.launch import TRAIN, LaunchSettings, runner_command, train_command
from infra.jobs.remote import JOBS_DIR, MODELS_DIR, NODE_VENV, QUEUE_LOCK
from tests.support.fakes import SubmittingNode

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits"
MASTER = "spark://control-1:7077,control-2:7077"
# The stack's settings as infra.program's training_settings makes them (the declared job's
# props) and as `jobDefaults` carries them (less the job's own keys, with the master's URL).
STACK = {
    "workers": 2,
    "epochs": 3,
    "batch_size": 32,
    "data": "digits",
    "rows": 0,
    "strategy": "multi-worker",
    "cores_per_worker": 1,
    "spark_conf": "spark.driver.memory=512m",
    "runner_keep_alive": 600,
    "runner_yield": False,
}


def _flags(argv: list[str]) -> dict[str, str | None]:
    """`trainstack-train`'s flags and their values (None: a flag without one)."""
    assert argv[0] == TRAIN, argv
    found: dict[str, str | None] = {}
    rest = argv[1:]
    for i, token in enumerate(rest):
        if not token.startswith("--"):
            continue
        value = rest[i + 1] if i + 1 < len(rest) else None
        found[token] = None if value is None or value.startswith("--") else value
    return found


# --- the builder ---------------------------------------------------------------------------------


def test_the_declared_job_passes_the_flags_it_passed_before():
    settings = {**STACK, "job_sha": "c" * 64, "job_params": '{"dropout": 0.1}', "env_sha": "d" * 64}
    command = _job_command(LaunchSettings.declared(settings, MASTER), f"{MODELS_DIR}/run-a")
    assert command[: command.index("--") + 1] == [
        f"{NODE_VENV}/bin/python", "-m", "trainstack_training.queue", f"{MODELS_DIR}/run-a",
        "--lock", QUEUE_LOCK, "--epochs", "3", "--tee", "--",
    ]  # fmt: skip
    assert _flags(command[command.index("--") + 1 :]) == {
        "--master": MASTER,
        "--workers": "2",
        "--epochs": "3",
        "--batch-size": "32",
        "--data": "digits",
        "--rows": "0",
        "--spark-conf": "spark.driver.memory=512m",
        "--job-dir": f"{JOBS_DIR}/{'c' * 64}",
        "--job-params": '{"dropout": 0.1}',
        "--job-env": f"{MODELS_DIR}/envs/{'d' * 64}/site",
        "--train-strategy": "multi-worker",
        "--cores-per-worker": "1",
        "--runner-keep-alive": "600",
        "--no-runner-yield": None,
        "--output": f"{MODELS_DIR}/run-a",
    }


def test_a_declared_run_from_an_earlier_state_leaves_out_the_keys_it_lacks():
    old = {k: STACK[k] for k in ("workers", "epochs", "batch_size", "data", "rows", "spark_conf")}
    command = train_command(LaunchSettings.declared(old, MASTER), "/r")
    assert set(_flags(command)) == {
        "--master", "--workers", "--epochs", "--batch-size", "--data", "--rows", "--spark-conf",
        "--output",
    }  # fmt: skip
    # Off or default values leave their flag out too: trainstack-train's defaults are the same.
    quiet = {**STACK, "job_sha": "", "runner_keep_alive": 0, "runner_yield": True, "strategy": ""}
    flags = _flags(train_command(LaunchSettings.declared(quiet, MASTER), "/r"))
    assert not {"--job-dir", "--job-env", "--train-strategy", "--runner-keep-alive"} & set(flags)
    assert "--no-runner-yield" not in flags


def test_a_submitted_job_passes_every_flag_defaults_included():
    defaults = {**STACK, "master_url": MASTER, "runner_keep_alive": 0, "runner_yield": True}
    launch = LaunchSettings.submitted(defaults, job_sha="e" * 64, job_params="{}", job_env="")
    flags = _flags(train_command(launch, "/r", app_name="trainstack-job-1"))
    assert flags["--job-env"] == "" and flags["--runner-keep-alive"] == "0"
    assert flags["--train-strategy"] == "multi-worker" and flags["--cores-per-worker"] == "1"
    assert flags["--app-name"] == "trainstack-job-1"
    assert "--no-runner-yield" not in flags
    no_key = {k: v for k, v in defaults.items() if k not in ("runner_keep_alive", "runner_yield")}
    launch = LaunchSettings.submitted(no_key, job_sha="e" * 64, job_params="{}", job_env="")
    assert launch.runner_keep_alive == 0 and launch.runner_yield


def test_the_output_then_the_hold_file_close_the_command():
    launch = LaunchSettings.declared(STACK, MASTER)
    command = train_command(launch, "/r", app_name="x", hold_file="/h")
    assert command[-4:] == ["--output", "/r", "--hold-file", "/h"]
    assert train_command(launch, "/r", app_name="x")[-2:] == ["--output", "/r"]


def test_the_settings_are_frozen():
    launch = LaunchSettings.declared(STACK, MASTER)
    with pytest.raises(AttributeError):
        launch.workers = 4  # type: ignore[misc]


# --- both callers, from the one builder -----------------------------------------------------------


def _declared(monkeypatch, tmp_path: Path, settings: dict, node=None) -> list[str]:
    """The command the declared job's provider streams on its node."""
    node = node or SubmittingNode()
    monkeypatch.setattr(training, "_candidates", lambda props: [node])
    monkeypatch.setattr(training, "_ship_job", lambda node, props: None)
    monkeypatch.delenv(training.TEST_HOLD_FILE_ENV, raising=False)
    props = {"master_url": MASTER, "settings": settings, "run_id": "run-a",
             "host_artifacts_dir": str(tmp_path), "monitoring_url": ""}  # fmt: skip
    _TrainingJobProvider()._run(props)
    (command,) = node.streamed
    return command


def _submitted(monkeypatch, tmp_path: Path, defaults: dict, node=None) -> tuple[list[str], str]:
    """The command `trainstack submit` starts on its node (detached), and the job's id."""
    node = node or SubmittingNode()
    monkeypatch.setattr(commands, "transports_for", lambda records: [node])
    monkeypatch.setattr(commands, "submitter", lambda nodes, check_venv=True: node)
    monkeypatch.setattr(commands, "ship", lambda node, packed: None)
    job = tmp_path / "job"
    shutil.copytree(EXAMPLE, job)
    job_id = Jobs({"jobDefaults": defaults, "jobNodes": ["ts-worker-1"]}).submit(job, {}, {})
    (detached,) = [argv[2] for argv in node.ran if argv[:2] == ["sh", "-c"]]
    line = detached.removeprefix("setsid nohup ").split(" >/dev/null")[0]
    return shlex.split(line), job_id


def test_the_declared_job_and_a_submitted_one_agree_on_the_shared_flags(monkeypatch, tmp_path):
    from trainstack_training.manifest import load_spec

    from infra.jobs import pack

    sha = pack(EXAMPLE).sha
    params = json.dumps(load_spec(EXAMPLE, {}).params, sort_keys=True)
    declared = _declared(monkeypatch, tmp_path, {**STACK, "job_sha": sha, "job_params": params})
    submitted, job_id = _submitted(monkeypatch, tmp_path, {**STACK, "master_url": MASTER})
    runner = submitted[: submitted.index("--") + 1]
    python = f"{NODE_VENV}/bin/python"
    run_dir = f"{MODELS_DIR}/{job_id}"
    assert runner == [python, "-m", "trainstack_training.queue", run_dir,
                      "--lock", QUEUE_LOCK, "--epochs", "3", "--"]  # fmt: skip
    # The same runner and queue; the declared job's output streamed to `pulumi up` (--tee).
    assert declared[: declared.index("--") + 1] == [
        *runner[:3], f"{MODELS_DIR}/run-a", *runner[4:-1], "--tee", "--",
    ]  # fmt: skip
    mine, theirs = _flags(declared[len(runner) + 1 :]), _flags(submitted[len(runner) :])
    # What differs is each caller's own: the run directory, submit's application name and its
    # `--job-env ""` (a job without packages; the declared job leaves the flag out).
    assert mine.pop("--output") == f"{MODELS_DIR}/run-a"
    assert theirs.pop("--output") == run_dir
    assert theirs.pop("--app-name") == f"trainstack-{job_id}"
    assert theirs.pop("--job-env") == ""
    assert mine == theirs
    assert mine["--job-dir"] == f"{JOBS_DIR}/{sha}" and "--no-runner-yield" in mine


def test_each_caller_runs_what_the_builder_makes(monkeypatch, tmp_path):
    settings = {**STACK, "job_sha": "c" * 64, "job_params": "{}"}
    declared = _declared(monkeypatch, tmp_path, settings)
    launch = LaunchSettings.declared(settings, MASTER)
    train = train_command(launch, f"{MODELS_DIR}/run-a")
    assert declared == runner_command(launch, f"{MODELS_DIR}/run-a", train, install=False, tee=True)
    submitted, job_id = _submitted(monkeypatch, tmp_path, {**STACK, "master_url": MASTER})
    sha = submitted[submitted.index("--job-dir") + 1].rsplit("/", 1)[-1]
    params = submitted[submitted.index("--job-params") + 1]
    launch = LaunchSettings.submitted(
        {**STACK, "master_url": MASTER}, job_sha=sha, job_params=params, job_env=""
    )
    run_dir = f"{MODELS_DIR}/{job_id}"
    assert submitted == queued_command(launch, run_dir, f"trainstack-{job_id}", install=False)
    assert submitted[submitted.index("--") + 1 :] == train_command(
        launch, run_dir, app_name=f"trainstack-{job_id}"
    )


def test_the_declared_job_starts_with_the_record_a_submitted_job_starts_with(monkeypatch, tmp_path):
    """One record for both (infra.jobs.launch.job_record): `trainstack status`/`list` show the
    stack's job, and the tracking sync reads the same fields for it."""
    from trainstack_training.manifest import load_spec

    from infra.jobs import pack

    sha = pack(EXAMPLE).sha
    spec = load_spec(EXAMPLE, {})
    params = json.dumps(spec.params, sort_keys=True)
    mine, theirs = SubmittingNode(), SubmittingNode()
    monkeypatch.setattr(training, "_candidates", lambda props: [mine])
    monkeypatch.setattr(training, "_ship_job", lambda node, props: None)
    facts = {"params": spec.params, "mode": spec.mode, "framework": spec.framework,
             "experiment": spec.experiment}  # fmt: skip
    props = {"master_url": MASTER, "settings": {**STACK, "job_sha": sha, "job_params": params},
             "run_id": "run-a", "host_artifacts_dir": str(tmp_path), "monitoring_url": "",
             "facts": facts, "job_source": str(EXAMPLE), "stack": "dev"}  # fmt: skip
    _TrainingJobProvider()._run(props)
    _, job_id = _submitted(monkeypatch, tmp_path, {**STACK, "master_url": MASTER}, theirs)
    declared = json.loads(mine.written[f"{MODELS_DIR}/run-a/job.json"])
    submitted = json.loads(theirs.written[f"{MODELS_DIR}/{job_id}/job.json"])
    assert set(declared) == set(submitted)
    assert (declared["id"], declared["origin"], declared["state"]) == ("run-a", "stack", "queued")
    assert (submitted["id"], submitted["origin"]) == (job_id, "submit")
    same = ("code_sha", "params", "mode", "framework", "epochs", "workers", "batch_size",
            "data", "experiment")  # fmt: skip
    assert {k: declared[k] for k in same} == {k: submitted[k] for k in same}
    assert declared["framework"] == "tensorflow" and declared["stack"] == "dev"


@pytest.mark.parametrize(
    ("workers", "slots", "strategy", "refusal"),
    [
        (3, 2, "multi-worker", "--workers 3: this cluster has 2 training slots (one rank each); "
         "ask for at most 2"),
        (2, 1, "multi-worker", "--workers 2: this cluster has 1 training slot (one rank each); "
         "ask for at most 1"),
        (0, 2, "multi-worker", "--workers 0: a job needs at least 1 worker"),
        (2, 2, "single", "--workers 2: the stack trains with the `single` strategy (one worker "
         "with all of its cores); leave --workers out"),
    ],
)  # fmt: skip
def test_a_job_larger_than_the_cluster_is_refused_before_anything_ships(
    workers, slots, strategy, refusal, monkeypatch
):
    node = SubmittingNode()
    monkeypatch.setattr(commands, "transports_for", lambda records: [node])
    monkeypatch.setattr(commands, "submitter", lambda nodes, check_venv=True: node)
    defaults = {**STACK, "master_url": MASTER, "slots": slots, "strategy": strategy,
                "workers": 1 if strategy == "single" else STACK["workers"]}  # fmt: skip
    jobs = Jobs({"jobDefaults": defaults, "jobNodes": ["ts-worker-1"]})
    with pytest.raises(commands.CliError) as caught:
        jobs.submit(EXAMPLE, {}, {"workers": workers})
    assert str(caught.value) == refusal and caught.value.code == commands.EXIT_INPUT
    assert node.ran == [] and node.written == {}


def test_a_job_sized_in_workers_gets_that_many_ranks(monkeypatch, tmp_path):
    defaults = {**STACK, "master_url": MASTER, "slots": 2}
    node = SubmittingNode()
    monkeypatch.setattr(commands, "transports_for", lambda records: [node])
    monkeypatch.setattr(commands, "submitter", lambda nodes, check_venv=True: node)
    monkeypatch.setattr(commands, "ship", lambda node, packed: None)
    job = tmp_path / "job"
    shutil.copytree(EXAMPLE, job)
    job_id = Jobs({"jobDefaults": defaults, "jobNodes": ["ts-worker-1"]}).submit(
        job, {}, {"workers": 1}
    )
    (detached,) = [argv[2] for argv in node.ran if argv[:2] == ["sh", "-c"]]
    command = shlex.split(detached.removeprefix("setsid nohup ").split(" >/dev/null")[0])
    assert _flags(command[command.index("--") + 1 :])["--workers"] == "1"
    assert json.loads(node.written[f"{MODELS_DIR}/{job_id}/job.json"])["workers"] == 1


def _with_workers(tmp_path: Path, value: str) -> Path:
    job = tmp_path / "sized"
    shutil.copytree(EXAMPLE, job)
    manifest = job / "trainstack.toml"
    manifest.write_text(manifest.read_text().replace("[job]\n", f"[job]\nworkers = {value}\n"))
    return job


def test_the_manifest_sizes_a_job_and_submit_workers_wins(monkeypatch, tmp_path):
    node = SubmittingNode()
    monkeypatch.setattr(commands, "transports_for", lambda records: [node])
    monkeypatch.setattr(commands, "submitter", lambda nodes, check_venv=True: node)
    monkeypatch.setattr(commands, "ship", lambda node, packed: None)
    jobs = Jobs({"jobDefaults": {**STACK, "master_url": MASTER, "slots": 2},
                 "jobNodes": ["ts-worker-1"]})  # fmt: skip
    job = _with_workers(tmp_path, "1")
    sized = jobs.submit(job, {}, {})
    chosen = jobs.submit(job, {}, {"workers": 2})
    records = {
        path.rsplit("/", 2)[-2]: json.loads(data)
        for path, data in node.written.items()
        if path.endswith("/job.json")
    }
    assert records[sized]["workers"] == 1 and records[chosen]["workers"] == 2


def test_a_manifest_larger_than_the_cluster_is_refused_before_anything_ships(monkeypatch, tmp_path):
    node = SubmittingNode()
    monkeypatch.setattr(commands, "transports_for", lambda records: [node])
    monkeypatch.setattr(commands, "submitter", lambda nodes, check_venv=True: node)
    jobs = Jobs({"jobDefaults": {**STACK, "master_url": MASTER, "slots": 2},
                 "jobNodes": ["ts-worker-1"]})  # fmt: skip
    with pytest.raises(commands.CliError) as caught:
        jobs.submit(_with_workers(tmp_path, "3"), {}, {})
    assert str(caught.value) == (
        "[job] workers = 3: this cluster has 2 training slots (one rank each); ask for at most 2"
    )
    assert node.written == {}


@pytest.mark.parametrize("value", ["0", "-1", '"two"', "true", "1.5"])
def test_a_bad_manifest_workers_names_the_value(tmp_path, value):
    from trainstack_training.manifest import JobError, load_spec

    with pytest.raises(JobError) as caught:
        load_spec(_with_workers(tmp_path, value))
    assert "[job] workers = " in str(caught.value) and "an integer >= 1" in str(caught.value)


@pytest.mark.parametrize(("concurrent", "slots"), [(True, ["--slots", "2"]), (False, [])])
def test_concurrent_jobs_off_queues_one_job_at_a_time(monkeypatch, tmp_path, concurrent, slots):
    """trainstack:concurrentJobs false: the queue process gets no capacity, so it admits one
    job at a time (trainstack_training.queue); the refusal still uses the cluster's slots."""
    defaults = {**STACK, "master_url": MASTER, "slots": 2, "concurrent": concurrent}
    submitted, _ = _submitted(monkeypatch, tmp_path, defaults)
    runner = submitted[: submitted.index("--") + 1]
    assert runner[runner.index("--epochs") + 2 : -1] == slots
