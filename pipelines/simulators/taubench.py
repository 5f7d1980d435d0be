"""τ-bench users: :class:`TauInstructionUser` (offline, the evaluation's), :class:`TauRulesUser`
(offline, knows the solution: training data and plumbing checks only) and :class:`FuzzyLLMUser`
(the paper's prompt).

:class:`TauInstructionUser` knows only its instruction (:class:`TauUserView`): see its
docstring. What follows describes :class:`TauRulesUser`, which reads the task's ground-truth
actions (it can say values the instruction does not contain: flight numbers, a reservation id
the instruction says the user forgot, payment ids), so no measured setting uses it.

:class:`TauRulesUser` has the fuzzy intent of the Clarifier paper's user: it opens with what it
wants in one vague sentence and gives each detail only when the agent asks for it.

It is grounded in the task: the instruction (its opening sentence picks the request; the
whole instruction is what it says about *which* items or flights when asked), the user id,
and the arguments of the ground-truth actions, which are the details a real user would
know (email, name and zip, order or reservation ids, reasons, payment method, addresses,
trip details). What it withholds: everything but the request's kind, until asked. What it
answers: a question naming a detail (email, zip, order, reason, payment, address, origin,
date, cabin, passengers, bags, insurance) gets that detail; a request to confirm gets
"yes". When the agent says something that asks nothing, the user volunteers its next
withheld detail (a user moving things on); with nothing left, it says ``###STOP###``, as
τ-bench's users do, and the episode ends. It gives up after ``max_turns`` turns.

Deterministic: no randomness at all, so a session's seed changes nothing; forks copy the
small state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pipelines.env.taubench.data import TauTask
from pipelines.llm import Failure, LLMClient, SamplingParams
from pipelines.simulators.base import UserTurn
from pipelines.simulators.llm import ROLE, call_seed
from pipelines.simulators.protection import SimulatorFault

STOP = "###STOP###"
# What the user says it wants, by the first ground-truth write action (in task order).
_INTENTS: dict[str, str] = {
    "cancel_pending_order": "I'd like to cancel an order.",
    "modify_pending_order_items": "I want to change some items in an order I placed.",
    "modify_pending_order_address": "I need to change the shipping address of an order.",
    "modify_pending_order_payment": "I want to change how I pay for an order.",
    "modify_user_address": "I need to update my address.",
    "return_delivered_order_items": "I'd like to return something I received.",
    "exchange_delivered_order_items": "I'd like to exchange something I received.",
    "book_reservation": "I want to book a flight.",
    "cancel_reservation": "I need to cancel a reservation.",
    "update_reservation_flights": "I need to change my flights.",
    "update_reservation_baggages": "I want to change the bags on my reservation.",
    "update_reservation_passengers": "I need to change the passenger details on my reservation.",
    "send_certificate": "I had a problem with my trip and would like some compensation.",
    "transfer_to_human_agents": "I need help with something that may need a person.",
}
_DEFAULT_INTENT = "Hi, I have a question about my account."


@dataclass(frozen=True)
class Detail:
    """Something the user knows: what it is, the words an agent's question would use, and
    what the user says when asked."""

    name: str
    keywords: tuple[str, ...]
    answer: str


def _values(task: TauTask, key: str) -> list[Any]:
    seen: list[Any] = []
    for action in task.actions:
        value = action.kwargs.get(key)
        if value is not None and value not in seen:
            seen.append(value)
    return seen


def _join(values: list[Any]) -> str:
    texts = [str(v) for v in values]
    return texts[0] if len(texts) == 1 else ", ".join(texts[:-1]) + " and " + texts[-1]


def task_details(task: TauTask) -> list[Detail]:
    """The details the user can give, in the order a conversation needs them (identity first)."""
    details: list[Detail] = []
    email = _values(task, "email") or re.findall(r"[\w.+-]+@[\w-]+\.[\w.]+", task.instruction)
    by_name = next((a.kwargs for a in task.actions if a.name == "find_user_id_by_name_zip"), None)
    if email:
        details.append(Detail("email", ("email", "e-mail"), f"My email is {email[0]}."))
    if by_name is not None:
        details.append(
            Detail(
                "name_zip", ("name", "zip", "postal"),
                f"I'm {by_name.get('first_name', '')} {by_name.get('last_name', '')}, zip code {by_name.get('zip', '')}.",
            )
        )
    details.append(Detail("user_id", ("user id", "user_id", "username", "account id"), f"My user id is {task.user_id}."))
    for key, label, words in (
        ("order_id", "order", ("order id", "order number", "which order", "order #")),
        ("reservation_id", "reservation", ("reservation id", "reservation number", "confirmation", "which reservation", "booking id")),
    ):
        values = _values(task, key)
        if values:
            details.append(Detail(key, words, f"The {label}{'s are' if len(values) > 1 else ' is'} {_join(values)}."))
    reasons = _values(task, "reason")
    if reasons:
        details.append(Detail("reason", ("reason", "why"), f"It's {_join(reasons)}."))
    payments = _values(task, "payment_method_id") + _values(task, "payment_id")
    payments += [p.get("payment_id") for a in task.actions for p in a.kwargs.get("payment_methods", []) if isinstance(p, dict)]
    payments = [p for i, p in enumerate(payments) if p and p not in payments[:i]]
    if payments:
        details.append(Detail("payment", ("payment", "pay ", "card", "refund", "gift card", "paypal"), f"Please use {_join(payments)}."))
    address = next((a.kwargs for a in task.actions if "address1" in a.kwargs), None)
    if address is not None:
        parts = [address.get(k, "") for k in ("address1", "address2", "city", "state", "country", "zip")]
        details.append(Detail("address", ("address",), "The address is " + ", ".join(p for p in parts if p) + "."))
    booking = next((a.kwargs for a in task.actions if a.name == "book_reservation"), None)
    flights = _values(task, "flights")
    if booking is not None:
        details.append(Detail("route", ("origin", "destination", "from", "where", "city", "airport"),
                              f"From {booking.get('origin')} to {booking.get('destination')}, {str(booking.get('flight_type', '')).replace('_', ' ')}."))
    if flights:
        legs = [f"{f.get('flight_number')} on {f.get('date')}" for legs in flights for f in legs if isinstance(f, dict)]
        details.append(Detail("flights", ("date", "when", "flight"), f"The flights: {_join(legs)}." if legs else "Any flight works."))
    cabins = _values(task, "cabin")
    if cabins:
        details.append(Detail("cabin", ("cabin", "class", "economy", "business"), f"{str(cabins[-1]).replace('_', ' ')}, please."))
    passengers = [p for a in task.actions for p in a.kwargs.get("passengers", []) if isinstance(p, dict)]
    if passengers:
        names = [f"{p.get('first_name')} {p.get('last_name')} (born {p.get('dob')})" for p in passengers]
        details.append(Detail("passengers", ("passenger", "traveler", "traveller", "who", "birth"), f"The passengers: {_join(names)}."))
    bags = _values(task, "total_baggages")
    if bags:
        details.append(Detail("bags", ("bag", "luggage", "baggage"), f"{bags[-1]} bags in total."))
    insurance = _values(task, "insurance")
    if insurance:
        details.append(Detail("insurance", ("insurance",), "Yes, I want insurance." if insurance[-1] == "yes" else "No insurance."))
    amounts = _values(task, "amount")
    if amounts and any(a.name == "send_certificate" for a in task.actions):
        details.append(Detail("amount", ("amount", "how much", "compensation"), f"I think {amounts[0]} would be fair."))
    # Which items or what exactly: the user describes it in its own words, the instruction.
    request_words = ("item", "which one", "what would you like", "what do you want", "how can i help", "what can i",
                     "option", "product", "describe", "more about")
    details.append(Detail("request", request_words,
                          _request_text(task.instruction)))
    return details


def _request_text(instruction: str) -> str:
    """The instruction told in the first person, without its identity sentence."""
    sentences = re.split(r"(?<=[.!?])\s+", instruction.strip())
    kept = [s for s in sentences if not re.match(r"(?i)(you are|your user id is|your name is)\b", s)] or sentences
    text = " ".join(kept)
    for pattern, replacement in ((r"\bYou are\b", "I am"), (r"\byou are\b", "I am"), (r"\bYou\b", "I"), (r"\byou\b", "I"),
                                 (r"\bYour\b", "My"), (r"\byour\b", "my"), (r"\byourself\b", "myself")):
        text = re.sub(pattern, replacement, text)
    return text


def asked_details(text: str, details: list[Detail]) -> list[Detail]:
    """The details a question names (by their keywords), in the details' order."""
    lowered = text.lower()
    return [d for d in details if any(word in lowered for word in d.keywords)]


_CONFIRM = re.compile(r"\b(confirm|proceed|shall i|should i|would you like me to|go ahead|yes/no|\(yes\))\b", re.IGNORECASE)


@dataclass
class _State:
    given: set[str] = field(default_factory=set)
    turns: int = 0


class TauRulesSession:
    def __init__(self, task: TauTask, details: list[Detail], max_turns: int, state: _State | None = None):
        self.task = task
        self.details = details
        self.max_turns = max_turns
        self._state = state or _State()

    async def opening(self) -> UserTurn:
        self._state.turns += 1
        writes = [a.name for a in self.task.actions if a.name in _INTENTS]
        return UserTurn(_INTENTS[writes[0]] if writes else _DEFAULT_INTENT)

    async def respond(self, agent_text: str) -> UserTurn:
        self._state.turns += 1
        if self._state.turns > self.max_turns:
            return UserTurn(f"I have to go now. {STOP}", end=True)
        asked = asked_details(agent_text, self.details)
        # Identity: one way is enough; email first, as the retail policy asks.
        if any(d.name in ("email", "name_zip", "user_id") for d in asked):
            identity = [d for d in asked if d.name in ("email", "name_zip", "user_id")]
            asked = [d for d in asked if d not in identity] + identity[:1]
        if asked:
            self._state.given.update(d.name for d in asked)
            return UserTurn(" ".join(d.answer for d in asked))
        if _CONFIRM.search(agent_text):
            return UserTurn("Yes, please go ahead.")
        if "?" in agent_text:
            return UserTurn("I'm not sure what you need from me. Could you say which detail you need?")
        withheld = [d for d in self.details if d.name not in self._state.given]
        if withheld:
            self._state.given.add(withheld[0].name)
            return UserTurn(withheld[0].answer)
        return UserTurn(f"Thanks, that's all. {STOP}", end=True)

    def fork(self) -> TauRulesSession:
        return TauRulesSession(self.task, self.details, self.max_turns, _State(set(self._state.given), self._state.turns))


class TauRulesUser:
    """τ-bench users from their tasks (see the module docstring)."""

    name = "tau_rules"

    def __init__(self, max_turns: int = 30):
        self.max_turns = max_turns

    def session(self, goal: Any, seed: int, reference: Any = None) -> TauRulesSession:
        if not isinstance(goal, TauTask):
            raise TypeError(f"the τ-bench rules user plays TauTask goals, got {type(goal).__name__}")
        return TauRulesSession(goal, task_details(goal), self.max_turns)


# --------------------------------------------------------------------------------------
# The LLM user: the Clarifier paper's User-Driven Fuzzy Intent prompt (appendix 7.1)
# --------------------------------------------------------------------------------------

# The paper's user prompt template, its three parts as sections. The template does not show
# where the hidden instruction goes; as in τ-bench's own user prompt, it follows the role.
FUZZY_USER_PROMPT = """You are a user interacting with an agent. Your behavior simulates a human user following a hidden instruction.

Instruction: {instruction}

Instructions:
- Generate only one message at a time.
- Reveal information gradually instead of all at once.
- Do not invent facts missing from the instruction—if the agent asks for unavailable details, say you don't remember.
- When the instruction's goal is completed, output STOP.
- Do not repeat the instruction verbatim; use natural conversational phrasing.
- Maintain a natural, human-like conversation style.

Expected output: a single user utterance per step."""
# τ-bench's agent opens the conversation; the user answers it.
TAU_GREETING = "Hi! How can I help you today?"
_STOP_TOKEN = re.compile(r"(?:#{3})?\bSTOP\b(?:#{3})?")


def fuzzy_user_messages(task: TauTask, history: tuple[tuple[str, str], ...]) -> list[dict[str, str]]:
    """The user model's messages: the prompt, then the conversation from the user's side
    (the agent's utterances as ``user`` messages, the user's own as ``assistant`` ones)."""
    messages = [
        {"role": "system", "content": FUZZY_USER_PROMPT.format(instruction=task.instruction.strip())},
        {"role": "user", "content": TAU_GREETING},
    ]
    for speaker, text in history:
        messages.append({"role": "assistant" if speaker == "user" else "user", "content": text})
    return messages


def parse_fuzzy_reply(raw: str) -> tuple[str, bool]:
    """(text without the stop token, whether the user stops). "STOP" and τ-bench's
    "###STOP###" both end the conversation; "stop" in lower case is just a word.

    >>> parse_fuzzy_reply("Great, thanks! ###STOP###"), parse_fuzzy_reply("Is it a one-stop flight?")
    (('Great, thanks!', True), ('Is it a one-stop flight?', False))
    """
    text = re.sub(r"^\s*(?:user|customer)\s*:\s*", "", raw.strip(), flags=re.IGNORECASE)
    end = bool(_STOP_TOKEN.search(text))
    return " ".join(_STOP_TOKEN.sub(" ", text).split()), end


class FuzzyLLMSession:
    """One user whose turns an LLM writes from :data:`FUZZY_USER_PROMPT`. Same contract as
    the JOSH LLM sessions: seeded per (session, turn, attempt), a failed call raises
    :class:`SimulatorFault` and leaves the session as it was (``ProtectedSimulator`` retries)."""

    def __init__(self, client: LLMClient, sampling: SamplingParams, task: TauTask, seed: int, history: tuple = (), turn: int = 0):
        self._client = client
        self._sampling = sampling
        self.task = task
        self.seed = seed
        self.history: tuple[tuple[str, str], ...] = history
        self.turn = turn

    async def opening(self, *, attempt: int = 0) -> UserTurn:
        return await self._take_turn(None, attempt)

    async def respond(self, agent_text: str, *, attempt: int = 0) -> UserTurn:
        return await self._take_turn(agent_text, attempt)

    def fork(self) -> FuzzyLLMSession:
        return FuzzyLLMSession(self._client, self._sampling, self.task, self.seed, self.history, self.turn)

    def record_fallback(self, agent_text: str | None, turn: UserTurn) -> None:
        self.history = self._with_agent(agent_text) + (("user", turn.text),)
        self.turn += 1

    def _with_agent(self, agent_text: str | None) -> tuple[tuple[str, str], ...]:
        return self.history if agent_text is None else self.history + (("agent", agent_text),)

    async def _take_turn(self, agent_text: str | None, attempt: int) -> UserTurn:
        history = self._with_agent(agent_text)
        result = await self._client.complete(fuzzy_user_messages(self.task, history), ROLE, self._sampling, call_seed(self.seed, self.turn, attempt))
        if isinstance(result, Failure):
            raise SimulatorFault(f"llm_{result.reason}", result.last_error)
        text, end = parse_fuzzy_reply(result.text)
        if not text and not end:
            raise SimulatorFault("empty_reply", "the user model wrote nothing")
        self.history = history + (("user", text),)
        self.turn += 1
        return UserTurn(text, end=end)


class FuzzyLLMUser:
    """The paper's LM-simulated user for τ-bench over any OpenAI-compatible endpoint (role
    ``user_simulator``: ``openai``, or a local model behind ``transformers serve``)."""

    name = "fuzzy_llm"

    def __init__(self, client: LLMClient, sampling: SamplingParams | None = None):
        self.client = client
        self.sampling = sampling if sampling is not None else SamplingParams(temperature=0.0, max_tokens=256)

    def session(self, goal: Any, seed: int, reference: Any = None) -> FuzzyLLMSession:
        if not isinstance(goal, TauTask):
            raise TypeError(f"the fuzzy LLM user plays TauTask goals, got {type(goal).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        return FuzzyLLMSession(self.client, self.sampling, goal, seed)


# --------------------------------------------------------------------------------------
# The instruction-grounded rules user: it knows its instruction and nothing else
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TauUserView:
    """What a τ-bench user knows: its domain and its instruction. Never the task's
    ground-truth actions or outputs (the solution), so a user built from it cannot say them."""

    domain: str
    instruction: str

    @classmethod
    def of(cls, task: TauTask) -> TauUserView:
        return cls(task.domain, task.instruction)


_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_RESERVATION = re.compile(r"\b(?!HAT\d{3}\b)(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{6}\b")
# (detail, words in the agent's question, words of the instruction's sentences that say it)
_SENTENCE_DETAILS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("reason", ("reason", "why"), ("no longer", "mistake", "because", "broken", "reason", "unwell", "sick")),
    ("payment", ("payment", "pay ", "card", "refund", "gift card", "paypal", "certificate"),
     ("pay", "refund", "gift card", "paypal", "credit card", "certificate", "card")),
    ("address", ("address",), ("address", "deliver", "ship")),
    ("route", ("origin", "destination", "from where", "where", "airport"), ("fly from", "from ", " to ")),
    ("date", ("date", "when"), ("may ", "june", "today", "tomorrow", "next day")),
    ("cabin", ("cabin", "class", "economy", "business"), ("economy", "business", "cabin", "class")),
    ("passengers", ("passenger", "traveler", "traveller", "who", "birth"), ("passenger", "traveler", "companion", "born", "birthday")),
    ("bags", ("bag", "luggage", "baggage"), ("bag", "luggage", "baggage")),
    ("insurance", ("insurance",), ("insurance",)),
)
_INTENT_WORDS: tuple[tuple[str, str], ...] = (
    ("exchange", "exchange_delivered_order_items"), ("return", "return_delivered_order_items"),
    ("book", "book_reservation"), ("fly from", "book_reservation"), ("compensation", "send_certificate"),
    ("complain", "send_certificate"), ("bag", "update_reservation_baggages"), ("passenger", "update_reservation_passengers"),
    ("address", "modify_pending_order_address"), ("cancel", "cancel_pending_order"), ("upgrade", "modify_pending_order_items"),
    ("downgrade", "modify_pending_order_items"), ("modify", "modify_pending_order_items"), ("change", "modify_pending_order_items"),
)
_AIRLINE_INTENT = {"cancel_pending_order": "cancel_reservation", "modify_pending_order_items": "update_reservation_flights"}


def instruction_intent(view: TauUserView) -> str:
    """The user's opening, from the instruction's words alone.

    >>> instruction_intent(TauUserView("retail", "You are Mei Davis in 80217. You want to return the office chair."))
    "I'd like to return something I received."
    """
    lowered = view.instruction.lower()
    for word, action in _INTENT_WORDS:
        if word in lowered:
            if view.domain == "airline":
                action = _AIRLINE_INTENT.get(action, action)
            return _INTENTS.get(action, _DEFAULT_INTENT)
    return _DEFAULT_INTENT


def instruction_details(view: TauUserView) -> list[Detail]:
    """The details this user can give: only values its instruction states (in the order a
    conversation needs them, identity first). A detail the instruction lacks is not here: asked
    for it, the user says it does not know.

    >>> [d.name for d in instruction_details(TauUserView("retail", "You are Mei Davis in 80217. You want to return the office chair."))]
    ['name_zip', 'request']
    """
    text = view.instruction
    sentences = _SENTENCE.split(text.strip())
    details: list[Detail] = []
    email = re.findall(r"[\w.+-]+@[\w-]+\.[\w.]+\w", text)
    if email:
        details.append(Detail("email", ("email", "e-mail"), f"My email is {email[0]}."))
    name = re.match(r"\s*You are ([A-Z][a-z]+) ([A-Z][a-z]+)\b", text)
    zip_code = re.search(r"\b\d{5}\b", sentences[0]) if sentences else None
    user_id = re.search(r"\b[a-z]+_[a-z]+_\d+\b", text)
    if name and zip_code:
        details.append(Detail("name_zip", ("name", "zip", "postal"), f"I'm {name.group(1)} {name.group(2)}, zip code {zip_code.group(0)}."))
    if user_id:
        # Without a name it is how this user says who it is, asked for its name or zip too.
        words = ("user id", "user_id", "username", "account id") + (() if name else ("name", "zip", "postal"))
        extra = f", zip code {zip_code.group(0)}" if zip_code and not name else ""
        details.append(Detail("user_id", words, f"My user id is {user_id.group(0)}{extra}."))
    orders = list(dict.fromkeys("#W" + m for m in re.findall(r"#?W(\d{7})\b", text)))
    if orders:
        details.append(Detail("order_id", ("order id", "order number", "which order", "order #"),
                              f"The order{'s are' if len(orders) > 1 else ' is'} {_join(orders)}."))
    reservations = list(dict.fromkeys(_RESERVATION.findall(text))) if view.domain == "airline" else []
    if reservations:
        details.append(Detail("reservation_id", ("reservation id", "reservation number", "confirmation", "which reservation", "booking id"),
                              f"The reservation{'s are' if len(reservations) > 1 else ' is'} {_join(reservations)}."))
    for detail, asked, says in _SENTENCE_DETAILS:
        if detail in ("route", "date", "cabin", "passengers", "bags", "insurance") and view.domain != "airline":
            continue
        told = [s for s in sentences[1:] if any(word in s.lower() for word in says)]
        if told:
            details.append(Detail(detail, asked, _request_text(" ".join(told))))
    request_words = ("item", "which one", "what would you like", "what do you want", "how can i help", "what can i",
                     "option", "product", "describe", "more about")
    details.append(Detail("request", request_words, _request_text(text)))
    return details


# What an agent may ask for that this user might not know: (detail, words of the question).
_ASKABLE: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("email", ("email", "e-mail")), ("name_zip", ("name", "zip", "postal")),
    ("user_id", ("user id", "user_id", "username", "account id")),
    ("order_id", ("order id", "order number", "which order", "order #")),
    ("reservation_id", ("reservation id", "reservation number", "which reservation", "booking id")),
    *((name, asked) for name, asked, _ in _SENTENCE_DETAILS),
)


class TauInstructionSession(TauRulesSession):
    """A rules session that answers from the instruction only; see :class:`TauInstructionUser`."""

    def __init__(self, view: TauUserView, details: list[Detail], max_turns: int, state: _State | None = None):
        self.view = view
        self.details = details
        self.max_turns = max_turns
        self._state = state or _State()

    async def opening(self) -> UserTurn:
        self._state.turns += 1
        return UserTurn(instruction_intent(self.view))

    async def respond(self, agent_text: str) -> UserTurn:
        if _CONFIRM.search(agent_text) and re.search(r"(?i)\bconfirm\b|yes/no", agent_text):
            self._state.turns += 1
            if self._state.turns > self.max_turns:
                return UserTurn(f"I have to go now. {STOP}", end=True)
            return UserTurn("Yes, please go ahead.")
        known = {d.name for d in self.details}
        lowered = agent_text.lower()
        unknown = [name for name, words in _ASKABLE if name not in known and any(word in lowered for word in words)]
        asked = asked_details(agent_text, self.details)
        if unknown and not [d for d in asked if d.name != "request"] and "?" in agent_text:
            self._state.turns += 1
            if self._state.turns > self.max_turns:
                return UserTurn(f"I have to go now. {STOP}", end=True)
            return UserTurn(f"Sorry, I don't know my {unknown[0].replace('_', ' ').replace('name zip', 'zip code')}.")
        return await super().respond(agent_text)

    def fork(self) -> TauInstructionSession:
        return TauInstructionSession(self.view, self.details, self.max_turns, _State(set(self._state.given), self._state.turns))


class TauInstructionUser:
    """The offline fuzzy user that knows only its instruction (:class:`TauUserView`): it opens
    with the kind of request its instruction names, gives a detail when asked for it only if
    the instruction states it (identity, order or reservation ids, reasons, payment, address
    and trip sentences, the request in its own words) and says it does not know otherwise;
    a turn that asks nothing gets its next unsaid detail, and with none left it stops. Unlike
    :class:`TauRulesUser` it never reads the ground-truth actions, so it cannot tell the agent
    a value (a flight number, a forgotten reservation id, a payment id) the instruction lacks."""

    name = "tau_instruction"

    def __init__(self, max_turns: int = 30):
        self.max_turns = max_turns

    def session(self, goal: Any, seed: int, reference: Any = None) -> TauInstructionSession:
        if not isinstance(goal, TauTask):
            raise TypeError(f"the τ-bench instruction user plays TauTask goals, got {type(goal).__name__}")
        view = TauUserView.of(goal)
        return TauInstructionSession(view, instruction_details(view), self.max_turns)
