"""torch jobs end to end in local[2]: Spark's barrier stage, gloo, trainstack's DDP loop and a
full-mode job, from a packages overlay with torch in it (conftest.torch_site)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from trainstack_training.frameworks.torch import COLLECTIVE_TIMEOUT_S

from tests.support.processes import Proc, proc

from .conftest import EXAMPLES, run_cli

pytestmark = pytest.mark.training

TORCH_DIGITS = str(EXAMPLES / "digits-torch")
TORCH_CNN = str(EXAMPLES / "digits-torch-cnn")


def torch_job(tmp_path: Path, code: str, manifest: str = "") -> Path:
    """A torch job directory: `code` as m.py, torch in its requirements."""
    job = tmp_path / "job"
    job.mkdir()
    (job / "trainstack.toml").write_text(
        '[job]\nentry = "m"\nframework = "torch"\nrequirements = "requirements.txt"\n' + manifest
    )
    (job / "requirements.txt").write_text("torch==2.15.0\n")
    (job / "m.py").write_text(code)
    return job


def _rows(out: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (out / "epochs.jsonl").read_text().splitlines()]


# Appended to a copy of examples/digits-torch: each rank writes a digest (sha256) of its
# parameters when build_model returns (weights-rank<N>.initial) and after each optimizer step
# (weights-rank<N>.last: the step count and the digest), through torch's global step hook,
# so that trainstack's own loop and its default optimizer run unchanged.
WEIGHTS_PROBE = """

import hashlib as _hashlib
from pathlib import Path as _Path

_built = build_model
_probe = {}


def _digest(params):
    h = _hashlib.sha256()
    for p in params:
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _after_step(optimizer, args, kwargs):
    _probe["steps"] = _probe.get("steps", 0) + 1
    params = [p for group in optimizer.param_groups for p in group["params"]]
    _probe["last"].write_text(f"{_probe['steps']} {_digest(params)}\\n")


def build_model(ctx):
    model = _built(ctx)
    run = _Path(ctx.run_dir)
    (run / f"weights-rank{ctx.rank}.initial").write_text(_digest(model.parameters()) + "\\n")
    _probe["last"] = run / f"weights-rank{ctx.rank}.last"
    if not _probe.get("hooked"):
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(_after_step)
        _probe["hooked"] = True
    return model
"""


def test_the_torch_digits_example_trains_with_ddp_on_two_ranks(tmp_path, torch_site):
    job = tmp_path / "job"
    shutil.copytree(TORCH_DIGITS, job)
    with (job / "model.py").open("a") as code:
        code.write(WEIGHTS_PROBE)
    out = tmp_path / "out"
    rc, s, err = run_cli(
        ["--job-dir", str(job), "--job-env", torch_site, "--workers", "2",
         "--epochs", "5", "--output", str(out)]
    )  # fmt: skip
    assert rc == 0 and s["ok"], (s, err[-3000:])
    assert s["framework"] == "torch" and s["workers"] == 2 and s["attempts"] == 1, s
    # As the TensorFlow example after 5 epochs (0.92 on these settings).
    assert s["final_val_accuracy"] >= 0.88, s
    assert set(s["final"]) == {"loss", "accuracy", "val_loss", "val_accuracy"}, s["final"]
    assert [r["epoch"] for r in _rows(out)] == [1, 2, 3, 4, 5]
    assert s["model_path"] == str(out / "model.pt")
    assert (out / "model.pt").stat().st_size > 0 and (out / "model.pt2").exists()
    assert not (out / "backup").exists()  # nothing left to resume
    assert s["time_split"]["tensorflow_startup"] > 0  # torch's import and process group
    # Two ranks on gloo, which trained on shards of their own: DDP kept their parameters
    # equal, step by step, and training changed them.
    for rank in (0, 1):
        log = (out / f"rank-{rank}.log").read_text()
        assert f"process group: gloo, rank {rank} of 2, on cpu" in log, log[-2000:]
    initial = [(out / f"weights-rank{r}.initial").read_text().split() for r in (0, 1)]
    last = [(out / f"weights-rank{r}.last").read_text().split() for r in (0, 1)]
    steps = int(last[0][0])
    assert steps >= 5 and last[0][0] == last[1][0], last  # every step of the 5 epochs, each
    assert initial[0] == initial[1], initial  # torch.manual_seed(cfg.seed) on every rank
    assert last[0][1] == last[1][1], f"the ranks' final parameters differ: {last}"
    assert last[0][1] != initial[0][0], "training did not change the parameters"


def test_a_lost_torch_rank_resumes_from_the_last_checkpoint(tmp_path, torch_site):
    # The ranks stream their data (docs/training.md, Streaming): each epoch's batches are read
    # a row group at a time, again from the row groups after the resume.
    rc, s, err = run_cli(
        ["--job-dir", TORCH_DIGITS, "--job-env", torch_site, "--workers", "2",
         "--epochs", "4", "--output", str(tmp_path), "--data-stream", "on",
         "--fault-kill-epoch", "3", "--fault-kill-worker", "1", "--no-plot"]
    )  # fmt: skip
    assert rc == 0 and s["ok"], (s, err[-3000:])
    assert s["attempts"] == 2, s
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [w["input"] for w in metrics["worker_input"]] == ["stream", "stream"], metrics
    assert metrics["time_split"]["input_wait"] >= 0, metrics["time_split"]
    assert "resuming from" in (tmp_path / "rank-0.log").read_text()
    rows = _rows(tmp_path)
    # Epochs 1 and 2 were trained once: the second attempt started from their checkpoint.
    assert [r["epoch"] for r in rows if r["attempt"] == 1] == [1, 2], rows
    assert [r["epoch"] for r in rows if r["attempt"] == 2] == [3, 4], rows
    assert s["final_val_accuracy"] >= 0.8, s


def test_a_full_mode_torch_job_trains_its_own_loop(tmp_path, torch_site):
    rc, s, err = run_cli(
        ["--job-dir", TORCH_CNN, "--job-env", torch_site, "--workers", "2",
         "--epochs", "3", "--output", str(tmp_path)]
    )  # fmt: skip
    assert rc == 0 and s["ok"], (s, err[-3000:])
    assert s["framework"] == "torch" and s["final"]["val_accuracy"] >= 0.85, s
    assert [r["epoch"] for r in _rows(tmp_path)] == [1, 2, 3]
    assert (tmp_path / "model.pt").stat().st_size > 0


def test_an_error_in_torch_code_names_the_users_line(tmp_path, torch_site):
    job = torch_job(tmp_path, "def build_model(ctx):\n    return ctx.torch.nn.Linear(3)\n")
    rc, s, _ = run_cli(["--job-dir", str(job), "--job-env", torch_site, "--output", str(job)])
    assert rc == 1 and s["kind"] == "JobCodeError", s
    assert s["error"].startswith("your code failed: TypeError:") and "(at m.py:2)" in s["error"]
    assert "trainstack_training" not in s["error"], s["error"]


def test_a_build_model_that_returns_no_module_is_one_sentence(tmp_path, torch_site):
    job = torch_job(tmp_path, "def build_model(ctx):\n    return 3\n")
    rc, s, _ = run_cli(["--job-dir", str(job), "--job-env", torch_site, "--output", str(job)])
    assert rc == 1, s
    assert s["error"] == (
        "your code failed: build_model(ctx) in m.py returned int; a torch job's build_model "
        "must return a torch.nn.Module"
    ), s["error"]


def test_fsdp_trains_resumes_and_saves_the_whole_model(tmp_path, torch_site):
    job = tmp_path / "job"
    shutil.copytree(TORCH_DIGITS, job)
    manifest = job / "trainstack.toml"
    manifest.write_text(
        manifest.read_text().replace(
            'framework = "torch"', 'framework = "torch"\nstrategy = "fsdp"'
        )
    )
    out = tmp_path / "out"
    rc, s, err = run_cli(
        ["--job-dir", str(job), "--job-env", torch_site, "--workers", "2", "--epochs", "4",
         "--output", str(out), "--fault-kill-epoch", "3", "--fault-kill-worker", "1", "--no-plot"]
    )  # fmt: skip
    assert rc == 0 and s["ok"], (s, err[-3000:])
    assert s["attempts"] == 2 and s["final_val_accuracy"] >= 0.8, s
    assert [r["epoch"] for r in _rows(out) if r["attempt"] == 2] == [3, 4]
    # FSDP ran, in both attempts: each rank held a shard of the parameters (DTensors), half
    # of the model's, not a whole copy as with DDP; and the chief could not export the
    # sharded model, so it saved the gathered state alone.
    held = {}
    for rank in (0, 1):
        log = (out / f"rank-{rank}.log").read_text()
        found = re.findall(r"FSDP: this rank holds (\d+) of the model's (\d+) parameters", log)
        assert len(found) == 2, log[-3000:]  # one line per attempt
        held[rank] = {(int(local), int(total)) for local, total in found}
    assert held[0] == held[1] == {(4805, 9610)}, held
    chief = (out / "rank-0.log").read_text()
    assert "no exported copy of an FSDP model: load model.pt into your model" in chief
    assert not (out / "model.pt2").exists()
    # The gathered state of the sharded model loads into the plain model.
    check = (
        "import sys, torch\n"
        f"sys.path.insert(0, {torch_site!r})\n"
        "state = torch.load(sys.argv[1], weights_only=True)\n"
        "nn = torch.nn\n"
        "m = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 10))\n"
        "m.load_state_dict(state)\n"
        "print('loaded', sum(p.numel() for p in m.parameters()))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", check, str(out / "model.pt")],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": torch_site},
    )  # fmt: skip
    assert loaded.stdout.startswith("loaded 9610"), loaded.stderr[-2000:]


def test_one_torch_rank_failing_stops_the_other_within_seconds(tmp_path, torch_site):
    """Rank 1 raises after the process group is up; rank 0 waits in an all-reduce that rank 1
    never joins: Spark stops rank 0's process, not gloo's timeout (COLLECTIVE_TIMEOUT_S).

    Rank 0 records its PID and start time; rank 1 raises only once the test has seen that
    process running. When the CLI has returned, that process is gone; and the CLI returns
    before gloo's timeout could have ended rank 0."""
    alive, go = tmp_path / "rank0-alive", tmp_path / "go"
    job = torch_job(
        tmp_path,
        "import os, threading, time\n\n"
        "def beat(path):\n"
        "    while True:\n"
        "        open(path, 'a').write(f'{time.time()}\\n')\n"
        "        time.sleep(0.1)\n\n"
        "def train(ctx):\n"
        "    if ctx.rank == 1:\n"
        f"        while not os.path.exists({str(go)!r}):\n"
        "            time.sleep(0.1)\n"
        "        print(f'raising at {time.time()}', flush=True)\n"
        "        raise ValueError('rank one gives up')\n"
        "    started = open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19]\n"
        f"    open({str(tmp_path / 'rank0.pid')!r}, 'w').write(f'{{os.getpid()}} {{started}}')\n"
        f"    threading.Thread(target=beat, args=({str(alive)!r},), daemon=True).start()\n"
        "    ctx.torch.distributed.all_reduce(ctx.torch.zeros(1))  # never completes\n",
        "progress_timeout = 0\n",
    )
    out = tmp_path / "out"
    pid_file = tmp_path / "rank0.pid"
    with ThreadPoolExecutor(1) as pool:
        cli = pool.submit(
            run_cli,
            ["--job-dir", str(job), "--job-env", torch_site, "--output", str(out)],
            timeout=COLLECTIVE_TIMEOUT_S - 60,
        )
        try:
            rank0 = None
            while rank0 is None and not cli.done():
                rank0 = _recorded(pid_file)
                time.sleep(0.2)
        finally:
            go.touch()
        rc, s, err = cli.result()
    assert rank0 is not None, f"rank 0 never recorded its process: {s} {err[-2000:]}"
    assert rc == 1 and s["kind"] == "JobCodeError", s
    assert "ValueError: rank one gives up (at m.py:13)" in s["error"], s["error"]
    assert not rank0.alive(), f"rank 0 ({rank0}) still runs after the CLI returned"
    raised = float(re.findall(r"raising at ([0-9.]+)", (out / "rank-1.log").read_text())[0])
    stopped_s = max(float(t) for t in alive.read_text().split()) - raised
    print(f"rank 0 was stopped {stopped_s:.1f} s after rank 1 raised")


def _recorded(pid_file: Path) -> Proc | None:
    """The process rank 0 recorded (PID and start time), seen running by this test."""
    text = pid_file.read_text().split() if pid_file.exists() else []
    if len(text) != 2:
        return None  # not yet, or half written
    pid, started = int(text[0]), int(text[1])
    running = proc(pid)
    assert running is not None and running.started == started, (text, running)
    return running
