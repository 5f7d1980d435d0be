"""The ``speaker`` stage on a small embedded corpus: the acceptance criteria of the SpeakER
datasets, checked on what the stage published."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.artifacts.validate import validate
from pipelines.episodes.formats import CLARIFY, THINK, TOOL_CALL, Malformed, SpeakRLFormat
from pipelines.errors import ConfigError, DataError
from pipelines.rewards.verifiable import VerifiableJudge
from pipelines.speaker.synthesis import env_seed
from pipelines.speaker.tables import SPECS
from pipelines.speaker.trajectory import ChatTurn, Trajectory, replay_trajectory
from stages.speaker import run

from .conftest import stage_params

FORMAT = SpeakRLFormat()
ARTIFACTS = ("speaker_dialogues", "speaker_sft", "speaker_grpo", "speaker_dpo")


def _table(params: dict, name: str):
    return pq.read_table(Path(params["output"]) / f"{name}.parquet")


def _parsed(content: str):
    parsed = FORMAT.parse(content)
    assert not isinstance(parsed, Malformed), f"{parsed.reason}: {content!r}"
    return parsed


def test_stage_publishes_the_datasets_and_their_metrics(stage_run):
    params, metrics = stage_run
    for name in ARTIFACTS:
        assert _table(params, name).num_rows == metrics["rows"][name] > 0, name
    assert json.loads(Path(params["metrics"]).read_text()) == metrics
    dialogues = metrics["dialogues"]
    assert dialogues["kept"] + dialogues["dropped"] == metrics["seeds"] == metrics["rows"]["speaker_dialogues"]
    assert sum(dialogues["dropped_by_reason"].values()) == dialogues["dropped"]
    assert "llm" not in metrics, "run accounting is not a metric (issue 28 item 9)"
    # Slot-filling questions (a taxi's missing place or time) are counted apart from the clarifications.
    sft = _table(params, "speaker_sft").to_pylist()
    slot_rows = sum(r["kind"] == "clarify" and r["ambiguity_type"] is None for r in sft)
    slot_questions = sum(r["n_slot_questions"] for r in _table(params, "speaker_dialogues").to_pylist() if r["kept"])
    assert metrics["clarifications"]["slot_filling"] == slot_questions == slot_rows > 0
    import catalog.io

    timings = json.loads((catalog.io.TIMINGS_DIR / "speaker.json").read_text())
    assert "total" in timings["llm"], "the run's LLM accounting is in reports/timings/speaker.json"


def test_expectation_suites_pass(stage_run):
    params, _ = stage_run
    tables = {name: _table(params, name) for name in ARTIFACTS}
    for name, table in tables.items():
        report = validate(table, SPECS[name], {"speaker_dialogues": tables["speaker_dialogues"]})
        assert report.success, report.to_text()


def test_every_kept_dialogue_replays_successfully_with_a_clarification(stage_run, speaker_corpus, database):
    params, metrics = stage_run
    goals = {d.dialogue_id: d.goal for d in speaker_corpus.dialogues}
    kept = [r for r in _table(params, "speaker_dialogues").to_pylist() if r["kept"]]
    assert len(kept) == metrics["dialogues"]["kept"] > 0
    for row in kept:
        turns = tuple(ChatTurn(t["role"], t["content"], t["kind"]) for t in json.loads(row["turns_json"]))
        trajectory = Trajectory(row["dialogue_id"], goals[row["dialogue_id"]], env_seed(params["seed"], row["dialogue_id"]), turns)
        assert replay_trajectory(trajectory, database).success, row["dialogue_id"]
        assert row["n_clarifications"] >= 1 and len(row["clarification_questions"]) == row["n_clarifications"]


def test_every_dpo_negative_fails_replay(rules_result, database):
    pairs = [pair for outcome in rules_result.kept for pair in outcome.pairs]
    assert pairs
    for pair in pairs:
        outcome = replay_trajectory(pair.negative, database)
        assert outcome.problem is None and not outcome.success and outcome.failure_reasons == pair.negative_reasons
        assert pair.chosen.kind == CLARIFY and pair.rejected.kind != CLARIFY
        assert pair.negative.turns[: len(pair.prompt)] == pair.prompt, "chosen and rejected answer the same conversation"


def test_sft_completions_and_dpo_outputs_parse_with_the_runner_parser(stage_run):
    params, _ = stage_run
    system = None
    for row in _table(params, "speaker_sft").to_pylist():
        (completion,) = row["completion"]
        actions = _parsed(completion["content"])
        assert completion["role"] == "assistant" and actions[0].kind == THINK
        assert (row["kind"] == CLARIFY) == any(a.kind == CLARIFY for a in actions)
        if row["ambiguity_type"] is not None:
            assert row["kind"] == CLARIFY
        elif row["kind"] == CLARIFY:  # slot filling: a taxi request that left out a place or the time
            assert row["ask_needed"] and "taxi" in row["prompt"][-1]["content"]
        assert row["prompt"][0]["role"] == "system" and row["prompt"][-1]["role"] == "user"
        system = system or row["prompt"][0]["content"]
        assert row["prompt"][0]["content"] == system
    kinds = set()
    for row in _table(params, "speaker_dpo").to_pylist():
        chosen, rejected = _parsed(row["chosen"][0]["content"]), _parsed(row["rejected"][0]["content"])
        kinds.add(row["ask_needed"])
        if row["ask_needed"]:
            assert [a.kind for a in chosen] == [THINK, CLARIFY]
            assert CLARIFY not in [a.kind for a in rejected] and rejected[0].kind == THINK
            assert row["negative_failure"] and row["ambiguity_type"] is not None
        else:  # act here: the tool call over a needless question, or over the search without a said constraint
            assert [a.kind for a in chosen] == [THINK, TOOL_CALL] and [a.kind for a in rejected] in ([THINK, CLARIFY], [THINK, TOOL_CALL])
            if rejected[-1].kind == TOOL_CALL:
                wanted, dropping = dict(chosen[-1].arguments), dict(rejected[-1].arguments)
                assert rejected[-1].tool_name == chosen[-1].tool_name and dropping.items() < wanted.items()
                assert len(wanted) - len(dropping) == 1
                kinds.add("dropped")
            assert row["negative_failure"] == [] and row["ambiguity_type"] is None
        assert row["prompt"][0]["content"] == system
    assert kinds == {True, False, "dropped"}


def test_grpo_rows_give_the_rewards_what_they_read(stage_run):
    params, _ = stage_run
    judge = VerifiableJudge()
    rows = _table(params, "speaker_grpo").to_pylist()
    for row in rows:
        (message,) = row["prompt"]
        assert message["role"] == "user" and message["content"].rstrip().endswith("Agent:")
        assert "<think>" in message["content"] and "User:" in message["content"]
        columns = {k: row[k] for k in ("discriminating_slots", "candidate_values", "known_slots")}
        if not row["ask_needed"]:
            # Act here: the reference acts, nothing discriminates, the user's slots are known.
            assert [a.kind for a in _parsed(row["reference"])] == [THINK, TOOL_CALL]
            assert row["discriminating_slots"] == [] and row["known_slots"] and row["ambiguity_type"] is None
            continue
        question = next(a.text for a in _parsed(row["reference"]) if a.kind == CLARIFY)
        verdict = judge.verdict(question, columns)
        assert verdict.score == 1.0, (question, row["discriminating_slots"], row["known_slots"], verdict.reason)
        assert set(json.loads(row["candidate_values"])) == set(row["discriminating_slots"])
        assert json.loads(row["goal"])
    assert {row["ask_needed"] for row in rows} == {True, False}


def test_act_here_points_are_counted_and_their_needless_question_re_asks_a_known_slot(stage_run):
    params, metrics = stage_run
    dpo = [row for row in _table(params, "speaker_dpo").to_pylist() if not row["ask_needed"]]
    grpo = [row for row in _table(params, "speaker_grpo").to_pylist() if not row["ask_needed"]]
    assert metrics["act_here"]["dpo_pairs"] == len(dpo) > 0 and metrics["act_here"]["grpo_rows"] == len(grpo) > 0
    known = {(r["dialogue_id"], r["step"]): r["known_slots"] for r in grpo}
    judge = VerifiableJudge()
    assert sum(metrics["act_here"]["by_rejected"].values()) == len(dpo)
    assert sum(any(a.kind == TOOL_CALL for a in _parsed(row["rejected"][0]["content"])) for row in dpo) == metrics["act_here"]["by_rejected"]["dropped_slot"]
    for row in dpo:
        question = next((a.text for a in _parsed(row["rejected"][0]["content"]) if a.kind == CLARIFY), None)
        if question is None:
            continue  # the search without a said constraint (test_sft_completions_and_dpo_outputs_parse_with_the_runner_parser)
        columns = {"discriminating_slots": [], "known_slots": known[(row["dialogue_id"], row["step"])]}
        assert judge.verdict(question, columns).reason == "asks_known_slot", question


def test_no_training_artifact_holds_a_test_split_dialogue(stage_run):
    params, _ = stage_run
    source = Path(params["source"])
    test_ids = set((source / "testListFile.json").read_text().split())
    assert test_ids
    for name in ARTIFACTS:
        table = _table(params, name)
        assert not set(table.column("dialogue_id").to_pylist()) & test_ids, name
        if "split" in table.column_names:
            assert set(table.column("split").to_pylist()) <= {"train", "val"}, name


def test_clarifications_are_grounded_in_the_tool_results(rules_result):
    """The agent asks after it has searched (it knows how many candidates there are), and
    the reasoning names that count."""
    for outcome in rules_result.kept:
        turns = outcome.trajectory.turns
        for index, turn in outcome.trajectory.clarifications:
            if turn.point.type != "underspecification":
                continue
            before = [t for t in turns[:index] if t.role == "assistant"]
            assert before and before[-1].kind == TOOL_CALL
            think = _parsed(turn.content)[0].text
            assert str(turn.point.n_candidates) in think


def test_rerunning_the_stage_reproduces_its_outputs(stage_run, tmp_path):
    params, metrics = stage_run
    again = stage_params(Path(params["source"]), tmp_path)
    assert run(again) == metrics
    for name in ARTIFACTS:
        assert _table(again, name).equals(_table(params, name)), name


@pytest.mark.parametrize(
    "override, message",
    [
        ({"surprise": 1}, "unknown key"),
        ({"synthesizer": {"backend": "hf", "model_path": "x"}}, "not supported"),
        ({"synthesizer": {"backend": "openai"}}, "base_url"),
        ({"max_clarifications": 0}, "max_clarifications"),
        ({"dedup": {"threshold": 1.5}}, "threshold"),
    ],
)
def test_bad_params_are_config_errors(speaker_corpus_dir, tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        run(stage_params(speaker_corpus_dir, tmp_path, **override))


def test_the_stage_fails_loudly_when_a_test_dialogue_reaches_a_training_table(stage_run, tmp_path, monkeypatch):
    """Fault injection: a loader that loses the split (every seed read as train) lets test
    seeds through the synthesis filter; the leak check stops the stage before publishing."""
    import dataclasses

    import stages.speaker as stage

    real = stage.synthesize_seeds

    def split_lost(dialogues, *args, **kwargs):
        return real([dataclasses.replace(d, split="train") for d in dialogues], *args, **kwargs)

    monkeypatch.setattr(stage, "synthesize_seeds", split_lost)
    params, _ = stage_run
    again = stage_params(Path(params["source"]), tmp_path / "leaky")
    with pytest.raises(DataError, match="test-split dialogue"):
        run(again)
    assert not Path(again["output"]).exists() and not Path(again["metrics"]).exists()


def _said(think: str) -> dict[str, str]:
    """The think's "Said: slot=value, ..." pairs."""
    import re

    match = re.search(r"Said: (.+?)\.(?: |$)", think)
    if match is None or match.group(1) == "nothing yet":
        return {}
    return dict(pair.split("=", 1) for pair in match.group(1).split(", "))


def test_no_clarify_row_asks_about_a_slot_the_user_stated(stage_run):
    """Issue 26: the data never teaches a question about a slot the user has already stated
    for the search it follows (the search's arguments, answers, "I don't mind"), nor one
    about a slot the think lists as said; the audit's count of such questions is 0."""
    from pipelines.rewards.verifiable import asked_slots
    from pipelines.speaker.audit import asks_stated_slot, search_state

    params, metrics = stage_run
    clarify = [r for r in _table(params, "speaker_sft").to_pylist() if r["kind"] == CLARIFY]
    assert clarify
    after_search = 0
    for row in clarify:
        parsed = _parsed(row["completion"][0]["content"])
        question = " ".join(a.text for a in parsed if a.kind == CLARIFY)
        state = search_state(row["prompt"])
        if state is not None:
            after_search += 1
            assert not asked_slots(question) & state.stated, (row["dialogue_id"], row["step"], question)
        assert not asks_stated_slot(question, row["prompt"])
        assert not asked_slots(question) & set(_said(parsed[0].text)), (row["dialogue_id"], row["step"], question)
    assert after_search >= 0.8 * len(clarify)  # the underspecification questions follow a search
    assert metrics["audit"]["over_asking"]["asks_stated_slot"] == 0
    assert metrics["audit"]["after_search"]["stated"]["ask"] == 0 and metrics["audit"]["after_search"]["stated"]["act"] > 0


def test_said_values_in_the_think_occur_in_the_users_turns(stage_run):
    """The think's "Said: slot=value" pairs are copied from the dialogue: every value occurs
    (whole words) in the prompt's user turns, tool results left out."""
    from pipelines.rewards.verifiable import words
    from pipelines.speaker.audit import user_words

    params, _ = stage_run
    checked = {"clarify": 0, "respond": 0}
    for row in _table(params, "speaker_sft").to_pylist():
        think = _parsed(row["completion"][0]["content"])[0].text
        said = _said(think)
        heard = user_words(row["prompt"])
        for slot, value in said.items():
            assert f" {words(value)} " in heard, (row["dialogue_id"], row["step"], slot, value)
        if said and row["kind"] in checked:
            checked[row["kind"]] += 1
    assert checked["clarify"] > 0 and checked["respond"] > 0, checked


def test_contrasts_state_the_asked_slot_and_recommend(rules_result, database):
    """Every contrast is its question's situation with the asked slot stated in the request:
    the same prefix, a search whose arguments hold the slot, then a recommendation."""
    from pipelines.rewards.verifiable import asked_slots

    total = 0
    for outcome in rules_result.kept:
        turns = outcome.trajectory.turns
        for contrast in outcome.contrasts:
            total += 1
            question = " ".join(a.text for a in _parsed(turns[contrast.question].content) if a.kind == CLARIFY)
            user, call, observation, decision = contrast.turns
            assert user.kind == "user" and call.kind == TOOL_CALL and decision.kind == "respond"
            arguments = next(a for a in _parsed(call.content) if a.kind == TOOL_CALL).arguments
            point = turns[contrast.question].point
            assert set(point.slots) <= set(arguments) and asked_slots(question) & set(arguments), (contrast.dialogue_id, question)
            assert all(arguments[s] == point.goal_values[s] for s in point.slots)
            assert set(_said(_parsed(decision.content)[0].text)) >= set(point.slots)
    questions = sum(1 for o in rules_result.kept for _, t in o.trajectory.clarifications if t.point.type == "underspecification")
    assert total >= 0.8 * questions > 0
