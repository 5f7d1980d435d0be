"""The data catalog: every Parquet artifact a stage writes, by name -> (where it lies, which
expectation suite it must pass). Kedro's ``catalog.yml`` in spirit, with one difference that
DVC imposes: the paths themselves stay in ``params.yaml`` (``dvc.yaml`` interpolates them as
its ``outs``), so an entry names the params key its path comes from rather than a second copy
of the path. A stage says ``save({"speaker_sft": table, ...}, params)`` or
``load("l2a_samples", params)`` with its own typed section; which file and which suite that
means is decided here, never by a file's stem. ``tests/test_datasets.py`` checks every entry
against ``dvc.yaml``'s outs (and every Parquet out of ``dvc.yaml`` against the catalog).

A path template reads the stage's params section: ``{output}`` is its ``output`` key,
``{output.episodes}`` a nested key, ``{output|parent}`` the directory of that path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa

from pipelines.errors import ConfigError
from pipelines.registry import artifact_specs
from catalog.io import publish, publish_empty, read_artifact


@dataclass(frozen=True)
class Dataset:
    """One catalog entry: ``path`` (a template over the params section ``section``), the
    artifact spec ``spec`` it is validated with, and the ``dvc.yaml`` stages that write it
    (``role`` "out") or, for a stage's input at a path of its own section, read it ("dep").
    ``section`` None: each stage fills the path from its own section, named as the stage."""

    section: str | None
    path: str
    spec: str
    stages: tuple[str, ...]
    role: str = "out"

    def section_of(self, stage: str) -> str:
        """The params section whose keys fill the path when ``stage`` writes (or reads) it."""
        return self.section or stage


def _entries() -> dict[str, Dataset]:
    def beside(section: str | None, stages: Sequence[str], names: Sequence[str], prefix: str = "", key: str = "output") -> dict[str, Dataset]:
        """Tables written side by side into the directory ``{key}``, each ``<spec>.parquet``."""
        return {prefix + n: Dataset(section, f"{{{key}}}/{n}.parquet", n, tuple(stages)) for n in names}

    episodes = ("episodes", "episode_events")
    return {
        **beside("seeds", ["seeds"], ("dialogues", "turns", "goals", "entities", "splits")),
        # gold_replay and gold_replay_real run one module, each on its own section of one shape
        **beside(None, ["gold_replay", "gold_replay_real"], episodes, "gold_replay."),
        **beside("speaker", ["speaker"], ("speaker_dialogues", "speaker_sft", "speaker_grpo", "speaker_dpo")),
        **beside("evaluate", ["evaluate"], episodes, "evaluate.", key="output.episodes"),
        **beside("pir", ["pir_augment"], ("pir_traces",)),
        **beside("josh", ["josh"], ("josh_trees", "josh_sft", "josh_kto", "josh_eval")),
        "toolwoz_eval": Dataset("josh_evaluate", "{output.episodes}", "toolwoz_eval", ("josh_evaluate",)),
        "l2a_samples": Dataset("hindsight", "{output}", "l2a_samples", ("hindsight",)),
        "l2a_train": Dataset("hindsight", "{output|parent}/l2a_train.parquet", "l2a_train", ("hindsight",)),
        "calibration_runs": Dataset("calibrate", "{output.runs}", "calibration_runs", ("calibrate",)),
        "l2a_eval": Dataset("l2a.eval", "{output.generations}", "l2a_eval", ("l2a_eval",)),
        # l2a_eval reads hindsight's samples wherever its own section points (a user's file too)
        "l2a_eval.samples": Dataset("l2a.eval", "{samples}", "l2a_samples", ("l2a_eval",), "dep"),
        **beside("clarifier.data", ["clarifier_data"], ("clarifier_sft", "clarifier_dpo", "clarifier_grpo")),
        **beside("clarifier.eval", ["clarifier_eval"], episodes, "clarifier_eval."),
    }


DATASETS: dict[str, Dataset] = _entries()

_FIELD = re.compile(r"\{([A-Za-z_][\w.]*)(\|parent)?\}")


def _value(section: Any, dotted: str, name: str) -> Any:
    value = section
    for key in dotted.split("."):
        if isinstance(value, Mapping):
            value = value.get(key)
        else:
            value = getattr(value, key, None)
        if value is None:
            raise ConfigError(f"catalog: dataset {name!r} needs {DATASETS[name].section or 'its section'}.{dotted}, which is not set")
    return value


def dataset(name: str) -> Dataset:
    """The entry ``name``; ConfigError listing the catalog for a name it lacks."""
    try:
        return DATASETS[name]
    except KeyError:
        raise ConfigError(f"catalog: no dataset {name!r} (datasets: {', '.join(sorted(DATASETS))})") from None


def path(name: str, section: Any) -> Path:
    """Where dataset ``name`` lies, its template filled from ``section`` (the stage's params
    section: a mapping or a typed config).

    >>> path("speaker_sft", {"output": "data/processed/speaker"}).as_posix()
    'data/processed/speaker/speaker_sft.parquet'
    >>> path("l2a_train", {"output": "data/l2a/l2a_samples.parquet"}).as_posix()
    'data/l2a/l2a_train.parquet'
    """
    entry = dataset(name)

    def fill(match: re.Match) -> str:
        value = Path(_value(section, match.group(1), name))
        return (value.parent if match.group(2) else value).as_posix()

    return Path(_FIELD.sub(fill, entry.path))


def spec_of(name: str) -> Any:
    """The artifact spec (expectation suite) dataset ``name`` is validated with."""
    return artifact_specs()[dataset(name).spec]


def load(name: str, section: Any, *, record_columns: Sequence[str] = ()) -> pa.Table:
    """Dataset ``name``, read and validated against its suite before any use
    (:func:`catalog.io.read_artifact`)."""
    return read_artifact(path(name, section), spec_of(name), record_columns=record_columns)


def save(tables: Mapping[str, pa.Table], section: Any, *, report: Path | str | None = None,
         notes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Validate every table against its dataset's suite and, only if all pass, write them all
    atomically where the catalog puts them (:func:`catalog.io.publish`); returns the report."""
    return publish({path(name, section): (table, spec_of(name)) for name, table in tables.items()},
                   Path(report) if report is not None else None, notes)


def save_empty(name: str, table: pa.Table, section: Any) -> None:
    """Write dataset ``name`` with no rows (:func:`catalog.io.publish_empty`)."""
    publish_empty(path(name, section), table, spec_of(name))


__all__ = ["DATASETS", "Dataset", "dataset", "load", "path", "save", "save_empty", "spec_of"]
