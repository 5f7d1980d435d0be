"""The runner with scripted agents and users: what the user is shown, tool errors, the three
ways an episode ends, malformed outputs and their retries, the step limit, batching, forks,
determinism and the artifact tables."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest

from pipelines.artifacts.validate import validate
from pipelines.episodes import (
    DEFAULT_APOLOGY,
    EPISODE_EVENTS,
    EPISODES,
    AgentOutput,
    EpisodeSpec,
    EpisodeState,
    ReActFormat,
    ReplayAgent,
    RunnerConfig,
    episode_tables,
    play,
    run_episodes_sync,
)
from pipelines.simulators.base import UserTurn

from .helpers import ScriptedAgent, ScriptedSimulator, talkative_user

THINK_SECRET = "the user seems to want the cheapest option"


@pytest.fixture(scope="module")
def dialogues(small_corpus):
    return small_corpus.dialogues


def spec(dialogue, seed=0, episode_id=None):
    return EpisodeSpec.from_dialogue(dialogue, seed=seed, episode_id=episode_id)


def kinds(episode):
    return [e.kind for e in episode.events]


def content_of(episode):
    """Events without timings, which differ between runs."""
    return [dataclasses.replace(e, latency_s=None) for e in episode.events]


# --------------------------------------------------------------------------------------
# What the user sees
# --------------------------------------------------------------------------------------


def test_think_and_tool_traffic_are_hidden_from_the_user(dialogues, database):
    def policy(context):
        if context.exchange == 0 and context.step == 0:
            return f'<think>{THINK_SECRET}</think><tool_call>{{"name": "query_hotel", "arguments": {{"area": "north"}}}}</tool_call>'
        if context.exchange == 0:
            return f"<think>{THINK_SECRET}</think><clarify>Which price range would you like?</clarify>"
        return f"<think>{THINK_SECRET}</think>Here you go. <end>"

    user = talkative_user()
    [episode] = run_episodes_sync([spec(dialogues[0])], ScriptedAgent(policy), user, database)

    assert user.sessions[0].shown == ["Which price range would you like?"]
    assert kinds(episode) == ["user", "think", "tool_call", "observation", "think", "clarify", "user", "think", "respond", "end"]
    assert episode.n_clarifications == 1 and episode.n_tool_calls == 1
    think_events = [e for e in episode.events if e.kind == "think"]
    assert all(e.text == THINK_SECRET for e in think_events)
    # The agent itself does see the tool result.
    observation = next(e for e in episode.events if e.kind == "observation")
    assert json.loads(observation.observation_json)["count"] >= 0


def test_the_agent_context_holds_the_history_in_chat_form(dialogues, database):
    seen = []

    def policy(context):
        seen.append(context)
        if context.step == 0 and context.exchange == 0:
            return '<tool_call>{"name": "query_attraction", "arguments": {"area": "west"}}</tool_call>'
        return "Bye <end>"

    run_episodes_sync([spec(dialogues[0], seed=5)], ScriptedAgent(policy), talkative_user(), database)
    first, second = seen
    assert [m["role"] for m in first.messages] == ["system", "user"]
    assert "<clarify>" in first.messages[0]["content"] and "query_attraction" in first.messages[0]["content"]
    assert [m["role"] for m in second.messages] == ["system", "user", "assistant", "user"]
    assert second.messages[3]["content"].startswith("<tool_response>\n{")
    assert (first.turn, second.turn, second.step, second.seed) == (1, 1, 1, 5)
    assert [call.name for _, call in second.calls] == ["query_attraction"]
    assert first.step_seed != second.step_seed


# --------------------------------------------------------------------------------------
# Tool errors, ends, limits
# --------------------------------------------------------------------------------------


def test_tool_errors_are_recorded_and_the_episode_goes_on(dialogues, database):
    def policy(context):
        if context.exchange == 0 and context.step == 0:
            return '<tool_call>{"name": "query_spaceship", "arguments": {"area": "north"}}</tool_call>'
        if context.exchange == 0 and context.step == 1:
            return '<tool_call>{"name": "query_hotel", "arguments": {"stars": "eleven"}}</tool_call>'
        if context.exchange == 0:
            return "Sorry, which area?"
        return "Done. <end>"

    [episode] = run_episodes_sync([spec(dialogues[0])], ScriptedAgent(policy), talkative_user(), database)
    observations = [e for e in episode.events if e.kind == "observation"]
    assert "unknown tool" in observations[0].detail
    assert "stars must be one of" in observations[1].detail
    assert all("error" in json.loads(o.observation_json) for o in observations)
    assert episode.n_tool_calls == 2 and episode.n_tool_errors == 2
    assert episode.ended_by == "agent_end" and episode.n_turns == 4


def test_the_turn_limit_ends_an_episode_nobody_ends(dialogues, database):
    user = talkative_user()
    agent = ScriptedAgent(lambda context: f"Reply {context.exchange}")
    [episode] = run_episodes_sync([spec(dialogues[0])], agent, user, database, RunnerConfig(max_exchanges=3))
    assert episode.ended_by == "turn_limit"
    assert episode.n_turns == 6  # three user turns, three replies
    assert user.sessions[0].shown == ["Reply 0", "Reply 1"]  # the last reply gets no answer
    last = episode.events[-1]
    assert (last.kind, last.actor, last.detail, last.turn) == ("end", "runner", "turn_limit", 5)


def test_the_default_turn_limit_is_twenty_exchanges(dialogues, database):
    [episode] = run_episodes_sync([spec(dialogues[0])], ScriptedAgent(lambda c: "Go on."), talkative_user(), database)
    assert episode.ended_by == "turn_limit" and episode.n_turns == 40


def test_the_user_ends_the_episode(dialogues, database):
    script = ["I need a hotel.", "In the north.", UserTurn("Thanks, bye.", end=True), "never said"]
    agent = ScriptedAgent(lambda context: "<clarify>Anything else?</clarify>")
    user = ScriptedSimulator(lambda goal, reference: script)
    [episode] = run_episodes_sync([spec(dialogues[0])], agent, user, database)

    assert episode.ended_by == "user_end"
    assert len(agent.calls) == 2  # the agent is not asked to answer the goodbye
    assert episode.transcript()[-1] == ("user", "Thanks, bye.")
    assert episode.events[-1].actor == "user" and episode.events[-1].turn == 4
    assert episode.n_clarifications == 2


def test_the_agent_ends_the_episode_and_its_last_words_count(dialogues, database):
    # The goal checker grades the final response: facts given only there count.
    dialogue = next(d for d in dialogues if len(d.goal.domains) == 1)
    replayed = run_episodes_sync([spec(dialogue)], ReplayAgent(), talkative_user(), database)[0]
    texts = [e.text for e in replayed.events if e.kind == "respond"]
    calls = [(e.tool_name, e.arguments_json) for e in replayed.events if e.kind == "tool_call"]

    def policy(context, last_words):
        if len(context.calls) < len(calls):
            name, arguments = calls[len(context.calls)]
            return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'
        return f"{last_words} <end>"

    user = talkative_user()
    everything = ScriptedAgent(lambda context: policy(context, " ".join(texts)))
    [episode] = run_episodes_sync([spec(dialogue)], everything, user, database)
    assert episode.ended_by == "agent_end" and episode.success, episode.result.reasons
    assert user.sessions[0].shown == []  # the episode ended with the agent's first reply
    assert kinds(episode)[-2:] == ["respond", "end"] and episode.events[-1].actor == "agent"

    nothing = ScriptedAgent(lambda context: policy(context, "Goodbye."))
    assert not run_episodes_sync([spec(dialogue)], nothing, talkative_user(), database)[0].success


def test_a_bare_end_ends_without_saying_anything(dialogues, database):
    [episode] = run_episodes_sync([spec(dialogues[0])], ScriptedAgent(lambda c: "<end>"), talkative_user(), database)
    assert kinds(episode) == ["user", "end"] and episode.ended_by == "agent_end" and episode.n_turns == 1


def test_the_opening_turn_may_end_the_episode(dialogues, database):
    user = ScriptedSimulator(lambda goal, reference: [UserTurn("", end=True)])
    agent = ScriptedAgent(lambda c: "unused")
    [episode] = run_episodes_sync([spec(dialogues[0])], agent, user, database)
    assert episode.ended_by == "user_end" and agent.calls == []


# --------------------------------------------------------------------------------------
# Malformed outputs, the step limit, failed backends, simulator faults
# --------------------------------------------------------------------------------------


def test_malformed_outputs_are_retried_then_the_turn_fails_with_the_apology(dialogues, database):
    seen = []

    def policy(context):
        seen.append(context)
        return "<clarify>Which area?" if context.exchange == 0 else "Fine. <end>"

    user = talkative_user()
    config = RunnerConfig(malformed_retries=2)
    [episode] = run_episodes_sync([spec(dialogues[0])], ScriptedAgent(policy), user, database, config)

    assert kinds(episode) == ["user", "malformed", "malformed", "malformed", "fallback", "user", "respond", "end"]
    malformed = [e for e in episode.events if e.kind == "malformed"]
    assert all(e.text == "<clarify>Which area?" and "not closed" in e.detail for e in malformed)
    assert episode.n_malformed == 3 and episode.n_agent_fallbacks == 1
    assert user.sessions[0].shown == [DEFAULT_APOLOGY]  # nothing of the malformed outputs
    # Each retry saw its failed output and why; the next turn sees the apology as said.
    assert [c.attempt for c in seen] == [0, 1, 2, 0]
    assert seen[1].messages[-2:] == (
        {"role": "assistant", "content": "<clarify>Which area?"},
        {"role": "user", "content": seen[1].messages[-1]["content"]},
    )
    assert "not closed" in seen[1].messages[-1]["content"]
    assert seen[3].messages[-2] == {"role": "assistant", "content": DEFAULT_APOLOGY}


def test_a_retry_that_succeeds_saves_the_turn(dialogues, database):
    agent = ScriptedAgent(lambda c: "<clarify>Which day?</clarify> oops" if c.attempt == 0 else "<clarify>Which day?</clarify>")
    config = RunnerConfig(max_exchanges=2)
    [episode] = run_episodes_sync([spec(dialogues[0])], agent, talkative_user(), database, config)
    assert episode.n_malformed == 2 and episode.n_agent_fallbacks == 0 and episode.n_clarifications == 2


def test_the_step_limit_fails_a_turn_that_never_replies(dialogues, database):
    agent = ScriptedAgent(lambda c: '<tool_call>{"name": "query_hotel", "arguments": {}}</tool_call>')
    config = RunnerConfig(max_exchanges=2, max_steps=3)
    [episode] = run_episodes_sync([spec(dialogues[0])], agent, talkative_user(), database, config)
    assert episode.n_tool_calls == 6 and episode.n_agent_fallbacks == 2
    fallback = next(e for e in episode.events if e.kind == "fallback")
    assert "after 3 steps" in fallback.detail and fallback.text == DEFAULT_APOLOGY


def test_a_failed_backend_call_counts_as_malformed_without_polluting_the_history(dialogues, database):
    seen = []

    def policy(context):
        seen.append(context)
        return AgentOutput("", error="timeout: no answer") if context.attempt == 0 else AgentOutput("Hello <end>", prompt_tokens=7, completion_tokens=3)

    [episode] = run_episodes_sync([spec(dialogues[0])], ScriptedAgent(policy), talkative_user(), database)
    assert kinds(episode) == ["user", "malformed", "respond", "end"]
    assert "timeout" in episode.events[1].detail
    assert seen[0].messages == seen[1].messages  # the same request again (with a new seed)
    assert seen[0].step_seed != seen[1].step_seed
    assert (episode.prompt_tokens, episode.completion_tokens) == (7, 3)


def test_simulator_retries_and_fallbacks_are_recorded(dialogues, database):
    script = [
        UserTurn("I need a train.", retries=2, failure="timeout"),
        UserTurn("Sorry, could you repeat that?", retries=3, fallback=True, failure="invalid_output"),
    ]
    user = ScriptedSimulator(lambda goal, reference: script)
    [episode] = run_episodes_sync([spec(dialogues[0])], ScriptedAgent(lambda c: "Which day?"), user, database)
    assert (episode.simulator_retries, episode.simulator_fallbacks) == (5, 1)
    fallback = next(e for e in episode.events if e.kind == "fallback")
    assert (fallback.actor, fallback.retries, fallback.detail, fallback.turn) == ("user", 3, "invalid_output", 2)


# --------------------------------------------------------------------------------------
# Batching, determinism, forks
# --------------------------------------------------------------------------------------


def test_live_episodes_are_stepped_together_in_one_act_call_per_round(dialogues, database):
    # Episode i ends after i + 1 replies: the batches shrink as episodes finish.
    agent = ScriptedAgent(lambda c: "Bye <end>" if c.exchange >= c.seed else f"Reply {c.exchange}")
    specs = [spec(dialogues[i], seed=i) for i in range(4)]
    episodes = run_episodes_sync(specs, agent, talkative_user(), database)

    assert [len(batch) for batch in agent.calls] == [4, 3, 2, 1]
    assert [[c.episode_id for c in batch] for batch in agent.calls][1] == [s.episode_id for s in specs[1:]]
    assert [e.n_turns for e in episodes] == [2, 4, 6, 8]
    assert [e.episode_id for e in episodes] == [s.episode_id for s in specs]


def test_simulators_are_awaited_concurrently(dialogues, database):
    class SlowSession:
        async def opening(self):
            await asyncio.sleep(0.2)
            return UserTurn("hi")

        async def respond(self, agent_text):
            await asyncio.sleep(0.2)
            return UserTurn("bye", end=True)

        def fork(self):
            return self

    class SlowSimulator:
        name = "slow"

        def session(self, goal, seed, reference=None):
            return SlowSession()

    specs = [spec(dialogues[0], seed=i) for i in range(10)]
    start = time.perf_counter()
    episodes = run_episodes_sync(specs, ScriptedAgent(lambda c: "Hello"), SlowSimulator(), database)
    elapsed = time.perf_counter() - start
    assert all(e.ended_by == "user_end" for e in episodes)
    assert elapsed < 1.5, f"10 episodes x 2 slow user turns took {elapsed:.2f}s: not concurrent"
    assert all(e.latency_s >= 0.2 for ep in episodes for e in ep.events if e.kind == "user")


def test_runs_are_deterministic_for_seeds(dialogues, database):
    specs = [spec(d, seed=3) for d in dialogues[:8]]
    first = run_episodes_sync(specs, ReplayAgent(ReActFormat()), talkative_user(), database)
    second = run_episodes_sync(specs, ReplayAgent(ReActFormat()), talkative_user(), database)
    assert [content_of(e) for e in first] == [content_of(e) for e in second]
    other_seed = run_episodes_sync([spec(d, seed=4) for d in dialogues[:8]], ReplayAgent(ReActFormat()), talkative_user(), database)
    assert booking_observations(first) and booking_observations(first) != booking_observations(other_seed)


def booking_observations(episodes):
    return [e.observation_json for ep in episodes for e in ep.events if e.kind == "observation" and '"reference"' in e.observation_json]


def test_forked_episodes_are_independent(dialogues, database):
    user = talkative_user()
    agent = ScriptedAgent(lambda c: "unused")
    state = EpisodeState.start(spec(dialogues[0]), agent, user, database, RunnerConfig())
    asyncio.run(state.hear_user())
    state.take(AgentOutput('<tool_call>{"name": "query_hotel", "arguments": {"area": "north"}}</tool_call>'))
    before = (len(state.events), len(state.messages), len(state.environment.state.calls))

    branch = state.fork()
    branch.take(AgentOutput('<tool_call>{"name": "query_hotel", "arguments": {"area": "south"}}</tool_call>'))
    branch.take(AgentOutput("<clarify>South it is. Which day?</clarify>"))
    asyncio.run(branch.hear_user())

    assert (len(state.events), len(state.messages), len(state.environment.state.calls)) == before
    assert state.phase == "agent" and branch.phase == "agent"
    assert user.sessions[0].shown == [] and branch.session.shown == ["South it is. Which day?"]
    assert len(branch.environment.state.calls) == 2 and branch.exchange == 1 and state.exchange == 0

    state.take(AgentOutput("North it is. <end>"))
    original = state.finish()
    forked = asyncio.run(play([branch], ScriptedAgent(lambda c: "Bye <end>")))[0]
    assert [e.kind for e in original.events] == ["user", "tool_call", "observation", "respond", "end"]
    assert [e.kind for e in forked.events] == [
        "user", "tool_call", "observation", "tool_call", "observation", "clarify", "user", "respond", "end",
    ]
    assert original.events[:3] == forked.events[:3]  # the shared past


def test_play_and_run_refuse_inconsistent_input(dialogues, database):
    with pytest.raises(ValueError, match="unique"):
        run_episodes_sync([spec(dialogues[0]), spec(dialogues[0])], ScriptedAgent(lambda c: "x"), talkative_user(), database)
    state = EpisodeState.start(spec(dialogues[0]), ScriptedAgent(lambda c: "x"), talkative_user(), database, RunnerConfig())
    with pytest.raises(ValueError, match="format"):
        asyncio.run(play([state], ScriptedAgent(lambda c: "x", fmt=ReActFormat())))
    with pytest.raises(RuntimeError, match="does not wait for the agent"):
        state.take(AgentOutput("hello"))
    with pytest.raises(ValueError):
        RunnerConfig(max_steps=0)


# --------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------


def test_episode_tables_validate(dialogues, database):
    def policy(context):
        if context.exchange == 0 and context.attempt == 0:
            return "<clarify>unclosed"
        if context.exchange == 0 and context.step == 0:
            return f'<think>{THINK_SECRET}</think><tool_call>{{"name": "nope", "arguments": {{}}}}</tool_call>'
        return f"<clarify>Question {context.exchange}?</clarify>"

    specs = [spec(d, seed=i) for i, d in enumerate(dialogues[:5])]
    episodes = run_episodes_sync(specs, ScriptedAgent(policy), talkative_user(4), database)
    tables = episode_tables(episodes)
    assert tables["episodes"].num_rows == 5
    assert tables["episode_events"].num_rows == sum(len(e.events) for e in episodes)

    report = validate(tables["episodes"], EPISODES)
    assert report.success, report.to_text()
    report = validate(tables["episode_events"], EPISODE_EVENTS, {"episodes": tables["episodes"]})
    assert report.success, report.to_text()

    row = tables["episodes"].slice(0, 1).to_pylist()[0]
    assert row["ended_by"] == "user_end" and row["n_malformed"] == 1 and row["n_tool_errors"] == 1
    assert [d["domain"] for d in row["domain_results"]] == list(row["goal_domains"])
    kinds_column = set(tables["episode_events"].column("kind").to_pylist())
    assert {"user", "malformed", "think", "tool_call", "observation", "clarify", "end"} <= kinds_column


def test_the_event_suite_catches_broken_tables(dialogues, database):
    episodes = run_episodes_sync([spec(dialogues[0])], ScriptedAgent(lambda c: "Bye <end>"), talkative_user(), database)
    tables = episode_tables(episodes)
    events = tables["episode_events"]
    shouting = ["shout" if kind == "respond" else kind for kind in events.column("kind").to_pylist()]
    broken = events.set_column(events.schema.get_field_index("kind"), "kind", [shouting])
    report = validate(broken, EPISODE_EVENTS, {"episodes": tables["episodes"]})
    assert [(f.type, f.column) for f in report.failures] == [("expect_column_values_to_be_in_set", "kind")]
    orphans = validate(events, EPISODE_EVENTS, {"episodes": tables["episodes"].slice(0, 0)})
    assert not orphans.success


def test_an_output_cut_by_the_generation_limit_is_reported_as_truncated_not_malformed(dialogues, database):
    def policy(context):
        if context.attempt == 0:
            return AgentOutput("<think>a</think><clarify>Which area would you", completion_tokens=16, truncated=True)
        return AgentOutput("<clarify>Which day?</clarify> oops") if context.attempt == 1 else AgentOutput("Fine. <end>")

    [episode] = run_episodes_sync([spec(dialogues[0])], ScriptedAgent(policy), talkative_user(), database)
    assert kinds(episode) == ["user", "truncated", "malformed", "respond", "end"]
    truncated = episode.events[1]
    assert truncated.detail.startswith("truncated at the generation limit (16 tokens)") and "not closed" in truncated.detail
    assert episode.n_truncated == 1 and episode.n_malformed == 1 and episode.n_agent_fallbacks == 0


def test_progress_reports_finished_and_partly_played_episodes_after_every_round(dialogues, database):
    lengths = iter([1, 3, 2])  # the user says goodbye in their first, third and second turn

    def script(goal, reference):
        n = next(lengths)
        return [*(f"line {i}" for i in range(n - 1)), UserTurn("Thanks, bye.", end=True)]

    calls = []
    agent = ScriptedAgent(lambda context: "<clarify>Anything else?</clarify>")
    specs = [spec(d) for d in dialogues[:3]]
    episodes = run_episodes_sync(specs, agent, ScriptedSimulator(script), database,
                                 progress=lambda done, total: calls.append((done, total)))
    assert [e.ended_by for e in episodes] == ["user_end"] * 3
    # after each round: the finished episodes, plus each playing one's share of its 20 turns
    # (round 1: one done, two at 1/20; round 2: two done, one at 2/20; round 3: all done)
    assert calls == [(1.1, 3), (2.1, 3), (3, 3)], calls
