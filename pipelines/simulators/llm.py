"""JOSH's LLM user simulators (JOSH, section 4.3): goal-based and guide-based.

**Goal-based** (JOSH Table 11): the model plays the customer. Its system prompt holds the
goal (the MultiWOZ goal message, HTML stripped, or a rendering of the goal's fields); the
conversation follows from the customer's side: the agent's utterances are ``user``
messages and the customer's own earlier turns ``assistant`` messages; the last message
carries Table 11's reminder, which ends in "CUSTOMER:".

**Guide-based** (JOSH Table 12): two calls per turn. A coach (the guide) reads the goal,
the conversation so far and, when the goal comes from a dataset dialogue, that
dialogue's customer turns, and advises what the customer should say next, quoting the
source where it can. The customer model then writes the reply with that advice in its
prompt. Grounding in the source keeps reruns on the same trajectory.

A reply containing END_CONVERSATION ends the conversation; the token is removed from the
text. Calls use role "user_simulator" at temperature 0 unless configured otherwise, with
a seed derived from (session seed, turn, attempt): a rerun sends the same requests and is
served from the response cache, and a retry (attempt > 0, see ``protection``) asks anew.
An LLM failure raises :class:`SimulatorFault`; ``ProtectedSession`` turns faults into
retries and recorded fallbacks.
"""

from __future__ import annotations

import hashlib
import re
from typing import Sequence

from pipelines.llm import Failure, LLMClient, SamplingParams
from pipelines.records import Dialogue, Goal
from pipelines.simulators.base import END_CONVERSATION, UserTurn
from pipelines.simulators.goals import goal_instructions
from pipelines.simulators.protection import SimulatorFault

ROLE = "user_simulator"
AGENT, CUSTOMER = "agent", "customer"
History = tuple[tuple[str, str], ...]  # (speaker, text), oldest first

# JOSH Table 11, SYSTEM. The line "DO NOT say <span class='emphasis'> or </span> to the
# agent" is left out: the goal reaches the model with its markup stripped.
GOAL_SYSTEM_PROMPT = """You're a customer talking to a travel agent.
You have the following goals you want to accomplish in the conversation (don't relay them all at once to the agent):
{goals}

Discuss with the agent to try and accomplish each one of your goals in order.
If the agent fails at an action, check other goals for a backup plan
Relay information piecemeal to the agent to encourage conversation.
EXCEPTION: Make sure you've communicated all the necessary information for that intent before proceeding with a booking.
ALL of your listed goals must be fulfilled in order for you to agree to a booking.
When you want to end the conversation say END_CONVERSATION
Always say END_CONVERSATION to hang up!"""

# JOSH Table 11, USER: appended to the last message before each customer turn.
GOAL_REMINDER = """REMEMBER: You are a customer talking to a travel agent.
When you want to end the conversation say END_CONVERSATION
Always say END_CONVERSATION to hang up!
Try to address your next goal or finish the current goal you're focusing on.
Note: if you are looking for a "place to stay", don't refer to it as a hotel unless the goals explicitly state you are looking for a type hotel.
Don't relay all the information about your goal to the agent at once.
ABOVE ALL ELSE, it is critical ALL of your listed goals are fulfilled in order for you to agree to a booking. Double check each of your requirements and tell the agent if one is not met. If you're not sure, double check.
EXCEPTION: Make sure you've communicated all the necessary information for that intent before proceeding with a booking.
If the agent fails at an action, check other goals for a backup plan.
{advice}Remember, you are the customer.
CUSTOMER:"""

# How the guide's advice reaches the customer model (guide-based simulator only).
ADVICE_BLOCK = """A coach who knows how this conversation should go advises you:
{advice}
Follow the advice; when it suggests a quote, say it.
"""

# The customer speaks first in MultiWOZ, but a chat model answers a user message: the
# conversation starts with the agent's implied greeting.
AGENT_GREETING = "Hello, how can I help you?"

# JOSH Table 12, the guide (coach) prompt.
GUIDE_PROMPT = """You are a coach giving tips to a user simulator trying to replicate a conversation as consistently as possible. The user simulator is in the middle of a conversation, give it advice on what to do in the next turn.
Consistency means that over multiple runs, the user simulator should behave in the exact same way, it is your job to try and help it stay on the same trajectory every run.

##### Grounding Goals and Conversation #####
Customer goals:
{goals}
{source}
#####
##### CURRENT (real) Conversation #####
This is the CURRENT conversation the user simulator is having:
{current}

Use your best judgement if the conversation is not going well, it's possible the agent is not good enough and you need to end the conversation. End the conversation by putting END_CONVERSATION after your quote.
Keep in mind the Customer goals all must be communicated in order to give the agent enough information to properly search and book.
It is critical you give consistent advice over multiple iterations of the same conversation. The best way to do that is to ground your response in {grounding} and providing quotes whenever possible.
Please write brief advice on what the user simulator should say in order to keep it consistent and aligned with {aligned}. Write this advice to the user simulator, referring to it as "you". No yapping.:
Example:
Advice:
The user should ...
Suggested quote:
"Hello, how can I help you?"
Advice:
The conversation should be ended
Suggested quote:
"Thanks, goodbye" END_CONVERSATION
Output:"""
# The source is the reference dialogue's customer turns: they are what the guide quotes.
# The agent under training is not the source's agent, so the source agent's lines would
# describe dialogue states this conversation need not be in.
GUIDE_SOURCE = "The following is the source conversation the user simulator is trying to replicate (the customer's turns):\n{turns}"
GUIDE_NO_SOURCE = "There is no source conversation for these goals: base your advice on the customer goals alone."
EMPTY_CONVERSATION = "(The conversation has not started yet: the customer speaks first.)"

# A model that answers as "CUSTOMER: ..." (the prompt ends with that label) means the text.
_OWN_LABEL = re.compile(r"^\s*(?:\*\*)?(?:customer|user)(?:\*\*)?\s*:\s*", re.I)
_QUOTED = re.compile(r'^"([^"]*)"$')
_END = re.compile(r"\[?\s*" + END_CONVERSATION + r"\s*\]?")


#: The customer's replies and the guide's advice unless the ``user_simulator`` role's backend
#: section sets ``sampling``: temperature 0, as in JOSH.
DEFAULT_SAMPLING = SamplingParams(temperature=0.0, max_tokens=256)


# --------------------------------------------------------------------------------------
# Prompts (public so that stages and tests can show exactly what a model is sent)
# --------------------------------------------------------------------------------------


def goal_text(goal: Goal) -> str:
    return "\n".join(goal_instructions(goal))


def goal_messages(goal: Goal, history: History, advice: str | None = None) -> list[dict[str, str]]:
    """The customer model's messages: JOSH Table 11 around the conversation so far."""
    messages = [
        {"role": "system", "content": GOAL_SYSTEM_PROMPT.format(goals=goal_text(goal))},
        {"role": "user", "content": AGENT_GREETING},
    ]
    # Sessions alternate by construction (every agent turn gets a customer turn), so the
    # roles alternate too, as strict chat templates require.
    messages += [{"role": "assistant" if speaker == CUSTOMER else "user", "content": text} for speaker, text in history]
    reminder = GOAL_REMINDER.format(advice=ADVICE_BLOCK.format(advice=advice.strip()) if advice else "")
    if messages[-1]["role"] == "user":
        messages[-1] = {"role": "user", "content": f"{messages[-1]['content']}\n\n{reminder}"}
    else:
        messages.append({"role": "user", "content": reminder})
    return messages


def guide_messages(goal: Goal, history: History, reference: Dialogue | None) -> list[dict[str, str]]:
    """The guide's single user message: JOSH Table 12."""
    customer_turns = [t.text for t in reference.turns if t.speaker == "user"] if reference is not None else []
    if customer_turns:
        source = GUIDE_SOURCE.format(turns="\n".join(f"customer: {text}" for text in customer_turns))
        grounding, aligned = "the source conversation", "the source conversation"
    else:
        source, grounding, aligned = GUIDE_NO_SOURCE, "the customer goals", "the customer goals"
    current = "\n".join(f"{speaker}: {text}" for speaker, text in history) or EMPTY_CONVERSATION
    prompt = GUIDE_PROMPT.format(goals=goal_text(goal), source=source, current=current, grounding=grounding, aligned=aligned)
    return [{"role": "user", "content": prompt}]


def parse_reply(raw: str) -> tuple[str, bool]:
    """(text without END_CONVERSATION, whether the customer ends the conversation)."""
    text = _OWN_LABEL.sub("", raw.strip(), count=1)
    end = END_CONVERSATION in text
    text = " ".join(_END.sub(" ", text).split())
    quoted = _QUOTED.match(text)
    return (quoted.group(1).strip() if quoted else text), end


def call_seed(session_seed: int, turn: int, attempt: int) -> int:
    """The request seed of one turn's call: stable across runs (so the response cache
    answers a rerun) and different for each retry attempt."""
    digest = hashlib.sha256(f"{session_seed}:{turn}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


# --------------------------------------------------------------------------------------
# Sessions
# --------------------------------------------------------------------------------------


class _LLMSession:
    """One customer whose turns an LLM writes. Subclasses define ``_write``."""

    def __init__(self, client: LLMClient, sampling: SamplingParams, goal: Goal, seed: int,
                 reference: Dialogue | None = None, history: History = (), turn: int = 0):
        self._client = client
        self._sampling = sampling
        self.goal = goal
        self.seed = seed
        self.reference = reference
        self.history: History = history
        self.turn = turn  # turns written so far; part of every call's seed

    async def opening(self, *, attempt: int = 0) -> UserTurn:
        return await self._take_turn(None, attempt)

    async def respond(self, agent_text: str, *, attempt: int = 0) -> UserTurn:
        return await self._take_turn(agent_text, attempt)

    def fork(self) -> _LLMSession:
        # The history is a tuple of strings: sharing it is copying it.
        return type(self)(self._client, self._sampling, self.goal, self.seed, self.reference, self.history, self.turn)

    def record_fallback(self, agent_text: str | None, turn: UserTurn) -> None:
        """Take a turn written by someone else (a fallback) as this customer's own, so that
        the conversation the model sees next is the one the agent had."""
        self.history = self._with_agent(agent_text) + ((CUSTOMER, turn.text),)
        self.turn += 1

    async def _take_turn(self, agent_text: str | None, attempt: int) -> UserTurn:
        history = self._with_agent(agent_text)
        text, end = await self._write(history, call_seed(self.seed, self.turn, attempt))
        # State changes only once the turn is written: a failed call leaves the session as it was.
        self.history = history + ((CUSTOMER, text),)
        self.turn += 1
        return UserTurn(text, end=end)

    def _with_agent(self, agent_text: str | None) -> History:
        return self.history if agent_text is None else self.history + ((AGENT, agent_text),)

    async def _complete(self, messages: Sequence[dict[str, str]], sampling: SamplingParams, seed: int) -> str:
        result = await self._client.complete(messages, ROLE, sampling, seed)
        if isinstance(result, Failure):
            raise SimulatorFault(f"llm_{result.reason}", result.last_error)
        return result.text

    async def _write(self, history: History, seed: int) -> tuple[str, bool]:
        raise NotImplementedError


class GoalLLMSession(_LLMSession):
    async def _write(self, history: History, seed: int) -> tuple[str, bool]:
        return parse_reply(await self._complete(goal_messages(self.goal, history), self._sampling, seed))


class GuideLLMSession(_LLMSession):
    async def _write(self, history: History, seed: int) -> tuple[str, bool]:
        advice = await self._complete(guide_messages(self.goal, history, self.reference), self._sampling, seed)
        if not advice.strip():
            raise SimulatorFault("empty_advice", "the guide gave no advice")
        messages = goal_messages(self.goal, history, advice=advice)
        return parse_reply(await self._complete(messages, self._sampling, seed))


class _LLMSimulator:
    """Sessions of ``_session_class`` over one client; the client (and its cache and
    accounting) is shared by every session."""

    name: str
    _session_class: type[_LLMSession]

    def __init__(self, client: LLMClient, sampling: SamplingParams = DEFAULT_SAMPLING):
        self.client = client
        self.sampling = sampling

    def session(self, goal: Goal, seed: int, reference: Dialogue | None = None) -> _LLMSession:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        return self._session_class(self.client, self.sampling, goal, seed, reference)


class GoalLLMSimulator(_LLMSimulator):
    """JOSH's goal-based user simulator."""

    name = "goal_llm"
    _session_class = GoalLLMSession


class GuideLLMSimulator(_LLMSimulator):
    """JOSH's guide-based user simulator, grounded in the reference dialogue when given."""

    name = "guide_llm"
    _session_class = GuideLLMSession
