"""scripts/testplan.py: every test module runs in a tier, and the CI time table adds up."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def testplan():
    spec = importlib.util.spec_from_file_location("testplan", ROOT / "scripts" / "testplan.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["testplan"] = module
    spec.loader.exec_module(module)
    return module


ENGINE_MARKER = re.compile(r"pytest\.mark\.(?!unit\b|parametrize\b)\w+")


def test_every_test_directory_runs_in_exactly_one_engine_stream(testplan):
    paths = [p for s in testplan.ENGINE for p in s.paths]
    assert len(paths) == len(set(paths)), f"a path in two engine streams: {paths}"
    directories = {str(f.parent.relative_to(ROOT)) for f in (ROOT / "tests").rglob("test_*.py")} - {
        *testplan.NESTED,
        "tests/unit",
    }
    left_out = sorted(d for d in directories if not any(d.startswith(p) for p in paths))
    assert not left_out, (
        f"test directories in no stream of scripts/testplan.py ENGINE: {left_out}; add each to "
        "a stream (tests/README.md says which)"
    )
    for path in paths:
        assert (ROOT / path).exists(), f"ENGINE names {path}, which does not exist"


def test_every_engine_test_among_the_unit_tests_is_in_an_engine_stream(testplan):
    paths = {p for s in testplan.ENGINE for p in s.paths}
    marked = {
        str(f.relative_to(ROOT))
        for f in (ROOT / "tests" / "unit").glob("test_*.py")
        if ENGINE_MARKER.search(f.read_text())
    }
    assert "tests/unit/test_cancelled_program.py" in marked  # the check sees what it looks for
    assert marked <= paths, f"engine tests in tests/unit in no engine stream: {marked - paths}"


def test_every_module_among_the_unit_tests_runs_in_a_tier(testplan):
    """A module of tests/unit without the unit marker and in no engine stream runs nowhere:
    the fast tier selects `-m unit`, the engine streams take only the modules they name."""
    paths = {p for s in testplan.ENGINE for p in s.paths}
    nowhere = sorted(
        str(f.relative_to(ROOT))
        for f in (ROOT / "tests" / "unit").glob("test_*.py")
        if "pytest.mark.unit" not in f.read_text() and str(f.relative_to(ROOT)) not in paths
    )
    assert not nowhere, (
        f"modules of tests/unit that no tier runs: {nowhere}; mark them "
        "`pytestmark = pytest.mark.unit`, or name an engine test's module in an ENGINE stream"
    )


def test_the_tiers_are_graphs_each_stream_needing_only_streams_before_it(testplan):
    testplan.check_graph(testplan.FAST)
    testplan.check_graph(testplan.ENGINE)
    needs = {s.name: set(s.after) for s in testplan.ENGINE}
    # The shared stack needs only the baked image; the small stacks wait for the training tier
    # too, so that no more than two streams run at once.
    assert needs == {
        "newcomer+images": set(),
        "training": set(),
        "platform": {"newcomer+images"},
        "stacks+ssh": {"newcomer+images", "training"},
    }
    assert not any(s.after for s in testplan.FAST)
    with pytest.raises(ValueError, match="needs"):
        testplan.check_graph((testplan.Stream("b", after=("a",)), testplan.Stream("a")))
    with pytest.raises(ValueError, match="two streams"):
        testplan.check_graph((testplan.Stream("a"), testplan.Stream("a")))


def test_the_unit_stream_runs_every_unit_test(testplan):
    unit = next(s for s in testplan.FAST if s.name == "unit")
    assert unit.paths == ("tests",)
    assert testplan.stream_command(unit, "unit")[-1] == "tests"


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("", "not unit"),
        ("-m drills -x", "(not unit) and (drills)"),
        ("-mssh", "(not unit) and (ssh)"),
    ],
)
def test_a_users_marker_narrows_the_tiers_own(testplan, user, expected):
    command = testplan.pytest_command(("tests/platform",), "not unit", user.split())
    assert command[:3] == [sys.executable, "-m", "pytest"]
    assert command[command.index("-m", 3) + 1] == expected
    assert command.count("-m") == 2  # python's -m pytest, and one marker
    assert command[-1] == "tests/platform"


def test_no_tests_collected_passes_only_when_the_user_narrowed(testplan, monkeypatch):
    monkeypatch.delenv("PYTEST_ARGS", raising=False)
    assert not testplan.passed({"platform": 5})
    monkeypatch.setenv("PYTEST_ARGS", "-k rotation")
    assert testplan.passed({"platform": 5, "training+ssh": 0})
    assert not testplan.passed({"platform": 1})


def test_the_table_shows_each_module_the_index_and_the_counts(testplan, monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINSTACK_TIMES_DIR", str(tmp_path))
    testplan.write_record("speed", seconds=20.0, reference_seconds=10.0, index=2.0)
    testplan.write_record("setup", seconds=61)
    testplan.write_record("tier-fast", seconds=90, exit=0)
    testplan.write_record("stream-unit", seconds=88, exit=0)
    (tmp_path / "pytest-unit.json").write_text(
        json.dumps({"modules": {"tests/unit/test_a.py": 80}, "counts": {"passed": 500}})
    )
    testplan.write_record(
        "tier-engine",
        seconds=1800,
        exit=1,
        cores=2,
        cpu_busy=0.93,
        saturated=0.8,
        containers_cpu_s=1250,
        memory_peak_gib=17.2,
    )
    testplan.write_record("stream-newcomer+images", seconds=521, exit=0, cpu_s=300, started_s=0)
    testplan.write_record("stream-platform", seconds=1700, exit=1, cpu_s=754.4, started_s=521.3)
    testplan.write_record("stream-stacks+ssh", not_run=True)
    (tmp_path / "pytest-platform.json").write_text(
        json.dumps(
            {
                "modules": {"tests/platform/test_10_platform.py": 125.4},
                "counts": {"passed": 40, "failed": 2},
            }
        )
    )
    testplan.write_record("total", seconds=2400)
    text = "\n".join(testplan.table_lines(testplan.read_records()))
    # The engine tier's load over its whole length (its streams overlap): 0.93 x 2 x 30 min.
    tier = next(line for line in text.splitlines() if line.strip().startswith("engine tier"))
    assert tier.split()[2:4] == ["30:00", "CPU"], tier
    assert (
        "CPU 93% of 2 cores = 55.8 CPU-min (80% of the time all busy), containers' CPU 20:50, "
        "memory peak 17.2 GiB"
    ) in tier
    assert "machine-speed index" in text and "2.00" in text
    assert "tests/platform/test_10_platform.py" in text and "2:05" in text
    # Each stream's start since the tier's: platform started when the bake had passed.
    assert "started +0:00; host CPU 5:00" in text
    assert "exit 1; started +8:41; host CPU 12:34; 40 passed, 2 failed" in text
    assert re.search(r"stacks\+ssh +- +not run$", text, re.M), text
    assert "tests/unit/test_a.py" not in text  # the unit tier's modules stay out of the table
    assert "at reference speed 20:00" in text  # 40 min on a machine twice as slow
    assert text.splitlines()[-1] == "tests: 540 passed, 2 failed, 0 errors, 0 skipped"


def test_a_tiers_load_is_the_share_of_every_core_it_kept_busy(testplan, monkeypatch):
    monkeypatch.setattr(testplan.Load, "INTERVAL", 0.05)
    load = testplan.Load()
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:  # one core busy for half a second
        pass
    fields = load.fields()
    assert fields["cores"] == os.cpu_count()
    assert 1 / fields["cores"] / 2 < fields["cpu_busy"] <= 1, fields
    assert fields["saturated"] is not None and 0 <= fields["saturated"] <= 1, fields
    assert 0 < fields["memory_peak_gib"] < 1024, fields


def test_the_speed_reference_is_a_measurement(testplan):
    reference = json.loads(testplan.REFERENCE.read_text())
    assert reference["seconds"] > 0
    assert reference["measured"]


def test_each_stream_records_its_own_end_and_exit(testplan, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TRAINSTACK_TIMES_DIR", str(tmp_path))
    slow = testplan.Stream("slow", command=("sh", "-c", "sleep 2; echo done"))
    quick = testplan.Stream("quick", command=("sh", "-c", "echo quick; exit 3"))
    assert testplan.Streams().run((slow, quick), "unit") == {"slow": 0, "quick": 3}
    records = testplan.read_records()
    assert records["stream-slow"]["seconds"] >= 2
    # Listed first but ended last: the quick stream's time is its own, not the slow one's.
    assert records["stream-quick"]["seconds"] < 1.5 and records["stream-quick"]["exit"] == 3
    out = capsys.readouterr().out
    assert "[quick] quick\n" in out and "[slow] done\n" in out
    assert (tmp_path / "slow.log").read_text() == "done\n"


def test_a_streams_host_cpu_counts_the_processes_it_started(testplan, monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINSTACK_TIMES_DIR", str(tmp_path))
    # The stream's own process only waits; its child burns a core for about a second.
    loop = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1: pass"
    burn = f"{sys.executable} -c '{loop}'"
    busy = testplan.Stream("busy", command=("sh", "-c", f"{burn}; sleep 0.1"))
    idle = testplan.Stream("idle", command=("sh", "-c", "sleep 1"))
    assert testplan.Streams().run((busy, idle), "unit") == {"busy": 0, "idle": 0}
    records = testplan.read_records()
    assert records["stream-busy"]["cpu_s"] >= 0.9, records["stream-busy"]
    assert records["stream-idle"]["cpu_s"] < 0.5, records["stream-idle"]


# The scheduler, with tiny streams: each prints when it starts and sleeps a little.


def tiny(testplan, name, seconds=0.2, code=0, after=()):
    script = f"sleep {seconds}; exit {code}"
    return testplan.Stream(name, command=("sh", "-c", script), after=tuple(after))


def test_a_stream_starts_when_its_needs_passed_beside_independent_ones(
    testplan, monkeypatch, tmp_path, capsys
):
    monkeypatch.setenv("TRAINSTACK_TIMES_DIR", str(tmp_path))
    streams = (
        tiny(testplan, "bake", 0.2),
        tiny(testplan, "train", 0.8),
        tiny(testplan, "shared", 0.1, after=["bake"]),
        tiny(testplan, "small", 0.1, after=["bake", "train"]),
    )
    codes = testplan.Streams().run(streams, "unit")
    assert codes == {"bake": 0, "train": 0, "shared": 0, "small": 0}
    records = testplan.read_records()
    start = {name: records[f"stream-{name}"]["started_s"] for name in codes}
    end = {name: start[name] + records[f"stream-{name}"]["seconds"] for name in codes}
    # The independent ones run side by side.
    assert start["train"] < end["bake"] and start["bake"] < end["train"], records
    # Each other one starts once its needs ended; shared does not wait for train, which it
    # does not need (a stage would have made it wait).
    out = capsys.readouterr().out
    order = [
        out.index("[bake] finished"),
        out.index("testplan: shared starts at +"),
        out.index("[train] finished"),
        out.index("testplan: small starts at +"),
    ]
    assert order == sorted(order), out
    assert ", after bake\n" in out and ", after bake, train\n" in out
    assert start["shared"] < end["train"] <= start["small"] + 0.1, records


def test_a_failed_need_leaves_its_dependents_not_run_and_fails_the_tier(
    testplan, monkeypatch, tmp_path, capsys
):
    monkeypatch.setenv("TRAINSTACK_TIMES_DIR", str(tmp_path))
    monkeypatch.delenv("PYTEST_ARGS", raising=False)
    (tmp_path / "pytest-shared.json").write_text("{}")  # an earlier run's, not this one's
    streams = (
        tiny(testplan, "bake", 0.1, code=1),
        tiny(testplan, "train", 0.4),
        tiny(testplan, "shared", after=["bake"]),
        tiny(testplan, "small", after=["train"]),  # its need passes, but after the failure
    )
    assert testplan.run_tier("fake", streams, "unit") == 1
    records = testplan.read_records()
    # The one running when the other failed finished; nothing started after the failure.
    assert records["stream-train"]["exit"] == 0
    assert records["stream-shared"] == {"name": "stream-shared", "not_run": True}
    assert records["stream-small"] == {"name": "stream-small", "not_run": True}
    assert not (tmp_path / "pytest-shared.json").exists()
    assert not (tmp_path / "shared.log").exists()
    tier = records["tier-fake"]
    assert tier["exit"] == 1 and tier["cores"] == os.cpu_count() and 0 <= tier["cpu_busy"] <= 1
    out = capsys.readouterr().out
    assert "testplan: fake tier: bake beside train; shared after bake; small after train" in out
    assert "testplan: bake failed; not starting shared, small; train left to finish" in out
    assert "testplan: stream bake failed (exit 1)" in out
    assert "testplan: stream shared not run" in out and "testplan: stream small not run" in out
    assert "[shared] $" not in out and "[small] $" not in out


def test_a_tier_passes_when_every_stream_passed(testplan, monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINSTACK_TIMES_DIR", str(tmp_path))
    streams = (tiny(testplan, "a", 0.1), tiny(testplan, "b", 0.1, after=["a"]))
    assert testplan.run_tier("fake", streams, "unit") == 0
    records = testplan.read_records()
    assert records["tier-fake"]["exit"] == 0
    assert records["stream-b"]["started_s"] >= records["stream-a"]["seconds"]
