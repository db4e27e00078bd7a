"""A sweep's definition: reading it, checking it, and turning it into Optuna's objects.

Where it runs: on the control machine, where ``trainstack sweep`` checks a definition
(``read_sweep``, ``with_overrides``) before anything is created; and in the sweep's driver on
the cluster, which gets the spec as JSON (``to_dict``/``from_dict``) and builds its study with
``distributions``, ``sampler``, ``pruner`` and ``direction``, the only importers of optuna.

The definition is the ``[sweep]`` table of the job's manifest, trainstack.toml (beside [job] and
[params]), or of a separate TOML file given with ``--file``::

    [sweep]
    method = "tpe"           # tpe (default) | random | grid
    metric = "val_accuracy"  # required: an epoch metric of the job (a key of its epoch rows)
    goal = "max"             # required: max | min
    trials = 8               # trials in all (default 10; grid: the grid's size); >= 1
    parallel = 2             # trials at once (default 2, at most trials); >= 1
    seed = 0                 # the sampler's seed (default: none, not reproducible)
    early_stop = "median"    # off (default) | median | asha
    min_epochs = 1           # epochs a trial runs before it can be stopped (default 1)
    reduction_factor = 3     # asha only (default 3, >= 2)
    max_failed = 3           # stop the sweep after this many failed trials (default: trials)

    [sweep.params]           # each one a key of the job's [params]
    learning_rate = { distribution = "loguniform", low = 1e-4, high = 1e-1 }
    dropout       = { distribution = "uniform", low = 0.0, high = 0.5 }
    hidden_units  = { distribution = "int", low = 32, high = 256, step = 32 }  # step: default 1
    optimizer     = { distribution = "choice", values = ["adam", "sgd"] }

A bad definition raises SweepError: one sentence naming the file, the key as written, and what
is allowed (``examples/digits/trainstack.toml: [sweep] goal = "up": allowed: max, min``).
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.pruners import BasePruner
    from optuna.samplers import BaseSampler

MANIFEST = "trainstack.toml"  # the job's manifest (manifest.MANIFEST)
TPE, RANDOM, GRID = "tpe", "random", "grid"
METHODS = (TPE, RANDOM, GRID)
GOALS = ("max", "min")
OFF, MEDIAN, ASHA = "off", "median", "asha"
EARLY_STOPS = (OFF, MEDIAN, ASHA)
LOGUNIFORM, UNIFORM, INT, CHOICE = "loguniform", "uniform", "int", "choice"
DISTRIBUTIONS = (LOGUNIFORM, UNIFORM, INT, CHOICE)
_PARAM_KEYS = {
    LOGUNIFORM: ("distribution", "low", "high"),
    UNIFORM: ("distribution", "low", "high"),
    INT: ("distribution", "low", "high", "step"),
    CHOICE: ("distribution", "values"),
}
_ALL_PARAM_KEYS = ("distribution", "low", "high", "step", "values")
_GRID_KINDS = (CHOICE, INT)  # the distributions with finitely many values
_SETTINGS = (
    "method", "metric", "goal", "trials", "parallel", "seed", "early_stop", "min_epochs",
    "reduction_factor", "max_failed",
)  # fmt: skip
_SWEEP_KEYS = (*_SETTINGS, "params")
DEFAULT_TRIALS, DEFAULT_PARALLEL = 10, 2
_SEED_MAX = 2**32 - 1  # numpy's seeds, which Optuna's samplers use: 0 .. 2**32 - 1
_EXAMPLE = 'dropout = { distribution = "uniform", low = 0.0, high = 0.5 }'

Value = str | int | float | bool


class SweepError(ValueError):
    """The sweep's definition is bad; one sentence naming the file, the key and what is allowed."""


def _show(value: Any) -> str:
    """A value as the user wrote it in TOML: strings quoted, booleans lower-case."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, dict) and value:
        return "{ " + ", ".join(f"{k} = {_show(v)}" for k, v in value.items()) + " }"
    return repr(value) if isinstance(value, int | float) else str(value)


def _error(where: str, what: str) -> SweepError:
    return SweepError(f"{where}: {what}" if where else what)


def _bad(where: str, key: str, value: Any, fix: str) -> SweepError:
    """``<where>: <key> = <value as written>: <fix>``."""
    return _error(where, f"{key} = {_show(value)}: {fix}")


def _unknown(table: dict[str, Any], allowed: tuple[str, ...], head: str, where: str) -> None:
    unknown = [k for k in table if k not in allowed]
    if unknown:
        keys = f"key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}"
        raise _error(where, f"{head} unknown {keys}; allowed: {', '.join(allowed)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _one_of(value: Any, key: str, allowed: tuple[str, ...], where: str) -> str:
    """A string setting (None: missing) checked against its allowed values."""
    if value not in allowed or not isinstance(value, str):
        shown = " is missing;" if value is None else f" = {_show(value)}:"
        raise _error(where, f"{key}{shown} allowed: {', '.join(allowed)}")
    return value


def _whole(value: Any, key: str, low: int, where: str, high: int | None = None) -> int:
    if not _is_int(value) or value < low or (high is not None and value > high):
        allowed = f"from {low} to {high}" if high is not None else f">= {low}"
        raise _bad(where, key, value, f"give a whole number {allowed}")
    return int(value)


@dataclass(frozen=True)
class Param:
    """One swept parameter: low/high (and an int's step) for a range, values for a choice."""

    name: str
    distribution: str  # loguniform | uniform | int | choice
    low: float | int | None = None  # an int for `int`, else a float
    high: float | int | None = None
    step: int | None = None  # int only (1 unless given)
    values: tuple[Value, ...] | None = None  # choice only

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["values"] = None if self.values is None else list(self.values)
        return d

    def points(self) -> Sequence[Value]:
        """Its points in a grid: a choice's values, an int's range with its step (high too)."""
        if self.distribution == CHOICE:
            return self.values or ()
        return range(int(self.low or 0), int(self.high or 0) + 1, self.step or 1)

    def describe(self) -> str:
        if self.distribution == CHOICE:
            shown = (v if isinstance(v, str) else _show(v) for v in self.values or ())
            return f"choice({', '.join(shown)})"
        step = f", step {self.step}" if self.distribution == INT and self.step != 1 else ""
        return f"{self.distribution}({self.low!r}, {self.high!r}{step})"


@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep definition."""

    params: tuple[Param, ...]
    method: str
    metric: str
    goal: str
    trials: int
    parallel: int
    seed: int | None
    early_stop: str
    min_epochs: int
    reduction_factor: int
    max_failed: int

    def settings(self) -> dict[str, Any]:
        """Everything but the params, as in the [sweep] table."""
        return {key: getattr(self, key) for key in _SETTINGS}

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe; ``from_dict`` gives this spec back exactly."""
        return {**self.settings(), "params": [p.to_dict() for p in self.params]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepSpec:
        """The spec of ``to_dict`` (e.g. the driver's JSON file), checked again."""
        where = "sweep spec"
        if not isinstance(d, dict) or set(d) != set(_SWEEP_KEYS):
            got = sorted(d) if isinstance(d, dict) else d
            raise _error(where, f"keys {got!r} are not a sweep spec's: {sorted(_SWEEP_KEYS)}")
        method = _one_of(d["method"], "[sweep] method", METHODS, where)
        params = tuple(
            _param(p["name"], {k: v for k, v in p.items() if k != "name" and v is not None},
                   method, where)
            for p in d["params"]
        )  # fmt: skip
        return _checked(d, params, where)

    def with_overrides(self, trials: int | None = None, parallel: int | None = None) -> SweepSpec:
        """The spec with the command line's --trials/--parallel, checked again with the same
        errors, prefixed with the options given (``--trials 0: [sweep] trials = 0: ...``).
        With --trials alone, parallel is capped at the new trials; a max_failed equal to the
        old trials (its default: failures never stop the sweep early) follows the new trials."""
        values, given = self.settings(), []
        if trials is not None:
            given.append(f"--trials {trials}")
            if self.max_failed == self.trials:
                values["max_failed"] = trials
            if parallel is None and _is_int(trials) and trials >= 1:
                values["parallel"] = min(self.parallel, trials)
            values["trials"] = trials
        if parallel is not None:
            given.append(f"--parallel {parallel}")
            values["parallel"] = parallel
        return _checked(values, self.params, " ".join(given)) if given else self


def _bound(table: dict[str, Any], key: str, kind: str, head: str, where: str) -> float | int:
    """A range parameter's low or high: an int for `int`, a finite float otherwise."""
    if key not in table:
        raise _error(where, f"{head}: {key} is missing; a {kind} parameter needs low and high")
    value = table[key]
    if kind == INT:
        if not _is_int(value):
            raise _bad(where, f"{head}: {key}", value, "give a whole number (an int parameter)")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(where, f"{head}: {key}", value, "give a finite number")
    return float(value)


def _choices(values: Any, head: str, where: str) -> tuple[Value, ...]:
    kinds = "strings, finite numbers, booleans"
    if not isinstance(values, list) or not values:
        raise _bad(where, f"{head}: values", values, f"give a non-empty list of {kinds}")
    seen: list[Value] = []
    for v in values:
        if not isinstance(v, str | int | float) or (isinstance(v, float) and not math.isfinite(v)):
            raise _error(where, f"{head}: values has {_show(v)}; allowed: {kinds}")
        twin = next((s for s in seen if s == v), None)
        if twin is not None:  # 1, 1.0 and true are one value to Optuna's choices.index too
            same = f"{_show(v)} twice" if type(twin) is type(v) else f"{_show(twin)} and {_show(v)}"
            raise _error(where, f"{head}: values has {same}, which are equal; give distinct values")
        seen.append(v)
    return tuple(seen)


def _param(name: str, table: Any, method: str, where: str) -> Param:
    """One [sweep.params] entry, checked (and, with method = "grid", gridable)."""
    head = f"[sweep.params] {name}"
    if not isinstance(table, dict):
        raise _bad(where, head, table, f"give a table such as {_EXAMPLE.split(' = ', 1)[1]}")
    _unknown(table, _ALL_PARAM_KEYS, f"{head}:", where)
    kind = _one_of(table.get("distribution"), f"{head}: distribution", DISTRIBUTIONS, where)
    extra = [k for k in table if k not in _PARAM_KEYS[kind]]
    if extra:
        allowed = ", ".join(_PARAM_KEYS[kind])
        raise _error(where, f"{head}: {extra[0]} is not a {kind} key; allowed: {allowed}")
    if method == GRID and kind not in _GRID_KINDS:
        fix = f"allowed with grid: {', '.join(_GRID_KINDS)}"
        raise _error(where, f'{head}: method = "grid" cannot search a {kind} parameter; {fix}')
    if kind == CHOICE:
        if "values" not in table:
            raise _error(where, f"{head}: values is missing; a choice parameter needs values")
        return Param(name, kind, values=_choices(table["values"], head, where))
    low, high = (_bound(table, key, kind, head, where) for key in ("low", "high"))
    if not low < high:
        raise _error(where, f"{head}: low {low!r} is not below high {high!r}")
    if kind == LOGUNIFORM and low <= 0:
        raise _error(where, f"{head}: low {low!r} must be above 0 for a loguniform parameter")
    step = _whole(table.get("step", 1), f"{head}: step", 1, where) if kind == INT else None
    return Param(name, kind, low=low, high=high, step=step)


def _grid_size(params: tuple[Param, ...]) -> int:
    return math.prod(len(p.points()) for p in params)  # no list: a range's len is free


def _checked(values: dict[str, Any], params: tuple[Param, ...], where: str) -> SweepSpec:
    """The settings (every key of _SETTINGS present) checked, alone and together."""
    method = _one_of(values["method"], "[sweep] method", METHODS, where)
    metric = values["metric"]
    if not isinstance(metric, str) or not metric.strip():
        raise _bad(where, "[sweep] metric", metric, "give an epoch metric's name, e.g. val_loss")
    goal = _one_of(values["goal"], "[sweep] goal", GOALS, where)
    early_stop = _one_of(values["early_stop"], "[sweep] early_stop", EARLY_STOPS, where)
    trials = _whole(values["trials"], "[sweep] trials", 1, where)
    parallel = _whole(values["parallel"], "[sweep] parallel", 1, where)
    seed = values["seed"]
    if seed is not None:
        seed = _whole(seed, "[sweep] seed", 0, where, _SEED_MAX)
    min_epochs = _whole(values["min_epochs"], "[sweep] min_epochs", 1, where)
    reduction_factor = _whole(values["reduction_factor"], "[sweep] reduction_factor", 2, where)
    max_failed = _whole(values["max_failed"], "[sweep] max_failed", 1, where)
    if parallel > trials:
        fix = f"more than trials = {trials}; allowed: at most {trials}"
        raise _error(where, f"[sweep] parallel = {parallel} is {fix}")
    if method == GRID and trials > (size := _grid_size(params)):
        fix = f'the grid\'s {size} points (method = "grid"); allowed: at most {size}'
        raise _error(where, f"[sweep] trials = {trials} is more than {fix}")
    return SweepSpec(
        params, method, metric, goal, trials, parallel, seed, early_stop, min_epochs,
        reduction_factor, max_failed,
    )  # fmt: skip


def parse_sweep(table: dict[str, Any], job_params: dict[str, Any], where: str) -> SweepSpec:
    """A [sweep] table checked into a spec; ``job_params`` is the job's [params] (every swept
    parameter must be one of them) and ``where`` names the file in the errors."""
    if not isinstance(table, dict):
        raise _bad(where, "sweep", table, "[sweep] must be a table")
    _unknown(table, _SWEEP_KEYS, "[sweep]", where)
    method = _one_of(table.get("method", TPE), "[sweep] method", METHODS, where)
    if "metric" not in table:
        raise _error(where, '[sweep] metric is missing; name an epoch metric, e.g. "val_loss"')
    _one_of(table.get("goal"), "[sweep] goal", GOALS, where)
    early_stop = _one_of(table.get("early_stop", OFF), "[sweep] early_stop", EARLY_STOPS, where)
    if "reduction_factor" in table and early_stop != ASHA:
        fix = f'only used with early_stop = "asha", not "{early_stop}"'
        raise _bad(where, "[sweep] reduction_factor", table["reduction_factor"], fix)
    raw = table.get("params")
    if not isinstance(raw, dict) or not raw:
        fix = f"give a [sweep.params] table with at least one parameter, e.g. {_EXAMPLE}"
        if raw is None:
            raise _error(where, f"[sweep] params is missing; {fix}")
        raise _bad(where, "[sweep] params", raw, fix)
    for name in raw:
        if name not in job_params:
            known = ", ".join(job_params) or "none"
            raise _error(where, f"[sweep.params] {name} is not one of the job's [params]: {known}")
    params = tuple(_param(name, spec, method, where) for name, spec in raw.items())
    trials = table.get("trials", _grid_size(params) if method == GRID else DEFAULT_TRIALS)
    parallel = min(DEFAULT_PARALLEL, trials) if _is_int(trials) else DEFAULT_PARALLEL
    values = {
        "method": method, "metric": table["metric"], "goal": table["goal"], "trials": trials,
        "parallel": table.get("parallel", parallel), "seed": table.get("seed"),
        "early_stop": early_stop, "min_epochs": table.get("min_epochs", 1),
        "reduction_factor": table.get("reduction_factor", 3),
        "max_failed": table.get("max_failed", trials),
    }  # fmt: skip
    return _checked(values, params, where)


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise _error(str(path), "no such file")
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise _error(str(path), f"cannot read it: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise _error(str(path), f"not valid TOML: {exc}") from None


def read_sweep(directory: Path, job_params: dict[str, Any], file: Path | None = None) -> SweepSpec:
    """The [sweep] table of ``file`` if given, else of the job's manifest, checked."""
    path = Path(file) if file is not None else Path(directory) / MANIFEST
    values = _read_toml(path)
    if "sweep" not in values:
        fix = (
            "a sweep file holds [sweep] and [sweep.params]"
            if file is not None
            else "add one to the job's manifest, or pass --file with a TOML file that has one"
        )
        raise _error(str(path), f"no [sweep] table; {fix}")
    return parse_sweep(values["sweep"], job_params, str(path))


# --- Optuna's objects (optuna is imported here only) ----------------------------------------


def distributions(spec: SweepSpec) -> dict[str, BaseDistribution]:
    """Each parameter's Optuna distribution, by name, in the definition's order."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, BaseDistribution] = {}
    for p in spec.params:
        if p.distribution == CHOICE:
            out[p.name] = CategoricalDistribution(list(p.values or ()))
        elif p.distribution == INT:
            low, high, step = int(p.low or 0), int(p.high or 0), p.step or 1
            # The highest value the step reaches, as Optuna would cut it, minus its warning.
            out[p.name] = IntDistribution(low, low + (high - low) // step * step, step=step)
        else:
            log = p.distribution == LOGUNIFORM
            out[p.name] = FloatDistribution(float(p.low or 0), float(p.high or 0), log=log)
    return out


def grid_space(spec: SweepSpec) -> dict[str, list[Value]]:
    """The grid a `grid` sweep walks: each choice's values, each int's range with its step."""
    return {p.name: list(p.points()) for p in spec.params}


def sampler(spec: SweepSpec) -> BaseSampler:
    """The study's sampler, seeded with the spec's seed (None: not reproducible)."""
    from optuna.samplers import GridSampler, RandomSampler, TPESampler

    class _GridSampler(GridSampler):
        """Optuna's GridSampler calls study.stop() once the grid is done, which raises outside
        study.optimize (the driver asks and tells); the driver stops after `trials` trials,
        at most the grid's size, itself."""

        def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
            return None

    if spec.method == GRID:
        return _GridSampler(grid_space(spec), seed=spec.seed)
    if spec.method == RANDOM:
        return RandomSampler(seed=spec.seed)
    # TPE's random start: Optuna's 10 would make a sweep of 10 trials a random search; a
    # quarter of the trials, from 2 to 10, leaves TPE most of a small sweep.
    return TPESampler(seed=spec.seed, n_startup_trials=min(10, max(2, spec.trials // 4)))


def pruner(spec: SweepSpec) -> BasePruner:
    """What stops a poor trial early. The driver reports epoch k's metric as step k (1-based)."""
    from optuna.pruners import MedianPruner, NopPruner, SuccessiveHalvingPruner

    if spec.early_stop == MEDIAN:
        # Optuna never prunes a step < n_warmup_steps; steps start at 1 (epoch 1), so
        # n_warmup_steps = min_epochs (not - 1): the min_epochs-th epoch's report is the first
        # that may stop a trial. No pruning before `parallel` trials (the first wave) completed.
        return MedianPruner(n_startup_trials=spec.parallel, n_warmup_steps=spec.min_epochs)
    if spec.early_stop == ASHA:
        # A step >= min_resource (its first rung) may be stopped: the min_epochs-th epoch's.
        return SuccessiveHalvingPruner(
            min_resource=spec.min_epochs, reduction_factor=spec.reduction_factor
        )
    return NopPruner()


def direction(spec: SweepSpec) -> Literal["maximize", "minimize"]:
    """The study's direction: "maximize" for goal = "max", "minimize" for "min"."""
    return "maximize" if spec.goal == "max" else "minimize"


def describe(spec: SweepSpec) -> dict[str, str]:
    """One flat string per setting, for the sweep's MLflow parent run's params; the stopping
    settings only where they apply, and each parameter's range as ``space.<name>``."""
    shown = {k: v if isinstance(v, str) else _show(v) for k, v in spec.settings().items()}
    shown["seed"] = "none" if spec.seed is None else str(spec.seed)
    if spec.early_stop == OFF:
        del shown["min_epochs"]
    if spec.early_stop != ASHA:
        del shown["reduction_factor"]
    shown.update({f"space.{p.name}": p.describe() for p in spec.params})
    return shown
