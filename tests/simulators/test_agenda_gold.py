"""The agenda simulator against gold dialogues: the gold system utterances are fed to it as
if they were the agent's (the gold user lines differ from the simulator's, which is the
point: a good agent's utterances must carry the simulated user to its goal).

When the gold dialogue has done everything the goal asks for is decided independently of
the simulator, by the goal checker on the replayed gold dialogue: the first system turn
after which the goal checks out. The simulator must end by the last gold turn, and never
before that one.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipelines.env.checker import check_goal
from pipelines.env.replay import replay
from pipelines.env.tools import Database, ToolEnvironment
from pipelines.multiwoz.embedded import generate_corpus
from pipelines.multiwoz.parse import parse_database, parse_dialogues
from pipelines.records import Dialogue
from pipelines.simulators import SimulatorSpec, AgendaSimulator

from .conftest import run

N_DIALOGUES = 60


def _corpus(seed: int, raw_db: dict | None = None) -> tuple[list[Dialogue], Database]:
    corpus = generate_corpus(N_DIALOGUES, seed=seed, db=raw_db)
    entities, taxi_options = {}, {}
    for domain, records in corpus["db"].items():
        parsed, options = parse_database(domain, records, f"{domain}_db.json")
        if domain == "taxi":
            taxi_options = options
        else:
            entities[domain] = parsed
    return parse_dialogues(corpus["data"], "data.json"), Database(entities, taxi_options)


def _goal_complete_at(dialogue: Dialogue, database: Database) -> int | None:
    """The first gold system turn (0-based among system turns) after which the goal checker
    passes the dialogue; None when it never does."""
    result = replay(dialogue, ToolEnvironment(database, dialogue.goal, seed=0))
    texts = list(result.system_texts)
    return next((k for k in range(len(texts)) if check_goal(dialogue.goal, result.state, texts[: k + 1]).success), None)


@dataclass
class Outcome:
    dialogue_id: str
    ended_at: int | None  # system turn after which the simulator ended
    complete_at: int | None
    last: int
    done: bool  # the simulator ended because every sub-goal was done (not by giving up)


def _play(simulator: AgendaSimulator, dialogue: Dialogue, database: Database, seed: int) -> Outcome:
    session = simulator.session(dialogue.goal, seed=seed)
    run(session.opening())
    system_turns = [t for t in dialogue.turns if t.speaker == "system"]
    ended_at = None
    for k, turn in enumerate(system_turns):
        if run(session.respond(turn.text)).end:
            ended_at = k
            break
    return Outcome(dialogue.dialogue_id, ended_at, _goal_complete_at(dialogue, database), len(system_turns) - 1, session.done)


def _check(outcomes: list[Outcome]) -> None:
    graded = [o for o in outcomes if o.complete_at is not None]
    ended = [o for o in graded if o.ended_at is not None and o.done]
    assert len(ended) >= 0.95 * len(graded), [o for o in graded if o not in ended][:5]
    early = [o for o in outcomes if o.ended_at is not None and (o.complete_at is None or o.ended_at < o.complete_at)]
    assert not early, early[:5]


@pytest.mark.parametrize("seed", [7, 23])
@pytest.mark.parametrize("config", [SimulatorSpec(), SimulatorSpec(verbosity="verbose", noise=0.3)], ids=["normal", "noisy"])
def test_gold_system_turns_lead_the_simulator_to_the_end(seed, config):
    dialogues, database = _corpus(seed)
    simulator = AgendaSimulator(database, config)
    outcomes = [_play(simulator, d, database, seed=i) for i, d in enumerate(dialogues)]
    assert all(o.complete_at is not None for o in outcomes), "every embedded gold dialogue completes its goal"
    _check(outcomes)


@pytest.mark.real_data
def test_gold_system_turns_on_the_real_database(real_raw_db):
    dialogues, database = _corpus(31, raw_db=real_raw_db)
    simulator = AgendaSimulator(database)
    outcomes = [_play(simulator, d, database, seed=i) for i, d in enumerate(dialogues)]
    assert sum(o.complete_at is not None for o in outcomes) >= 0.9 * len(outcomes)
    _check(outcomes)


def test_an_agent_that_says_nothing_useful_never_completes_a_goal():
    dialogues, database = _corpus(7)
    simulator = AgendaSimulator(database)
    for i, dialogue in enumerate(dialogues[:20]):
        session = simulator.session(dialogue.goal, seed=i)
        run(session.opening())
        turns = [run(session.respond("I'm sorry, I didn't quite get that.")) for _ in range(12)]
        assert any(t.end for t in turns) and not session.done
