"""Your own code on the shared stack (docs/jobs.md): a job directory of the user's with an
error fails the `up` with their error at their file and line, keeps the servers and launches
nothing more; the convolutional example (full mode), with a package of its own, then trains
through `pulumi up`, its code shipped by content and its package installed once; the
regression example (simple mode, float labels) trains through `pulumi up` with its own metrics
in the stack's output. Leaves the shared stack on its default job (examples/digits),
retrained."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .conftest import CONFIG, MODELS, sh

pytestmark = pytest.mark.e2e

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BROKEN = """\
def _width(ctx):
    return ctx.params["width"]


def build_model(ctx):
    tf = ctx.tf
    model = tf.keras.Sequential([tf.keras.layers.Dense(_width(ctx))])
    return model
"""


def test_an_error_in_the_users_code_fails_the_up_naming_their_file_and_line(
    platform, engine, tmp_path
):
    stack = platform.stack
    job = tmp_path / "broken-job"
    job.mkdir()
    (job / "trainstack.toml").write_text('[job]\nentry = "net"\n')
    (job / "net.py").write_text(BROKEN)
    (job / ".git").mkdir()  # never shipped
    (job / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    before = {c.name: c.id for c in engine.containers.list(filters={"label": stack.selector})}
    stack.set_config(job=str(job))
    try:
        failed = stack.run("up", "--yes", "--skip-preview", check=False)
    finally:
        stack.run("config", "rm", "trainstack:job")
    out = failed.stdout + failed.stderr
    assert failed.returncode != 0
    assert "your code failed: KeyError: 'width' (at net.py:2)" in out, out[-4000:]
    said = out[out.index("your code failed") :][:3000]
    # Their frames only: none of trainstack's or Spark's.
    assert 'File "net.py", line 7, in build_model' in said, said
    assert "trainstack_training" not in out.split("your code failed", 1)[1][:2000]
    after = {c.name: c.id for c in engine.containers.list(filters={"label": stack.selector})}
    assert after == before
    shipped = sh(platform.container("worker-1"), f"ls -a {MODELS}/jobs/*/ | sort -u")[1]
    assert "net.py" in shipped and ".git" not in shipped


def test_the_convolutional_example_trains_in_full_mode_through_pulumi_up(platform, tmp_path):
    stack = platform.stack
    # The example, with a package of its own that the nodes do not have (docs/jobs.md,
    # Packages): installed with the code by the `up`, imported on every TensorFlow worker.
    job = tmp_path / "digits-cnn"
    shutil.copytree(EXAMPLES / "digits-cnn", job)
    (job / "requirements.txt").write_text("tabulate==0.9.0\n")
    manifest = job / "trainstack.toml"
    manifest.write_text(
        manifest.read_text().replace("[job]\n", '[job]\nrequirements = "requirements.txt"\n')
    )
    with (job / "cnn.py").open("a") as cnn:
        cnn.write("\nimport tabulate  # noqa: E402,F401\n")
    stack.set_config(job=str(job))
    try:
        up = stack.up()
        result = platform.outputs()["training"]
    finally:
        stack.run("config", "rm", "trainstack:job")
    assert "shipped to" in up.stdout, up.stdout[-3000:]
    assert result["ok"] is True
    assert result["epochs"] == int(CONFIG["trainEpochs"])
    assert result["final_val_accuracy"] >= 0.85, result
    assert len(result["code_sha"]) == 64 and result["job"].endswith("digits-cnn")
    assert "installing packages" in up.stdout + up.stderr and len(result["env_sha"]) == 64
    code, _ = sh(
        platform.container("worker-1"),
        f"test -f {MODELS}/envs/{result['env_sha']}/site/tabulate/__init__.py",
    )
    assert code == 0
    code, rows = sh(
        platform.container("control-3"), f"cat {result['cluster_run_dir']}/epochs.jsonl"
    )
    assert code == 0, rows
    epochs = [json.loads(line)["epoch"] for line in rows.splitlines() if line.startswith("{")]
    assert epochs == list(range(1, int(CONFIG["trainEpochs"]) + 1))
    code, listing = sh(platform.container("worker-2"), f"ls {MODELS}/jobs/{result['code_sha']}")
    assert code == 0 and "cnn.py" in listing


def test_a_regression_trains_in_simple_mode_through_pulumi_up(platform):
    stack = platform.stack
    stack.set_config(job=str(EXAMPLES / "regression"))
    try:
        stack.up()
        result = platform.outputs()["training"]
    finally:
        stack.run("config", "rm", "trainstack:job")
    assert result["ok"] is True and result["job"].endswith("examples/regression"), result
    # The model's own metrics in the stack's output; nothing of a classifier's.
    assert result["task"] == "regression" and result["metric"] == "val_mae", result
    assert set(result["final"]) == {"loss", "mae", "val_loss", "val_mae"}, result
    assert not [k for k in (*result, *result["final"]) if "accuracy" in k], result
    assert result["epochs"] == int(CONFIG["trainEpochs"])


def test_back_on_the_default_job_a_new_run_then_nothing(platform):
    stack = platform.stack
    # A new run of it (its trigger is the code's sha), then nothing.
    back = stack.up()
    assert "launching on" in back.stdout
    assert platform.outputs()["training"]["job"].endswith("examples/digits")
    stack.run("preview", "--expect-no-changes")
