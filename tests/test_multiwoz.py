"""The MultiWOZ data layer: embedded generator, parser, directory loader, tables."""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import pytest

from pipelines.errors import DataError
from pipelines.multiwoz.embedded import generate_corpus, generate_dialogue
from pipelines.multiwoz.embedded_db import build_database
from pipelines.multiwoz.ontology import INFO_SLOTS, norm_value, parse_time, values_match
from pipelines.multiwoz.parse import parse_dialogue, parse_dialogues
from pipelines.multiwoz.tables import corpus_tables
from catalog.multiwoz_dir import load_multiwoz, write_multiwoz


def _matches(record, constraints):
    return all(values_match(s, v, record.get(s)) for s, v in constraints.items())


# -- ontology -------------------------------------------------------------------------

def test_values_are_compared_after_normalisation_and_times_as_times():
    assert norm_value("King's College ") == norm_value("kings college")
    assert values_match("name", "Pizza Express Fen Ditton", "pizza express fen ditton")
    assert values_match("leaveAt", "9:30", "09:45") and not values_match("leaveAt", "10:00", "09:45")
    assert values_match("arriveBy", "10:00", "9:59") and not values_match("arriveBy", "09:00", "10:00")
    assert values_match("time", "9:30", "09:30") and not values_match("time", "9:30", "19:30")
    assert values_match("food", "dontcare", "italian")
    assert parse_time("25:00") is None and parse_time("abc") is None and parse_time("7.05") == 425


# -- embedded generator ---------------------------------------------------------------

def test_generator_is_deterministic_and_prefix_stable():
    a = generate_corpus(40, seed=3)
    b = generate_corpus(40, seed=3)
    assert a == b
    bigger = generate_corpus(60, seed=3)
    assert all(bigger["data"][k] == v for k, v in a["data"].items())
    assert generate_corpus(40, seed=4)["data"] != a["data"]


def test_goals_look_like_multiwoz_goals_and_are_satisfiable():
    corpus = generate_corpus(400, seed=11)
    db = corpus["db"]
    n_domains = Counter()
    seen = Counter()
    for dialogue_id, dialogue in corpus["data"].items():
        goal = dialogue["goal"]
        domains = [d for d in goal if d not in ("message", "topic") and goal[d]]
        n_domains[len(domains)] += 1
        assert goal["message"], dialogue_id
        for d in domains:
            g = goal[d]
            seen["book" if g.get("book") else "no_book"] += 1
            seen["fail_info"] += bool(g["fail_info"])
            seen["fail_book"] += bool(g.get("fail_book"))
            seen["reqt"] += bool(g["reqt"])
            assert set(g["info"]) <= set(INFO_SLOTS[d]), (dialogue_id, d)
            if d in ("restaurant", "hotel", "attraction", "train"):
                assert any(_matches(r, g["info"]) for r in db[d]), f"{dialogue_id}: {d} info unsatisfiable"
            if g["fail_info"]:
                assert not any(_matches(r, g["fail_info"]) for r in db[d]), f"{dialogue_id}: fail_info matches"
        # Cross-domain references resolve to the referenced value.
        text = " ".join(goal["message"])
        if "same day as the hotel booking" in text and goal["train"]:
            assert goal["train"]["info"]["day"] == goal["hotel"]["book"]["day"]
        if goal["taxi"] and "the restaurant" in text and goal["restaurant"]:
            names = {goal["taxi"]["info"]["departure"], goal["taxi"]["info"]["destination"]}
            assert names & {r["name"] for r in db["restaurant"]}
    assert n_domains[1] > 40 and n_domains[2] > 80 and n_domains[3] > 40
    assert seen["fail_info"] > 10 and seen["fail_book"] > 10 and seen["book"] > 100 and seen["reqt"] > 100


def test_rendered_dialogues_alternate_and_carry_belief_states_and_acts():
    db = build_database(0)
    dialogue_id, raw = generate_dialogue(5, 0, db)
    dialogue = parse_dialogue(dialogue_id, raw, "embedded", "train")
    assert [t.speaker for t in dialogue.turns] == ["user", "system"] * (len(dialogue.turns) // 2)
    assert all(t.belief_state is not None for t in dialogue.turns if t.speaker == "system")
    assert all(t.dialog_acts for t in dialogue.turns)
    assert dialogue.missing == ()
    # Every booking in the goal shows up as a booked record in the final belief state.
    final = dialogue.turns[-1]
    for goal in dialogue.goal.domains:
        if goal.book:
            assert final.belief(goal.domain).booked, goal.domain


def test_generator_grounds_goals_in_the_real_database(real_raw_db):
    corpus = generate_corpus(60, seed=2, db=real_raw_db)
    for dialogue in corpus["data"].values():
        for d in ("restaurant", "hotel", "attraction", "train"):
            g = dialogue["goal"][d]
            if g:
                assert any(_matches(r, g["info"]) for r in real_raw_db[d])


# -- loader ---------------------------------------------------------------------------

def test_loader_reads_the_embedded_layout(small_corpus_dir, small_corpus):
    assert (small_corpus_dir / "data.json").exists() and (small_corpus_dir / "db" / "train_db.json").exists()
    assert len(small_corpus.dialogues) == 120
    splits = Counter(small_corpus.splits.values())
    assert splits == {"train": 96, "val": 12, "test": 12}
    assert set(small_corpus.entities) >= {"restaurant", "hotel", "attraction", "train", "police", "hospital"}
    assert small_corpus.taxi_options["taxi_colors"]
    assert all(d.missing == () for d in small_corpus.dialogues)


def test_loader_reads_the_real_database_with_a_data_json(tmp_path, real_db_dir, real_raw_db):
    corpus = generate_corpus(30, seed=5, db=real_raw_db)
    (tmp_path / "data.json").write_text(json.dumps(corpus["data"]), encoding="utf-8")
    loaded = load_multiwoz(tmp_path, db_dir=real_db_dir)
    assert len(loaded.dialogues) == 30
    assert len(loaded.entities["restaurant"]) == len(real_raw_db["restaurant"])
    names = {e.name for e in loaded.entities["attraction"]}
    assert "king's college" in names
    assert len(loaded.entities["train"]) == len(real_raw_db["train"])


def _one_dialogue() -> tuple[str, dict]:
    return generate_dialogue(1, 0, build_database(0))


def test_partial_data_is_loaded_and_recorded_never_invented():
    dialogue_id, raw = _one_dialogue()
    raw = copy.deepcopy(raw)
    del raw["goal"]["message"]
    del raw["log"][1]["metadata"]
    del raw["log"][2]["dialog_act"]
    raw["log"][3]["dialog_act"] = "No Annotation"
    dialogue = parse_dialogue(dialogue_id, raw, "data.json", "train")
    assert dialogue.turns[1].belief_state is None
    assert dialogue.turns[2].dialog_acts is None and dialogue.turns[3].dialog_acts is None
    assert dialogue.goal.message == ()
    assert set(dialogue.missing) == {"goal.message", "turns.metadata", "turns.dialog_act"}
    tables = corpus_tables(type("C", (), {"dialogues": [dialogue], "source": "x", "entities": {}})())
    turns = tables["turns"].to_pylist()
    assert turns[1]["has_belief_state"] is False and turns[1]["belief"] is None
    assert turns[2]["dialog_acts"] is None


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda raw: raw["goal"].__setitem__("spaceship", {"info": {}}), "goal.spaceship"),
        (lambda raw: raw.__setitem__("goal", ["not", "a", "dict"]), "goal"),
        (lambda raw: next(v for v in raw["goal"].values() if isinstance(v, dict) and v).__setitem__("info", "cheap"), ".info"),
        (lambda raw: raw["log"][1].__setitem__("metadata", {"spaceship": {}}), "log[1].metadata.spaceship"),
        (lambda raw: raw["log"][0].__setitem__("text", None), "log[0].text"),
        (lambda raw: raw.__delitem__("log"), "log"),
    ],
)
def test_bad_records_name_file_dialogue_and_field(mutate, field):
    dialogue_id, raw = _one_dialogue()
    raw = copy.deepcopy(raw)
    mutate(raw)
    with pytest.raises(DataError) as info:
        parse_dialogues({dialogue_id: raw}, "/data/data.json")
    message = str(info.value)
    assert "/data/data.json" in message and dialogue_id in message and field in message


def _write_corpus(tmp_path: Path, n: int = 5) -> Path:
    target = tmp_path / "mw"
    write_multiwoz(generate_corpus(n, seed=1), target)
    return target


def test_bad_files_give_clear_errors(tmp_path):
    target = _write_corpus(tmp_path)
    data_path = target / "data.json"
    text = data_path.read_text(encoding="utf-8")

    data_path.write_text(text[:-20], encoding="utf-8")  # truncated JSON
    with pytest.raises(DataError, match="data.json"):
        load_multiwoz(target)

    first_id = next(iter(json.loads(text)))
    body = text.strip()[1:-1]
    data_path.write_text("{" + body + "," + body + "}", encoding="utf-8")  # duplicate dialogue ids
    with pytest.raises(DataError, match=first_id.replace(".", r"\.")):
        load_multiwoz(target)

    data_path.write_bytes(text.encode("utf-8").replace(b"I ", b"I \xff", 1))  # not UTF-8
    with pytest.raises(DataError, match="UTF-8"):
        load_multiwoz(target)

    data_path.unlink()
    with pytest.raises(DataError, match="data.json"):
        load_multiwoz(target)

    with pytest.raises(DataError, match="not found"):
        load_multiwoz(tmp_path / "nowhere")


def test_an_empty_data_json_or_an_empty_split_is_an_error(tmp_path):
    target = _write_corpus(tmp_path, n=10)
    data_path = target / "data.json"
    ids = sorted(json.loads(data_path.read_text(encoding="utf-8")))
    original = data_path.read_text(encoding="utf-8")

    data_path.write_text("{}", encoding="utf-8")
    with pytest.raises(DataError, match=r"data\.json: no dialogues"):
        load_multiwoz(target)
    data_path.write_text(original, encoding="utf-8")

    (target / "testListFile.json").write_text("PMUL9999.json\n", encoding="utf-8")  # names no dialogue
    with pytest.raises(DataError, match=r"testListFile\.json: the test split is empty"):
        load_multiwoz(target)

    (target / "testListFile.json").write_text("".join(f"{i}\n" for i in ids[:5]), encoding="utf-8")
    (target / "valListFile.json").write_text("".join(f"{i}\n" for i in ids[5:]), encoding="utf-8")
    with pytest.raises(DataError, match=r"data\.json: the train split is empty"):
        load_multiwoz(target)


def test_the_seeds_stage_fails_on_an_empty_data_json_and_keeps_its_artifacts(tmp_path):
    from stages.seeds import run as run_seeds

    target = _write_corpus(tmp_path)
    params = {"source": str(target), "output": str(tmp_path / "out")}
    run_seeds(params)
    published = {p.name: p.read_bytes() for p in (tmp_path / "out").glob("*.parquet")}
    (target / "data.json").write_text("{}", encoding="utf-8")
    with pytest.raises(DataError, match="no dialogues"):
        run_seeds(params)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").glob("*.parquet")} == published


def test_unknown_database_domain_and_duplicate_entity_ids(tmp_path):
    target = _write_corpus(tmp_path)
    (target / "db" / "spaceport_db.json").write_text("[]", encoding="utf-8")
    with pytest.raises(DataError, match="spaceport"):
        load_multiwoz(target)
    (target / "db" / "spaceport_db.json").unlink()
    hotels = json.loads((target / "db" / "hotel_db.json").read_text(encoding="utf-8"))
    hotels.append(dict(hotels[0]))
    (target / "db" / "hotel_db.json").write_text(json.dumps(hotels), encoding="utf-8")
    with pytest.raises(DataError, match="hotel_db.json.*duplicate id"):
        load_multiwoz(target)


def test_split_lists_accept_ids_with_or_without_extension(tmp_path):
    target = _write_corpus(tmp_path, n=10)
    ids = sorted(json.loads((target / "data.json").read_text(encoding="utf-8")))
    (target / "testListFile.json").write_text(ids[0][:-5] + "\n" + ids[1] + "\n", encoding="utf-8")
    (target / "valListFile.json").write_text(json.dumps([ids[2]]), encoding="utf-8")
    corpus = load_multiwoz(target)
    assert corpus.splits[ids[0]] == "test" and corpus.splits[ids[1]] == "test" and corpus.splits[ids[2]] == "val"
    assert Counter(corpus.splits.values())["train"] == 7


def test_tables_match_their_schemas(small_corpus):
    tables = corpus_tables(small_corpus)
    assert tables["dialogues"].num_rows == 120
    assert tables["turns"].num_rows == sum(len(d.turns) for d in small_corpus.dialogues)
    assert tables["goals"].num_rows == sum(len(d.goal.domains) for d in small_corpus.dialogues)
    system = [row for row in tables["turns"].slice(0, 40).to_pylist() if row["speaker"] == "system"]
    assert all(row["has_belief_state"] for row in system)
    assert any(dict(row["belief"]) for row in system)
