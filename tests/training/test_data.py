"""Training data: column contract, dialogue-level hold-out, left truncation, TRL rows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipelines.errors import ConfigError, DataError
from pipelines.rewards.prompts import render_speakrl_prompt
from pipelines.training.config import DataSpec, GRPOObjective, HoldoutSpec, SourceSpec
from pipelines.training.data import (
    LABELED,
    PAIRS,
    build_train_dataset,
    chat_windows,
    dialogue_chats,
    drop_oldest_rendered_turn,
    fit_prompt,
    is_held_out,
    join_prompts,
    prepare_source,
    reward_columns,
    source_layout,
    trainer_rows,
)

from .conftest import tiny_tables


def chars(messages, add_generation_prompt=False):
    """A stand-in token counter: one token per character."""
    return sum(len(m["content"]) for m in messages) + (1 if add_generation_prompt else 0)


def msg(role, content):
    return {"role": role, "content": content}


SPEC = DataSpec(sources=(), holdout=HoldoutSpec(fraction=0.25), compact_prompts=False, max_history_messages=None)


def test_the_holdout_is_by_dialogue_stable_and_the_same_in_every_dataset():
    spec = HoldoutSpec(fraction=0.3)
    ids = [f"D{i:03d}.json" for i in range(400)]
    held = {i for i in ids if is_held_out(i, spec)}
    assert 0.2 < len(held) / len(ids) < 0.4
    assert held == {i for i in ids if is_held_out(i, HoldoutSpec(fraction=0.3))}
    assert held != {i for i in ids if is_held_out(i, HoldoutSpec(fraction=0.3, salt="other"))}

    tables = tiny_tables(40)
    splits = {}
    for name, method in (("speaker_sft", "sft"), ("speaker_dpo", "dpo"), ("speaker_grpo", "grpo")):
        table = tables[name]
        prepared = prepare_source(table.to_pylist(), table.column_names, SourceSpec(f"{name}.parquet"), method, SPEC, chars, 10_000)
        splits[name] = ({r["dialogue_id"] for r in prepared.train}, {r["dialogue_id"] for r in prepared.heldout})
    train_ids, heldout_ids = splits["speaker_sft"]
    # The corpus val split is held out (every fifth tiny dialogue), not a hash.
    val_ids = {r["dialogue_id"] for r in tables["speaker_sft"].to_pylist() if r["split"] == "val"}
    assert heldout_ids == val_ids and not train_ids & heldout_ids
    assert all(split == (train_ids, heldout_ids) for split in splits.values())


def test_a_test_split_row_stops_training_and_a_source_without_splits_is_hashed():
    table = tiny_tables(10)["speaker_sft"]
    rows = table.to_pylist()
    rows[3] = {**rows[3], "split": "test"}
    with pytest.raises(DataError, match=r"speaker_sft.parquet, record 'D001.json', field 'split': a test-split dialogue"):
        prepare_source(rows, table.column_names, SourceSpec("speaker_sft.parquet"), "sft", SPEC, chars, 10_000)
    unsplit = [{k: v for k, v in r.items() if k != "split"} for r in table.to_pylist()]
    columns = [c for c in table.column_names if c != "split"]
    prepared = prepare_source(unsplit, columns, SourceSpec("speaker_sft.parquet"), "sft", SPEC, chars, 10_000)
    assert {r["dialogue_id"] for r in prepared.heldout} == {r["dialogue_id"] for r in unsplit if is_held_out(r["dialogue_id"], SPEC.holdout)}


def test_truncation_drops_the_agents_history_before_user_turns_and_never_the_completion():
    prompt = [msg("system", "S" * 10), msg("user", "a" * 30), msg("assistant", "b" * 30), msg("user", "c" * 20)]
    completion = [msg("assistant", "z" * 25)]

    assert fit_prompt(prompt, [completion], chars, 200) == prompt
    fitted = fit_prompt(prompt, [completion], chars, 10 + 30 + 20 + 25)
    assert fitted == [prompt[0], prompt[1], prompt[3]]  # the user's earlier turn outlives the agent's
    assert fit_prompt(prompt, [completion], chars, 10 + 20 + 25) == [prompt[0], prompt[3]]
    assert fit_prompt(prompt, [completion], chars, 10 + 20 + 24) is None  # the last message and completion stay whole
    # Pairs fit with the longer completion; prompts alone leave room for the reserve.
    assert fit_prompt(prompt, [completion, [msg("assistant", "z" * 40)]], chars, 10 + 20 + 40) == [prompt[0], prompt[3]]
    assert fit_prompt(prompt, [], chars, 10 + 20 + 1 + 16, reserve=16) == [prompt[0], prompt[3]]


def test_a_table1_prompt_loses_its_oldest_turns_first():
    text = render_speakrl_prompt("User: I need a hotel.\nAgent: Which area?\nUser: The north, please.")
    shorter = drop_oldest_rendered_turn(text)
    assert shorter == render_speakrl_prompt("Agent: Which area?\nUser: The north, please.")
    assert drop_oldest_rendered_turn(drop_oldest_rendered_turn(shorter)) is None  # the last turn stays
    assert drop_oldest_rendered_turn("just a user message") is None

    prompt = [msg("user", text)]
    fitted = fit_prompt(prompt, [], chars, len(shorter) + 1)
    assert fitted == [msg("user", shorter)]


def test_layouts_and_missing_columns():
    assert source_layout("dpo", SourceSpec("d.parquet"), ["dialogue_id", "prompt", "chosen", "rejected"], "dialogue_id") == PAIRS
    assert source_layout("kto", SourceSpec("d.parquet"), ["dialogue_id", "prompt", "chosen", "rejected"], "dialogue_id") == PAIRS
    assert source_layout("kto", SourceSpec("j.parquet"), ["dialogue_id", "prompt", "completion", "label"], "dialogue_id") == LABELED
    with pytest.raises(ConfigError, match=r"sft needs columns prompt\+completion.*missing 'completion'"):
        source_layout("sft", SourceSpec("g.parquet"), ["dialogue_id", "prompt", "reference"], "dialogue_id")
    assert source_layout("sft", SourceSpec("g.parquet", completion_column="reference"), ["dialogue_id", "prompt", "reference"], "dialogue_id")
    with pytest.raises(ConfigError, match="hold-out key 'dialogue_id'"):
        source_layout("dpo", SourceSpec("d.parquet"), ["prompt", "chosen", "rejected"], "dialogue_id")
    assert reward_columns(GRPOObjective()) == ("discriminating_slots",)


def test_kto_reads_pairs_as_one_desirable_and_one_undesirable_example():
    table = tiny_tables(8)["speaker_dpo"]
    prepared = prepare_source(table.to_pylist(), table.column_names, SourceSpec("speaker_dpo.parquet"), "kto", SPEC, chars, 10_000)
    rows = trainer_rows("kto", prepared)
    assert len(rows) == 2 * len(prepared.train)
    assert [r["label"] for r in rows[:2]] == [True, False]
    assert rows[0]["completion"] == prepared.train[0]["chosen"] and rows[1]["completion"] == prepared.train[0]["rejected"]
    assert set(build_train_dataset("kto", [prepared]).column_names) == {"prompt", "completion", "label"}


def test_sft_reads_a_text_column_as_the_completion_and_grpo_keeps_reward_columns():
    table = tiny_tables(8)["speaker_grpo"]
    source = SourceSpec("speaker_grpo.parquet", max_rows=3, completion_column="reference")
    prepared = prepare_source(table.to_pylist(), table.column_names, source, "sft", SPEC, chars, 10_000)
    assert len(prepared.train) == 3
    assert prepared.train[0]["completion"] == [msg("assistant", prepared.train[0]["reference"])]

    prepared = prepare_source(table.to_pylist(), table.column_names, SourceSpec("speaker_grpo.parquet"), "grpo", SPEC, chars, 10_000)
    dataset = build_train_dataset("grpo", [prepared])
    assert {"prompt", "discriminating_slots", "candidate_values", "known_slots"} <= set(dataset.column_names)


def test_prompts_can_come_from_another_table_at_the_same_decision_point():
    tables = tiny_tables(10)
    grpo, sft = tables["speaker_grpo"], tables["speaker_sft"]
    rows, missing = join_prompts(grpo.to_pylist(), sft.to_pylist(), "dialogue_id")
    assert missing == 0 and len(rows) == grpo.num_rows
    assert rows[6]["prompt"] == sft.to_pylist()[6]["prompt"]  # dialogue 3, step 0
    assert rows[6]["discriminating_slots"] == ["area"]

    only_step_1 = [r for r in sft.to_pylist() if r["step"] == 1]
    prepared = prepare_source(grpo.to_pylist(), grpo.column_names, SourceSpec("g.parquet"), "grpo", SPEC, chars, 10_000, prompt_rows=only_step_1)
    assert prepared.stats["no_prompt"] == 10  # the step-0 rows; the act-here rows (step 1) join
    assert {r["step"] for r in prepared.train + prepared.heldout} == {1}


def test_dialogue_windows_make_every_assistant_message_a_target_once():
    system = msg("system", "S" * 10)
    chat = [system, msg("user", "u" * 20), msg("assistant", "a" * 20), msg("user", "v" * 20), msg("assistant", "b" * 20),
            msg("user", "w" * 20), msg("assistant", "c" * 50)]
    assert chat_windows(chat, chars, 1000) == [chat]
    windows = chat_windows(chat, chars, 10 + 20 + 20 + 20 + 20)
    assert windows == [[system, *chat[1:5]], [system, *chat[5:7]]]
    assert chat_windows(chat, chars, 10 + 20 + 49) == [[system, *chat[1:3]], [system, *chat[3:5]]]  # "c" cannot fit

    table = tiny_tables(20)["speaker_sft"]
    rows = table.to_pylist()
    chats = dialogue_chats(rows, "dialogue_id")
    assert len(chats) == 20 and [m["role"] for m in chats["D000.json"]] == ["system", "user", "assistant", "user", "assistant"]
    source = SourceSpec("speaker_sft.parquet", windows=True, max_rows=5)
    prepared = prepare_source(rows, table.column_names, source, "sft", SPEC, chars, 10_000)
    assert len(prepared.train) == 5 and prepared.stats["train_targets"] == 10
    # Every target keeps its reasoning, as a decision row's completion does (the windows are the targets).
    targets = [m["content"] for w in prepared.train for m in w["messages"] if m["role"] == "assistant"]
    assert len(targets) == 10 and all(t.startswith("<think>") for t in targets), targets
    assert prepared.heldout and "completion" in prepared.heldout[0]  # evaluation stays per decision
    assert build_train_dataset("sft", [prepared]).column_names == ["messages"]


def test_rows_that_cannot_fit_are_dropped_and_counted():
    table = tiny_tables(20)["speaker_sft"]
    prepared = prepare_source(table.to_pylist(), table.column_names, SourceSpec("speaker_sft.parquet"), "sft", SPEC, chars, 150)
    assert prepared.stats["train_dropped_too_long"] > 0
    assert prepared.stats["train"] + prepared.stats["train_dropped_too_long"] + prepared.stats["heldout_rows"] == prepared.stats["rows"]
    assert all(chars(r["prompt"] + r["completion"]) <= 150 for r in prepared.train)


@pytest.mark.parametrize("max_rows", [None, 150])
def test_prompts_fitted_in_worker_processes_are_the_serial_ones(max_rows):
    # 400 rows, some too long for 150 positions: the forked path (>= 128 rows a round), the
    # extra round a dropped row makes under max_rows, and the order, against one process.
    table = tiny_tables(200)["speaker_sft"]
    source = SourceSpec("speaker_sft.parquet", max_rows=max_rows)
    serial = prepare_source(table.to_pylist(), table.column_names, source, "sft", SPEC, chars, 150)
    forked = prepare_source(table.to_pylist(), table.column_names, source, "sft", SPEC, chars, 150, workers=2)
    assert serial.stats["train_dropped_too_long"] > 0
    assert (forked.train, forked.heldout, forked.stats) == (serial.train, serial.heldout, serial.stats)
    if max_rows is not None:
        assert len(forked.train) == max_rows


def test_rows_whose_target_states_what_the_fitted_prompt_lacks_are_left_out_when_asked():
    from pipelines.speaker.phrasing import reqt_answer
    from pipelines.training.config import ModelSpec, TrainConfig, config_dict, method_outputs

    result = '<tool_response>\n{"count": 1, "results": [{"name": "lucky inn", "phone": "01223 4567", "postcode": "cb11aa"}]}\n</tool_response>'
    history = [msg("user", "I need a guesthouse in the north, please. " * 3), msg("assistant", '<tool_call>{"name": "find_hotel"}</tool_call>'),
               msg("user", result), msg("assistant", "<think>One match.</think>\nLucky inn is a guesthouse in the north."),
               msg("user", "What is its phone number?")]

    def row(i, split, answer):
        return {"dialogue_id": f"D{i:03d}.json", "split": split, "step": 3, "prompt": history,
                "completion": [msg("assistant", f"<think>The results have it.</think>\n{answer}")]}

    right = reqt_answer("lucky inn", {"phone": "01223 4567"})
    invented = reqt_answer("lucky inn", {"phone": "01223 9999"})
    rows = [row(0, "train", right), row(1, "train", invented), row(2, "train", "Anything else I can help with?"),
            row(3, "val", invented)]
    columns = list(rows[0])
    spec = replace(SPEC, drop_ungrounded=True)
    whole = chars(history + rows[0]["completion"]) + 10
    prepared = prepare_source(rows, columns, SourceSpec("sft.parquet"), "sft", spec, chars, whole)
    assert sorted(r["dialogue_id"] for r in prepared.train) == ["D000.json", "D002.json"]  # (shuffled)
    assert prepared.heldout == []
    assert (prepared.stats["train_dropped_ungrounded"], prepared.stats["heldout_dropped_ungrounded"]) == (1, 1)
    # Fitted tighter, older messages go, the search result with them: the right answer's
    # row now states a phone its prompt lacks. Kept by default (what it teaches), left out when asked.
    tight = chars(history[-1:] + rows[0]["completion"]) + 5  # only the question is left
    kept = prepare_source(rows, columns, SourceSpec("sft.parquet"), "sft", SPEC, chars, tight)
    by_id = {r["dialogue_id"]: r for r in kept.train}
    assert len(by_id) == 3 and result not in [m["content"] for m in by_id["D000.json"]["prompt"]]
    assert not any("ungrounded" in key for key in kept.stats)  # the default's stats as before the option
    left = prepare_source(rows, columns, SourceSpec("sft.parquet"), "sft", spec, chars, tight)
    assert [r["dialogue_id"] for r in left.train] == ["D002.json"] and left.stats["train_dropped_ungrounded"] == 2
    assert left.stats["train_dropped_too_long"] == 0

    # Only for SFT prompt-completion rows; reports written before the option stay as they were.
    def config(method, data):
        return TrainConfig(method=method, model=ModelSpec(path="m"), data=data, output=method_outputs(method, "models", "reports"))

    with pytest.raises(ConfigError, match="drop_ungrounded"):
        config("dpo", replace(spec, sources=(SourceSpec("dpo.parquet"),)))
    with pytest.raises(ConfigError, match="drop_ungrounded"):
        config("sft", replace(spec, sources=(SourceSpec("sft.parquet", windows=True),)))
    assert config_dict(config("sft", spec).data)["drop_ungrounded"] is True
    assert "drop_ungrounded" not in config_dict(config("sft", SPEC).data)
