"""Turn decoded MultiWOZ 2.x/2.4 JSON into typed records.

Pure functions: they take the decoded JSON (and the name of the file it came from, for
error messages) and return records. Reading files is the job of ``catalog.io``.

Real data is partial: a turn may lack ``metadata`` or ``dialog_act``, a goal may lack
``message``. Such gaps are recorded in ``missing`` and never filled with invented values.
Real goals also carry keys the loader does not know (booleans named after a domain inside
a domain goal, say); by default such a key is skipped and recorded in ``ignored``, so one
odd key does not block a corpus; ``strict=True`` makes it a :class:`DataError`. Anything
malformed raises :class:`DataError` naming the file, record and field.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Iterable, Mapping

from pipelines.errors import DataError
from pipelines.multiwoz.ontology import (
    BELIEF_DOMAINS,
    BOOK_FLAGS,
    DB_DOMAINS,
    GOAL_DOMAINS,
    GOAL_NON_DOMAIN_KEYS,
)
from pipelines.records import (
    BookedRecord,
    DialogAct,
    Dialogue,
    DomainBelief,
    DomainGoal,
    Entity,
    Goal,
    Turn,
    frozen_dict,
)

_SCALARS = (str, int, float, bool)


def _string_map(value: Any, source: str, record: str, field: str, drop: frozenset[str] = frozenset()) -> dict[str, str]:
    # Fast path: almost every map in real data is already {str: str}.
    if type(value) is dict and not drop and all(type(item) is str for item in value.values()):
        return value
    if not isinstance(value, dict):
        raise DataError(source, f"expected an object, got {type(value).__name__}", record, field)
    out: dict[str, str] = {}
    for key, item in value.items():
        if key in drop:
            continue
        if item is None:
            continue
        if isinstance(item, bool):
            out[key] = "yes" if item else "no"
            continue
        if not isinstance(item, _SCALARS):
            raise DataError(source, f"expected a string value, got {type(item).__name__}", record, f"{field}.{key}")
        out[key] = str(item)
    return out


def parse_goal(dialogue_id: str, raw: Any, source: str, strict: bool = False) -> Goal:
    """The goal of one dialogue. A domain-goal field beyond info/fail_info/book/fail_book/reqt
    is skipped and listed in ``Goal.ignored`` as its path, e.g. ``goal.hotel.hotel``; with
    ``strict`` it raises. An unknown domain always raises: no tool serves it, so the goal
    could not be played or graded, and it means the source is not MultiWOZ."""
    if not isinstance(raw, dict):
        raise DataError(source, f"goal must be an object, got {type(raw).__name__}", dialogue_id, "goal")
    missing: list[str] = []
    ignored: list[str] = []
    domains: list[DomainGoal] = []
    for key, value in raw.items():
        if key in GOAL_NON_DOMAIN_KEYS:
            continue
        if key not in GOAL_DOMAINS:
            raise DataError(source, f"unknown domain {key!r} (known: {', '.join(GOAL_DOMAINS)})", dialogue_id, f"goal.{key}")
        if value in ({}, None, []):
            continue
        if not isinstance(value, dict):
            raise DataError(source, f"a domain goal must be an object, got {type(value).__name__}", dialogue_id, f"goal.{key}")
        domain_goal, unknown = _parse_domain_goal(dialogue_id, key, value, source, strict)
        domains.append(domain_goal)
        ignored += unknown
    # Goal order of the official data is alphabetical by key; the order in which the user
    # pursues the domains is the order of the ``message``. Keep the file's key order.
    message_raw = raw.get("message")
    if message_raw is None:
        missing.append("goal.message")
        message: tuple[str, ...] = ()
    elif isinstance(message_raw, str):
        message = (message_raw,)
    elif isinstance(message_raw, list) and all(isinstance(m, str) for m in message_raw):
        message = tuple(message_raw)
    else:
        raise DataError(source, "goal message must be a list of strings", dialogue_id, "goal.message")
    domains = _with_references(domains, message)
    return Goal(dialogue_id=dialogue_id, domains=tuple(domains), message=message, missing=tuple(missing), ignored=tuple(ignored))


# Cross-domain references that real goal messages state and the goal dicts resolve in
# advance: (message pattern, domain, slot, referred domain, referred slot). The goal's
# taxi ``arriveBy`` is the restaurant time the generator expected to be booked (often the
# ``If the booking fails how about ...`` backup), whereas the user is told the booked time.
_MESSAGE_REFERENCES: tuple[tuple[re.Pattern[str], str, str, str, str], ...] = (
    (re.compile(r"arrives? (?:at )?the restaurant by the booked time", re.I), "taxi", "arriveBy", "restaurant", "time"),
)
_TAG = re.compile(r"<[^>]*>")
# "The train should be on the same day as the hotel booking"; "book a table ... on the same
# day" (as the domain the message took up before). The message sentence's domain is the one
# it (or the sentence before it) names.
_SAME_DAY = re.compile(r"\bsame day(?: as (?:the |your )?(restaurant|hotel|train|attraction))?", re.I)
_SENTENCE_DOMAIN = re.compile(r"\b(train|restaurant|hotel|place to stay|places? to dine|taxi|attraction|places? to go)\b", re.I)
_DOMAIN_WORDS = {"place to stay": "hotel", "place to dine": "restaurant", "places to dine": "restaurant",
                 "places to go": "attraction", "place to go": "attraction"}


def _day_references(domains: list[DomainGoal], message: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """{domain: (referred domain, "day")} for the message's "same day" phrases."""
    present = {d.domain for d in domains}
    order: list[str] = []  # the domains in the order the message takes them up
    found: dict[str, tuple[str, str]] = {}
    for sentence in message:
        text = _TAG.sub("", sentence)
        same = _SAME_DAY.search(text)
        named = [_DOMAIN_WORDS.get(m.group(1).lower(), m.group(1).lower()) for m in _SENTENCE_DOMAIN.finditer(text[: same.start()] if same else text)]
        for domain in named:
            if domain in present and domain not in order:
                order.append(domain)
        current = named[-1] if named and named[-1] in present else (order[-1] if order else None)
        if same is None or current is None:
            continue
        other = same.group(1).lower() if same.group(1) else next((d for d in reversed(order) if d != current), None)
        if other and other != current and other in present:
            found[current] = (other, "day")
    return found


def _with_references(domains: list[DomainGoal], message: tuple[str, ...]) -> list[DomainGoal]:
    text = _TAG.sub("", " ".join(message))
    present = {d.domain for d in domains}
    references: dict[str, dict[str, tuple[str, str]]] = {}
    for pattern, domain, slot, other, other_slot in _MESSAGE_REFERENCES:
        if domain in present and other in present and pattern.search(text):
            references.setdefault(domain, {})[slot] = (other, other_slot)
    for domain, (other, slot) in _day_references(domains, message).items():
        if domain != "taxi":
            references.setdefault(domain, {}).setdefault("day", (other, slot))
    return [replace(d, references=frozen_dict(references[d.domain])) if d.domain in references else d for d in domains]


_DOMAIN_GOAL_FIELDS = ("book", "fail_book", "fail_info", "info", "reqt")


def _parse_domain_goal(dialogue_id: str, domain: str, raw: dict, source: str, strict: bool) -> tuple[DomainGoal, list[str]]:
    """The domain goal and the paths of the unknown fields it skipped."""
    base = f"goal.{domain}"
    unknown = [f"{base}.{key}" for key in raw if key not in _DOMAIN_GOAL_FIELDS]
    if unknown and strict:
        key = unknown[0].rsplit(".", 1)[1]
        raise DataError(source, f"unknown goal field {key!r} (known: {', '.join(_DOMAIN_GOAL_FIELDS)})", dialogue_id, unknown[0])
    info = _string_map(raw.get("info", {}) or {}, source, dialogue_id, f"{base}.info")
    fail_info = _string_map(raw.get("fail_info", {}) or {}, source, dialogue_id, f"{base}.fail_info")
    book_raw = raw.get("book", {}) or {}
    book = _string_map(book_raw, source, dialogue_id, f"{base}.book", drop=BOOK_FLAGS)
    fail_book = _string_map(raw.get("fail_book", {}) or {}, source, dialogue_id, f"{base}.fail_book", drop=BOOK_FLAGS)
    invalid = book_raw.get("invalid") if isinstance(book_raw, dict) else None
    if invalid is not None and not isinstance(invalid, bool):
        raise DataError(source, "book.invalid must be true or false", dialogue_id, f"{base}.book.invalid")
    reqt_raw = raw.get("reqt", []) or []
    if isinstance(reqt_raw, dict):  # some releases store reqt as {slot: "?"}
        reqt_raw = list(reqt_raw)
    if not isinstance(reqt_raw, list) or not all(isinstance(r, str) for r in reqt_raw):
        raise DataError(source, "reqt must be a list of attribute names", dialogue_id, f"{base}.reqt")
    return DomainGoal(
        domain=domain,
        info=frozen_dict(info),
        fail_info=frozen_dict(fail_info),
        book=frozen_dict(book),
        fail_book=frozen_dict(fail_book),
        reqt=tuple(reqt_raw),
        book_invalid=invalid,
    ), unknown


def parse_belief_state(dialogue_id: str, index: int, raw: Any, source: str) -> tuple[DomainBelief, ...]:
    field = f"log[{index}].metadata"
    if not isinstance(raw, dict):
        raise DataError(source, f"metadata must be an object, got {type(raw).__name__}", dialogue_id, field)
    beliefs = []
    for domain, value in raw.items():
        if domain not in BELIEF_DOMAINS:
            raise DataError(source, f"unknown domain {domain!r} in belief state", dialogue_id, f"{field}.{domain}")
        if not isinstance(value, dict):
            raise DataError(source, "a domain belief must be an object", dialogue_id, f"{field}.{domain}")
        semi = _string_map(value.get("semi", {}) or {}, source, dialogue_id, f"{field}.{domain}.semi")
        book_raw = value.get("book", {}) or {}
        if not isinstance(book_raw, dict):
            raise DataError(source, "book must be an object", dialogue_id, f"{field}.{domain}.book")
        booked_raw = book_raw.get("booked", []) or []
        if not isinstance(booked_raw, list):
            raise DataError(source, "booked must be a list", dialogue_id, f"{field}.{domain}.book.booked")
        booked = tuple(
            BookedRecord(domain, frozen_dict(_string_map(b, source, dialogue_id, f"{field}.{domain}.book.booked[{i}]")))
            for i, b in enumerate(booked_raw)
        )
        book = _string_map({k: v for k, v in book_raw.items() if k != "booked"}, source, dialogue_id, f"{field}.{domain}.book")
        beliefs.append(DomainBelief(domain, frozen_dict(semi), frozen_dict(book), booked))
    return tuple(beliefs)


def parse_dialog_acts(dialogue_id: str, index: int, raw: Any, source: str) -> tuple[DialogAct, ...] | None:
    field = f"log[{index}].dialog_act"
    if isinstance(raw, str):  # MultiWOZ 2.1 writes "No Annotation" for unannotated turns
        return None
    if not isinstance(raw, dict):
        raise DataError(source, f"dialog_act must be an object, got {type(raw).__name__}", dialogue_id, field)
    acts = []
    for act, pairs in raw.items():
        if not isinstance(pairs, list):
            raise DataError(source, "dialog act arguments must be a list of [slot, value] pairs", dialogue_id, f"{field}.{act}")
        for j, pair in enumerate(pairs):
            if not (isinstance(pair, list) and len(pair) == 2):
                raise DataError(source, "expected a [slot, value] pair", dialogue_id, f"{field}.{act}[{j}]")
            acts.append(DialogAct(act=act, slot=str(pair[0]), value=str(pair[1])))
    return tuple(acts)


def parse_dialogue(dialogue_id: str, raw: Any, source: str, split: str, strict: bool = False) -> Dialogue:
    if not isinstance(raw, dict):
        raise DataError(source, f"a dialogue must be an object, got {type(raw).__name__}", dialogue_id)
    if "goal" not in raw:
        raise DataError(source, "dialogue has no goal", dialogue_id, "goal")
    if "log" not in raw:
        raise DataError(source, "dialogue has no log", dialogue_id, "log")
    goal = parse_goal(dialogue_id, raw["goal"], source, strict)
    log = raw["log"]
    if not isinstance(log, list):
        raise DataError(source, f"log must be a list, got {type(log).__name__}", dialogue_id, "log")
    turns = []
    missing: set[str] = set()
    for index, item in enumerate(log):
        if not isinstance(item, dict):
            raise DataError(source, "a turn must be an object", dialogue_id, f"log[{index}]")
        text = item.get("text")
        if not isinstance(text, str):
            raise DataError(source, "turn text must be a string", dialogue_id, f"log[{index}].text")
        speaker = "user" if index % 2 == 0 else "system"
        belief = None
        metadata = item.get("metadata")
        if speaker == "system":
            if metadata is None or metadata == {}:
                missing.add("turns.metadata")
            else:
                belief = parse_belief_state(dialogue_id, index, metadata, source)
        acts = None
        if "dialog_act" in item:
            acts = parse_dialog_acts(dialogue_id, index, item["dialog_act"], source)
        if acts is None:
            missing.add("turns.dialog_act")
        turns.append(Turn(dialogue_id, index, speaker, text, belief, acts))
    return Dialogue(dialogue_id, goal, tuple(turns), split, tuple(sorted(missing | set(goal.missing))), goal.ignored)


def _split_key(dialogue_id: str) -> str:
    return dialogue_id[:-5] if dialogue_id.endswith(".json") else dialogue_id


def parse_split_list(text: str, source: str) -> list[str]:
    """``testListFile.json`` / ``valListFile.json`` hold one id per line (despite the
    extension); a JSON list is accepted too."""
    stripped = text.strip()
    if stripped.startswith("["):
        import json

        try:
            ids = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise DataError(source, f"invalid JSON list of dialogue ids: {exc}") from exc
        except RecursionError:
            raise DataError(source, "invalid JSON list of dialogue ids: nested too deeply") from None
        if not all(isinstance(i, str) for i in ids):
            raise DataError(source, "split list must hold dialogue id strings")
        return ids
    return [line.strip() for line in stripped.splitlines() if line.strip()]


def unknown_split_ids(listed: Iterable[str], dialogue_ids: Iterable[str]) -> list[str]:
    """The ids of a split list that name no dialogue, in list order (with or without the
    ``.json`` suffix, as the lists themselves vary).

    >>> unknown_split_ids(["SNG01", "MUL02.json", "PMUL03"], ["SNG01.json", "MUL02.json"])
    ['PMUL03']
    """
    known = {_split_key(i) for i in dialogue_ids}
    return [i for i in listed if _split_key(i) not in known]


def parse_dialogues(
    raw: Any,
    source: str,
    test_ids: Iterable[str] = (),
    val_ids: Iterable[str] = (),
    strict: bool = False,
) -> list[Dialogue]:
    if not isinstance(raw, dict):
        raise DataError(source, f"data.json must map dialogue ids to dialogues, got {type(raw).__name__}")
    test = {_split_key(i) for i in test_ids}
    val = {_split_key(i) for i in val_ids}
    dialogues = []
    for dialogue_id, item in raw.items():
        key = _split_key(dialogue_id)
        split = "test" if key in test else "val" if key in val else "train"
        dialogues.append(parse_dialogue(dialogue_id, item, source, split, strict))
    return dialogues


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{prefix}.{key}" if prefix else key, item, out)
    elif isinstance(value, list):
        out[prefix] = ",".join(str(v) for v in value)
    elif value is not None:
        out[prefix] = str(value)


def parse_database(domain: str, raw: Any, source: str) -> tuple[list[Entity], Mapping[str, tuple[str, ...]]]:
    """Entities of one ``<domain>_db.json``. The taxi file is not a table but the options
    a taxi booking draws from; it is returned as the second element."""
    if domain not in DB_DOMAINS:
        raise DataError(source, f"unknown domain {domain!r} (known: {', '.join(DB_DOMAINS)})")
    if not isinstance(raw, list):
        raise DataError(source, f"a database must be a list of records, got {type(raw).__name__}")
    if domain == "taxi":
        options: dict[str, tuple[str, ...]] = {}
        for i, record in enumerate(raw):
            if not isinstance(record, dict):
                raise DataError(source, "taxi options must be an object", str(i))
            for key, values in record.items():
                if not isinstance(values, list):
                    raise DataError(source, "taxi option values must be a list", str(i), key)
                options[key] = tuple(str(v) for v in values)
        return [], frozen_dict(options)
    entities: list[Entity] = []
    seen: set[str] = set()
    for i, record in enumerate(raw):
        if not isinstance(record, dict):
            raise DataError(source, f"a database record must be an object, got {type(record).__name__}", f"#{i}")
        attributes: dict[str, str] = {}
        _flatten("", {k: v for k, v in record.items() if k != "location"}, attributes)
        if "location" in record:
            attributes["location"] = ",".join(str(v) for v in record["location"]) if isinstance(record["location"], list) else str(record["location"])
        if "trainID" in attributes and "id" not in attributes:
            # Real MultiWOZ reuses a trainID for different trains (other days, even the same
            # day), so a train's identity is (trainID, day, departure time).
            entity_id = "-".join(attributes.get(k, "") for k in ("trainID", "day", "leaveAt"))
        else:
            entity_id = attributes.get("id", "")
        if not entity_id:
            raise DataError(source, "record has neither 'id' nor 'trainID'", f"#{i}", "id")
        if entity_id in seen:
            raise DataError(source, "duplicate id", entity_id, "id")
        seen.add(entity_id)
        name = attributes.get("name") or attributes.get("trainID") or attributes.get("department") or entity_id
        entities.append(Entity(domain, entity_id, name, frozen_dict(attributes)))
    return entities, frozen_dict({})
