"""The alert `TrainingNoProgress` fires: the prometheus role's rules, rendered the way the
product renders them (python -m infra.monitoring check), fed series of the training metrics
by `promtool test rules`. It fires once a run with epochs left has pushed no progress for
longer than the timeout, and not while the run makes progress or once it has finished.
promtool comes from `make setup` (tools/bin); without it this test fails and says so."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from infra.config import StackConfig
from infra.monitoring.__main__ import ROOT, render

pytestmark = pytest.mark.unit

ALERT = "TrainingNoProgress"
TIMEOUT_S = 300  # monitoringProgressTimeout below; not the default (600 s)
INTERVAL_S = 60
MINUTES = 20
# As Prometheus stores them when it scrapes the Pushgateway (honor_labels; the scrape's node).
LABELS = {"job": "trainstack_training", "node": "control-1"}


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool as `python -m infra.monitoring check` finds it (on PATH, which scripts/env.sh
    puts tools/bin on), else in tools/bin; missing, the tests fail (never skip) and say why."""
    found = shutil.which("promtool") or shutil.which("promtool", path=str(ROOT / "tools" / "bin"))
    if not found:
        pytest.fail(
            "promtool is neither on PATH nor in tools/bin: run `make setup` (step promtool), "
            'then `eval "$(scripts/env.sh)"`',
            pytrace=False,
        )
    return found


@pytest.fixture(scope="module")
def rules(tmp_path_factory) -> Path:
    """rules.yml as the product renders it (the prometheus role's template, the project's
    group_vars), for a stack whose progress timeout is TIMEOUT_S."""
    out = tmp_path_factory.mktemp("prometheus")
    render(out, StackConfig.from_mapping({"monitoringProgressTimeout": f"{TIMEOUT_S // 60}m"}))
    return out / "rules.yml"


def series(metric: str, run_id: str, values: list[float]) -> dict[str, str]:
    labels = ",".join(f'{k}="{v}"' for k, v in {**LABELS, "run_id": run_id}.items())
    return {"series": f"{metric}{{{labels}}}", "values": " ".join(f"{v:g}" for v in values)}


def run(run_id: str, progress: list[float], epoch: int, epochs: int) -> list[dict[str, str]]:
    """A run's series, one sample a minute: when the chief last pushed (seconds since the
    start of the test's clock), its last finished epoch and its epochs."""
    n = len(progress)
    return [
        series("trainstack_training_last_progress_timestamp_seconds", run_id, progress),
        series("trainstack_training_epoch", run_id, [epoch] * n),
        series("trainstack_training_epochs", run_id, [epochs] * n),
    ]


def firing(rules: Path, run_id: str) -> dict:
    """The alert promtool must see firing for `run_id`: labels and annotations."""
    rule = next(
        r
        for g in yaml.safe_load(rules.read_text())["groups"]
        for r in g["rules"]
        if r.get("alert") == ALERT
    )
    return {
        "exp_labels": {**LABELS, "run_id": run_id, "severity": "warning"},
        "exp_annotations": {
            "summary": f"Training run {run_id} made no progress for {TIMEOUT_S} s",
            "description": rule["annotations"]["description"],
        },
    }


def promtool_passes(
    promtool: str, tmp_path: Path, rules: Path, name: str, series: list[dict], checks: list[dict]
) -> None:
    """`promtool test rules` with one test case: `series` in, `checks` (at()) must hold."""
    tests = [{"name": name, "input_series": series, "alert_rule_test": checks}]
    test_file = tmp_path / "progress_test.yml"
    test_file.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(rules)],
                "evaluation_interval": f"{INTERVAL_S}s",
                "tests": [{"interval": f"{INTERVAL_S}s", **t} for t in tests],
            },
            sort_keys=False,
        )
    )
    result = subprocess.run(
        [promtool, "test", "rules", str(test_file)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def at(minute: int, exp_alerts: list[dict]) -> dict:
    return {"eval_time": f"{minute}m", "alertname": ALERT, "exp_alerts": exp_alerts}


def test_the_rendered_rule_uses_the_stacks_progress_timeout(rules):
    text = rules.read_text()
    assert f"alert: {ALERT}" in text
    assert f"> {TIMEOUT_S}\n" in text, textwrap.indent(text, "  ")


def test_a_stalled_run_fires_after_the_timeout_with_its_labels(promtool, tmp_path, rules):
    # The chief pushed at 0 s, then nothing: epoch 3 of 10. `for:`-less, the rule's own window
    # is the timeout: silent for 300 s is not yet over it, 360 s is.
    stalled = run("run-stalled", [0] * (MINUTES + 1), 3, 10)
    promtool_passes(
        promtool,
        tmp_path,
        rules,
        "a stalled run",
        stalled,
        [
            at(0, []),
            at(TIMEOUT_S // 60, []),
            at(TIMEOUT_S // 60 + 1, [firing(rules, "run-stalled")]),
            at(MINUTES, [firing(rules, "run-stalled")]),
        ],
    )


def test_a_run_making_progress_or_finished_does_not_fire(promtool, tmp_path, rules):
    # Progress every 4 minutes (silent for up to 240 s, under the 300 s timeout).
    steps = [float(m // 4 * 4 * 60) for m in range(MINUTES + 1)]
    assert max(m * 60 - s for m, s in enumerate(steps)) == 4 * 60 - 60
    progressing = run("run-progressing", steps, 3, 10)
    # Silent since 0 s, but all its epochs are done.
    finished = run("run-finished", [0] * (MINUTES + 1), 10, 10)
    # And beside them a stalled run, which fires alone: the alert is live in this very test.
    stalled = run("run-stalled", [0] * (MINUTES + 1), 3, 10)
    promtool_passes(
        promtool,
        tmp_path,
        rules,
        "runs that make progress or have finished",
        progressing + finished + stalled,
        [
            at(m, [firing(rules, "run-stalled")] if m * 60 > TIMEOUT_S else [])
            for m in range(MINUTES + 1)
        ],
    )
