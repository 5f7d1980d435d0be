"""Fixtures for the user-simulator tests: a small hand-made database whose contents the
tests reason about, goal builders, and the fake OpenAI-compatible server."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from pipelines.env.tools import Database
from pipelines.llm import ClientConfig, LLMClient, ResponseCache
from pipelines.records import DomainGoal, Entity, Goal, frozen_dict


def _venue(domain: str, id_: str, name: str, **attributes: str) -> Entity:
    base = {"name": name, "address": f"{id_} hills road", "phone": f"0122333{int(id_):04d}", "postcode": f"cb{id_}9zz"}
    return Entity(domain, id_, name, frozen_dict({**base, **attributes}))


def _train(train_id: str, day: str, departure: str, destination: str, leave: str, arrive: str) -> Entity:
    attributes = {"trainID": train_id, "day": day, "departure": departure, "destination": destination, "leaveAt": leave,
                  "arriveBy": arrive, "duration": "51 minutes", "price": "23.60 pounds"}
    return Entity("train", f"{train_id}-{day}-{leave}", train_id, frozen_dict(attributes))


ENTITIES = {
    "restaurant": [
        _venue("restaurant", "1", "the golden curry", food="indian", pricerange="expensive", area="centre"),
        _venue("restaurant", "2", "curry prince", food="indian", pricerange="moderate", area="east"),
        _venue("restaurant", "3", "the nirala", food="indian", pricerange="moderate", area="north"),
        _venue("restaurant", "4", "la margherita", food="italian", pricerange="cheap", area="west"),
        _venue("restaurant", "5", "pizza hut city centre", food="italian", pricerange="cheap", area="centre"),
        _venue("restaurant", "6", "pizza hut", food="italian", pricerange="moderate", area="south"),
    ],
    "hotel": [
        _venue("hotel", "11", "acorn guest house", type="guesthouse", area="north", pricerange="moderate", stars="4",
               parking="yes", internet="yes"),
        _venue("hotel", "12", "the lensfield hotel", type="hotel", area="south", pricerange="expensive", stars="3",
               parking="yes", internet="yes"),
        _venue("hotel", "13", "alexander bed and breakfast", type="guesthouse", area="centre", pricerange="cheap", stars="4",
               parking="no", internet="yes"),
    ],
    "attraction": [
        _venue("attraction", "21", "king's college", type="college", area="centre", **{"entrance fee": "free"}),
        _venue("attraction", "22", "abbey pool", type="swimmingpool", area="east", **{"entrance fee": "?"}),
        _venue("attraction", "23", "the place", type="nightclub", area="centre", **{"entrance fee": "5 pounds"}),
    ],
    "train": [
        _train("TR0001", "monday", "cambridge", "london kings cross", "05:00", "05:51"),
        _train("TR0002", "monday", "cambridge", "london kings cross", "07:00", "07:51"),
        _train("TR0003", "monday", "cambridge", "london kings cross", "09:00", "09:51"),
        _train("TR0003", "tuesday", "ely", "cambridge", "06:10", "07:00"),
    ],
    "police": [_venue("police", "31", "Parkside Police Station")],
}
TAXI_OPTIONS = {"taxi_colors": ("black", "grey"), "taxi_types": ("toyota", "skoda")}


@pytest.fixture(scope="session")
def tiny_db() -> Database:
    return Database(ENTITIES, TAXI_OPTIONS)


def domain_goal(domain: str, info=None, *, fail_info=None, book=None, fail_book=None, reqt=()) -> DomainGoal:
    return DomainGoal(domain, frozen_dict(info), frozen_dict(fail_info), frozen_dict(book), frozen_dict(fail_book), tuple(reqt))


def make_goal(*domains: DomainGoal, message: tuple[str, ...] = (), dialogue_id: str = "TEST0001.json") -> Goal:
    return Goal(dialogue_id, tuple(domains), message)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


# -- LLM simulators ------------------------------------------------------------------------


def make_client(base_url: str, cache_dir=None, **overrides: Any) -> LLMClient:
    """A client that gives up fast: faults cost milliseconds."""
    settings: dict[str, Any] = {"base_url": base_url, "model": "fake-model", "timeout_s": 2.0, "max_retries": 0,
                                "backoff_base_s": 0.001, "backoff_max_s": 0.005}
    settings.update(overrides)
    return LLMClient(ClientConfig(**settings), cache=ResponseCache(cache_dir) if cache_dir is not None else None)


@pytest.fixture
def scripted_replies(monkeypatch) -> Callable[[Callable[[list[dict], int | None], str]], None]:
    """Make the fake server answer with ``script(messages, seed)`` instead of its echo."""
    from pipelines.llm.testing import fake_server

    def install(script: Callable[[list[dict], int | None], str]) -> None:
        monkeypatch.setattr(fake_server, "reply_text", lambda messages, seed, index, as_json: script(messages, seed))

    return install
