"""The processed MultiWOZ artifacts: Arrow schemas, expectation suites, records → tables.

Five tables come out of the ``seeds`` stage (``data/processed/multiwoz/*.parquet``):
``dialogues``, ``turns``, ``goals``, ``entities`` and ``splits``. Map columns hold the
goal constraints and the flattened belief state (``turns.belief['restaurant-food']``
in DuckDB); JSON strings are used only where the value is a list of records.
"""

from __future__ import annotations

import json
from typing import Iterable

import pyarrow as pa

from pipelines.artifacts.spec import ArtifactSpec, Reference, between, in_set, not_null
from pipelines.multiwoz.ontology import DB_DOMAINS, GOAL_DOMAINS
from pipelines.records import SPEAKERS, SPLITS, Corpus, Dialogue, DomainBelief

STRING_MAP = pa.map_(pa.string(), pa.string())
DIALOG_ACT = pa.struct([("act", pa.string()), ("slot", pa.string()), ("value", pa.string())])

DIALOGUES = ArtifactSpec(
    name="dialogues",
    min_rows=1,
    description=(
        "One row per dialogue: split, domains of its goal, the goal message, what the source lacked (missing) "
        "and the unknown source keys the loader skipped (ignored)."
    ),
    schema=pa.schema([
        ("dialogue_id", pa.string()),
        ("split", pa.string()),
        ("n_turns", pa.int32()),
        ("domains", pa.list_(pa.string())),
        ("goal_message", pa.list_(pa.string())),
        ("missing", pa.list_(pa.string())),
        ("ignored", pa.list_(pa.string())),  # e.g. "goal.hotel.hotel": an unknown goal key, not loaded
        ("source", pa.string()),
    ]),
    keys=("dialogue_id",),
    expectations=(in_set("split", SPLITS), not_null("source"), between("n_turns", 1, None)),
)

TURNS = ArtifactSpec(
    name="turns",
    min_rows=1,
    description="One row per utterance; system turns carry the belief state (MultiWOZ metadata) when annotated.",
    schema=pa.schema([
        ("dialogue_id", pa.string()),
        ("turn_index", pa.int32()),
        ("speaker", pa.string()),
        ("text", pa.string()),
        ("has_belief_state", pa.bool_()),
        ("belief", STRING_MAP),  # "domain-slot" -> value, non-empty values only (DST style)
        ("booked_json", pa.string()),  # {domain: [booked records]} when anything is booked
        ("dialog_acts", pa.list_(DIALOG_ACT)),  # null when the source has no annotation
    ]),
    keys=("dialogue_id", "turn_index"),
    expectations=(in_set("speaker", SPEAKERS), not_null("text"), not_null("has_belief_state"), between("turn_index", 0, None)),
    references=(Reference("dialogue_id", "dialogues", "dialogue_id"),),
)

GOALS = ArtifactSpec(
    name="goals",
    min_rows=1,
    description="One row per (dialogue, domain) of a user goal, in the order the goal lists them.",
    schema=pa.schema([
        ("dialogue_id", pa.string()),
        ("domain", pa.string()),
        ("position", pa.int32()),
        ("info", STRING_MAP),
        ("fail_info", STRING_MAP),
        ("book", STRING_MAP),
        ("fail_book", STRING_MAP),
        ("reqt", pa.list_(pa.string())),
        ("book_invalid", pa.bool_()),
    ]),
    keys=("dialogue_id", "domain"),
    expectations=(in_set("domain", GOAL_DOMAINS), between("position", 0, None)),
    references=(Reference("dialogue_id", "dialogues", "dialogue_id"),),
)

ENTITIES = ArtifactSpec(
    name="entities",
    min_rows=1,
    description="Database entities of every domain; all attributes as strings in a map.",
    schema=pa.schema([
        ("domain", pa.string()),
        ("entity_id", pa.string()),
        ("name", pa.string()),
        ("area", pa.string()),
        ("pricerange", pa.string()),
        ("type", pa.string()),
        ("attributes", STRING_MAP),
    ]),
    keys=("domain", "entity_id"),
    expectations=(in_set("domain", DB_DOMAINS), not_null("name")),
)

SPLITS_SPEC = ArtifactSpec(
    name="splits",
    min_rows=1,
    description="Split of every dialogue (train / val / test).",
    schema=pa.schema([("dialogue_id", pa.string()), ("split", pa.string())]),
    keys=("dialogue_id",),
    expectations=(in_set("split", SPLITS),),
    references=(Reference("dialogue_id", "dialogues", "dialogue_id"),),
)

SPECS: dict[str, ArtifactSpec] = {s.name: s for s in (DIALOGUES, TURNS, GOALS, ENTITIES, SPLITS_SPEC)}


def _belief_columns(beliefs: tuple[DomainBelief, ...]) -> tuple[list[tuple[str, str]], str | None]:
    slots: list[tuple[str, str]] = []
    booked: dict[str, list[dict[str, str]]] = {}
    for belief in beliefs:
        for slot, value in belief.semi.items():
            if value and value != "not mentioned":
                slots.append((f"{belief.domain}-{slot}", value))
        for slot, value in belief.book.items():
            if value:
                slots.append((f"{belief.domain}-book-{slot}", value))
        if belief.booked:
            booked[belief.domain] = [dict(b.values) for b in belief.booked]
    return slots, (json.dumps(booked, sort_keys=True) if booked else None)


def dialogue_tables(dialogues: Iterable[Dialogue], source: str) -> dict[str, pa.Table]:
    """``dialogues``, ``turns``, ``goals`` and ``splits`` tables of the given dialogues."""
    d_rows: dict[str, list] = {name: [] for name in DIALOGUES.schema.names}
    t_rows: dict[str, list] = {name: [] for name in TURNS.schema.names}
    g_rows: dict[str, list] = {name: [] for name in GOALS.schema.names}
    for dialogue in dialogues:
        d_rows["dialogue_id"].append(dialogue.dialogue_id)
        d_rows["split"].append(dialogue.split)
        d_rows["n_turns"].append(len(dialogue.turns))
        d_rows["domains"].append(list(dialogue.goal.domain_names))
        d_rows["goal_message"].append(list(dialogue.goal.message))
        d_rows["missing"].append(list(dialogue.missing))
        d_rows["ignored"].append(list(dialogue.ignored))
        d_rows["source"].append(source)
        for turn in dialogue.turns:
            t_rows["dialogue_id"].append(turn.dialogue_id)
            t_rows["turn_index"].append(turn.index)
            t_rows["speaker"].append(turn.speaker)
            t_rows["text"].append(turn.text)
            t_rows["has_belief_state"].append(turn.belief_state is not None)
            if turn.belief_state is None:
                t_rows["belief"].append(None)
                t_rows["booked_json"].append(None)
            else:
                slots, booked = _belief_columns(turn.belief_state)
                t_rows["belief"].append(slots)
                t_rows["booked_json"].append(booked)
            t_rows["dialog_acts"].append(
                None if turn.dialog_acts is None else [{"act": a.act, "slot": a.slot, "value": a.value} for a in turn.dialog_acts]
            )
        for position, goal in enumerate(dialogue.goal.domains):
            g_rows["dialogue_id"].append(dialogue.dialogue_id)
            g_rows["domain"].append(goal.domain)
            g_rows["position"].append(position)
            g_rows["info"].append(list(goal.info.items()))
            g_rows["fail_info"].append(list(goal.fail_info.items()))
            g_rows["book"].append(list(goal.book.items()))
            g_rows["fail_book"].append(list(goal.fail_book.items()))
            g_rows["reqt"].append(list(goal.reqt))
            g_rows["book_invalid"].append(goal.book_invalid)
    splits = {"dialogue_id": list(d_rows["dialogue_id"]), "split": list(d_rows["split"])}
    return {
        "dialogues": pa.Table.from_pydict(d_rows, schema=DIALOGUES.schema),
        "turns": pa.Table.from_pydict(t_rows, schema=TURNS.schema),
        "goals": pa.Table.from_pydict(g_rows, schema=GOALS.schema),
        "splits": pa.Table.from_pydict(splits, schema=SPLITS_SPEC.schema),
    }


def entity_table(corpus: Corpus) -> pa.Table:
    rows: dict[str, list] = {name: [] for name in ENTITIES.schema.names}
    for domain in sorted(corpus.entities):
        for entity in corpus.entities[domain]:
            rows["domain"].append(domain)
            rows["entity_id"].append(entity.entity_id)
            rows["name"].append(entity.name)
            for column in ("area", "pricerange", "type"):
                rows[column].append(entity.attributes.get(column))
            rows["attributes"].append(sorted(entity.attributes.items()))
    return pa.Table.from_pydict(rows, schema=ENTITIES.schema)


def corpus_tables(corpus: Corpus) -> dict[str, pa.Table]:
    tables = dialogue_tables(corpus.dialogues, corpus.source)
    tables["entities"] = entity_table(corpus)
    return tables
