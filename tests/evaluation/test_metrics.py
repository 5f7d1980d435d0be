"""Episode scores and Avg@k, on real episodes played by the runner."""

from __future__ import annotations

import pytest

from pipelines.env.tools import Database
from pipelines.episodes import EpisodeSpec, ReplayAgent, SpeakRLFormat, run_episodes_sync
from pipelines.episodes.records import EpisodeEvent
from pipelines.evaluation.metrics import EpisodeScore, avg_at_k, clarification_verdicts, goal_slot_values, mean_std, score_episode
from pipelines.simulators.agenda import AgendaSimulator


@pytest.fixture(scope="module")
def gold_episodes(small_corpus):
    database = Database(small_corpus.entities, small_corpus.taxi_options)
    dialogues = [d for d in small_corpus.dialogues if d.split == "train"][:12]
    specs = [EpisodeSpec.from_dialogue(d, seed=s) for s in (0, 1) for d in dialogues]
    episodes = run_episodes_sync(specs, ReplayAgent(SpeakRLFormat()), AgendaSimulator(database), database)
    return episodes, {d.dialogue_id: d.goal for d in dialogues}


def test_gold_replays_score_full_success(gold_episodes):
    episodes, goals = gold_episodes
    scores = [score_episode(e, goals[e.dialogue_id]) for e in episodes]
    summary = avg_at_k(scores)
    assert summary["runs"] == 2 and summary["episodes"] == 24 and summary["seeds"] == [0, 1]
    assert summary["success"] == {"mean": 1.0, "std": 0.0}
    assert summary["inform_rate"]["mean"] == 1.0
    assert summary["turns"]["mean"] == pytest.approx(sum(e.n_turns for e in episodes) / 24)
    assert summary["clarifications_per_dialogue"]["mean"] == 0.0
    assert summary["discriminating_share"] is None  # no questions were asked
    assert all(v["mean"] == 1.0 for v in summary["domain_success"].values())


def _score(seed: int, success: bool, turns: int, questions: int = 0, good: int = 0) -> EpisodeScore:
    return EpisodeScore(
        episode_id=f"m/d{seed}-{success}-{turns}", dialogue_id="d", seed=seed, success=success, n_turns=turns,
        ended_by="user_end", domains={"hotel": success}, inform=(int(success), 1), book=(0, 0), request=(1, 1),
        n_clarifications=questions, n_discriminating=good, n_malformed=0, n_agent_fallbacks=0,
    )


def test_avg_at_k_is_mean_and_sample_std_of_the_runs():
    scores = [
        _score(0, True, 10), _score(0, False, 12),  # run 0: success 0.5, turns 11
        _score(1, True, 8), _score(1, True, 10),  # run 1: success 1.0, turns 9
        _score(2, False, 20, questions=2, good=1), _score(2, False, 14),  # run 2: success 0.0, turns 17
    ]
    summary = avg_at_k(scores)
    assert summary["success"]["mean"] == pytest.approx(0.5)
    assert summary["success"]["std"] == pytest.approx(0.5)  # sample std of 0.5, 1.0, 0.0
    assert summary["turns"]["mean"] == pytest.approx(37 / 3)
    assert summary["book_rate"] is None  # no booking anywhere
    # Only run 2 asked: the share is over that run's questions.
    assert summary["discriminating_share"] == {"mean": 0.5, "std": 0.0}
    assert summary["clarifications_per_dialogue"]["mean"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        mean_std([])


def test_clarification_verdicts_follow_what_the_user_has_said(gold_episodes):
    episodes, goals = gold_episodes
    episode = next(e for e in episodes if goals[e.dialogue_id].get("restaurant") is not None and "area" in goals[e.dialogue_id].get("restaurant").info)
    goal = goals[episode.dialogue_id]
    area = goal.get("restaurant").info["area"]
    assert area in goal_slot_values(goal)["area"]

    def event(i: int, kind: str, text: str) -> EpisodeEvent:
        return EpisodeEvent(episode.episode_id, i, i, kind, "user" if kind == "user" else "agent", text=text)

    from dataclasses import replace

    asked_open = replace(episode, events=(event(0, "user", "I want a restaurant."), event(1, "clarify", "Which part of town do you prefer?")))
    assert clarification_verdicts(asked_open, goal) == [1.0]
    asked_known = replace(episode, events=(event(0, "user", f"A restaurant in the {area} please."), event(1, "clarify", "Which part of town do you prefer?")))
    assert clarification_verdicts(asked_known, goal) == [0.0]
    irrelevant = replace(episode, events=(event(0, "user", "I want a restaurant."), event(1, "clarify", "Do you like the weather today?")))
    assert clarification_verdicts(irrelevant, goal) == [0.0]
