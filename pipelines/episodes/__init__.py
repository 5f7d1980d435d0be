"""The dialogue runner: agents talk to user simulators and act through the tool environment.

* :mod:`~pipelines.episodes.formats`: the agent output formats (SpeakRL tokens, JOSH ReACT,
  OpenAI function calling), each with a strict parser and a renderer;
* :mod:`~pipelines.episodes.agents`: batched agents (local transformers model, OpenAI-compatible
  endpoint, gold replay);
* :mod:`~pipelines.episodes.runner`: plays many episodes together, forkable episode state;
* :mod:`~pipelines.episodes.records` / :mod:`~pipelines.episodes.tables`: the episode records
  and their Arrow artifacts.
"""

from pipelines.episodes.agents import Agent, AgentContext, AgentOutput, HFAgent, OpenAIAgent, ReplayAgent
from pipelines.episodes.formats import (
    ACTION_KINDS,
    DEFAULT_TASK_PROMPT,
    END_TOKEN,
    FORMATS,
    AgentAction,
    AgentFormat,
    FunctionCallingFormat,
    Malformed,
    ReActFormat,
    SpeakRLFormat,
    get_format,
)
from pipelines.episodes.records import ACTORS, ENDED_BY, EVENT_KINDS, Episode, EpisodeEvent
from pipelines.episodes.runner import (
    DEFAULT_APOLOGY,
    EpisodeSpec,
    EpisodeState,
    RunnerConfig,
    play,
    run_episodes,
    run_episodes_sync,
)
from pipelines.episodes.tables import EPISODE_EVENTS, EPISODES, episode_tables

__all__ = [
    "ACTION_KINDS",
    "ACTORS",
    "Agent",
    "AgentAction",
    "AgentContext",
    "AgentFormat",
    "AgentOutput",
    "DEFAULT_APOLOGY",
    "DEFAULT_TASK_PROMPT",
    "ENDED_BY",
    "END_TOKEN",
    "EPISODES",
    "EPISODE_EVENTS",
    "EVENT_KINDS",
    "Episode",
    "EpisodeEvent",
    "EpisodeSpec",
    "EpisodeState",
    "FORMATS",
    "FunctionCallingFormat",
    "HFAgent",
    "Malformed",
    "OpenAIAgent",
    "ReActFormat",
    "ReplayAgent",
    "RunnerConfig",
    "SpeakRLFormat",
    "episode_tables",
    "get_format",
    "play",
    "run_episodes",
    "run_episodes_sync",
]
