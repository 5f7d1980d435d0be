"""Hindsight extraction on hand-built logs: the full prefix as context, stop detection by
both rules, the empty-info drop, unannotated sessions, and the LLM extractor's failures."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from pipelines.learn_to_ask.hindsight import (
    CONTINUE,
    EMPTY_INFO,
    INVALID_OUTPUT,
    STOP,
    UNANNOTATED,
    LLMExtractor,
    RulesExtractor,
    hindsight_samples,
)
from pipelines.learn_to_ask.logs import Message, Session, session_from_dialogue
from pipelines.learn_to_ask.tables import L2A_SAMPLES, hindsight_metrics, samples_table
from pipelines.artifacts.validate import validate
from pipelines.records import Dialogue, DomainBelief, Goal, Turn


def u(text: str, *info: tuple[str, str]) -> Message:
    return Message("user", text, tuple(info))


def a(text: str) -> Message:
    return Message("assistant", text)


# A pharmacist-style log: the expert asks twice, the user changes an answer, then nothing new.
SESSION = Session(
    "s1",
    (
        u("I have a cold and a bad cough.", ("symptom", "cough")),
        a("Do you have a fever?"),                                   # t=1
        u("No fever.", ("fever", "absent")),
        a("Is your cough dry or productive?"),                      # t=3
        u("Dry. Well, actually productive, with yellow phlegm.", ("cough type", "productive"), ("phlegm", "yellow")),
        a("Thanks. Anything else?"),                                # t=5
        u("No, that's all."),
        a("I recommend an expectorant."),                           # t=7
    ),
    goal="Find medication for a cold with a cough.",
    split="train",
)


def by_turn(samples):
    return {s.turn: s for s in samples}


def test_context_is_the_full_prefix_and_future_the_rest():
    samples = by_turn(hindsight_samples([SESSION], RulesExtractor()))
    assert sorted(samples) == [1, 3, 5, 7]
    for turn, sample in samples.items():
        assert sample.context == SESSION.messages[:turn]  # every earlier message, not the latest block
        assert sample.future == SESSION.messages[turn:]
        assert sample.expert_reply == SESSION.messages[turn].content
    assert len(samples[5].context) == 5


def test_targets_are_what_the_future_reveals_and_the_dialogue_keeps():
    samples = by_turn(hindsight_samples([SESSION], RulesExtractor()))
    assert samples[1].info_truth == (("fever", "absent"), ("cough type", "productive"), ("phlegm", "yellow"))
    assert samples[3].info_truth == (("cough type", "productive"), ("phlegm", "yellow"))
    assert samples[1].decision_truth == samples[3].decision_truth == CONTINUE


def test_a_value_the_user_replaces_later_is_not_a_target():
    session = Session("s2", (u("A table please."), a("Which area?"), u("North.", ("area", "north")),
                             a("Any cuisine?"), u("Actually, the south. Italian.", ("area", "south"), ("food", "italian")),
                             a("Booked.")))
    samples = by_turn(hindsight_samples([session], RulesExtractor()))
    assert samples[1].info_truth == (("area", "south"), ("food", "italian"))
    assert ("area", "north") not in samples[1].info_truth


def test_stop_when_nothing_is_left_to_collect():
    samples = by_turn(hindsight_samples([SESSION], RulesExtractor(), "no_info"))
    # t=5: the user answers but reveals nothing new; t=7: nobody answers (eq. 1, I*_T = {}).
    assert (samples[5].decision_truth, samples[5].info_truth, samples[5].failure) == (STOP, (), None)
    assert (samples[7].decision_truth, samples[7].info_truth, samples[7].failure) == (STOP, (), None)


def test_reference_stop_rule_drops_continue_samples_with_empty_info():
    samples = by_turn(hindsight_samples([SESSION], RulesExtractor(), "no_user_reply"))
    assert samples[7].decision_truth == STOP and samples[7].failure is None
    # A user message follows t=5, so it is CONTINUE, with nothing to collect: dropped, with its reason.
    assert (samples[5].decision_truth, samples[5].info_truth, samples[5].failure) == (CONTINUE, (), EMPTY_INFO)
    metrics = hindsight_metrics(list(samples.values()), 1)
    assert metrics["kept"] == 3 and metrics["dropped"] == {EMPTY_INFO: 1}
    assert metrics["decisions"] == {CONTINUE: 2, STOP: 1}


def test_unannotated_sessions_fail_under_rules_instead_of_being_guessed():
    session = Session("s3", (Message("user", "Hello"), a("Which area?"), Message("user", "North")))
    (sample,) = hindsight_samples([session], RulesExtractor())
    assert (sample.failure, sample.info_truth, sample.decision_truth) == (UNANNOTATED, None, None)


def test_assistant_turns_before_the_first_user_message_are_not_samples():
    session = Session("s4", (a("Hello, how can I help?"), u("A hotel.", ("type", "hotel")), a("Booked.")))
    assert [s.turn for s in hindsight_samples([session], RulesExtractor())] == [2]


def test_multiwoz_dialogue_annotations_become_belief_deltas():
    def belief(**semi: str) -> tuple[DomainBelief, ...]:
        return (DomainBelief("restaurant", semi, {}),)

    turns = (
        Turn("d", 0, "user", "Cheap food please."),
        Turn("d", 1, "system", "Which area?", belief(pricerange="cheap", area="not mentioned")),
        Turn("d", 2, "user", "North."),
        Turn("d", 3, "system", "Done.", belief(pricerange="cheap", area="north")),
    )
    session = session_from_dialogue(Dialogue("d", Goal("d", (), ("You want cheap food.",)), turns, split="val"))
    assert [m.role for m in session.messages] == ["user", "assistant", "user", "assistant"]
    assert session.messages[0].info == (("restaurant-pricerange", "cheap"),)
    assert session.messages[2].info == (("restaurant-area", "north"),)
    (first, last) = hindsight_samples([session], RulesExtractor())
    assert first.info_truth == (("restaurant-area", "north"),) and first.decision_truth == CONTINUE
    assert last.decision_truth == STOP and first.split == "val"
    # An unannotated system turn leaves the user message before it without info.
    turns = (*turns[:3], Turn("d", 3, "system", "Done."))
    assert session_from_dialogue(Dialogue("d", Goal("d", ()), turns)).messages[2].info is None


def test_llm_extractor_reads_json_and_records_failures_without_garbage():
    replies = iter([
        json.dumps({"info": [{"field": "fever", "value": "absent"}]}),
        "The patient has a productive cough.",      # prose: a failure, not a string target
        ("timeout", "no reply in 60 s"),              # the call itself failed
    ])
    seen: list[list[dict[str, str]]] = []

    def complete(conversations: list[list[dict[str, str]]]) -> list[Any]:
        seen.extend(conversations)
        return [next(replies) for _ in conversations]

    samples = by_turn(hindsight_samples([SESSION], LLMExtractor(complete, "openai")))
    # t=7 has no user message after it: nothing is asked, and it is STOP.
    assert len(seen) == 3 and samples[7].decision_truth == STOP and samples[7].info_truth == ()
    assert samples[1].info_truth == (("fever", "absent"),) and samples[1].decision_truth == CONTINUE
    assert (samples[3].failure, samples[3].info_truth, samples[3].decision_truth) == (INVALID_OUTPUT, None, None)
    assert "productive cough" in samples[3].failure_detail
    assert samples[5].failure == "llm_timeout"
    # The prompt holds the goal, the whole context and the future.
    prompt = seen[1][-1]["content"]
    assert SESSION.goal in prompt and "I have a cold" in prompt and "No fever." in prompt
    assert prompt.index("[Current Context]") < prompt.index("Do you have a fever?") < prompt.index("[Future Conversation]")


def test_samples_table_passes_its_suite():
    samples = hindsight_samples([SESSION], RulesExtractor(), "no_user_reply")
    table = samples_table(samples)
    report = validate(table, L2A_SAMPLES, {})
    assert report.success, report.to_text()
    assert table.column("info_truth").to_pylist()[0][0] == {"field": "fever", "value": "absent"}
    # A decision outside continue/stop fails it.
    bad = table.set_column(table.schema.get_field_index("decision_truth"), "decision_truth",
                           pa.array(["maybe"] * table.num_rows))
    assert not validate(bad, L2A_SAMPLES, {}).success


def test_an_extraction_with_words_absent_from_the_future_is_ungrounded():
    from pipelines.learn_to_ask.hindsight import EXAMPLE_REPLY, UNGROUNDED

    session = Session("s5", (u("A table please."), a("Which area?"), u("North.", ("area", "north")), a("Booked.")))
    # What a small model does with the prompt's worked example: copy it.
    (first, last) = hindsight_samples([session], LLMExtractor(lambda convs: [EXAMPLE_REPLY] * len(convs), "hf"))
    assert (first.failure, first.info_truth, first.decision_truth) == (UNGROUNDED, None, None)
    assert "color of phlegm" in first.failure_detail and last.decision_truth == STOP
    (first, _) = hindsight_samples([session], LLMExtractor(
        lambda convs: ['{"info": [{"field": "area", "value": "north"}]}'] * len(convs), "hf"))
    assert first.info_truth == (("area", "north"),) and first.failure is None


def test_the_hf_backend_runs_the_extractor_and_records_what_it_cannot_read(tiny_model_dir, single_torch_thread):
    from pipelines.llm import Accounting
    from stages.hindsight import extractor_backend, make_extractor

    llm = {"roles": {"extractor": {"backend": "hf", "model_path": str(tiny_model_dir), "sampling": {"max_tokens": 24}}}}
    extractor = make_extractor(extractor_backend(llm), llm, Accounting())
    samples = by_turn(hindsight_samples([SESSION], extractor))
    assert {s.extractor for s in samples.values()} == {"hf"}
    # An untrained model writes no valid extraction: each asked point is a recorded failure.
    for turn in (1, 3, 5):
        assert samples[turn].failure in (INVALID_OUTPUT, "ungrounded") and samples[turn].info_truth is None
    assert samples[7].decision_truth == STOP


def test_the_openai_backend_extracts_through_a_real_local_server_and_caches(make_server, monkeypatch, tmp_path):
    from pipelines.learn_to_ask.hindsight import LLMExtractor
    from pipelines.llm import Accounting
    from pipelines.llm.testing import fake_server
    from stages.hindsight import extractor_backend, make_extractor

    def reply(messages, seed, index, as_json):
        request = messages[-1]["content"]
        future = request[request.index("[Future Conversation]"):].split("\n")[1]  # its first message
        if "Is your cough" in future:  # turn 3: prose instead of JSON
            return "The cough is productive."
        return json.dumps({"info": [{"field": "fever", "value": "absent"}]} if "fever" in future else {"info": []})

    monkeypatch.setattr(fake_server, "reply_text", reply)
    server = make_server()
    llm = {"cache_dir": str(tmp_path / "cache"), "roles": {"extractor": {
        "backend": "openai", "base_url": server.base_url, "model": "fake", "max_retries": 0, "repair_retries": 0}}}
    accounting = Accounting()
    extractor = make_extractor(extractor_backend(llm), llm, accounting)
    assert isinstance(extractor, LLMExtractor) and extractor.name == "openai"
    samples = by_turn(hindsight_samples([SESSION], extractor))
    assert samples[1].info_truth == (("fever", "absent"),)
    assert samples[5].decision_truth == STOP and samples[5].info_truth == ()
    assert samples[3].failure == "llm_invalid_output"  # the client's schema check: never a garbage target
    calls = accounting.as_dict()["roles"]["extractor"]["calls"]
    # A re-run with the same inputs is served from the response cache; a failure is not cached.
    replay = Accounting()
    again = make_extractor(extractor_backend(llm), llm, replay)
    assert by_turn(hindsight_samples([SESSION], again))[1].info_truth == (("fever", "absent"),)
    assert calls == 3 and replay.as_dict()["roles"]["extractor"]["cache_hits"] == 2 and server.stats.requests == 4
