"""Gold dialogues of the embedded corpus, replayed through the tool environment and graded
by the goal checker: the gold ones succeed, corrupted ones fail for the right reason."""

from __future__ import annotations

import dataclasses
import json

from pipelines.env.checker import check_goal, success_rate
from pipelines.env.replay import replay
from pipelines.env.tools import Database, ToolEnvironment
from pipelines.multiwoz.embedded import generate_corpus
from pipelines.multiwoz.ontology import DAYS
from pipelines.records import DomainBelief, frozen_dict
from catalog.multiwoz_dir import load_multiwoz


def _grade(dialogue, database):
    result = replay(dialogue, ToolEnvironment(database, dialogue.goal, seed=0))
    return check_goal(dialogue.goal, result.state, result.system_texts, result.system_acts)


def test_every_gold_dialogue_of_the_embedded_corpus_succeeds(small_corpus):
    database = Database(small_corpus.entities, small_corpus.taxi_options)
    results = [_grade(d, database) for d in small_corpus.dialogues]
    failures = [(r.dialogue_id, r.reasons) for r in results if not r.success]
    assert not failures, failures[:5]
    assert success_rate(results) == 1.0


def _first(corpus, predicate):
    return next(d for d in corpus.dialogues if predicate(d))


def test_a_wrong_booking_fails(small_corpus):
    database = Database(small_corpus.entities, small_corpus.taxi_options)
    dialogue = _first(small_corpus, lambda d: any(g.domain == "restaurant" and g.book and not g.fail_book for g in d.goal.domains))
    goal = dialogue.goal.get("restaurant")
    wrong_day = DAYS[(DAYS.index(goal.book["day"]) + 1) % 7]
    turns = []
    for turn in dialogue.turns:
        belief = turn.belief("restaurant")
        if belief is not None and belief.booked:
            # The system booked another day than the goal asks for.
            changed = DomainBelief(belief.domain, belief.semi, frozen_dict({**belief.book, "day": wrong_day}), belief.booked)
            turn = dataclasses.replace(turn, belief_state=tuple(changed if b.domain == "restaurant" else b for b in turn.belief_state))
        turns.append(turn)
    result = _grade(dataclasses.replace(dialogue, turns=tuple(turns)), database)
    assert not result.success
    assert result.domain("restaurant").book is False
    assert any("day" in reason for reason in result.domain("restaurant").reasons)
    assert _grade(dialogue, database).success  # the unmodified dialogue still passes


def test_a_missing_requested_attribute_fails(small_corpus):
    database = Database(small_corpus.entities, small_corpus.taxi_options)
    dialogue = _first(small_corpus, lambda d: any(g.domain == "hotel" and "phone" in g.reqt for g in d.goal.domains))
    hotel_phone = next(e.get("phone") for e in small_corpus.entities["hotel"] if e.get("phone") and e.get("phone") in " ".join(t.text for t in dialogue.turns))
    turns = []
    for turn in dialogue.turns:
        if turn.speaker == "system" and hotel_phone in turn.text:
            turn = dataclasses.replace(turn, text=turn.text.replace(hotel_phone, "on our website"),
                                       dialog_acts=tuple(a for a in turn.dialog_acts if a.slot != "Phone"))
        turns.append(turn)
    result = _grade(dataclasses.replace(dialogue, turns=tuple(turns)), database)
    assert not result.success
    assert result.domain("hotel").request is False
    assert any("phone" in reason for reason in result.domain("hotel").reasons)


def test_gold_replay_on_the_real_database(tmp_path, real_db_dir, real_raw_db):
    corpus = generate_corpus(150, seed=21, db=real_raw_db)
    (tmp_path / "data.json").write_text(json.dumps(corpus["data"]), encoding="utf-8")
    loaded = load_multiwoz(tmp_path, db_dir=real_db_dir)
    database = Database(loaded.entities, loaded.taxi_options)
    results = [_grade(d, database) for d in loaded.dialogues]
    assert success_rate(results) >= 0.95, [(r.dialogue_id, r.reasons) for r in results if not r.success][:5]


def test_runner_replays_embedded_style_goals_on_the_real_database(tmp_path, real_db_dir, real_raw_db):
    """Replay agent + agenda simulator through the dialogue runner, grounded in the real DB."""
    from pipelines.episodes import EpisodeSpec, ReplayAgent, get_format, run_episodes_sync
    from pipelines.simulators.agenda import AgendaSimulator

    corpus = generate_corpus(120, seed=31, db=real_raw_db)
    (tmp_path / "data.json").write_text(json.dumps(corpus["data"]), encoding="utf-8")
    loaded = load_multiwoz(tmp_path, db_dir=real_db_dir)
    database = Database(loaded.entities, loaded.taxi_options)
    specs = [EpisodeSpec.from_dialogue(d, seed=0) for d in loaded.dialogues]
    episodes = run_episodes_sync(specs, ReplayAgent(get_format("speakrl")), AgendaSimulator(database), database)
    assert len(episodes) == 120
    assert sum(e.success for e in episodes) / len(episodes) >= 0.95
    assert all(e.n_tool_errors == 0 for e in episodes)


def test_gold_calls_reads_each_dialogues_gold_steps_once_and_gives_what_the_functions_give(small_corpus, monkeypatch):
    """The replay agent's cache (GoldCalls) answers as gold_tool_calls and replay do, per
    dialogue and database, and reads a dialogue's annotations once however often it is asked."""
    import pipelines.env.replay as replay_module
    from pipelines.env.replay import GoldCalls, gold_tool_calls

    database = Database(small_corpus.entities, small_corpus.taxi_options)
    dialogues = small_corpus.dialogues[:5]
    expected = [(gold_tool_calls(d, database), gold_tool_calls(d), _grade(d, database)) for d in dialogues]
    reads = []
    original = replay_module._gold_steps
    monkeypatch.setattr(replay_module, "_gold_steps", lambda d, db=None: reads.append(d.dialogue_id) or original(d, db))
    cache = GoldCalls()
    for _ in range(3):
        for dialogue, (with_db, without_db, graded) in zip(dialogues, expected):
            assert cache.calls(dialogue, database) == with_db and cache.calls(dialogue) == without_db
            result = cache.replay(dialogue, ToolEnvironment(database, dialogue.goal, seed=0))
            assert check_goal(dialogue.goal, result.state, result.system_texts, result.system_acts) == graded
    assert sorted(reads) == sorted([d.dialogue_id for d in dialogues] * 2)  # once with the database, once without
