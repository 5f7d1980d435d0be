"""The embedded policy's view of an episode: the prompts it was trained on.

A model trained by the training flows never saw the runner's full SpeakRL system prompt
(every tool's JSON schema: thousands of tokens) nor a whole dialogue: it saw the compact
system prompt, as much recent history as fits its context, and shortened tool
observations (:mod:`pipelines.policy.prompts`, :func:`pipelines.training.data.compact`).
:class:`PolicyPromptAgent` rewrites each step's context the same way before a wrapped
agent (usually an :class:`~pipelines.episodes.HFAgent`) sees it. A hub model with a long
context is evaluated with ``PromptSpec(compact=False)``: the runner's prompt unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from pipelines.episodes.agents import Agent, AgentContext, AgentOutput
from pipelines.training.config import DISTINGUISHING_FIELDS


@dataclass(frozen=True)
class PromptSpec:
    """``compact``: the compact system prompt and fitted history (else the runner's
    messages as they are). ``max_prompt_tokens``: the longest prompt, history cut from
    the front to fit (the model's context minus the reply's room); None keeps all of it.
    ``max_history_messages``: at most this many recent messages (None: as many as fit,
    every user turn first, :func:`pipelines.policy.prompts.compact_history`), e.g. 1 for a
    model fine-tuned on prompts cut that short.
    ``max_tool_results``: search results kept per ``<tool_response>`` (None: all);
    ``tool_result_fields``: the fields of the second and later ones (None: all of them;
    :class:`pipelines.training.config.ToolResultsSpec`, the training prompts' setting).
    ``system_prompt``: which system prompt replaces the runner's, by name
    (:data:`pipelines.policy.prompts.SYSTEM_PROMPT_NAMES`), the one the model was trained
    with (a training source's ``system_prompt``): ``compact`` (SpeakRL), ``toolwoz_react``
    (JOSH's ReAct over the ToolWOZ apis) or ``own`` (the runner's)."""

    compact: bool = True
    max_prompt_tokens: int | None = 448
    max_history_messages: int | None = None
    max_tool_results: int | None = 2
    system_prompt: str = "compact"
    tool_result_fields: tuple[str, ...] | None = DISTINGUISHING_FIELDS

    def __post_init__(self) -> None:
        from pipelines.config import positive_int
        from pipelines.errors import ConfigError
        from pipelines.policy.prompts import SYSTEM_PROMPT_NAMES

        if self.system_prompt not in SYSTEM_PROMPT_NAMES:
            raise ConfigError(f"system_prompt must be one of {list(SYSTEM_PROMPT_NAMES)}, got {self.system_prompt!r}")
        for name in ("max_prompt_tokens", "max_history_messages", "max_tool_results"):
            positive_int(getattr(self, name), name, optional=True)


class PolicyPromptAgent:
    """``inner`` with every context's messages rewritten by ``spec`` (module docstring)."""

    def __init__(self, inner: Agent, tokenizer: Any, spec: PromptSpec = PromptSpec()):
        self.inner = inner
        self.tokenizer = tokenizer
        self.spec = spec
        self.name = inner.name
        self.format = inner.format
        # One counter for the agent's life: an episode's messages recur in every later prompt.
        self.prompt_tokens = PromptTokens(tokenizer) if spec.compact and spec.max_prompt_tokens is not None else None

    async def act(self, contexts: Sequence[AgentContext]) -> list[AgentOutput]:
        return await self.inner.act([replace(c, messages=tuple(self.messages(c.messages))) for c in contexts])

    def messages(self, messages: Sequence[Any]) -> list[dict[str, Any]]:
        return policy_view(messages, self.tokenizer, self.spec, self.prompt_tokens)


class PromptTokens:
    """The number of tokens of a chat rendered by ``tokenizer``'s chat template with the
    generation prompt: what :func:`pipelines.policy.prompts.prompt_fits` counts, without
    tokenising every candidate prompt whole (on the H200 run's SFT evaluation, 2,300 fit tests
    took 3.2 s of the 4.8 s the host spent, ``benchmarks/eval_host.py``).

    A fast tokenizer cuts its input at its added tokens (leftmost, longest first) before
    normalising and pre-tokenising, and tokenises the pieces in between independently; so the
    count is one per added token plus each piece's count, and a piece (a message's content
    recurs in every later prompt of its episode) is tokenised once. Where that does not hold
    exactly (a slow tokenizer, an added token that strips its neighbours' whitespace, matches a
    single word only or is matched after normalisation), and with ``whole`` (to compare), every
    prompt is tokenised whole."""

    def __init__(self, tokenizer: Any, remember: int = 8192, *, whole: bool = False):
        import functools
        import re

        self.tokenizer = tokenizer
        added = list(getattr(tokenizer, "added_tokens_decoder", {}).values())
        exact = not whole and getattr(tokenizer, "is_fast", False) and all(
            not (t.lstrip or t.rstrip or t.single_word or t.normalized) for t in added)
        self.added = frozenset(t.content for t in added) if exact else None
        # Longest first: the regex takes the first alternative that matches, as leftmost-longest does.
        self.cut = re.compile("(" + "|".join(re.escape(t) for t in sorted(self.added or (), key=len, reverse=True)) + ")") if self.added else None
        self.piece = functools.lru_cache(maxsize=remember)(self._piece)

    def __call__(self, chat: list[dict[str, Any]]) -> int:
        if self.added is None:
            return len(self.tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"])
        text = self.tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        pieces = self.cut.split(text) if self.cut is not None else [text]
        return sum(1 if piece in self.added else self.piece(piece) for piece in pieces if piece)

    def _piece(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def fits(self, max_prompt_tokens: int) -> Any:
        """``prompt_fits(tokenizer, max_prompt_tokens)``, counted this way."""
        return lambda chat: self(chat) <= max_prompt_tokens


def policy_view(messages: Sequence[Any], tokenizer: Any, spec: PromptSpec, prompt_tokens: PromptTokens | None = None) -> list[dict[str, Any]]:
    """The messages a policy sees of the runner's ``messages`` under ``spec`` (module
    docstring); ``prompt_tokens`` counts a candidate prompt's tokens (a new
    :class:`PromptTokens` when None)."""
    if not spec.compact:
        return [dict(m) for m in messages]
    from functools import partial

    from pipelines.policy.prompts import compact_history, named_system_prompt
    from pipelines.training.config import ToolResultsSpec
    from pipelines.training.data import shorten_tool_response

    # The rewrite training prompts got (pipelines.training.data.compact), fitted here to
    # the context instead of to a training window.
    shorten = None
    if spec.max_tool_results is not None:
        shorten = partial(shorten_tool_response, spec=ToolResultsSpec(spec.max_tool_results, spec.tool_result_fields))
    fits = None
    if spec.max_prompt_tokens is not None:
        fits = (prompt_tokens or PromptTokens(tokenizer)).fits(spec.max_prompt_tokens)
    system_prompt = named_system_prompt(spec.system_prompt)
    chat = compact_history(messages, fits, shorten=shorten, system_prompt=system_prompt, max_history_messages=spec.max_history_messages)
    # Not even the last message fits: the system prompt alone (the reply still has room).
    return chat if chat is not None else compact_history(messages, shorten=shorten, system_prompt=system_prompt, max_history_messages=0)
