"""Claims checked against what the policy saw (pipelines/evaluation/grounding.py): the runner's
messages rebuilt from an episode's events equal those the agent was given; each stated attribute
is right or wrong, with its value in the prompt or not; and the README's account of the partial
H100 run is computed from that run's committed episodes (benchmarks/grounding.py)."""

from __future__ import annotations

import json

import pytest

from pipelines.episodes.formats import AgentAction, Malformed, get_format
from pipelines.evaluation.grounding import claims, grounding_table, replies
from pipelines.speaker.phrasing import reqt_answer
from tests.benchmark_support import ROOT, flat, load_benchmark


def test_the_messages_rebuilt_from_the_events_are_those_the_agent_was_given(small_corpus):
    from dataclasses import asdict

    from pipelines.env.tools import Database
    from pipelines.episodes.agents import ReplayAgent
    from pipelines.episodes.runner import EpisodeSpec, run_episodes_sync
    from pipelines.simulators.agenda import AgendaSimulator

    given = []

    class ThinkingReplay(ReplayAgent):
        """The gold replay, with a reasoning before every output; keeps the messages it is given
        before each plain response."""

        def actions(self, context):
            actions = [AgentAction.think(f"step {context.turn}.{context.step}"), *super().actions(context)]
            if any(a.kind == "respond" for a in actions):
                given.append((context.episode_id, list(context.messages[1:])))  # the runner's system prompt: replaced in any view
            return actions

    database = Database(small_corpus.entities, small_corpus.taxi_options)
    dialogues = [d for d in small_corpus.dialogues if d.split == "test"][:4]
    fmt = get_format("speakrl")
    episodes = run_episodes_sync([EpisodeSpec.from_dialogue(d) for d in dialogues], ThinkingReplay(fmt, database=database),
                                 AgendaSimulator(database), database)
    rebuilt = [(episode.episode_id, messages) for episode in episodes for _, messages, _ in replies([asdict(e) for e in episode.events], fmt)]
    given.sort(key=lambda pair: [e.episode_id for e in episodes].index(pair[0]))  # episodes play concurrently
    assert len(rebuilt) == len(given) > 4
    assert rebuilt == [(episode, [dict(m) for m in messages]) for episode, messages in given]
    assert any(m["content"].startswith("<tool_response>") for _, ms in given for m in ms)


def _events(said_postcode: str, venue: str = "lucky inn") -> list[dict]:
    observation = {"count": 2, "results": [{"name": "lucky inn", "postcode": "cb49xw", "phone": "01223000001"},
                                           {"name": "red house", "postcode": "cb11aa", "phone": "01223000002"}]}
    return [
        {"kind": "user", "actor": "user", "turn": 0, "text": "a cheap hotel"},
        {"kind": "tool_call", "actor": "agent", "turn": 1, "tool_name": "query_hotel", "arguments_json": json.dumps({"pricerange": "cheap"})},
        {"kind": "observation", "actor": "environment", "turn": 1, "tool_name": "query_hotel", "observation_json": json.dumps(observation)},
        {"kind": "respond", "actor": "agent", "turn": 1, "text": "I recommend lucky inn."},
        {"kind": "user", "actor": "user", "turn": 2, "text": "Its postcode and phone number?"},
        {"kind": "think", "actor": "agent", "turn": 3, "text": "The results have them."},
        {"kind": "respond", "actor": "agent", "turn": 3, "text": reqt_answer(venue, {"postcode": said_postcode, "phone": "01223000001"})},
    ]


def test_each_stated_attribute_is_right_or_wrong_with_its_value_in_the_prompt_or_not():
    fmt = get_format("speakrl")
    everything = claims("e", _events("cb49xw"), fmt, lambda messages: messages)
    assert [(c.slot, c.said, c.truth, c.outcome) for c in everything] == [
        ("postcode", "cb49xw", "cb49xw", "right_in_prompt"), ("phone", "01223000001", "01223000001", "right_in_prompt")]
    # A view that kept only the last user turn: the results are not in the prompt.
    last_only = claims("e", _events("cb16yq"), fmt, lambda messages: messages[-1:])
    assert [c.outcome for c in last_only] == ["wrong_not_in_prompt", "right_not_in_prompt"]
    assert grounding_table(last_only) == {"claims": 2, "right_in_prompt": 0, "right_not_in_prompt": 1, "wrong_in_prompt": 0,
                                          "wrong_not_in_prompt": 1, "no_record": 0}
    assert grounding_table(last_only, ["postcode"])["claims"] == 1
    # A venue the episode never looked up has no record to check against.
    assert [c.outcome for c in claims("e", _events("cb49xw", venue="merry cantina"), fmt, lambda m: m)] == ["no_record", "no_record"]
    # The first plain response states nothing in the answer shape.
    assert [turn for turn, _, _ in replies(_events("x"), fmt)] == [1, 3]
    # A malformed output is in the history with the feedback the runner gave; a backend failure
    # (no output) is not.
    events = _events("x")
    events[5:5] = [{"kind": "malformed", "actor": "agent", "turn": 3, "text": "<clarify>oops", "detail": "<clarify> is not closed"},
                   {"kind": "malformed", "actor": "agent", "turn": 3, "text": None, "detail": "the agent produced no output (timeout)"}]
    *_, (_, before, _) = replies(events, fmt)
    assert before[-2:] == [{"role": "assistant", "content": "<clarify>oops"}, fmt.feedback_message(Malformed("<clarify> is not closed", ""))]


def test_the_readme_gives_the_committed_runs_grounding():
    pytest.importorskip("gguf")
    bench = load_benchmark("grounding")
    rows = {(r["prompt_tokens"], r["fields"]): r for r in bench.grounding_rows(bench.DEFAULT, [576, 1536], ["reduced", "whole"], ["sft"],
                                                                                 ["phone", "postcode", "address"])}
    seen, wider = rows[(576, "reduced")], rows[(1536, "whole")]
    # What the model saw: right exactly when the value was in its prompt.
    assert seen["right_not_in_prompt"] == seen["wrong_in_prompt"] == 0
    readme = flat((ROOT / "README.md").read_text(encoding="utf-8"))
    stated = [
        f"{seen['claims']} phone numbers, postcodes and addresses",
        f"{seen['right_in_prompt']} right, each with the value in its prompt, {seen['wrong_not_in_prompt']} wrong, each without",
        f"{wider['wrong_in_prompt']} of the {seen['wrong_not_in_prompt']} wrong ones",
        f"{seen['failed_with_wrong']} of the {seen['failed_dialogues']} failed SFT dialogues state a wrong phone number, postcode or address, "
        f"none of the {seen['succeeded_dialogues']} successful ones does" if seen["succeeded_with_wrong"] == 0 else "(some successful ones do)",
    ]
    missing = [line for line in stated if line not in readme]
    assert not missing, missing


def test_a_job_stopped_before_its_last_evaluation_is_read_from_the_sft_models_tables(tmp_path):
    import shutil

    bench = load_benchmark("grounding")
    with pytest.raises(SystemExit, match="evaluate_sft_episodes.parquet"):
        bench.episode_tables(tmp_path)
    for name in ("episodes", "episode_events"):
        shutil.copy(bench.DEFAULT / f"{name}.parquet", tmp_path / f"evaluate_sft_{name}.parquet")
    assert bench.episode_tables(tmp_path) == (tmp_path / "evaluate_sft_episodes.parquet", tmp_path / "evaluate_sft_episode_events.parquet")
    shutil.copy(bench.DEFAULT / "episodes.parquet", tmp_path / "episodes.parquet")  # the whole evaluation, once there, first
    assert bench.episode_tables(tmp_path)[0] == tmp_path / "episodes.parquet"


def test_the_readme_gives_the_committed_runs_failures():
    bench = load_benchmark("failures")
    sft = bench.failure_rows(bench.DEFAULT, ["sft"])["sft"]
    others = sft["failed"] - sft["with_wrong_value"]
    assert sum(sft["by_check"].values()) == others
    readme = flat((ROOT / "README.md").read_text(encoding="utf-8"))
    stated = [
        f"of the SFT model's {sft['failed']} failures, {sft['with_wrong_value']} state a wrong phone number, postcode or address; "
        f"of the other {others}, {sft['by_check'][('taxi', 'book')]} first fail at booking a taxi",
        f"(\"{sft['example'][('taxi', 'book')]}\")",
        f"searched a domain again {sft['requeries']} times; {sft['dropping']} of those searches leave out a slot",
        f"in {sft['failed_dropping']} of the {sft['failed']} failed dialogues (and {sft['succeeded_dropping']} of the "
        f"{sft['dialogues'] - sft['failed']} successful ones",
        "by tool, " + ", ".join(f"`{tool}` {d} of {n}" for tool, (d, n) in sorted(sft["dropping_by_tool"].items(), key=lambda i: -i[1][0]) if d),
        f"searched for a venue by its name {sft['name_searches']} times; {sft['name_misses']} of those searches found nothing",
        f"in {sft['failed_name_miss']} failed and {sft['succeeded_name_miss']} successful dialogues",
        f"only {sft['name_misses_other_kind']} times was its next search for the name among another kind of place",
    ]
    missing = [line for line in stated if line not in readme]
    assert not missing, missing
