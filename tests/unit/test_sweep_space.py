"""The sweep's definition (issue 50, trainstack_training.sweep.space): a [sweep] table checked
into a spec, each bad one refused in one sentence naming the key as written; the spec's JSON
round trip and command-line overrides; and the Optuna objects built from it, run against real
in-memory studies."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from trainstack_training.manifest import JobError, load_spec
from trainstack_training.sweep import space
from trainstack_training.sweep.space import Param, SweepError, SweepSpec, parse_sweep, read_sweep

pytestmark = pytest.mark.unit

WHERE = "examples/digits/trainstack.toml"
JOB_PARAMS = {"learning_rate": 0.01, "dropout": 0.2, "hidden_units": 128, "optimizer": "adam"}
DROP = object()  # a key to leave out of the table
LR = {"distribution": "loguniform", "low": 1e-4, "high": 1e-1}
DROPOUT = {"distribution": "uniform", "low": 0.0, "high": 0.5}
UNITS = {"distribution": "int", "low": 32, "high": 256, "step": 32}
OPTIMIZER = {"distribution": "choice", "values": ["adam", "sgd"]}

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _table(params: Any = None, **settings: Any) -> dict[str, Any]:
    """A good [sweep] table, with `settings` changed (DROP: left out) and `params` replaced."""
    table: dict[str, Any] = {
        "method": "tpe", "metric": "val_accuracy", "goal": "max", "trials": 8, "parallel": 2,
        "seed": 0, "early_stop": "median", "min_epochs": 1, "max_failed": 3,
        "params": {"learning_rate": dict(LR), "dropout": dict(DROPOUT),
                   "hidden_units": dict(UNITS), "optimizer": dict(OPTIMIZER)},
    }  # fmt: skip
    if params is DROP:
        del table["params"]
    elif params is not None:
        table["params"] = params
    for key, value in settings.items():
        if value is DROP:
            table.pop(key, None)
        else:
            table[key] = value
    return table


def _spec(params: Any = None, **settings: Any) -> SweepSpec:
    return parse_sweep(_table(params, **settings), JOB_PARAMS, WHERE)


def _refused(table: Any, job_params: dict[str, Any] = JOB_PARAMS) -> str:
    with pytest.raises(SweepError) as refused:
        parse_sweep(table, job_params, WHERE)
    return str(refused.value)


# --- a good definition ---------------------------------------------------------------------


def test_a_good_definition_is_parsed_into_its_spec() -> None:
    spec = _spec()
    assert spec == SweepSpec(
        params=(
            Param("learning_rate", "loguniform", low=1e-4, high=1e-1),
            Param("dropout", "uniform", low=0.0, high=0.5),
            Param("hidden_units", "int", low=32, high=256, step=32),
            Param("optimizer", "choice", values=("adam", "sgd")),
        ),
        method="tpe", metric="val_accuracy", goal="max", trials=8, parallel=2, seed=0,
        early_stop="median", min_epochs=1, reduction_factor=3, max_failed=3,
    )  # fmt: skip


def test_the_defaults_and_whole_number_float_bounds() -> None:
    spec = parse_sweep(
        {"metric": "val_loss", "goal": "min", "params": {"dropout": {**DROPOUT, "high": 1}}},
        JOB_PARAMS,
        WHERE,
    )
    assert (spec.method, spec.trials, spec.parallel, spec.seed) == ("tpe", 10, 2, None)
    assert (spec.early_stop, spec.min_epochs, spec.reduction_factor) == ("off", 1, 3)
    assert spec.max_failed == 10  # default: trials
    assert spec.params[0].high == 1.0 and isinstance(spec.params[0].high, float)
    # One trial: parallel's default follows it rather than failing "2 is more than 1".
    assert _spec(trials=1, parallel=DROP).parallel == 1
    # An int range need not be divisible by its step (Optuna cuts it; no warning here).
    assert _spec({"hidden_units": {**UNITS, "high": 250}}).params[0].high == 250


def test_grid_takes_choice_and_int_parameters_and_its_size_is_the_default_trials() -> None:
    grid = {"hidden_units": dict(UNITS), "optimizer": dict(OPTIMIZER)}
    spec = _spec(grid, method="grid", trials=DROP)
    assert spec.trials == 16  # 8 int values x 2 choices
    assert _spec(grid, method="grid", trials=16).trials == 16


def test_asha_takes_its_reduction_factor() -> None:
    spec = _spec(early_stop="asha", reduction_factor=2, min_epochs=2)
    assert (spec.early_stop, spec.reduction_factor, spec.min_epochs) == ("asha", 2, 2)


# --- each bad definition, one sentence naming the key ----------------------------------------

_BAD_SETTINGS = [
    ({"trails": 8}, "[sweep] unknown key trails; allowed: method, metric, goal, trials, parallel, "
     "seed, early_stop, min_epochs, reduction_factor, max_failed, params"),
    ({"method": "bayes"}, '[sweep] method = "bayes": allowed: tpe, random, grid'),
    ({"metric": DROP}, "[sweep] metric is missing;"),
    ({"metric": ""}, '[sweep] metric = "": give an epoch metric'),
    ({"metric": 3}, "[sweep] metric = 3: give an epoch metric"),
    ({"goal": "up"}, '[sweep] goal = "up": allowed: max, min'),
    ({"goal": DROP}, "[sweep] goal is missing; allowed: max, min"),
    ({"early_stop": "hyperband"}, '[sweep] early_stop = "hyperband": allowed: off, median, asha'),
    ({"trials": 0}, "[sweep] trials = 0: give a whole number >= 1"),
    ({"trials": 8.0}, "[sweep] trials = 8.0: give a whole number >= 1"),
    ({"trials": True}, "[sweep] trials = true: give a whole number >= 1"),
    ({"trials": "8"}, '[sweep] trials = "8": give a whole number >= 1'),
    ({"parallel": 0}, "[sweep] parallel = 0: give a whole number >= 1"),
    ({"parallel": 9}, "[sweep] parallel = 9 is more than trials = 8; allowed: at most 8"),
    ({"seed": -1}, "[sweep] seed = -1: give a whole number from 0 to 4294967295"),
    ({"seed": 1.5}, "[sweep] seed = 1.5: give a whole number from 0 to"),
    ({"seed": False}, "[sweep] seed = false: give a whole number from 0 to"),
    ({"min_epochs": 0}, "[sweep] min_epochs = 0: give a whole number >= 1"),
    ({"early_stop": "asha", "reduction_factor": 1},
     "[sweep] reduction_factor = 1: give a whole number >= 2"),
    ({"reduction_factor": 3},
     '[sweep] reduction_factor = 3: only used with early_stop = "asha", not "median"'),
    ({"max_failed": 0}, "[sweep] max_failed = 0: give a whole number >= 1"),
    ({"max_failed": 2.5}, "[sweep] max_failed = 2.5: give a whole number >= 1"),
    ({"params": DROP}, "[sweep] params is missing; give a [sweep.params] table with at least one"),
    ({"params": {}}, "[sweep] params = {}: give a [sweep.params] table with at least one"),
    ({"params": 3}, "[sweep] params = 3: give a [sweep.params] table"),
]  # fmt: skip


@pytest.mark.parametrize(("settings", "message"), _BAD_SETTINGS, ids=lambda v: str(v)[:40])
def test_a_bad_setting_is_refused_naming_its_key(settings: dict[str, Any], message: str) -> None:
    text = _refused(_table(**settings))
    assert text.startswith(f"{WHERE}: {message}"), text
    assert "\n" not in text


_BAD_PARAMS = [
    ({"dropout": 0.3}, "[sweep.params] dropout = 0.3: give a table such as"),
    ({"dropout": {**DROPOUT, "stepp": 1}},
     "[sweep.params] dropout: unknown key stepp; allowed: distribution, low, high, step, values"),
    ({"dropout": {**DROPOUT, "step": 0.1}},
     "[sweep.params] dropout: step is not a uniform key; allowed: distribution, low, high"),
    ({"optimizer": {**OPTIMIZER, "low": 1}},
     "[sweep.params] optimizer: low is not a choice key; allowed: distribution, values"),
    ({"dropout": {"low": 0.0, "high": 0.5}},
     "[sweep.params] dropout: distribution is missing; allowed: loguniform, uniform, int, choice"),
    ({"dropout": {**DROPOUT, "distribution": "normal"}},
     '[sweep.params] dropout: distribution = "normal": allowed: loguniform, uniform, int, choice'),
    ({"dropout": {**DROPOUT, "low": 0.6}}, "[sweep.params] dropout: low 0.6 is not below high 0.5"),
    ({"dropout": {**DROPOUT, "low": 0.5}}, "[sweep.params] dropout: low 0.5 is not below high 0.5"),
    ({"dropout": {"distribution": "uniform", "low": 0.0}},
     "[sweep.params] dropout: high is missing; a uniform parameter needs low and high"),
    ({"dropout": {**DROPOUT, "low": "0"}}, '[sweep.params] dropout: low = "0": give a finite'),
    ({"dropout": {**DROPOUT, "high": True}}, "[sweep.params] dropout: high = true: give a finite"),
    ({"dropout": {**DROPOUT, "high": float("inf")}},
     "[sweep.params] dropout: high = inf: give a finite number"),
    ({"learning_rate": {**LR, "low": 0.0}},
     "[sweep.params] learning_rate: low 0.0 must be above 0 for a loguniform parameter"),
    ({"hidden_units": {**UNITS, "low": 32.0}},
     "[sweep.params] hidden_units: low = 32.0: give a whole number"),
    ({"hidden_units": {**UNITS, "high": 256.5}},
     "[sweep.params] hidden_units: high = 256.5: give a whole number"),
    ({"hidden_units": {**UNITS, "step": 0}},
     "[sweep.params] hidden_units: step = 0: give a whole number >= 1"),
    ({"hidden_units": {**UNITS, "step": 1.5}},
     "[sweep.params] hidden_units: step = 1.5: give a whole number >= 1"),
    ({"hidden_units": {**UNITS, "low": 256, "high": 32}},
     "[sweep.params] hidden_units: low 256 is not below high 32"),
    ({"optimizer": {"distribution": "choice"}},
     "[sweep.params] optimizer: values is missing; a choice parameter needs values"),
    ({"optimizer": {**OPTIMIZER, "values": []}},
     "[sweep.params] optimizer: values = []: give a non-empty list of"),
    ({"optimizer": {**OPTIMIZER, "values": "adam"}},
     '[sweep.params] optimizer: values = "adam": give a non-empty list of'),
    ({"optimizer": {**OPTIMIZER, "values": ["adam", ["sgd"]]}},
     '[sweep.params] optimizer: values has ["sgd"]; allowed: strings, finite numbers, booleans'),
    ({"optimizer": {**OPTIMIZER, "values": ["adam", "sgd", "adam"]}},
     '[sweep.params] optimizer: values has "adam" twice, which are equal; give distinct values'),
    ({"optimizer": {**OPTIMIZER, "values": [1, True]}},
     "[sweep.params] optimizer: values has 1 and true, which are equal; give distinct values"),
    ({"lr": dict(LR)}, "[sweep.params] lr is not one of the job's [params]: learning_rate, "
     "dropout, hidden_units, optimizer"),
]  # fmt: skip


@pytest.mark.parametrize(("params", "message"), _BAD_PARAMS, ids=lambda v: str(v)[:40])
def test_a_bad_parameter_is_refused_naming_it(params: dict[str, Any], message: str) -> None:
    text = _refused(_table(params))
    assert text.startswith(f"{WHERE}: {message}"), text
    assert "\n" not in text


def test_grid_refuses_a_continuous_parameter_naming_it() -> None:
    text = _refused(_table({"optimizer": dict(OPTIMIZER), "dropout": dict(DROPOUT)}, method="grid"))
    assert text == (
        f'{WHERE}: [sweep.params] dropout: method = "grid" cannot search a uniform parameter; '
        "allowed with grid: choice, int"
    )


def test_grid_refuses_more_trials_than_points_naming_both() -> None:
    text = _refused(_table({"optimizer": dict(OPTIMIZER)}, method="grid", trials=3))
    assert text == (
        f'{WHERE}: [sweep] trials = 3 is more than the grid\'s 2 points (method = "grid"); '
        "allowed: at most 2"
    )


def test_a_job_without_params_says_so_and_a_non_table_sweep_is_refused() -> None:
    assert _refused(_table(), {}) == (
        f"{WHERE}: [sweep.params] learning_rate is not one of the job's [params]: none"
    )
    assert _refused(3) == f"{WHERE}: sweep = 3: [sweep] must be a table"


# --- the driver's copy and the command line's overrides -------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        _spec(),
        _spec(seed=DROP, early_stop="asha", reduction_factor=4, min_epochs=2),
        _spec({"optimizer": {**OPTIMIZER, "values": ["a", 1, 2.5, False]}}, method="random"),
        _spec({"hidden_units": dict(UNITS)}, method="grid", trials=DROP, parallel=DROP),
    ],
    ids=["tpe", "asha", "mixed-choices", "grid"],
)
def test_the_spec_round_trips_through_json_exactly(spec: SweepSpec) -> None:
    back = SweepSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert back == spec
    assert [type(v) for v in back.params[-1].values or ()] == [
        type(v) for v in spec.params[-1].values or ()
    ]


def test_from_dict_checks_the_spec_again() -> None:
    d = _spec().to_dict()
    with pytest.raises(SweepError, match=r"^sweep spec: \[sweep\] trials = 0: give a whole"):
        SweepSpec.from_dict({**d, "trials": 0})
    with pytest.raises(SweepError, match=r"^sweep spec: keys .* are not a sweep spec's"):
        SweepSpec.from_dict({**d, "extra": 1})


def test_the_command_line_overrides_are_checked_with_the_same_errors() -> None:
    spec = _spec(max_failed=DROP)  # trials 8, parallel 2, max_failed 8 (its default)
    assert spec.with_overrides() is spec
    more = spec.with_overrides(trials=20, parallel=4)
    assert (more.trials, more.parallel, more.max_failed) == (20, 4, 20)
    assert _spec().with_overrides(trials=20).max_failed == 3  # a given max_failed stays
    one = spec.with_overrides(trials=1)  # parallel follows --trials down
    assert (one.trials, one.parallel, one.max_failed) == (1, 1, 1)
    with pytest.raises(SweepError) as refused:
        spec.with_overrides(trials=0)
    assert str(refused.value) == "--trials 0: [sweep] trials = 0: give a whole number >= 1"
    with pytest.raises(SweepError) as refused:
        spec.with_overrides(parallel=9)
    assert str(refused.value) == (
        "--parallel 9: [sweep] parallel = 9 is more than trials = 8; allowed: at most 8"
    )
    with pytest.raises(SweepError, match=r"^--trials 2 --parallel 3: \[sweep\] parallel = 3"):
        spec.with_overrides(trials=2, parallel=3)
    grid = _spec({"optimizer": dict(OPTIMIZER)}, method="grid", trials=DROP)
    with pytest.raises(SweepError, match=r"^--trials 5: .* more than the grid's 2 points"):
        grid.with_overrides(trials=5)


# --- reading it: the manifest's [sweep], or a file's -----------------------------------------

MANIFEST = """[job]
entry = "model"

[params]
learning_rate = 0.01
dropout = 0.2

[sweep]
metric = "val_accuracy"
goal = "max"
trials = 4

[sweep.params]
dropout = { distribution = "uniform", low = 0.0, high = 0.5 }
"""


def test_read_sweep_reads_the_manifest_or_the_given_file(tmp_path: Path) -> None:
    (tmp_path / "trainstack.toml").write_text(MANIFEST)
    params = {"learning_rate": 0.01, "dropout": 0.2}
    assert read_sweep(tmp_path, params).trials == 4
    other = tmp_path / "wide.toml"
    other.write_text(MANIFEST.split("\n\n", 2)[2].replace("trials = 4", "trials = 6"))
    assert read_sweep(tmp_path, params, other).trials == 6
    other.write_text('[sweep]\nmetric = "val_accuracy"\ngoal = "sideways"\n')
    with pytest.raises(SweepError) as refused:
        read_sweep(tmp_path, params, other)
    assert str(refused.value) == f'{other}: [sweep] goal = "sideways": allowed: max, min'


def test_read_sweep_names_the_path_of_a_missing_bad_or_sweepless_file(tmp_path: Path) -> None:
    manifest = tmp_path / "trainstack.toml"
    manifest.write_text('[job]\nentry = "model"\n')
    with pytest.raises(SweepError) as refused:
        read_sweep(tmp_path, {})
    assert str(refused.value) == (
        f"{manifest}: no [sweep] table; add one to the job's manifest, or pass --file with a "
        "TOML file that has one"
    )
    missing = tmp_path / "nope.toml"
    with pytest.raises(SweepError, match=f"^{missing}: no such file$"):
        read_sweep(tmp_path, {}, missing)
    broken = tmp_path / "broken.toml"
    broken.write_text("[sweep\n")
    with pytest.raises(SweepError, match=f"^{broken}: not valid TOML: "):
        read_sweep(tmp_path, {}, broken)
    with pytest.raises(SweepError, match=f"^{manifest}: no \\[sweep\\] table; a sweep file"):
        read_sweep(tmp_path, {}, manifest)


def test_the_manifest_allows_a_sweep_table_and_load_spec_ignores_it(tmp_path: Path) -> None:
    (tmp_path / "trainstack.toml").write_text(MANIFEST)
    (tmp_path / "model.py").write_text("def build_model(ctx): ...\n")
    assert load_spec(tmp_path).params == {"learning_rate": 0.01, "dropout": 0.2}
    (tmp_path / "trainstack.toml").write_text(MANIFEST + "\n[sweeps]\n")
    with pytest.raises(JobError, match=r"allowed: \[job\], \[params\], \[sweep\]"):
        load_spec(tmp_path)


# --- Optuna's objects ------------------------------------------------------------------------


def test_distributions_are_optunas_with_log_and_step() -> None:
    params = {**_table()["params"], "hidden_units": {**UNITS, "high": 250}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the int range is cut here, not by Optuna's warning
        found = space.distributions(_spec(params))
    assert found == {
        "learning_rate": FloatDistribution(1e-4, 1e-1, log=True),
        "dropout": FloatDistribution(0.0, 0.5, log=False),
        "hidden_units": IntDistribution(32, 224, step=32),
        "optimizer": CategoricalDistribution(["adam", "sgd"]),
    }


def _first_params(spec: SweepSpec) -> dict[str, Any]:
    study = optuna.create_study(sampler=space.sampler(spec), direction=space.direction(spec))
    return study.ask(space.distributions(spec)).params


@pytest.mark.parametrize("method", ["tpe", "random"])
def test_a_seed_makes_two_samplers_propose_the_same_first_params(method: str) -> None:
    spec = _spec(method=method, seed=7)
    assert type(space.sampler(spec)) is {
        "tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler
    }[method]  # fmt: skip
    first = _first_params(spec)
    assert _first_params(spec) == first
    assert _first_params(_spec(method=method, seed=8)) != first


def test_the_grid_sampler_walks_the_whole_grid_once() -> None:
    spec = _spec(
        {"hidden_units": {**UNITS, "high": 96}, "optimizer": dict(OPTIMIZER)},
        method="grid", trials=DROP, seed=0,
    )  # fmt: skip
    assert space.grid_space(spec) == {"hidden_units": [32, 64, 96], "optimizer": ["adam", "sgd"]}
    assert isinstance(space.sampler(spec), optuna.samplers.GridSampler)
    study = optuna.create_study(sampler=space.sampler(spec))
    seen = set()
    for _ in range(spec.trials // spec.parallel):  # in waves of `parallel`, as the driver runs
        wave = [study.ask(space.distributions(spec)) for _ in range(spec.parallel)]
        for trial in wave:
            seen.add((trial.params["hidden_units"], trial.params["optimizer"]))
            study.tell(trial, 0.0)  # the last one too: Optuna's own GridSampler would raise
    assert seen == {(u, o) for u in (32, 64, 96) for o in ("adam", "sgd")}


def test_the_median_pruner_stops_no_trial_before_min_epochs() -> None:
    spec = _spec(early_stop="median", min_epochs=3, parallel=1, trials=4)
    assert isinstance(space.pruner(spec), optuna.pruners.MedianPruner)
    study = optuna.create_study(direction=space.direction(spec), pruner=space.pruner(spec))
    good = study.ask()
    for epoch in range(1, 6):
        good.report(0.9, epoch)
    study.tell(good, 0.9)
    bad = study.ask()
    for epoch in (1, 2):  # worse than the median, but not yet min_epochs epochs
        bad.report(0.1, epoch)
        assert not bad.should_prune(), epoch
    bad.report(0.1, 3)  # its third epoch: now it may be stopped
    assert bad.should_prune()


def test_the_asha_pruner_and_the_others() -> None:
    asha = space.pruner(_spec(early_stop="asha", min_epochs=2, reduction_factor=4))
    assert isinstance(asha, optuna.pruners.SuccessiveHalvingPruner)
    assert (asha._min_resource, asha._reduction_factor) == (2, 4)
    assert isinstance(space.pruner(_spec(early_stop="off")), optuna.pruners.NopPruner)
    assert space.direction(_spec(goal="max")) == "maximize"
    assert space.direction(_spec(goal="min")) == "minimize"


def test_describe_gives_the_parent_runs_params() -> None:
    assert space.describe(_spec()) == {
        "method": "tpe", "metric": "val_accuracy", "goal": "max", "trials": "8",
        "parallel": "2", "seed": "0", "early_stop": "median", "min_epochs": "1",
        "max_failed": "3",
        "space.learning_rate": "loguniform(0.0001, 0.1)",
        "space.dropout": "uniform(0.0, 0.5)",
        "space.hidden_units": "int(32, 256, step 32)",
        "space.optimizer": "choice(adam, sgd)",
    }  # fmt: skip
    units = {k: v for k, v in UNITS.items() if k != "step"}
    asha = space.describe(_spec({"hidden_units": units}, seed=DROP, early_stop="asha"))
    assert (asha["seed"], asha["reduction_factor"]) == ("none", "3")
    assert asha["space.hidden_units"] == "int(32, 256)"


def test_parsing_imports_no_optuna() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from trainstack_training.sweep import space; "
        "space.parse_sweep({'metric': 'm', 'goal': 'max', 'params': {'a': {'distribution': "
        "'choice', 'values': [1, 2]}}}, {'a': 1}, 'x'); print('optuna' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
