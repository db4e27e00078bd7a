"""The job contract end to end in local[2] (real Spark, real TensorFlow): both examples
train, a job's parameters reach its code, and a bad job or an error in the job's code is
one clear failure naming the user's file and line. The jobs run in one warm runner, as the
stack's jobs do (conftest.warm_runner); test_training.py runs jobs in their own application."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from trainstack_training.rundir import ATTEMPTS_LOG, ERROR_FILE

from .conftest import EXAMPLES, IN_WARM_RUNNER, in_warm_runner, run_cli

pytestmark = [pytest.mark.training, pytest.mark.usefixtures("warm_runner")]

# After one rank fails, the other ranks stop within this many seconds (docs/jobs.md).
STOP_OTHER_RANKS_S = 15
# Barrier-stage attempts of the failing jobs below (--max-attempts): the first and 3 retries.
MAX_ATTEMPTS = 4
WORKERS = 2  # trainstack-train's default


def run_job(args: list[str], timeout: int = 600) -> tuple[int, dict, str]:
    """`run_cli` in the module's warm runner; the job must have run there."""
    rc, summary, err = run_cli([*args, *IN_WARM_RUNNER], timeout)
    assert in_warm_runner(err), err[-3000:]
    return rc, summary, err


def _record_start(path: Path) -> str:
    """One line of job code that appends "<rank> <attempt>" to `path` each time it runs."""
    return f"    open({str(path)!r}, 'a').write(f'{{ctx.rank}} {{ctx.attempt}}\\n')\n"


def _starts(path: Path) -> list[tuple[int, int]]:
    """The (rank, attempt) of each run of the job's code that `_record_start` recorded."""
    lines = path.read_text().split("\n") if path.exists() else []
    return [(int(r), int(a)) for r, a in (ln.split() for ln in lines if ln.strip())]


def _check_the_code_ran_in_one_attempt_only(
    out: Path, starts_file: Path
) -> tuple[Counter[int], int]:
    """Spark ran all MAX_ATTEMPTS barrier-stage attempts (rank 0 logs each one's start before
    the ranks meet), yet the job's code ran in one attempt only, at most once per rank: the
    retries after it failed at once on the recorded error. That attempt is the first unless
    an earlier one failed before the code started (seen in CI on a loaded machine: TensorFlow's
    gRPC server could not bind the port its rank had picked, and Spark retried the stage).
    Returns the code's runs per rank and the rank whose error was recorded."""
    attempts = (out / ATTEMPTS_LOG).read_text().splitlines()
    assert len(attempts) == MAX_ATTEMPTS, attempts
    starts = _starts(starts_file)
    print(f"{len(attempts)} barrier-stage attempts; the job's code started as {starts}")
    assert starts, "the job's code never started: the count below would prove nothing"
    ran_in = {a for _, a in starts}
    assert len(ran_in) == 1, f"the code reran in a retry: {starts}"
    assert min(ran_in) < MAX_ATTEMPTS, f"the code ran in the last attempt only: {starts}"
    per_rank = Counter(r for r, _ in starts)
    assert set(per_rank) <= set(range(WORKERS)) and max(per_rank.values()) == 1, starts
    return per_rank, int(json.loads((out / ERROR_FILE).read_text())["rank"])


def _job(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_the_convolutional_example_trains_in_full_mode(tmp_path):
    rc, s, err = run_job(
        ["--job-dir", str(EXAMPLES / "digits-cnn"), "--epochs", "8", "--output", str(tmp_path)]
    )
    assert rc == 0, err[-3000:]
    assert s["final_val_accuracy"] >= 0.85 and s["epochs"] == 8, s
    metrics = json.loads(Path(s["metrics_path"]).read_text())
    assert len(metrics["val_accuracy"]) == 8  # the curves come from ctx.callbacks()'s log
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_params_reach_the_code_and_datasets_transform_the_shard(tmp_path):
    job = _job(
        tmp_path / "job",
        {
            "trainstack.toml": '[job]\nentry = "m"\n[params]\nunits = 4\n',
            "m.py": (
                "def datasets(ctx):\n"
                "    return (ctx.x * 0.5, ctx.y), (ctx.x_val * 0.5, ctx.y_val)\n\n"
                "def build_model(ctx):\n"
                "    tf = ctx.tf\n"
                "    assert ctx.params == {'units': 7}, ctx.params\n"
                "    print(f'rank {ctx.rank} builds {ctx.params[\"units\"]} units')\n"
                "    m = tf.keras.Sequential([tf.keras.layers.Input((ctx.n_features,)),\n"
                "        tf.keras.layers.Dense(ctx.params['units'], activation='relu'),\n"
                "        tf.keras.layers.Dense(ctx.n_classes)])\n"
                "    m.compile('adam', tf.keras.losses.SparseCategoricalCrossentropy(True),\n"
                "        metrics=['accuracy'])\n"
                "    return m\n"
            ),
        },
    )
    rc, s, err = run_job(
        ["--job-dir", str(job), "--job-params", '{"units": 7}', "--epochs", "2",
         "--output", str(tmp_path / "out"), "--no-plot"]
    )  # fmt: skip
    assert rc == 0, err[-3000:]
    assert s["epochs"] == 2
    # What the job's code printed is in its rank's own log (`trainstack logs --rank N`).
    log = (tmp_path / "out" / "rank-0.log").read_text()
    assert log.startswith("--- rank 0, attempt 1, on ") and "rank 0 builds 7 units" in log, log


def test_an_error_in_the_users_code_names_their_file_and_line_and_is_not_retried(tmp_path):
    job = _job(
        tmp_path / "job",
        {
            "trainstack.toml": '[job]\nentry = "m"\n',
            "m.py": (
                "def build_model(ctx):\n"
                + _record_start(tmp_path / "starts")
                + "    return ctx.params['missing']\n"
            ),
        },
    )
    out = tmp_path / "out"
    rc, s, _ = run_job(
        ["--job-dir", str(job), "--output", str(out), "--max-attempts", str(MAX_ATTEMPTS)]
    )
    assert rc == 1 and s["ok"] is False and s["kind"] == "JobCodeError", s
    assert s["error"].startswith("your code failed: KeyError: 'missing' (at m.py:3)")
    assert 'File "m.py", line 3, in build_model' in s["error"]
    assert "trainstack_training" not in s["error"] and "pyspark" not in s["error"]
    # The retried attempts fail at once on the recorded error: no code reruns.
    ran, recorded = _check_the_code_ran_in_one_attempt_only(out, tmp_path / "starts")
    assert ran[recorded] == 1, (recorded, ran)  # the error recorded is of the code's one run


def test_a_job_without_progress_fails_with_every_ranks_stacks(tmp_path):
    job = _job(
        tmp_path / "job",
        {
            "trainstack.toml": '[job]\nentry = "m"\nprogress_timeout = 4\n',
            "m.py": (
                "import time\n\n"
                "def wait_forever():\n"
                "    while True:\n"
                "        time.sleep(0.2)\n\n"
                "def train(ctx):\n" + _record_start(tmp_path / "starts") + "    wait_forever()\n"
            ),
        },
    )
    out = tmp_path / "out"
    rc, s, _ = run_job(
        ["--job-dir", str(job), "--output", str(out), "--max-attempts", str(MAX_ATTEMPTS)]
    )
    assert rc == 1 and s["kind"] == "JobCodeError", s
    assert s["error"].startswith("no progress for 4 s on rank "), s["error"]
    stacks = sorted(out.glob("stacks-rank*.txt"))
    assert stacks, list(out.iterdir())
    text = stacks[0].read_text()
    assert "in wait_forever" in text and "m.py" in text, text[:2000]
    # The stuck rank's own log ends with the same stacks (`trainstack logs --rank N`).
    rank = stacks[0].name.removeprefix("stacks-rank").removesuffix(".txt")
    log = (out / f"rank-{rank}.log").read_text()
    assert "trainstack: no progress for 4 s" in log and "in wait_forever" in log, log[-2000:]
    # One hang, not one per retry: the retries fail at once on the recorded error, so the code
    # ran in one attempt only and no rank hung twice (each hang appends its notice to
    # the rank's log, which every attempt appends to); the rank named in the error hung once.
    _ran, recorded = _check_the_code_ran_in_one_attempt_only(out, tmp_path / "starts")
    assert s["error"].startswith(f"no progress for 4 s on rank {recorded} "), s["error"]
    hung = {int(p.name.removeprefix("stacks-rank").removesuffix(".txt")) for p in stacks}
    assert recorded in hung and hung <= set(range(WORKERS)), (recorded, stacks)
    notices = {
        r: (out / f"rank-{r}.log").read_text().count("trainstack: no progress for 4 s")
        for r in range(WORKERS)
        if (out / f"rank-{r}.log").exists()
    }
    print(f"stacks files of ranks {sorted(hung)}; no-progress notices per rank log {notices}")
    assert notices[recorded] == 1 and max(notices.values()) == 1, notices
    # A notice comes after its rank's stacks file is written.
    assert {r for r, n in notices.items() if n} <= hung, (notices, hung)


def test_one_rank_failing_stops_the_others_within_seconds(tmp_path):
    """Rank 1 raises while rank 0 waits in a loop that never ends and reports no progress
    (the no-progress timeout is off): rank 0's process is stopped within seconds of the
    error, not when it gives up, and the job fails with rank 1's error."""
    alive = tmp_path / "rank0-alive"
    job = _job(
        tmp_path / "job",
        {
            "trainstack.toml": '[job]\nentry = "m"\nprogress_timeout = 0\n',
            "m.py": (
                "import time\n\n"
                "def train(ctx):\n"
                "    if ctx.rank == 1:\n"
                "        print(f'raising at {time.time()}', flush=True)\n"
                "        raise ValueError('rank one gives up')\n"
                "    while True:  # rank 0: alive until stopped\n"
                f"        open({str(alive)!r}, 'a').write(f'{{time.time()}}\\n')\n"
                "        time.sleep(0.1)\n"
            ),
        },
    )
    rc, s, _ = run_job(["--job-dir", str(job), "--output", str(tmp_path / "out")], timeout=600)
    assert rc == 1 and s["kind"] == "JobCodeError", s
    assert "ValueError: rank one gives up (at m.py:6)" in s["error"], s["error"]
    log = (tmp_path / "out" / "rank-1.log").read_text()
    raised = min(float(t) for t in re.findall(r"raising at ([0-9.]+)", log))
    last_alive = max(float(t) for t in alive.read_text().split())
    stopped_s = last_alive - raised
    print(f"rank 0 was stopped {stopped_s:.1f} s after rank 1 raised")
    assert stopped_s < STOP_OTHER_RANKS_S, (stopped_s, log[-2000:])


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"m.py": "def build_model(ctx): ..."}, "no trainstack.toml"),
        ({"trainstack.toml": '[job]\nentry = "m"\n', "m.py": "x = 1\n"}, "defines neither"),
    ],
    ids=["no-manifest", "no-entry-function"],
)
def test_a_bad_job_directory_fails_before_spark_starts(tmp_path, files, message):
    job = _job(tmp_path / "job", files)
    started = time.monotonic()
    rc, s, _ = run_cli(["--job-dir", str(job), "--output", str(tmp_path / "out")])
    assert rc == 2 and s["kind"] == "JobError" and message in s["error"], s
    assert time.monotonic() - started < 30


REGRESSION_JOB = """\
def _target(x):
    # A float per row: the mean pixel, scaled to [0, 1].
    return (x.mean(axis=1) / 16.0).astype("float32")


def train(ctx):
    tf = ctx.tf
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    train = (
        tf.data.Dataset.from_tensor_slices((ctx.x, _target(ctx.x)))
        .batch(ctx.global_batch_size, drop_remainder=True).repeat().with_options(options)
    )
    val = (
        tf.data.Dataset.from_tensor_slices((ctx.x_val, _target(ctx.x_val)))
        .batch(1024).repeat().with_options(options)
    )
    with ctx.strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.layers.Input((ctx.n_features,)),
            tf.keras.layers.Dense(16, activation="relu"),
            tf.keras.layers.Dense(1),
        ])
        model.compile(tf.keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    history = model.fit(
        train, epochs=ctx.epochs, steps_per_epoch=ctx.steps_per_epoch, validation_data=val,
        validation_steps=-(-len(ctx.x_val) // 1024), callbacks=ctx.callbacks(), verbose=0,
    )
    ctx.save_model(model)
    return RETURNED
"""


def test_a_regression_model_in_full_mode_reports_its_own_metrics(tmp_path):
    returned = (
        "{'val_mae': history.history['val_mae'][-1], 'val_loss': history.history['val_loss'][-1]}"
    )
    job = _job(
        tmp_path / "job",
        {
            "trainstack.toml": '[job]\nentry = "m"\n',
            "m.py": REGRESSION_JOB.replace("RETURNED", returned),
        },
    )
    out = tmp_path / "out"
    rc, s, err = run_job(["--job-dir", str(job), "--epochs", "3", "--output", str(out)])
    assert rc == 0 and s["ok"], (s, err[-3000:])
    assert "accuracy" not in s and "final_val_accuracy" not in s, s
    assert set(s["final"]) == {"val_mae", "val_loss"} and s["metric"] == "val_loss", s
    assert 0 <= s["final"]["val_mae"] < 1, s
    metrics = json.loads(Path(s["metrics_path"]).read_text())
    assert {k: len(v) for k, v in metrics["history"].items()} == {
        "loss": 3,
        "mae": 3,
        "val_loss": 3,
        "val_mae": 3,
    }, metrics["history"]
    assert metrics["final"] == s["final"]  # the returned dict, verbatim
    assert Path(s["model_path"]).exists() and (out / "curves.png").stat().st_size > 0


def test_a_returned_value_that_is_not_a_number_is_named_not_a_traceback(tmp_path):
    job = _job(
        tmp_path / "job",
        {
            "trainstack.toml": '[job]\nentry = "m"\n',
            "m.py": REGRESSION_JOB.replace("RETURNED", "{'val_mae': 'good'}"),
        },
    )
    rc, s, _ = run_job(["--job-dir", str(job), "--epochs", "1", "--output", str(tmp_path / "o")])
    assert rc == 1 and s["ok"] is False and s["kind"] == "JobCodeError", s
    assert s["error"] == (
        "your code failed: train(ctx) in m.py returned val_mae='good'; each value of the "
        "returned dict must be a number (a metric's final value)"
    ), s["error"]


def test_the_regression_example_trains_in_simple_mode(tmp_path):
    # examples/regression: float labels (a regression, declared in its manifest), its own
    # table, `loss="mse", metrics=["mae"]`, val_mae shown first (the manifest's `metric`).
    example = EXAMPLES / "regression"
    data = str(example / "data" / "diabetes.parquet")
    rc, s, err = run_job(
        ["--job-dir", str(example), "--data", data, "--epochs", "3", "--output", str(tmp_path)]
    )
    assert rc == 0 and s["ok"], (s, err[-3000:])
    assert s["task"] == "regression" and s["metric"] == "val_mae", s
    assert "accuracy" not in s and "final_val_accuracy" not in s, s
    metrics = json.loads(Path(s["metrics_path"]).read_text())
    assert metrics["task"] == "regression" and metrics["data_path"] == "arrow", metrics
    assert metrics["config"]["label_col"] == "progression"  # the manifest's label
    assert set(metrics["final"]) == {"loss", "mae", "val_loss", "val_mae"}, metrics["final"]
    assert not [k for k in metrics if "accuracy" in k], sorted(metrics)
    assert {k: len(v) for k, v in metrics["history"].items()} == dict.fromkeys(
        ("loss", "mae", "val_loss", "val_mae"), 3
    )
    assert all(v > 0 for v in metrics["final"].values()), metrics["final"]
    assert Path(s["model_path"]).exists() and (tmp_path / "curves.png").stat().st_size > 0


OWN_DATA_JOB = """\
import numpy as np

WEIGHTS = np.array([1.0, -2.0, 0.5, 3.0], dtype="float32")


def _rows(seed, n):
    x = np.random.default_rng(seed).normal(size=(n, 4)).astype("float32")
    return x, (x @ WEIGHTS + 0.1).astype("float32")


def train(ctx):
    tf = ctx.tf
    try:
        ctx.x
    except AttributeError as exc:
        print(f"rank {ctx.rank}: {exc}")
    assert ctx.n_features is None and ctx.steps_per_epoch == 0 and ctx.task == "", ctx.task
    x, y = _rows(ctx.seed + ctx.rank, 256)  # this rank's own rows, made here
    x_val, y_val = _rows(1000, 128)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    train = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .batch(ctx.global_batch_size, drop_remainder=True).repeat().with_options(options)
    )
    val = tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(128).repeat()
    with ctx.strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(1)])
        model.compile(tf.keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
    for epoch in range(ctx.epochs):  # Python's count: 0 .. epochs - 1
        history = model.fit(train, epochs=1, steps_per_epoch=len(x) // ctx.batch_size, verbose=0)
        val_loss, val_mae = model.evaluate(val.with_options(options), steps=1, verbose=0)
        ctx.report(epoch=epoch, loss=history.history["loss"][-1], val_loss=val_loss,
                   val_mae=val_mae)
    ctx.save_model(model)
    return {"val_loss": val_loss, "val_mae": val_mae}
"""


def test_a_full_mode_job_that_reads_its_own_data_runs_no_data_stage(tmp_path):
    # data = "none": no data stage (no Spark SQL, nothing read), no shard in ctx, no task in
    # the result (the manifest names none), and a `range(epochs)` loop's reports shown 1..N.
    job = _job(
        tmp_path / "job",
        {"trainstack.toml": '[job]\nentry = "m"\ndata = "none"\n', "m.py": OWN_DATA_JOB},
    )
    out = tmp_path / "out"
    rc, s, err = run_job(["--job-dir", str(job), "--epochs", "3", "--output", str(out)])
    assert rc == 0 and s["ok"], (s, err[-3000:])
    assert '[trainstack] no data stage: the job reads its own data (data = "none"' in err
    assert "task" not in s and set(s["final"]) == {"val_loss", "val_mae"}, s
    metrics = json.loads(Path(s["metrics_path"]).read_text())
    assert "task" not in metrics and metrics["data_path"] == "none", metrics
    assert metrics["config"]["data"] == "none" and metrics["data_rows"] == 0
    phases = metrics["job_phases"]
    assert "spark_sql_session" not in phases and not [p for p in phases if "data" in p], phases
    assert not (out / "data").exists()  # the data stage's shards: none written
    rows = [json.loads(line) for line in (out / "epochs.jsonl").read_text().splitlines()]
    assert [(r["epoch"], r["reported_epoch"]) for r in rows] == [(1, 0), (2, 1), (3, 2)], rows
    assert metrics["epochs"] == 3 and len(metrics["history"]["val_mae"]) == 3
    assert metrics["final"]["val_mae"] < 1.5, metrics["final"]  # it learned something
    assert Path(s["model_path"]).exists()
    log = (out / "rank-0.log").read_text()
    assert 'rank 0: ctx.x is not available: the job\'s manifest says data = "none"' in log, log
