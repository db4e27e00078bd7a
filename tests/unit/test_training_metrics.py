"""The training run's push to the Pushgateway, without a Pushgateway."""

import prometheus_client
import pytest
from trainstack_training import metrics

pytestmark = pytest.mark.unit


def test_no_pushgateway_no_callback(monkeypatch):
    monkeypatch.delenv(metrics.PUSHGATEWAY_ENV, raising=False)
    assert metrics.keras_callbacks(None, "/x/run-1", 3, 2, True, 1, None, 64) == []


def test_only_the_chief_pushes(monkeypatch):
    monkeypatch.setenv(metrics.PUSHGATEWAY_ENV, "http://gw:9091")
    assert metrics.keras_callbacks(None, "/x/run-1", 3, 2, False, 1, None, 64) == []


def test_push_groups_by_run_id_and_sets_the_epoch(monkeypatch):
    pushed = []
    monkeypatch.setattr(
        prometheus_client,
        "push_to_gateway",
        lambda gw, job, registry, grouping_key, timeout: pushed.append(
            (gw, job, grouping_key, {m.name: m.samples[0].value for m in registry.collect()})
        ),
    )
    pusher = metrics.EpochPusher("http://gw:9091", "run-abc", epochs=3, workers=2)
    assert pusher.push(0, 1)
    assert "trainstack_training_loss" not in pushed[-1][3]  # no loss before an epoch ends
    assert pusher.push(2, 1, {"loss": 0.5, "val_accuracy": 0.9, "lr": 1.0}, 1000.0)
    gw, job, key, values = pushed[-1]
    assert (gw, job, key) == ("http://gw:9091", "trainstack_training", {"run_id": "run-abc"})
    assert values["trainstack_training_epoch"] == 2
    assert values["trainstack_training_epochs"] == 3
    assert values["trainstack_training_loss"] == 0.5
    assert values["trainstack_training_samples_per_second"] == 1000.0
    assert "trainstack_training_lr" not in values


def test_a_failed_push_does_not_raise(monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise OSError("connection refused")

    monkeypatch.setattr(prometheus_client, "push_to_gateway", refuse)
    pusher = metrics.EpochPusher("http://gw:9091", "run-abc", epochs=3, workers=2)
    assert pusher.push(1, 1) is False
    assert "connection refused" in capsys.readouterr().err


def test_the_runners_yields_are_one_counter_of_the_cluster(monkeypatch):
    pushed = []
    monkeypatch.setattr(
        prometheus_client,
        "push_to_gateway",
        lambda gw, job, registry, timeout: pushed.append(
            (gw, job, {s.name: s.value for m in registry.collect() for s in m.samples})
        ),
    )
    assert metrics.push_runner_yields("http://gw:9091", 3)
    gw, job, values = pushed[-1]
    assert (gw, job) == ("http://gw:9091", "trainstack_runner")
    assert values["trainstack_runner_yields_total"] == 3
    assert metrics.push_runner_yields("", 4) is False and len(pushed) == 1  # no Pushgateway
