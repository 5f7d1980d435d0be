"""τ-bench's retail and airline domains as askflow tool environments.

* :mod:`.database`: the tables, forked cheaply by copy on write, compared by fingerprint;
* :mod:`.retail` / :mod:`.airline` / :mod:`.common`: the tools, ``f(data, **kwargs) -> str``;
* :mod:`.data`: tasks, schemas and tables checked on the way in (errors name file, record, field);
* :mod:`.env`: one episode's environment, ground-truth replay and τ-bench's reward.
"""

from pipelines.env.taubench.data import DOMAINS, SPLITS, TABLES, TauAction, TauDomain, TauTask
from pipelines.env.taubench.database import TauBase, TauDatabase
from pipelines.env.taubench.env import (
    MAX_STEPS,
    TERMINATE_TOOLS,
    TauCall,
    TauEnvironment,
    TauReward,
    expected_database,
    replay,
    tau_reward,
)

__all__ = [
    "DOMAINS",
    "MAX_STEPS",
    "SPLITS",
    "TABLES",
    "TERMINATE_TOOLS",
    "TauAction",
    "TauBase",
    "TauCall",
    "TauDatabase",
    "TauDomain",
    "TauEnvironment",
    "TauReward",
    "TauTask",
    "expected_database",
    "replay",
    "tau_reward",
]
