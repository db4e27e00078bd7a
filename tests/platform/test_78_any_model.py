"""Any Keras model, not only classifiers (docs/training.md, "The task"), through `trainstack
submit` on the shared stack: a regression in simple mode (examples/regression, its data
streamed) and one in full mode (its own `train(ctx)`), each with the model's own metrics in
`status --json` and no accuracy anywhere. The regression through `pulumi up` is test_75's.
Runs in the warm runner that test_77 left up: about 40 s."""

from __future__ import annotations

import json

import pytest

from tests.support.jobs import regression_full_mode

from .cli import EXAMPLES, submit_and_follow, trainstack, workers
from .conftest import MODELS, sh

pytestmark = pytest.mark.e2e


def no_accuracy(result: dict) -> list[str]:
    return [k for k in (*result, *result.get("final", {})) if "accuracy" in k]


def test_a_regression_in_simple_mode_through_submit(platform, engine):
    # Streamed (docs/training.md, Streaming): `--data-stream on` reaches the ranks, which
    # read their shards a row group at a time and their containers' memory limit (from their
    # cgroup, v1 or v2: the limit the stack gave the container).
    record, _ = submit_and_follow(
        platform, EXAMPLES / "regression", "--epochs", "3", "--data-stream", "on"
    )
    result = record["result"]
    assert result["input"] == "stream", result
    _, text = sh(platform.container("control-3"), f"cat {MODELS}/{record['id']}/metrics.json")
    inputs = json.loads(text)["worker_input"]
    limits = {
        round(engine.containers.get(name).attrs["HostConfig"]["Memory"] / 1024**2, 1)
        for name in workers(platform)
    }
    assert [w["input"] for w in inputs] == ["stream", "stream"], inputs
    assert {w["memory_limit_mb"] for w in inputs} <= limits, (inputs, limits)
    assert result["task"] == "regression" and result["metric"] == "val_mae", result
    assert set(result["final"]) == {"loss", "mae", "val_loss", "val_mae"}, result
    assert not no_accuracy(result), result
    shown = trainstack(platform, "status", record["id"]).stdout
    assert "regression" in shown and "val_mae" in shown and "accuracy" not in shown, shown


def test_a_regression_in_full_mode_through_submit(platform, tmp_path):
    job = regression_full_mode(EXAMPLES, tmp_path / "regression-full")
    record, _ = submit_and_follow(platform, job, "--epochs", "3")
    result = record["result"]
    assert record["mode"] == "full" and result["task"] == "regression", record
    # The returned dict, verbatim: its own names, not Keras'.
    assert set(result["final"]) == {"val_mae", "val_mse"}, result
    assert not no_accuracy(result), result
