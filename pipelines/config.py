"""Config vocabulary shared by the methods (issue 31: one shape per kind of setting, at the
bottom floor). :class:`FanOutSpec`: how a stage fans its work out over Prefect workers; JOSH's
harvest (``josh.fan_out``) and SpeakER's synthesis (``speaker.fan_out``) read the same one.
:class:`OutputSpec`: every section's ``output`` paths (training, evaluation, Auto-Prompt).
:func:`positive_int` and :func:`rate`: the checks of a count and of a share, one wording each
(``where`` is the setting's key path, as the user wrote it); they return the value unchanged."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

from pipelines.errors import ConfigError, ConfigValueError

TASK_RUNNERS: tuple[str, ...] = ("thread", "process", "dask")
#: A stage whose LLM calls fail (invalid replies included) more often than this share exits
#: non-zero and publishes nothing (``max_llm_failure_rate`` in every section that calls a model).
MAX_LLM_FAILURE_RATE = 0.05


def positive_int(value: Any, where: str, *, optional: bool = False, minimum: int = 1) -> int | None:
    """``value`` if an int (not a bool) >= ``minimum``, or None when ``optional``; else a ConfigError.

    >>> positive_int(3, "josh.concurrency"), positive_int(None, "evaluate.max_goals", optional=True)
    (3, None)
    >>> positive_int(0, "workers", minimum=0)
    0
    >>> positive_int(True, "params.yaml clarifier.prompt.max_tool_chars", optional=True)
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigValueError: params.yaml clarifier.prompt.max_tool_chars: expected an integer >= 1 or null, got True
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigValueError(f"{where}: expected an integer >= {minimum}{' or null' if optional else ''}, got {value!r}")
    return value


def rate(value: Any, where: str, *, optional: bool = False) -> float | None:
    """``value`` if a number (not a bool) in [0, 1], or None when ``optional``; else a ConfigError.

    >>> rate(0.05, "evaluate.max_llm_failure_rate"), rate(1, "noise"), rate(None, "top_p", optional=True)
    (0.05, 1, None)
    >>> rate(1.5, "rules agent.p_ask")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigValueError: rules agent.p_ask: expected a number in [0, 1], got 1.5
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigValueError(f"{where}: expected a number in [0, 1]{' or null' if optional else ''}, got {value!r}")
    return value


def from_params(cls: type, value: Any, where: str, *, without: Sequence[str] = ()) -> Any:
    """An instance of the dataclass ``cls`` from a params mapping: nested dataclasses from
    nested mappings, tuples from lists, ``auto`` as None where None means "choose", a field
    typed ``Any`` as given (a sub-section another parser reads); unknown keys and ill-typed
    values are ConfigErrors naming ``where``. ``without``: fields this reader does not take
    (one section type read by several readers, e.g. a training section): unknown keys here."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {value!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)} - set(without)
    unknown = sorted(set(value) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(names)}")
    missing = sorted(f.name for f in dataclasses.fields(cls)
                     if f.name not in value and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
    if missing:
        raise ConfigError(f"{where}: missing required key(s) {missing}")
    kwargs = {name: _convert(hints[name], item, f"{where}.{name}") for name, item in value.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except ConfigError as exc:  # a dataclass's own check: say where the setting is
        raise ConfigError(str(exc) if str(exc).startswith(where) else f"{where}: {exc}") from None
    except ValueError as exc:  # a check written as ValueError (Architecture, PretrainConfig, ...)
        raise ConfigError(f"{where}: {exc}") from None


def _convert(hint: Any, value: Any, where: str) -> Any:
    if hint is Any:  # a sub-section that its own parser reads (BackendConfig.from_dict, ...)
        return value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and (value is None or (value == "auto" and bool in args)):
            return None  # null, or "auto" for an optional switch (None = choose for the machine)
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(option, value, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{where}: {value!r} fits none of {hint}")
    if dataclasses.is_dataclass(hint):
        return from_params(hint, value, where)
    if origin is tuple:
        if args and typing.get_origin(args[0]) is tuple and isinstance(value, Mapping):
            value = list(value.items())  # {name: weight} -> ((name, weight), ...)
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], item, f"{where}[{i}]") for i, item in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"{where}: expected {len(args)} items, got {value!r}")
        return tuple(_convert(a, item, f"{where}[{i}]") for i, (a, item) in enumerate(zip(args, value)))
    if origin is typing.Literal:
        if not any(type(value) is type(a) and value == a for a in args):
            raise ConfigError(f"{where}: expected one of {list(args)}, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            number = float(value)  # YAML reads 1e-4 (no dot) as a string
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return number
    if hint in (int, bool, str):
        if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
            raise ConfigError(f"{where}: expected {'true or false' if hint is bool else hint.__name__}, got {value!r}")
        return value
    if hint is type(None):
        if value is not None:
            raise ConfigError(f"{where}: expected null, got {value!r}")
        return None
    raise ConfigError(f"{where}: unsupported setting type {hint}")


def _path() -> Any:
    # None: not written by this section's stage; left out of model cards and reports
    return field(default=None, metadata={"omit_if_none": True})


@dataclass(frozen=True)
class OutputSpec:
    """Where a stage writes, one vocabulary for every section's ``output``: a run's
    ``model_dir`` (Hugging Face layout and its card), ``metrics`` (JSON), a training ``curve``
    (CSV), ``episodes`` (Parquet: a file, or the directory of the episode tables), a report's
    ``markdown``, ``plot`` rows (CSV), ``generations`` (Parquet), Auto-Prompt's ``runs``
    (Parquet) and ``prompts`` (JSON). A section sets only the keys its stage writes
    (:meth:`check`).

    >>> OutputSpec(metrics="r.json").check("pir_eval.output", ("metrics", "markdown"), {"markdown": "r.md"})
    OutputSpec(model_dir=None, metrics='r.json', curve=None, episodes=None, markdown='r.md', plot=None, generations=None, runs=None, prompts=None)
    >>> OutputSpec(curve="c.csv").check("pir_eval.output", ("metrics", "markdown"))
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigError: pir_eval.output: unknown key(s) ['curve']; allowed: ['markdown', 'metrics']
    """

    model_dir: str | None = _path()
    metrics: str | None = _path()
    curve: str | None = _path()
    episodes: str | None = _path()
    markdown: str | None = _path()
    plot: str | None = _path()
    generations: str | None = _path()
    runs: str | None = _path()
    prompts: str | None = _path()

    def check(self, where: str, keys: Sequence[str], defaults: Mapping[str, str] | None = None) -> "OutputSpec":
        """These outputs for a stage that writes ``keys``: a key set outside them is an error,
        an unset one takes its path in ``defaults`` or is an error."""
        given = {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}
        unknown = sorted(set(given) - set(keys))
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(keys)}")
        values = {**{k: v for k, v in (defaults or {}).items() if k in keys}, **given}
        missing = [key for key in keys if key not in values]
        if missing:
            raise ConfigError(f"{where}: missing required key(s) {missing}")
        return replace(self, **values)


@dataclass(frozen=True)
class FanOutSpec:
    """``workers`` 0: in the stage's process. ``workers`` n >= 1: a Prefect flow whose tasks
    each take ``chunk_size`` items (goals, seed dialogues), on Prefect's ``thread`` or
    ``process`` pool task runner with n workers, or on a Dask cluster (``dask``, prefect-dask:
    a ``LocalCluster`` of n worker processes, or the scheduler at ``address``) when one
    machine is not enough. The items' results do not depend on the runner.

    >>> FanOutSpec(workers=2, task_runner="dask").chunk_size
    16
    >>> FanOutSpec(workers=2, task_runner="mpi")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigError: task_runner: expected one of ['thread', 'process', 'dask'], got 'mpi'
    """

    workers: int = 0
    task_runner: str = "thread"
    chunk_size: int = 16
    address: str | None = None

    def __post_init__(self) -> None:
        if self.task_runner not in TASK_RUNNERS:
            raise ConfigError(f"task_runner: expected one of {list(TASK_RUNNERS)}, got {self.task_runner!r}")
        positive_int(self.workers, "workers", minimum=0)
        positive_int(self.chunk_size, "chunk_size")
