"""Every artifact spec askflow publishes, by name: what a ``schema:`` setting may name."""

from __future__ import annotations

import functools

from pipelines.artifacts.spec import ArtifactSpec


@functools.cache
def _specs() -> dict[str, ArtifactSpec]:
    from pipelines.clarifier.tables import SPECS as CLARIFIER
    from pipelines.episodes.tables import SPECS as EPISODES
    from pipelines.josh.tables import SPECS as JOSH, TOOLWOZ_EVAL
    from pipelines.learn_to_ask.tables import SPECS as LEARN_TO_ASK
    from pipelines.multiwoz.tables import SPECS as MULTIWOZ
    from pipelines.pir.tables import SPECS as PIR
    from pipelines.speaker.tables import SPECS as SPEAKER

    # toolwoz_eval (josh_evaluate's output) is not in JOSH: the josh stage publishes that dict whole
    return {**MULTIWOZ, **SPEAKER, **EPISODES, **PIR, **JOSH, TOOLWOZ_EVAL.name: TOOLWOZ_EVAL, **LEARN_TO_ASK, **CLARIFIER}


def artifact_specs() -> dict[str, ArtifactSpec]:
    """Every artifact spec askflow publishes, by name (by convention the stem of its Parquet
    file); a copy, which the caller may change."""
    return dict(_specs())


__all__ = ["artifact_specs"]
