"""askflow's vocabulary: the typed records every method reads and writes.

``Goal`` / ``DomainGoal``: what a (simulated) user wants, in MultiWOZ's goal form.
``Dialogue`` / ``Turn``: a conversation as stored in a corpus.
``Entity``: one row of a domain database.
``ToolCall``: one call of an environment tool, with its observation.
``Corpus``: everything the loader read from one MultiWOZ-layout directory.

Records are frozen dataclasses of plain values so that they can be hashed, copied
for free and turned into Arrow rows without surprises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

Speaker = str  # "user" | "system"
SPEAKERS: tuple[str, ...] = ("user", "system")
SPLITS: tuple[str, ...] = ("train", "val", "test")
TRAIN, VAL, TEST = SPLITS  # val: training's held-out metrics; test: evaluation only


def frozen_dict(values: Mapping[str, Any] | None = None) -> Mapping[str, Any]:
    return MappingProxyType(dict(values or {}))


@dataclass(frozen=True)
class DomainGoal:
    """One domain of a user goal. ``info``/``book`` are the constraints that finally hold;
    ``fail_info``/``fail_book`` are what the user asks first and must give up on."""

    domain: str
    info: Mapping[str, str] = field(default_factory=frozen_dict)
    fail_info: Mapping[str, str] = field(default_factory=frozen_dict)
    book: Mapping[str, str] = field(default_factory=frozen_dict)
    fail_book: Mapping[str, str] = field(default_factory=frozen_dict)
    reqt: tuple[str, ...] = ()
    book_invalid: bool | None = None
    # Constraints that refer to another domain's booking, {slot: (domain, slot)}: real goal
    # messages say "arrives the restaurant by the booked time", the goal's value being what
    # the generator expected that booking to be.
    references: Mapping[str, tuple[str, str]] = field(default_factory=frozen_dict)

    @property
    def wants_booking(self) -> bool:
        return bool(self.book)


@dataclass(frozen=True)
class Goal:
    dialogue_id: str
    domains: tuple[DomainGoal, ...]
    message: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()  # fields the source did not provide, e.g. "goal.message"
    ignored: tuple[str, ...] = ()  # unknown keys the source has and the loader skipped, e.g. "goal.hotel.hotel"

    def get(self, domain: str) -> DomainGoal | None:
        for domain_goal in self.domains:
            if domain_goal.domain == domain:
                return domain_goal
        return None

    @property
    def domain_names(self) -> tuple[str, ...]:
        return tuple(d.domain for d in self.domains)


@dataclass(frozen=True)
class DialogAct:
    act: str  # e.g. "Restaurant-Inform"
    slot: str
    value: str

    @property
    def domain(self) -> str:
        return self.act.split("-", 1)[0].lower()

    @property
    def intent(self) -> str:
        return self.act.split("-", 1)[-1].lower()


@dataclass(frozen=True)
class BookedRecord:
    """An entry of a belief state's ``booked`` list (e.g. name + reference)."""

    domain: str
    values: Mapping[str, str]


@dataclass(frozen=True)
class DomainBelief:
    domain: str
    semi: Mapping[str, str]
    book: Mapping[str, str]
    booked: tuple[BookedRecord, ...] = ()


@dataclass(frozen=True)
class Turn:
    dialogue_id: str
    index: int
    speaker: Speaker
    text: str
    # Belief state after this turn (system turns in MultiWOZ); None when the source has none.
    belief_state: tuple[DomainBelief, ...] | None = None
    dialog_acts: tuple[DialogAct, ...] | None = None

    def belief(self, domain: str) -> DomainBelief | None:
        for belief in self.belief_state or ():
            if belief.domain == domain:
                return belief
        return None


@dataclass(frozen=True)
class Dialogue:
    dialogue_id: str
    goal: Goal
    turns: tuple[Turn, ...]
    split: str = "train"
    missing: tuple[str, ...] = ()  # e.g. "turns.metadata", "turns.dialog_act"
    ignored: tuple[str, ...] = ()  # unknown source keys skipped by the loader (the goal's)


@dataclass(frozen=True)
class Entity:
    domain: str
    entity_id: str
    name: str
    attributes: Mapping[str, str]  # every attribute as a string; nested prices flattened as "price.single"

    def get(self, slot: str) -> str | None:
        return self.attributes.get(slot)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any]
    observation: Mapping[str, Any] | None = None  # filled in by the environment

    @property
    def ok(self) -> bool:
        return bool(self.observation) and "error" not in self.observation


@dataclass
class Corpus:
    """A MultiWOZ-layout corpus after loading."""

    source: str
    dialogues: list[Dialogue]
    entities: dict[str, list[Entity]]
    splits: dict[str, str]  # dialogue_id -> split
    taxi_options: Mapping[str, tuple[str, ...]] = field(default_factory=frozen_dict)
    # Ids a split list names that data.json lacks, per split file name, in file order.
    unknown_split_ids: Mapping[str, tuple[str, ...]] = field(default_factory=frozen_dict)
