"""The replay agent on the gold dialogues of the embedded corpus: it makes exactly the gold
tool calls, speaks the gold texts with the environment's references, and the goal checker
grades the episodes successful, with a scripted gold user and with the agenda simulator."""

from __future__ import annotations

import json

import pytest

from pipelines.env.checker import success_rate
from pipelines.env.replay import gold_tool_calls
from pipelines.episodes import AgentAction, AgentContext, EpisodeSpec, ReplayAgent, get_format, run_episodes_sync
from pipelines.simulators.agenda import AgendaSimulator

from .helpers import gold_user, talkative_user

FORMATS = ("speakrl", "react", "function_calling")


def specs_of(corpus, seed=0):
    return [EpisodeSpec.from_dialogue(d, seed=seed) for d in corpus.dialogues]


def failures(episodes):
    return [(e.episode_id, e.ended_by, e.result.reasons) for e in episodes if not e.success]


@pytest.mark.parametrize("format_name", FORMATS)
def test_replayed_gold_dialogues_succeed_with_the_gold_user(small_corpus, database, format_name):
    episodes = run_episodes_sync(specs_of(small_corpus), ReplayAgent(get_format(format_name)), gold_user(), database)
    assert len(episodes) == len(small_corpus.dialogues) == 120
    assert success_rate([e.result for e in episodes]) == 1.0, failures(episodes)[:5]
    assert all(e.ended_by == "agent_end" and e.n_malformed == 0 and e.n_tool_errors == 0 for e in episodes)


@pytest.mark.parametrize("format_name", FORMATS)
def test_replayed_gold_dialogues_succeed_with_the_agenda_simulator(small_corpus, database, format_name):
    episodes = run_episodes_sync(specs_of(small_corpus), ReplayAgent(get_format(format_name)), AgendaSimulator(database), database)
    rate = success_rate([e.result for e in episodes])
    assert rate >= 0.95, (rate, failures(episodes)[:5])
    assert all(e.n_malformed == 0 for e in episodes)


def test_the_replay_agent_makes_the_gold_calls_in_the_gold_turns(small_corpus, database):
    dialogues = [d for d in small_corpus.dialogues if gold_tool_calls(d)][:20]
    episodes = run_episodes_sync([EpisodeSpec.from_dialogue(d) for d in dialogues], ReplayAgent(), gold_user(), database)
    for dialogue, episode in zip(dialogues, episodes):
        made = [(e.turn, e.tool_name, json.loads(e.arguments_json)) for e in episode.events if e.kind == "tool_call"]
        gold = [(turn, call.name, dict(call.arguments)) for turn, call in gold_tool_calls(dialogue)]
        assert made == gold
        gold_texts = [t.text for t in dialogue.turns if t.speaker == "system"]
        assert len([e for e in episode.events if e.kind == "respond"]) == len(gold_texts)


def test_the_replay_agent_quotes_the_environments_references(small_corpus, database):
    dialogue = next(d for d in small_corpus.dialogues if any(g.book for g in d.goal.domains))
    episodes = run_episodes_sync(
        [EpisodeSpec.from_dialogue(dialogue, seed=s) for s in (1, 2)], ReplayAgent(), gold_user(), database
    )
    for episode in episodes:
        references = [
            json.loads(e.observation_json)["reference"]
            for e in episode.events
            if e.kind == "observation" and "reference" in json.loads(e.observation_json)
        ]
        said = " ".join(e.text for e in episode.events if e.kind == "respond")
        assert references and all(reference in said for reference in references)
        assert episode.success
    assert episodes[0].transcript() != episodes[1].transcript()  # different seeds, different references


def test_the_replay_agent_ends_with_the_last_gold_turn(small_corpus, database):
    dialogue = small_corpus.dialogues[0]
    [episode] = run_episodes_sync([EpisodeSpec.from_dialogue(dialogue)], ReplayAgent(), talkative_user(), database)
    gold_texts = [t.text for t in dialogue.turns if t.speaker == "system"]
    assert episode.ended_by == "agent_end"
    assert [e.text for e in episode.events if e.kind == "respond"][-1] == gold_texts[-1]
    # Past the gold dialogue (only a fork played on by hand gets there) it can only end.
    beyond = AgentContext("x", 0, len(gold_texts), 2 * len(gold_texts) + 1, 0, 0, (), reference=dialogue)
    assert ReplayAgent().actions(beyond) == [AgentAction.end()]


def test_the_replay_agent_needs_a_reference(small_corpus, database):
    spec = EpisodeSpec("no-reference", small_corpus.dialogues[0].goal)
    with pytest.raises(ValueError, match="reference dialogue"):
        run_episodes_sync([spec], ReplayAgent(), talkative_user(), database)
