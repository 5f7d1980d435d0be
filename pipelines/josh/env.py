"""The ToolWOZ environment behind the dialogue runner's tool-environment interface."""

from __future__ import annotations

from typing import Any, Mapping

from pipelines.env.toolwoz import ToolWozEnvironment, ToolWozScore


class RunnerToolWoz:
    """:class:`ToolWozEnvironment` as :class:`pipelines.episodes.runner.EpisodeState` calls
    an environment: ``call(name, arguments, turn=...)`` and ``fork()``. The turn is kept
    by the episode's own call log, so it is not needed here."""

    def __init__(self, environment: ToolWozEnvironment):
        self.environment = environment

    def call(self, name: str, arguments: Mapping[str, Any] | None = None, *, turn: int | None = None) -> dict[str, Any]:
        return self.environment.call(name, arguments)

    def fork(self) -> RunnerToolWoz:
        return RunnerToolWoz(self.environment.fork())

    def progress(self) -> ToolWozScore:
        return self.environment.progress()
