"""What a job's manifest decides of a run's settings: its data set, framework, label and task.

Where it runs: `chosen_data` on the control machine, where ``trainstack submit``
(infra/jobs/commands.py) and the stack's Pulumi program (infra/config/checks.py,
infra/program.py) pick the data set a job is launched with; `job_spec` and `apply_manifest` in
the driver, ``trainstack-train`` (launcher.py), once per launch, before Spark starts. The
driver decides the run's framework there, from the manifest, and carries it as data: in the
run's TrainConfig (``framework``) and in the spec's JSON each barrier task gets
(``JobSpec.to_json``). A rank reads neither the manifest nor these settings again.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainstack_training.config import AUTO_TASK, DIGITS, OWN_DATA, TrainConfig
from trainstack_training.manifest import (
    FRAMEWORKS,
    MANIFEST,
    TENSORFLOW,
    JobError,
    JobSpec,
    load_spec,
    read_where_it_is,
)


def job_spec(cfg: TrainConfig) -> JobSpec:
    """The run's checked job directory, with the run's parameters over the manifest's: the
    driver's one read of the manifest (the ranks get the result, `JobSpec.to_json`)."""
    if not cfg.job_dir:
        raise JobError(
            "job_dir is empty: give a job directory (trainstack.toml and your code; "
            "docs/jobs.md), e.g. examples/digits"
        )
    try:
        params = json.loads(cfg.job_params or "{}")
    except ValueError as exc:
        raise JobError(f"job_params is not a JSON object: {exc}") from None
    spec = load_spec(cfg.job_dir, params)
    if listed_requirements(spec) and not cfg.job_env:
        raise JobError(
            f"the job lists packages in {spec.requirements} but job_env is empty: run it with "
            "`trainstack submit` or `pulumi up`, which install them (docs/jobs.md, Packages)"
        )
    return spec


def apply_manifest(cfg: TrainConfig, spec: JobSpec) -> None:
    """The manifest's framework, label, task and `data = "none"` over the run's settings: its
    `framework` is the run's (the ranks' backend; the warm runner's executors preload it), its
    `label` names the label column, its `task` is the task (a run's own --framework or --task
    that contradicts it is refused); a job that reads its own data runs with data "none" (a
    run's own data set other than the default digits is refused, and "none" is refused for a
    job whose manifest does not say it)."""
    if spec.reads_own_data:
        if cfg.data not in (DIGITS, OWN_DATA):  # the digits: trainstack-train's default
            raise JobError(
                f"the run's data={cfg.data!r} contradicts the job's manifest "
                f'({spec.directory}/{MANIFEST} says data = "none": the job reads its own data '
                "and no data stage runs); leave --data out"
            )
        cfg.data = OWN_DATA
    elif cfg.data == OWN_DATA:
        raise JobError(
            f'the run\'s data="none" is for a job that reads its own data, but '
            f'{spec.directory}/{MANIFEST} does not say so; add data = "none" to its [job] '
            "table (full mode only), or give a data set"
        )
    cfg.framework = chosen_framework(cfg.framework, spec)
    if spec.label:
        cfg.label_col = spec.label
    if spec.task:
        if cfg.task not in (AUTO_TASK, spec.task):
            raise JobError(
                f"the run's task={cfg.task!r} contradicts the job's manifest "
                f"({spec.directory}/{MANIFEST} says task = {spec.task!r}); leave --task out "
                "or make them agree"
            )
        cfg.task = spec.task


def chosen_framework(given: str, spec: JobSpec) -> str:
    """The run's framework: the manifest's. `given` (the run's --framework or its config
    file's `framework`; "" when neither names one) may only repeat it: any other value is
    refused, TensorFlow included (it is not taken for "not given")."""
    if given and given != spec.framework:
        default = ", the default when it names none" if spec.framework == TENSORFLOW else ""
        others = ", ".join(repr(f) for f in FRAMEWORKS if f != spec.framework)
        raise JobError(
            f"the run's framework={given!r} contradicts the job's manifest, whose framework is "
            f"{spec.framework!r} ({spec.directory}/{MANIFEST}{default}): a job's framework is "
            f"its manifest's, so leave --framework out or give {spec.framework!r} (to train "
            f"with {others}, set framework in the manifest)"
        )
    return spec.framework


def data_location(spec: JobSpec, cluster_job_dir: str) -> str:
    """Where the cluster reads the manifest's data set ("" when it names none; "none" for a
    job that reads its own data): a path inside the job directory becomes that path under the
    code's copy on the shared storage."""
    if not spec.data or spec.reads_own_data or read_where_it_is(spec.data):
        return spec.data
    return f"{cluster_job_dir.rstrip('/')}/{Path(spec.data).as_posix()}"


def chosen_data(spec: JobSpec, cluster_job_dir: str, given: str = "", given_by: str = "") -> str:
    """The run's data set: `given` (a setting closer to the run than the manifest, named
    `given_by`: `--data`, `trainstack:trainData`) when set, else the manifest's (its
    `data_location`; "" when it names none). A job that reads its own data (`data = "none"`)
    takes no data set: one given with it is refused."""
    if spec.reads_own_data:
        if given:
            raise JobError(
                f"{given_by} {given!r}: the job's manifest ({spec.directory}/{MANIFEST}) says "
                'data = "none": it reads its own data and no data stage runs; leave '
                f"{given_by} out, or name the data set in the manifest's data instead"
            )
        return OWN_DATA
    return given or data_location(spec, cluster_job_dir)


def listed_requirements(spec: JobSpec) -> list[str]:
    """The requirement lines of the job's requirements file (comments and blanks dropped)."""
    if not spec.requirements:
        return []
    text = (Path(spec.directory) / spec.requirements).read_text()
    lines = (ln.split(" #", 1)[0].strip() for ln in text.splitlines())
    return [ln for ln in lines if ln and not ln.startswith("#")]
