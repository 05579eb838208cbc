"""Sweeps: a parameter grid expanded into independent tasks, run locally or on a Dask cluster, as one DataFrame.

A sweep is the cartesian product workload template x size point x mechanism (with its parameter grid) x
solver x eps x delta x repetition. Each point is a frozen `Task` with a stable hash (SHA-256 of its
canonical JSON, the index excluded). Tasks are independent, so they run anywhere:

- in this process (`max_workers=0`), in local processes (`concurrent.futures.ProcessPoolExecutor`, the
  default), or on a Dask distributed cluster (`scheduler="tcp://..."` or `client=distributed.Client`),
  using Dask's own `Client.submit` and `distributed.as_completed`;
- every finished task's result is written to `cache/<hash>.json`, so an interrupted sweep resumes where
  it stopped and a repeated sweep costs nothing.

Randomness never comes from global state. Two seeds derive from each task through `numpy.random.SeedSequence`:
- the instance seed, from the repetition and a hash of (workload template, size point): it is injected
  as `seed=` into random workload families (wrange, wdiscrete, wrelated, wtau) and draws the data, so
  every mechanism of one repetition sees the same W and x;
- the task seed, from the repetition and the task's own hash: it seeds the mechanism (when it takes a
  `seed`) and the Monte Carlo noise.

Selection is eps-independent (a mechanism reads privacy only through `is_pure` and the noise norm), so
a task with `shared_fit` takes its mechanism seed from the task without eps, delta and calibration
instead: the tasks of one point that differ only in privacy then select the same strategy, and the
sweep runs them together in one worker, fitting once (`mechanisms.base.shared_selections`); each still
gets its own exact error, bound and Monte Carlo noise. Sweeps over several eps set it (`shared_fits`).

The result has one row per task, sorted by task index, whatever the executor or completion order:
task fields, the mechanism's `record()` fields, the data-dependent bias of relaxed strategies and Monte
Carlo error when requested. Timing columns (`TIMING_COLUMNS`) are the only ones that vary between runs.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import inspect
import itertools
import json
import math
import os
import string
import sys
import time
import tomllib
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dpopt.plotting import saved_figure
from dpopt.privacy import DEFAULT_CALIBRATION, research_perturb
from dpopt.validation import parse_time_limit

if TYPE_CHECKING:
    from dpopt.marginal_strategy import TableFn
    from dpopt.privacy import Privacy
    from dpopt.strategy import Strategy
    from dpopt.workloads import Marginals

# Random workload families that take `seed=`; a sweep injects the instance seed when none is given.
RANDOM_FAMILIES = ("wrange", "wdiscrete", "wrelated", "wtau")
# Columns that measure time: they differ between runs and executors, everything else must not.
TIMING_COLUMNS = ("fit_seconds", "fit_cpu_seconds", "task_seconds", "mc_seconds")
# Record fields the task already carries (kept from the task) or that are renamed.
_RECORD_RENAME = {"workload": "workload_name", "solver": "fit_solver", "calibration": "noise_convention"}
_RECORD_DROP = ("mechanism", "epsilon", "delta")
CONFIG_KEYS = (
    "name", "workloads", "sizes", "mechanisms", "solvers", "epsilon", "delta", "calibration",
    "repetitions", "monte_carlo_trials", "data", "shared_fits", "time_limit",
)
CACHE_VERSION = 1


class SweepError(ValueError):
    """A sweep configuration or task that cannot be used."""


def _canonical(obj: Any) -> str:
    """Canonical JSON (sorted keys, no spaces) used for hashing."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default)


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, tuple):
        return list(obj)
    return str(obj)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _seed_from(repetition: int, digest: str) -> np.random.SeedSequence:
    """SeedSequence of (repetition, the first 64 bits of a hex digest)."""
    return np.random.SeedSequence([int(repetition), int(digest[:16], 16)])


def _int_seed(ss: np.random.SeedSequence) -> int:
    """A non-negative 63-bit integer seed drawn from a SeedSequence."""
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


@dataclass(frozen=True)
class Task:
    """One point of a sweep: fit `mechanism` on `workload` under (epsilon, delta), once.

    workload: a resolved workload spec (dpopt.specs grammar), random families carrying their seed.
    template / sizes: the grid coordinates it came from (sizes as sorted (name, value) pairs).
    params: mechanism constructor parameters as sorted (name, value) pairs (JSON scalars).
    solver: passed as `solver=` to mechanisms that take one; None means the mechanism's default.
    data: None, 'npy:PATH' (cells merged into n bins) or 'poisson:MEAN' (drawn from the instance seed).
    monte_carlo_trials: 0 for the exact expected error only; else this many noisy answers are drawn.
    time_limit: wall-clock seconds for the fit (`Mechanism.fit(time_limit=)`); None: no limit.
    index: position in the sweep (not part of the hash: the same task in two sweeps shares its cache).
    """

    workload: str
    mechanism: str
    epsilon: float
    delta: float = 0.0
    calibration: str = DEFAULT_CALIBRATION
    solver: str | None = None
    params: tuple[tuple[str, Any], ...] = ()
    repetition: int = 0
    template: str = ""
    sizes: tuple[tuple[str, Any], ...] = ()
    data: str | None = None
    monte_carlo_trials: int = 0
    shared_fit: bool = False
    time_limit: float | None = None
    index: int = field(default=0, compare=False)

    def key_fields(self) -> dict[str, Any]:
        """Every field except the index (what the hash covers); shared_fit and time_limit only when set."""
        d = asdict(self)
        d.pop("index")
        if not self.shared_fit:
            d.pop("shared_fit")  # so tasks without it keep the hashes (and caches) they always had
        if self.time_limit is None:
            d.pop("time_limit")  # likewise; a capped fit is another task (its result may differ)
        return d

    @property
    def fit_key(self) -> str:
        """Hash of what the selection depends on: the task without privacy, Monte Carlo and repetition."""
        d = self.key_fields()
        for k in ("epsilon", "delta", "calibration", "monte_carlo_trials", "repetition"):
            d.pop(k)
        return _sha(_canonical(d))[:24]

    @property
    def group_key(self) -> str:
        """Tasks with equal group keys run together in one worker (one fit when shared_fit)."""
        return f"{self.fit_key}/{self.repetition}" if self.shared_fit else self.task_hash

    @property
    def task_hash(self) -> str:
        """Stable 24-hex-digit hash of the task (same across processes, machines and Python versions)."""
        return _sha(_canonical({"v": CACHE_VERSION, **self.key_fields()}))[:24]

    @property
    def seed(self) -> int:
        """The task seed: SeedSequence(repetition, hash of everything but the repetition)."""
        d = self.key_fields()
        d.pop("repetition")
        return _int_seed(_seed_from(self.repetition, _sha(_canonical(d))))

    def seed_sequence(self) -> np.random.SeedSequence:
        """SeedSequence behind `seed`; spawn children for independent streams."""
        return np.random.SeedSequence(self.seed)

    @property
    def mechanism_seed(self) -> int:
        """The mechanism's seed: from the task seed, or with shared_fit from the task without privacy."""
        if self.shared_fit:
            return _int_seed(_seed_from(self.repetition, self.fit_key))
        return _int_seed(self.seed_sequence().spawn(2)[0])

    @property
    def monte_carlo_seed(self) -> np.random.SeedSequence:
        """The Monte Carlo noise stream (always the task's own: independent across eps)."""
        return self.seed_sequence().spawn(2)[1]

    def row(self) -> dict[str, Any]:
        """The task's own columns of a result row."""
        out: dict[str, Any] = {
            "index": self.index,
            "task_hash": self.task_hash,
            "template": self.template or self.workload,
            "workload_spec": self.workload,
            **dict(self.sizes),
            "mechanism": self.mechanism,
            "solver": self.solver if self.solver is not None else "default",
            "params": _canonical(dict(self.params)) if self.params else "",
            **{f"param_{k}": v for k, v in self.params},
            "epsilon": self.epsilon,
            "delta": self.delta,
            "calibration": self.calibration,
            "repetition": self.repetition,
            "seed": self.seed,
            "data": self.data or "",
            "monte_carlo_trials": self.monte_carlo_trials,
            "shared_fit": self.shared_fit,
        }
        if self.time_limit is not None:
            out["time_limit"] = self.time_limit
        return out


# --------------------------------------------------------------------------------------------------
# Configuration and expansion


@dataclass
class MechanismSpec:
    """A mechanism short name with a grid of constructor parameters (each value list is expanded)."""

    name: str
    params: dict[str, list[Any]] = field(default_factory=dict)

    @classmethod
    def parse(cls, item: str | Mapping[str, Any]) -> MechanismSpec:
        """'identity' or {'name': 'hierarchical', 'params': {'branching': [2, 4]}} (scalars allowed)."""
        if isinstance(item, str):
            return cls(item)
        if not isinstance(item, Mapping) or "name" not in item:
            raise SweepError(f"a mechanism entry must be a name or a table with 'name', got {item!r}")
        extra = set(item) - {"name", "params"}
        if extra:
            raise SweepError(f"unknown keys {sorted(extra)} in mechanism entry; expected 'name', 'params'")
        params = item.get("params", {}) or {}
        if not isinstance(params, Mapping):
            raise SweepError(f"mechanism params must be a table of name -> value(s), got {params!r}")
        return cls(str(item["name"]), {str(k): _as_list(v) for k, v in params.items()})

    def expand(self) -> list[tuple[tuple[str, Any], ...]]:
        """Every parameter combination, as sorted (name, value) pairs."""
        keys = sorted(self.params)
        return [tuple(zip(keys, vals, strict=True)) for vals in itertools.product(*(self.params[k] for k in keys))]


def _as_list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _as_bool(v: Any, key: str) -> bool:
    if not isinstance(v, bool):
        raise SweepError(f"'{key}' must be true or false, got {v!r}")
    return v


def _time_limit(value: Any) -> float | None:
    """A config's time_limit: seconds > 0 per fit, or absent / "none" for no limit."""
    try:
        return parse_time_limit(value)
    except ValueError:
        raise SweepError(f"'time_limit' must be seconds > 0 or \"none\", got {value!r}") from None


@dataclass
class SweepConfig:
    """A sweep's grid (see the module docstring); `sizes` is a table of lists (cartesian) or a list of points."""

    workloads: list[str]
    mechanisms: list[MechanismSpec]
    sizes: dict[str, list[Any]] | list[dict[str, Any]] = field(default_factory=dict)
    solvers: list[str | None] = field(default_factory=lambda: [None])
    epsilon: list[float] = field(default_factory=lambda: [1.0])
    delta: list[float] = field(default_factory=lambda: [0.0])
    calibration: str = DEFAULT_CALIBRATION
    repetitions: int = 1
    monte_carlo_trials: int = 0
    data: str | None = None
    shared_fits: bool = False
    time_limit: float | None = None
    name: str = "sweep"

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> SweepConfig:
        """Build from a parsed TOML/JSON table; unknown keys and empty grids are refused."""
        if not isinstance(d, Mapping):
            raise SweepError(f"a sweep config must be a table, got {type(d).__name__}")
        unknown = set(d) - set(CONFIG_KEYS)
        if unknown:
            raise SweepError(f"unknown config keys {sorted(unknown)}; expected some of {', '.join(CONFIG_KEYS)}")
        for key in ("workloads", "mechanisms"):
            if key not in d or not _as_list(d[key]):
                raise SweepError(f"a sweep config needs a non-empty '{key}' list")
        sizes = d.get("sizes", {})
        if isinstance(sizes, Mapping):
            sizes = {str(k): _as_list(v) for k, v in sizes.items()}
        elif isinstance(sizes, list):
            if not all(isinstance(p, Mapping) for p in sizes):
                raise SweepError("'sizes' as a list must hold tables of name -> value (one per point)")
            sizes = [dict(p) for p in sizes]
        else:
            raise SweepError(f"'sizes' must be a table of lists or a list of tables, got {sizes!r}")
        solvers = [None if s in (None, "", "default") else str(s) for s in _as_list(d.get("solvers", [None]))]
        reps = d.get("repetitions", 1)
        trials = d.get("monte_carlo_trials", 0)
        if isinstance(reps, bool) or not isinstance(reps, int) or reps < 1:
            raise SweepError(f"'repetitions' must be a positive integer, got {reps!r}")
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 0 or trials == 1:
            raise SweepError(f"'monte_carlo_trials' must be 0 or an integer >= 2, got {trials!r}")
        cfg = cls(
            workloads=[str(w) for w in _as_list(d["workloads"])],
            mechanisms=[MechanismSpec.parse(m) for m in _as_list(d["mechanisms"])],
            sizes=sizes,
            solvers=solvers,
            epsilon=[float(e) for e in _as_list(d.get("epsilon", [1.0]))],
            delta=[float(x) for x in _as_list(d.get("delta", [0.0]))],
            calibration=str(d.get("calibration", DEFAULT_CALIBRATION)),
            repetitions=reps,
            monte_carlo_trials=trials,
            data=d.get("data"),
            shared_fits=_as_bool(d.get("shared_fits", False), "shared_fits"),
            time_limit=_time_limit(d.get("time_limit")),
            name=str(d.get("name", "sweep")),
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Check privacy values and templates before any task runs (ValueError naming the problem)."""
        from dpopt.mechanisms.registry import MECHANISMS
        from dpopt.privacy import Privacy, check_privacy_range

        unknown = sorted({m.name for m in self.mechanisms} - set(MECHANISMS))
        if unknown:
            raise SweepError(f"unknown mechanism(s) {', '.join(map(repr, unknown))}; expected some of "
                             f"{', '.join(MECHANISMS)}")
        for e in self.epsilon:
            for dl in self.delta:
                check_privacy_range(Privacy(e, dl, calibration=self.calibration))
        for t in self.workloads:
            missing = set(_template_fields(t)) - set(_size_names(self.sizes))
            if missing:
                raise SweepError(f"workload template {t!r} uses {sorted(missing)} but 'sizes' does not give them")

    def expand(self) -> list[Task]:
        """All tasks, indexed 0..N-1 in grid order (template, size, mechanism, params, solver, eps, delta, rep)."""
        tasks: list[Task] = []
        for template in self.workloads:
            for point in _size_points(self.sizes, _template_fields(template)):
                for mech in self.mechanisms:
                    grid = itertools.product(mech.expand(), self.solvers, self.epsilon, self.delta,
                                             range(self.repetitions))
                    for params, solver, eps, delta, rep in grid:
                        tasks.append(Task(
                            workload=resolve_workload(template, point, rep),
                            mechanism=mech.name,
                            epsilon=eps,
                            delta=delta,
                            calibration=self.calibration,
                            solver=solver,
                            params=params,
                            repetition=rep,
                            template=template,
                            sizes=tuple(sorted(point.items())),
                            data=self.data,
                            monte_carlo_trials=self.monte_carlo_trials,
                            shared_fit=self.shared_fits,
                            time_limit=self.time_limit,
                            index=len(tasks),
                        ))
        return tasks


def _template_fields(template: str) -> list[str]:
    """Names used as {name} in a workload template."""
    try:
        return [f for _, f, _, _ in string.Formatter().parse(template) if f]
    except ValueError as exc:
        raise SweepError(f"bad workload template {template!r}: {exc}") from None


def _size_names(sizes: Mapping[str, list[Any]] | list[dict[str, Any]]) -> set[str]:
    if isinstance(sizes, Mapping):
        return set(sizes)
    return set.intersection(*(set(p) for p in sizes)) if sizes else set()


def _size_points(sizes: Mapping[str, list[Any]] | list[dict[str, Any]], used: list[str]) -> list[dict[str, Any]]:
    """The size points a template iterates over: only the names it uses (so unused names add no duplicates)."""
    if isinstance(sizes, Mapping):
        keys = [k for k in sizes if k in used]
        return [dict(zip(keys, vals, strict=True)) for vals in itertools.product(*(sizes[k] for k in keys))]
    points: list[dict[str, Any]] = []
    for p in sizes:
        q = {k: v for k, v in p.items() if k in used}
        if q not in points:
            points.append(q)
    return points or [{}]


def instance_seed(template: str, point: Mapping[str, Any], repetition: int) -> int:
    """Seed of a repetition's workload and data: SeedSequence(repetition, hash(template, size point))."""
    return _int_seed(_seed_from(repetition, _sha(_canonical({"template": template, "sizes": dict(point)}))))


def resolve_workload(template: str, point: Mapping[str, Any], repetition: int) -> str:
    """Fill a template's {names} and give unseeded random families the instance seed (% 2^32)."""
    spec = template.format(**point)
    seed = instance_seed(template, point, repetition) % 2**32
    if spec.lower().startswith("kron:"):
        return "kron:" + ",".join(_with_seed(f, seed + i) for i, f in enumerate(spec[5:].split(",")))
    return _with_seed(spec, seed)


def _with_seed(spec: str, seed: int) -> str:
    family = spec.split(":", 1)[0].strip().lower()
    if family in RANDOM_FAMILIES and "seed=" not in spec.replace(" ", ""):
        return f"{spec}:seed={seed}"
    return spec


def load_config(path: str | os.PathLike[str]) -> SweepConfig:
    """Read a sweep config from a .toml or .json file."""
    p = Path(path)
    if not p.is_file():
        raise SweepError(f"sweep config not found: {p}")
    try:
        if p.suffix.lower() == ".toml":
            d = tomllib.loads(p.read_text())
        elif p.suffix.lower() == ".json":
            d = json.loads(p.read_text())
        else:
            raise SweepError(f"sweep config must end in .toml or .json, got {p.name}")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SweepError(f"cannot parse sweep config {p}: {exc}") from None
    try:
        return SweepConfig.from_mapping(d)
    except ValueError as exc:  # SweepError, or a privacy value refused
        raise SweepError(f"sweep config {p}: {exc}") from None


# --------------------------------------------------------------------------------------------------
# Running one task


def load_data(data: str, n: int, seed: int) -> np.ndarray:
    """Data vector x (n,): 'npy:PATH' with consecutive cells merged into n bins, or 'poisson:MEAN'."""
    kind, _, arg = data.partition(":")
    if kind == "npy":
        x = np.load(arg, allow_pickle=False).astype(float).ravel()
        if x.size < n:
            raise SweepError(f"data file {arg} has {x.size} cells, fewer than the workload's n = {n}")
        edges = np.linspace(0, x.size, n + 1).round().astype(int)
        return np.add.reduceat(x, edges[:-1])
    if kind == "poisson":
        mean = float(arg or 100.0)
        return np.random.default_rng(seed).poisson(mean, size=n).astype(float)
    raise SweepError(f"unknown data spec {data!r}; expected 'npy:PATH' or 'poisson:MEAN'")


def _constructor_kwargs(cls: Callable[..., Any], task: Task, seed: int) -> dict[str, Any]:
    """The task's params, plus solver= and seed= when the constructor takes them."""
    kwargs = dict(task.params)
    try:
        sig = inspect.signature(cls)
        names = set(sig.parameters)
        var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    except (TypeError, ValueError):
        names, var_kw = set(), False
    if task.solver is not None:
        if "solver" not in names and not var_kw:
            raise SweepError(f"mechanism {task.mechanism} has no solver choice (asked for {task.solver!r})")
        kwargs["solver"] = task.solver
    if "seed" in names and "seed" not in kwargs:
        kwargs["seed"] = seed
    return kwargs


def _m_float(m: int) -> float:
    return float(m) if m < 2**1000 else math.inf


#: How the status of a task that produced no result starts (the rest say how the fit ended).
FAILED_STATUSES = ("skipped", "error", "unavailable")


def run_task(task: Task) -> dict[str, Any]:
    """Fit the task's mechanism and return its result fields (JSON-normalised; never raises).

    status is the mechanism's status, 'skipped: reason' for settings a mechanism refuses (cached), or
    'error: reason' for unexpected failures (not cached, retried on the next run).
    """
    from threadpoolctl import threadpool_limits

    t0 = time.perf_counter()
    with threadpool_limits(1), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = _run_task(task)
        except ImportError as exc:
            out = {"status": f"unavailable: {exc}"}
        except _SKIPS as exc:
            out = {"status": f"skipped: {exc}"}
        except Exception as exc:  # noqa: BLE001 - a sweep records failures instead of dying
            last = traceback.extract_tb(exc.__traceback__)[-1:]
            where = f" at {Path(last[0].filename).name}:{last[0].lineno}" if last else ""
            out = {"status": f"error: {type(exc).__name__}: {exc}{where}"}
    # Warnings (e.g. a solver stopped at its cap) go into the row instead of the workers' stderr.
    messages = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
    out["warnings"] = " | ".join(messages)[:500]
    out["task_seconds"] = time.perf_counter() - t0
    return _normalise(out)


def run_group(tasks: Sequence[Task]) -> list[dict[str, Any]]:
    """Run tasks that share a selection one after another in this process, fitting it once (see run_task)."""
    from dpopt.mechanisms.base import shared_selections

    with shared_selections():
        return [run_task(t) for t in tasks]


def _skip_types() -> tuple[type[BaseException], ...]:
    from dpopt.mechanisms.base import MechanismError
    from dpopt.specs import SpecError
    from dpopt.strategy import StrategyError
    from dpopt.workloads import WorkloadTooLargeError

    return (MechanismError, StrategyError, WorkloadTooLargeError, SpecError, SweepError, MemoryError)


_SKIPS = _skip_types()


def _run_task(task: Task) -> dict[str, Any]:
    from dpopt.bounds import log10_svd_bound
    from dpopt.error import expected_error, monte_carlo_total
    from dpopt.mechanisms.base import fit_budget
    from dpopt.mechanisms.registry import MECHANISMS, _load
    from dpopt.privacy import Privacy
    from dpopt.specs import parse_workload

    if task.mechanism not in MECHANISMS:
        raise SweepError(f"unknown mechanism {task.mechanism!r}; expected one of {', '.join(MECHANISMS)}")
    workload = parse_workload(task.workload)
    privacy = Privacy(task.epsilon, task.delta, calibration=task.calibration)
    # The data first: a task its data cannot serve is skipped before an expensive fit, not after it.
    x = None
    if task.data:
        x = load_data(task.data, workload.n, instance_seed(task.template or task.workload, dict(task.sizes), task.repetition))
    cls = _load(task.mechanism)
    mech = cls(**_constructor_kwargs(cls, task, task.mechanism_seed))
    with fit_budget(task.time_limit):  # reaches mechanisms whose fit does not take time_limit itself
        mech.fit(workload, privacy)
    rec = mech.record()
    out: dict[str, Any] = {}
    if task.shared_fit:
        out["selection_reused"] = bool(getattr(mech, "fit_info_", None) and mech.fit_info_.extra.get("selection_reused"))
    for k, v in rec.items():
        if k in _RECORD_DROP:
            continue
        out[_RECORD_RENAME.get(k, k)] = v
    err = mech.expected_error_
    m = workload.m
    bound = rec.get("bound")
    if isinstance(bound, float) and math.isfinite(bound) and bound > 0:
        log10_bound = math.log10(bound)  # the mechanism's own bound (P * SVDB of what it answers)
    else:  # beyond float64 (AllPredicate(1024)): recomputed in log space
        log10_bound = math.log10(privacy.variance_factor) + log10_svd_bound(workload)
    out["queries"] = _m_float(m)
    out["cells"] = workload.n
    out["log10_total_error"] = err.log10_total
    out["log10_bound"] = log10_bound
    if not math.isfinite(out.get("ratio_to_bound", math.nan)) and err.log10_total is not None:
        out["ratio_to_bound"] = 10 ** (err.log10_total - log10_bound)
    if x is not None and getattr(mech.strategy_, "B", None) is not None:
        # a factorisation W ~ B A (LRM, OM): the data-dependent term ||(W - B A) x||^2 (LRM Theorem 3);
        # least-squares strategies, dense or through factors, reproduce W exactly (support checked in fit)
        out["bias_sq"] = expected_error(mech.strategy_, workload, privacy, x=x, rtol=mech.support_rtol).bias_sq
    else:
        out["bias_sq"] = 0.0
    total = err.total + out["bias_sq"]
    out["avg_squared_error"] = (
        total / m if math.isfinite(total) and m < 2**1000 else 10 ** (err.log10_total - math.log10(m))
    )
    if task.monte_carlo_trials:
        t0 = time.perf_counter()
        if not workload.has_rows:
            out["mc_status"] = "skipped: the workload's rows cannot be listed"
        else:
            xx = np.zeros(workload.n) if x is None else x
            rng = np.random.default_rng(task.monte_carlo_seed)
            # through the mechanism's own research-mode answers, whatever form its strategy takes
            mc = monte_carlo_total(lambda k: np.stack([mech.answer(xx, rng) for _ in range(k)]),
                                   workload.sparse() @ xx, trials=task.monte_carlo_trials)
            out["mc_total_mean"] = float(mc["total_mean"].iloc[0])
            out["mc_total_se"] = float(mc["total_se"].iloc[0])
            out["mc_rmse"] = float(mc["rmse"].iloc[0])
            out["mc_status"] = "ok"
        out["mc_seconds"] = time.perf_counter() - t0
    return out


def _normalise(d: dict[str, Any]) -> dict[str, Any]:
    """JSON round trip, so fresh and cached rows are identical (numpy scalars -> Python, tuples -> lists)."""
    return json.loads(json.dumps(d, default=_json_default))


# --------------------------------------------------------------------------------------------------
# Cache


class ResultCache:
    """One JSON file per finished task under `root`, named by the task hash."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, task: Task) -> Path:
        """Where the task's result lives."""
        return self.root / f"{task.task_hash}.json"

    def get(self, task: Task) -> dict[str, Any] | None:
        """The cached result fields, or None (missing or unreadable files count as missing)."""
        p = self.path(task)
        try:
            payload = json.loads(p.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        if payload.get("version") != CACHE_VERSION or payload.get("task") != _normalise(task.key_fields()):
            return None
        return payload["result"]

    def put(self, task: Task, result: dict[str, Any]) -> None:
        """Write atomically (temporary file, then rename) so an interrupt never leaves half a file."""
        payload = {"version": CACHE_VERSION, "task": _normalise(task.key_fields()), "result": result}
        tmp = self.path(task).with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(payload, indent=1, default=_json_default))
        os.replace(tmp, self.path(task))


def cacheable(result: Mapping[str, Any]) -> bool:
    """Unexpected errors and missing modules are retried on the next run; everything else is kept."""
    return not str(result.get("status", "")).startswith(("error:", "unavailable:"))


# --------------------------------------------------------------------------------------------------
# Executors


def _progress_bar(total: int, initial: int, desc: str, enabled: bool):  # noqa: ANN202
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="task", file=sys.stderr, disable=not enabled,
                dynamic_ncols=True, smoothing=0.1)


Group = tuple[Task, ...]


def _iter_serial(groups: Sequence[Group]) -> Iterable[tuple[Task, dict[str, Any]]]:
    for g in groups:
        yield from zip(g, run_group(g), strict=True)


def _failed(g: Group, why: str) -> Iterable[tuple[Task, dict[str, Any]]]:
    for t in g:
        yield t, _normalise({"status": f"error: {why}"})


def _iter_processes(groups: Sequence[Group], max_workers: int | None) -> Iterable[tuple[Task, dict[str, Any]]]:
    with cf.ProcessPoolExecutor(max_workers=max_workers) as pool:
        futures = {pool.submit(run_group, g): g for g in groups}
        try:
            for fut in cf.as_completed(futures):
                g = futures[fut]
                try:
                    yield from zip(g, fut.result(), strict=True)
                except Exception as exc:  # noqa: BLE001 - a dead worker fails its tasks, not the sweep
                    yield from _failed(g, f"worker failed: {type(exc).__name__}: {exc}")
        finally:
            for fut in futures:
                fut.cancel()


def _iter_dask(groups: Sequence[Group], client: Any) -> Iterable[tuple[Task, dict[str, Any]]]:
    from distributed import as_completed

    # Keys name the tasks' hashes, so Dask never confuses two groups and a resubmitted group reuses its key.
    keys = [f"dpopt-task-{g[0].task_hash}" if len(g) == 1 else
            "dpopt-group-" + _sha("".join(t.task_hash for t in g))[:24] for g in groups]
    futures = [client.submit(run_group, g, key=k, pure=False) for g, k in zip(groups, keys, strict=True)]
    by_key = {f.key: g for f, g in zip(futures, groups, strict=True)}
    try:
        for fut in as_completed(futures):
            g = by_key[fut.key]
            try:
                yield from zip(g, fut.result(), strict=True)
            except Exception as exc:  # noqa: BLE001 - KilledWorker and friends fail the group only
                yield from _failed(g, f"dask task failed: {type(exc).__name__}: {exc}")
            fut.release()
    finally:
        for f in futures:
            f.cancel()


def _groups(tasks: Sequence[Task]) -> list[Group]:
    """Groups in first-seen order, tasks with equal group keys (shared fits) together, in hash order.

    Hash order makes the task that fits (and those that reuse its selection) the same whatever order
    the tasks came in, so every executor returns the same rows.
    """
    out: dict[str, list[Task]] = {}
    for t in tasks:
        out.setdefault(t.group_key, []).append(t)
    return [tuple(sorted(g, key=lambda t: t.task_hash)) for g in out.values()]


def run_sweep(
    tasks: SweepConfig | Sequence[Task],
    *,
    max_workers: int | None = None,
    scheduler: str | None = None,
    client: Any = None,
    cache: str | os.PathLike[str] | None = None,
    progress: bool = True,
    desc: str | None = None,
) -> pd.DataFrame:
    """Run every task and return the tidy result (one row per task, sorted by index).

    Executor: `client` (a distributed.Client) or `scheduler` (its address) runs on Dask; otherwise local
    processes with `max_workers` (None: one per core; 0: in this process, no pool). With `cache`, finished
    tasks are read from and written to that directory. Tasks with equal hashes run once; shared-fit tasks
    that differ only in privacy run as one group in one worker and fit once.
    """
    if isinstance(tasks, SweepConfig):
        desc = desc or tasks.name
        tasks = tasks.expand()
    tasks = list(tasks)
    if not all(isinstance(t, Task) for t in tasks):
        raise SweepError("run_sweep needs a SweepConfig or a sequence of Task")
    if max_workers is not None and (isinstance(max_workers, bool) or max_workers < 0):
        raise SweepError(f"max_workers must be None or an integer >= 0, got {max_workers!r}")
    if client is not None and scheduler is not None:
        raise SweepError("give either a Dask client or a scheduler address, not both")
    store = ResultCache(cache) if cache is not None else None
    results: dict[str, dict[str, Any]] = {}
    unique: dict[str, Task] = {}
    for t in tasks:
        unique.setdefault(t.task_hash, t)
    todo: list[Task] = []
    for h, t in unique.items():
        hit = store.get(t) if store is not None else None
        if hit is not None:
            results[h] = hit
        else:
            todo.append(t)
    bar = _progress_bar(len(unique), len(unique) - len(todo), desc or "sweep", progress)
    own_client = None
    try:
        groups = _groups(todo)
        if not groups:
            stream: Iterable[tuple[Task, dict[str, Any]]] = ()
        elif client is not None or scheduler is not None:
            if client is None:
                from distributed import Client

                own_client = client = Client(scheduler)
            stream = _iter_dask(groups, client)
        elif max_workers == 0 or len(groups) == 1:
            stream = _iter_serial(groups)
        else:
            stream = _iter_processes(groups, max_workers)
        for t, res in stream:
            results[t.task_hash] = res
            if store is not None and cacheable(res):
                store.put(t, res)
            bar.update(1)
    finally:
        bar.close()
        if own_client is not None:
            own_client.close()
    return assemble(tasks, results)


def assemble(tasks: Sequence[Task], results: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per task (task columns, then result columns), sorted by task index, columns in first-seen order."""
    rows, columns, result_columns = [], [], []
    for t in sorted(tasks, key=lambda t: t.index):
        row = _normalise(t.row())
        columns.extend(k for k in row if k not in columns)
        res = results[t.task_hash]
        result_columns.extend(k for k in res if k not in result_columns and k not in row)
        row.update({k: v for k, v in res.items() if k not in row})
        rows.append(row)
    columns += [c for c in result_columns if c not in columns]
    return pd.DataFrame(rows, columns=columns).reset_index(drop=True)


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    """The result without the timing columns: what must be identical across executors and runs."""
    return df.drop(columns=[c for c in TIMING_COLUMNS if c in df.columns])


def plot_sweep(df: pd.DataFrame, path: str | os.PathLike[str], metric: str = "expected_total_error") -> None:
    """Grouped bars of the mean `metric` (over repetitions) per workload and mechanism, one panel per (eps, delta)."""
    if metric not in df:
        raise SweepError(f"no column {metric!r} in the sweep results (did every task fail?)")
    ok = df[~df["status"].astype(str).str.startswith(FAILED_STATUSES)]
    panels = list(ok.groupby(["epsilon", "delta"], sort=True))[:6]
    with saved_figure(path, 1, max(1, len(panels)), figsize=(5.0 * max(1, len(panels)), 3.6), squeeze=False) as (_, axes):
        for ax, ((eps, delta), g) in zip(axes.ravel(), panels, strict=False):
            t = g.groupby(["workload_name", "mechanism"])[metric].mean().unstack("mechanism")
            xs = np.arange(len(t.index))
            w = 0.8 / max(1, len(t.columns))
            for i, mech in enumerate(t.columns):
                ax.bar(xs + i * w - 0.4 + w / 2, t[mech].to_numpy(), width=w, label=str(mech))
            ax.set_xticks(xs, [str(s) for s in t.index], rotation=30, ha="right", fontsize=7)
            ax.set_yscale("log")
            ax.set_title(f"eps={eps:g}, delta={delta:g}", fontsize=9)
            ax.set_ylabel(metric.replace("_", " "), fontsize=8)
            ax.legend(fontsize=7)


def research_answers(
    strategy: Strategy, workload: Marginals, tables: TableFn, privacy: Privacy, rng: np.random.Generator,
) -> tuple[list[np.ndarray], dict[str, float]]:
    """Research mode: noisy answers to every workload marginal from the data's marginal tables, numpy noise from
    rng (no secure sampler, no budget accounting), and their realised total squared error against the truth,
    for checking the expected error on real tables. A release goes through `dpopt.release.release`."""
    t0 = time.perf_counter()
    y = research_perturb(privacy, rng)(strategy.A.measured_tables(tables), strategy.sensitivity(privacy.norm))
    noisy = strategy.A.reconstruct(strategy.A.blocks(y), workload)
    wall = time.perf_counter() - t0
    sq = 0.0
    for s, w, est in zip(workload.subsets, workload.weights, noisy, strict=True):
        sq += float(w) ** 2 * float(np.sum((est - tables(s)) ** 2))
    return noisy, {"release_seconds": wall, "realised_total_sq_error": sq}

