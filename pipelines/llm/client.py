"""One client for any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, ``transformers serve``).

``LLMClient.complete`` returns a ``Completion`` or a ``Failure``; it never raises for anything
the server or the network did, and it never returns a silent empty answer. Around the
``openai`` package it adds:

* a concurrency bound: at most ``max_concurrency`` HTTP requests in flight per client (a
  request waiting for its retry back-off does not hold a slot);
* retries with exponential back-off and full jitter on timeouts, 429, 5xx, connection errors
  and malformed response bodies. The ``openai`` package's own retries are switched off so
  that every retry is seen, counted and bounded here;
* structured output: the JSON schema goes into ``response_format`` when the server takes it,
  into the prompt otherwise; every reply is validated, invalid ones get up to
  ``repair_retries`` repair requests (the invalid reply and the validation error are sent
  back), after which the call fails with reason "invalid_output";
* a content-addressed response cache (``ResponseCache``), so that a re-run with unchanged
  inputs sends no request at all;
* function calling: ``tools`` (OpenAI tool schemas) are sent with the request and part of
  the cache key; each choice's ``tool_calls`` come back in ``Completion.tool_calls`` (and are
  cached). A history may hold assistant messages with ``tool_calls`` (content None or empty)
  and ``tool`` messages; argument objects in such assistant messages are sent as JSON
  strings, the form the OpenAI API requires;
* per-role accounting of calls, cache hits, requests, retries, repairs, failures, tokens, cost.

Choices (``n > 1``): the client first asks the server for ``n`` choices in one request and
caches them as one record under (seed, n). Servers that reject ``n`` or answer fewer choices
(``transformers serve`` ignores ``n``) are remembered, and from then on the client fans out
itself: choice i is a separate request with seed ``seed + i``, cached per seed. A fan-out with
n=3 and seed 7 therefore reuses the single-choice answers of seeds 7, 8 and 9, and no two
choices or seeds ever share a cache record.

Secrets: the API key is read from the environment variable the configuration names, held in
an object whose repr hides it, and scrubbed from every error text this module produces; it is
never part of a cache key or record, nor of a log line written here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import weakref
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Mapping, NoReturn, Sequence

# Optional: the library trains and evaluates without them (an accelerator node has neither);
# only a client of an OpenAI-compatible endpoint needs them, and says so when they are absent.
try:
    import jsonschema
except ImportError:  # tests/gpu/test_imports.py runs the library without it
    jsonschema = None
# ``openai`` is imported when the first client is made (:func:`_import_openai`): its import
# takes ~1.4 s, which every stage importing pipelines.llm would pay without calling an endpoint.
openai: Any = None

from pipelines.config import positive_int
from pipelines.errors import AskflowError, ConfigError
from pipelines.llm.accounting import Accounting
from pipelines.llm.cache import ResponseCache
from pipelines.llm.config import ROLES, ClientConfig, SamplingParams

logger = logging.getLogger(__name__)

Message = Mapping[str, Any]

#: Reasons a call can fail with. The first five are transient and retried.
RETRYABLE_REASONS: tuple[str, ...] = ("timeout", "rate_limit", "server_error", "connection", "malformed_response")
#: "rejected": the server refused the request (4xx other than 408/429); retrying cannot help.
#: "invalid_output": the replies did not validate against the schema, repairs included.
FAILURE_REASONS: tuple[str, ...] = (*RETRYABLE_REASONS, "rejected", "invalid_output")

SCHEMA_INSTRUCTIONS = (
    "Reply with a single JSON object and nothing else (no prose, no code fences). "
    "It must validate against this JSON schema:\n{schema}"
)
REPAIR_INSTRUCTIONS = (
    "Your previous reply is not acceptable: {error}. "
    "Reply again with only the corrected JSON object, which must validate against this JSON schema:\n{schema}"
)
# Servers without authentication still get an Authorization header from the openai package;
# this placeholder is what vLLM's documentation uses.
NO_KEY_PLACEHOLDER = "EMPTY"


# ---------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cost + other.cost,
        )


@dataclass(frozen=True)
class Completion:
    """A successful call: ``texts`` holds the n choices, ``parsed`` their JSON values when a
    schema was given (else None). ``usage`` is what this call spent (zero when ``cached``);
    ``attempts`` the HTTP requests it sent, retries and repairs included; ``seeds`` the seed
    of each choice's request (one seed when the server produced all choices at once).
    ``tool_calls``: per choice, the assistant message's tool calls as the server sent them
    (``{"id", "type": "function", "function": {"name", "arguments"}}``, arguments usually a
    JSON string); an empty tuple for a choice without any (left out: empty for every choice).
    A choice with tool calls often has no text: its entry in ``texts`` is then ""."""

    ok: ClassVar[bool] = True

    role: str
    texts: tuple[str, ...]
    parsed: tuple[Any, ...] | None
    usage: Usage
    cached: bool
    attempts: int
    repairs: int = 0
    seeds: tuple[int, ...] = ()
    tool_calls: tuple[tuple[Mapping[str, Any], ...], ...] = ()

    def __post_init__(self) -> None:
        if not self.tool_calls:
            object.__setattr__(self, "tool_calls", tuple(() for _ in self.texts))
        elif len(self.tool_calls) != len(self.texts):
            raise ValueError(f"{len(self.tool_calls)} tool_calls entries for {len(self.texts)} choices")

    @property
    def text(self) -> str:
        """The first (for n=1: the only) choice."""
        return self.texts[0]

    def unwrap(self) -> "Completion":
        return self


@dataclass(frozen=True)
class Failure:
    """A call that failed for good: ``reason`` is one of ``FAILURE_REASONS``, ``attempts`` the
    HTTP requests it sent, ``last_error`` the last error seen (credentials scrubbed)."""

    ok: ClassVar[bool] = False

    role: str
    reason: str
    attempts: int
    last_error: str

    def unwrap(self) -> NoReturn:
        raise LLMFailure(self)


class LLMFailure(AskflowError):
    """Raised by ``Failure.unwrap()`` / ``unwrap()`` for callers that prefer exceptions."""

    def __init__(self, failure: Failure):
        self.failure = failure
        super().__init__(
            f"LLM call for role {failure.role!r} failed ({failure.reason}) after "
            f"{failure.attempts} request(s): {failure.last_error}"
        )


def unwrap(result: Completion | Failure) -> Completion:
    """The completion, or ``LLMFailure`` raised for a failure."""
    return result.unwrap()


@dataclass(frozen=True)
class CompletionRequest:
    """The arguments of one ``complete`` call, for ``complete_many``."""

    messages: Sequence[Message]
    role: str
    sampling: SamplingParams
    seed: int
    n: int = 1
    response_schema: Mapping[str, Any] | None = None
    tools: Sequence[Mapping[str, Any]] | None = None


# ---------------------------------------------------------------------------
# internals: secrets, transport results, schema handling
# ---------------------------------------------------------------------------


class _Secret:
    """A credential that does not show itself in reprs, tracebacks' locals or f-strings."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def scrub(self, text: str) -> str:
        return text.replace(self._value, "***") if self._value else text

    def __repr__(self) -> str:
        return "<secret>"

    __str__ = __repr__


@dataclass
class _Choices:
    """A parsed 200 response."""

    texts: list[str]
    prompt_tokens: int
    completion_tokens: int
    tool_calls: list[tuple[dict[str, Any], ...]] = field(default_factory=list)


@dataclass
class _HTTPFailure:
    """A request that failed: after its retries (``reason`` retryable) or at once ("rejected")."""

    reason: str
    message: str
    status: int | None = None
    param: str | None = None  # the OpenAI error body's ``param``, when the server names one


class _MalformedResponse(Exception):
    pass


@dataclass
class _CallState:
    """What one logical call has spent so far."""

    attempts: int = 0
    repairs: int = 0
    usage: Usage = field(default_factory=Usage)


class _ServerLacksN(Exception):
    """The server rejected ``n`` or answered fewer choices: fan out instead. ``attempts``: the
    requests spent finding out."""

    def __init__(self, attempts: int):
        super().__init__(attempts)
        self.attempts = attempts


def _import_openai() -> Any:
    """The ``openai`` module (imported once, into this module's ``openai``), or None when it
    is not installed."""
    global openai
    if openai is None:
        try:
            import openai as module
        except ImportError:
            return None
        openai = module
    return openai


@dataclass
class _LoopState:
    # An httpx connection pool and asyncio primitives belong to one event loop, and the sync
    # wrappers run each call in a fresh loop; so they are created per loop.
    http: openai.AsyncOpenAI
    semaphore: asyncio.Semaphore
    # One probe per unknown capability ("n", "response_format"): set once the probing call ends.
    probes: dict[str, asyncio.Event] = field(default_factory=dict)


_CODE_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```$", re.DOTALL)


def _validate_reply(text: str, validator: Any) -> tuple[Any, str | None]:
    """(parsed value, None) for a valid reply, (None, readable error) otherwise.

    One surrounding Markdown code fence is tolerated: models add it even when told not to, and
    it carries no information."""
    candidate = text.strip()
    fenced = _CODE_FENCE.match(candidate)
    if fenced:
        candidate = fenced.group(1).strip()
    try:
        value = json.loads(candidate)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at character {exc.pos})"
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    if error is not None:
        location = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        return None, f"{location}: {error.message}"
    return value, None


def _parse_choices(text: str) -> _Choices:
    """Read a chat-completion body strictly: the openai package would accept a body without
    choices and fail later, far from the cause."""
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _MalformedResponse(f"response body is not JSON ({exc.msg} at character {exc.pos})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list) or not payload["choices"]:
        raise _MalformedResponse("response body has no choices")
    choices = sorted(payload["choices"], key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
    texts = []
    tool_calls = []
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(message, dict) or not isinstance(content, (str, type(None))):
            raise _MalformedResponse("a choice has no message content")
        # content None: the model produced no text (only tool calls, or a refusal); an empty
        # reply is what the caller sees, and schema validation rejects it where a schema applies.
        texts.append(content or "")
        tool_calls.append(_read_tool_calls(message.get("tool_calls")))
    # Usage is optional in practice (some servers omit it); a missing count is counted as 0.
    usage = payload.get("usage") if isinstance(payload.get("usage"), dict) else {}
    return _Choices(
        texts, _token_count(usage.get("prompt_tokens")), _token_count(usage.get("completion_tokens")), tool_calls
    )


def _read_tool_calls(raw: Any) -> tuple[dict[str, Any], ...]:
    """A message's tool calls as ``{"id", "type", "function": {"name", "arguments"}}``, the
    arguments as the server sent them (a JSON string, from OpenAI). Only the structure is
    checked here: whether the arguments make sense is the caller's business."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _MalformedResponse("a choice's tool_calls is not a list")
    calls = []
    for call in raw:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _MalformedResponse("a tool call has no function name")
        read: dict[str, Any] = {}
        if isinstance(call.get("id"), str):
            read["id"] = call["id"]
        read["type"] = call.get("type") or "function"
        read["function"] = {"name": function["name"], "arguments": function.get("arguments", "")}
        calls.append(read)
    return tuple(calls)


def _token_count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _classify(exc: Exception) -> tuple[str, int | None]:
    """(failure reason, HTTP status) of a request error; reasons in RETRYABLE_REASONS retry."""
    if isinstance(exc, (openai.APITimeoutError, TimeoutError)):
        return "timeout", None
    if isinstance(exc, openai.APIConnectionError):
        return "connection", None
    if isinstance(exc, (_MalformedResponse, openai.APIResponseValidationError)):
        return "malformed_response", None
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        if status == 429:
            return "rate_limit", status
        if status == 408:
            return "timeout", status
        if status >= 500:
            return "server_error", status
        return "rejected", status
    raise exc  # anything else is a bug here, not a server condition


_CONTEXT_LENGTH = re.compile(r"context (length|window)|too many tokens|maximum .*tokens|prompt is too long", re.I)
_MENTIONS_N = re.compile(r"(?<![\w.-])n(?![\w-])")


def _unsupported(outcome: "_HTTPFailure", feature: str) -> bool:
    """Whether a failure means the server does not support ``feature`` ("response_format" or
    "n"): a 400/422 whose error names the feature (its ``param``, else its message). Any other
    rejection (context length, a bad message) is about this request only and changes nothing."""
    if outcome.reason != "rejected" or outcome.status not in (400, 422):
        return False
    if outcome.param:
        return outcome.param == feature or outcome.param.startswith(f"{feature}.")
    text = outcome.message
    if _CONTEXT_LENGTH.search(text):
        return False
    if feature == "response_format":
        return "response_format" in text or "json_schema" in text
    return bool(_MENTIONS_N.search(text))


def _error_param(exc: Exception) -> str | None:
    body = getattr(exc, "body", None)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    param = body.get("param") if isinstance(body, dict) else None
    return param if isinstance(param, str) else None


def _wire_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body as ``chat.completions.create(**body)`` sends it (``extra_body`` merged in,
    later keys winning), for the SDK's plain ``post``: ``create`` first walks every message
    through the SDK's typed-dict transform, which costs milliseconds of CPU per request on a
    long conversation and changes nothing in a plain JSON body like this one.

    >>> _wire_body({"model": "m", "messages": [], "extra_body": {"top_k": 50, "model": "x"}})
    {'model': 'x', 'messages': [], 'top_k': 50}
    """
    wire = {key: value for key, value in body.items() if key != "extra_body"}
    wire.update(body.get("extra_body") or {})
    return wire


def _with_instructions(messages: list[dict[str, Any]], instructions: str) -> list[dict[str, Any]]:
    """Append instructions to the last user message (or add a user message when the last one is
    not a plain-text user message). The last user turn is the place every chat template renders;
    an extra system message is dropped or rejected by some."""
    messages = [dict(m) for m in messages]
    last = messages[-1] if messages else None
    if last is not None and last.get("role") == "user" and isinstance(last.get("content"), str):
        last["content"] = f"{last['content']}\n\n{instructions}"
    else:
        messages.append({"role": "user", "content": instructions})
    return messages


def _plain(value: Any) -> Any:
    """``value`` with every mapping a dict and every list or tuple a list: what the JSON body
    and the cache key need (tool schemas and arguments may come as read-only mappings)."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _normalise_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Plain dict copies of the messages. An assistant message may have ``tool_calls`` instead
    of content (content None, empty or absent); its argument objects become JSON strings, the
    only form the OpenAI API takes (histories keep objects, which chat templates render).
    ``tool`` messages (``tool_call_id``, ``name``, ``content``) pass through as they are."""
    if isinstance(messages, (str, bytes)) or not messages:
        raise ValueError("messages must be a non-empty sequence of {'role': ..., 'content': ...} mappings")
    normalised = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message:
            raise ValueError(f"messages[{i}] must be a mapping with 'role' and 'content', got {message!r}")
        if message["role"] == "assistant" and message.get("tool_calls"):
            plain = _plain(message)
            plain["tool_calls"] = _outgoing_tool_calls(message["tool_calls"], i)
            normalised.append(plain)
            continue
        if "content" not in message:
            raise ValueError(f"messages[{i}] must be a mapping with 'role' and 'content', got {message!r}")
        normalised.append(dict(message))
    return normalised


def _outgoing_tool_calls(tool_calls: Any, i: int) -> list[dict[str, Any]]:
    if isinstance(tool_calls, (str, bytes, Mapping)) or not isinstance(tool_calls, Sequence):
        raise ValueError(f"messages[{i}]: tool_calls must be a sequence of tool calls, got {tool_calls!r}")
    calls = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(
                f"messages[{i}]: a tool call must be {{'type': 'function', 'function': {{'name': ..., "
                f"'arguments': ...}}}}, got {call!r}"
            )
        plain = _plain(call)
        arguments = plain["function"].get("arguments")
        if arguments is None:
            plain["function"]["arguments"] = "{}"
        elif not isinstance(arguments, str):
            plain["function"]["arguments"] = json.dumps(arguments, ensure_ascii=False)
        calls.append(plain)
    return calls


def _normalise_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence) or not tools:
        raise ValueError(f"tools must be a non-empty sequence of OpenAI tool schemas, got {tools!r}")
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or not isinstance(tool.get("function"), Mapping):
            raise ValueError(f"tools[{i}] must be a {{'type': 'function', 'function': {{...}}}} mapping, got {tool!r}")
    return _plain(tools)


# ---------------------------------------------------------------------------
# the client
# ---------------------------------------------------------------------------


class LLMClient:
    """An async client for one OpenAI-compatible endpoint and model.

    ``cache``: a ``ResponseCache`` (its directory is the caller's choice) or None for no
    caching. ``accounting``: shared counters, typically one per stage run; a private one is
    created when none is given. ``rng``: the source of back-off jitter (injectable for tests).
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        cache: ResponseCache | None = None,
        accounting: Accounting | None = None,
        rng: random.Random | None = None,
    ):
        missing = [name for name, module in (("openai", _import_openai()), ("jsonschema", jsonschema)) if module is None]
        if missing:
            raise ConfigError(f"an openai backend needs the {' and '.join(missing)} package(s), which are not installed")
        self.config = config
        self.cache = cache
        self.accounting = accounting if accounting is not None else Accounting()
        self._api_key = self._read_api_key(config)
        self._rng = rng or random.Random()
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopState] = weakref.WeakKeyDictionary()
        # What the endpoint turned out to support; None until a request has told.
        self.supports_response_format: bool | None = None if config.structured_output == "auto" else False
        self.supports_n: bool | None = None if config.server_side_n else False

    @staticmethod
    def _read_api_key(config: ClientConfig) -> _Secret:
        if config.api_key_env is None:
            return _Secret("")
        value = os.environ.get(config.api_key_env, "")
        if not value.strip():
            raise ConfigError(
                f"api_key_env: the environment variable {config.api_key_env!r} is not set or empty; "
                "export the API key under that name"
            )
        return _Secret(value.strip())

    def __repr__(self) -> str:
        return f"LLMClient(endpoint={self.config.endpoint!r}, model={self.config.model!r})"

    # ---- public API ----

    async def complete(
        self,
        messages: Sequence[Message],
        role: str,
        sampling: SamplingParams,
        seed: int,
        n: int = 1,
        response_schema: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> Completion | Failure:
        """n choices for one conversation, from the cache or the server.

        ``seed`` is sent with the request (choice i of a fan-out gets ``seed + i``) and is part
        of the cache key. With ``response_schema`` (a JSON schema), every choice is validated
        and ``Completion.parsed`` holds the values. With ``tools`` (OpenAI tool schemas), the
        tools are sent (and part of the cache key) and ``Completion.tool_calls`` holds each
        choice's calls; tools and a response schema together are refused."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles: {list(ROLES)}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        positive_int(n, "n")
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        messages = _normalise_messages(messages)
        if tools is not None:
            if response_schema is not None:
                raise ValueError("tools and response_schema cannot be combined in one call")
            tools = _normalise_tools(tools)
        validator = None
        if response_schema is not None:
            response_schema = dict(response_schema)
            validator_class = jsonschema.validators.validator_for(response_schema)
            validator_class.check_schema(response_schema)  # a bad schema is a bug: raise now
            validator = validator_class(response_schema)

        self.accounting.record_call(role)
        request = CompletionRequest(messages, role, sampling, seed, n, response_schema, tools)
        result: Completion | Failure | None = None
        probe_attempts = 0
        if n > 1:
            result = self._cached(request, seed, n)
            # Ask the server for all n at once unless it is known not to cope, or unless this
            # call was fanned out before and every per-seed answer is cached already.
            if result is None and self.supports_n is not False and not self._cached_per_seed(request):
                try:
                    result = await self._fetch_and_store(request, seed, n, validator)
                except _ServerLacksN as lacks:
                    probe_attempts = lacks.attempts
        if result is None:
            parts = await asyncio.gather(*(self._single_choice(request, seed + i, validator) for i in range(n)))
            result = _combine(role, parts, extra_attempts=probe_attempts)
        if isinstance(result, Completion) and result.cached:
            self.accounting.record_cache_hit(role)
        elif isinstance(result, Failure):
            self.accounting.record_failure(role, result.reason)
            logger.warning(
                "%s: call failed (%s) after %d request(s): %s", role, result.reason, result.attempts, result.last_error
            )
        return result

    async def complete_many(self, requests: Iterable[CompletionRequest]) -> list[Completion | Failure]:
        """All requests concurrently (within the client's concurrency bound), results in order."""
        return list(
            await asyncio.gather(
                *(
                    self.complete(r.messages, r.role, r.sampling, r.seed, r.n, r.response_schema, r.tools)
                    for r in requests
                )
            )
        )

    def complete_sync(self, *args: Any, **kwargs: Any) -> Completion | Failure:
        """``complete`` for synchronous callers (not from inside a running event loop)."""
        return self._run_sync(self.complete(*args, **kwargs))

    def complete_many_sync(self, requests: Iterable[CompletionRequest]) -> list[Completion | Failure]:
        return self._run_sync(self.complete_many(requests))

    async def aclose(self) -> None:
        """Close the HTTP connections this client opened in the running event loop."""
        state = self._loops.pop(asyncio.get_running_loop(), None)
        if state is not None:
            await state.http.close()

    async def __aenter__(self) -> "LLMClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ---- cache ----

    def _key_fields(self, request: CompletionRequest, seed: int, n: int) -> dict[str, Any]:
        # The API key cannot be here: nothing secret is in scope of this method; extra_body is
        # here only as its hash (SamplingParams.key_dict).
        fields = {
            "endpoint": self.config.endpoint,
            "model": self.config.model,
            "messages": request.messages,
            "sampling": request.sampling.key_dict(),
            "seed": seed,
            "n": n,
        }
        if request.response_schema is not None:
            fields["response_schema"] = request.response_schema
        if request.tools is not None:  # only when given: keys of calls without tools stay as they were
            fields["tools"] = request.tools
        return fields

    def _cached(self, request: CompletionRequest, seed: int, n: int) -> Completion | None:
        if self.cache is None:
            return None
        record = self.cache.get(self._key_fields(request, seed, n))
        return None if record is None else _cached_completion(request.role, record, (seed,))

    def _cached_per_seed(self, request: CompletionRequest) -> bool:
        """Whether every choice of a fanned-out call is cached. A fresh client does not know yet
        that its server lacks ``n``; without this check a re-run would send a probe request."""
        if self.cache is None:
            return False
        seeds = range(request.seed, request.seed + request.n)
        return all(self.cache.contains(self._key_fields(request, seed, 1)) for seed in seeds)

    async def _single_choice(self, request: CompletionRequest, seed: int, validator: Any) -> Completion | Failure:
        return self._cached(request, seed, 1) or await self._fetch_and_store(request, seed, 1, validator)

    async def _fetch_and_store(
        self, request: CompletionRequest, seed: int, n: int, validator: Any
    ) -> Completion | Failure:
        result = await self._fetch_discovering(request, seed, n, validator)
        if isinstance(result, Completion) and self.cache is not None:
            # Only successes are stored: a failure must be retried by the next run.
            record: dict[str, Any] = {
                "texts": list(result.texts),
                "parsed": None if result.parsed is None else list(result.parsed),
            }
            if request.tools is not None:
                record["tool_calls"] = [list(calls) for calls in result.tool_calls]
            self.cache.put(self._key_fields(request, seed, n), record)
        return result

    async def _fetch_discovering(
        self, request: CompletionRequest, seed: int, n: int, validator: Any
    ) -> Completion | Failure:
        """``_fetch``, but while a capability this call depends on is unknown, the first such
        call probes it and the others wait for that one call only (instead of every concurrent
        call sending a request bound to be rejected). Once the probe has ended they all go
        concurrently, within ``max_concurrency``, whether or not it found out: during an outage
        the probe learns nothing, and holding every call behind it would run them one at a time."""
        probes = self._loop_state().probes
        started: list[asyncio.Event] = []
        try:
            for capability, unknown in (
                ("n", n > 1 and self.supports_n is None),
                ("response_format", request.response_schema is not None and self.supports_response_format is None),
            ):
                if not unknown:
                    continue
                probe = probes.get(capability)
                if probe is None:
                    probes[capability] = probe = asyncio.Event()
                    started.append(probe)
                elif not probe.is_set():
                    await probe.wait()
            return await self._fetch(request, seed, n, validator)
        finally:
            for probe in started:
                probe.set()

    # ---- one logical request: transport, fallbacks, validation, repairs ----

    async def _fetch(self, request: CompletionRequest, seed: int, n: int, validator: Any) -> Completion | Failure:
        role, schema = request.role, request.response_schema
        state = _CallState()
        if n > 1 and self.supports_n is False:  # found out while this call waited
            raise _ServerLacksN(0)
        while True:
            use_response_format = schema is not None and self.supports_response_format is not False
            messages = request.messages
            if schema is not None and not use_response_format:
                messages = _with_instructions(messages, SCHEMA_INSTRUCTIONS.format(schema=json.dumps(schema)))
            body = self._body(
                messages, request.sampling, seed, n, schema if use_response_format else None, request.tools
            )
            outcome = await self._post(role, body, state)
            if isinstance(outcome, _Choices):
                break
            # Only an error naming the feature switches it off (a context-length 400 does not).
            # A concurrent call may have switched it off already: this one then follows suit.
            if use_response_format and self.supports_response_format is not True and _unsupported(outcome, "response_format"):
                if self.supports_response_format is None:
                    logger.info("%s: the server rejected response_format; using prompt instructions", self.config.endpoint)
                self.supports_response_format = False
                continue
            if n > 1 and self.supports_n is not True and _unsupported(outcome, "n"):
                if self.supports_n is None:
                    logger.info("%s: the server rejected n=%d; fanning out one request per seed", self.config.endpoint, n)
                self.supports_n = False
                raise _ServerLacksN(state.attempts)
            return Failure(role, outcome.reason, state.attempts, outcome.message)

        if use_response_format:
            self.supports_response_format = True
        if n > 1:
            if len(outcome.texts) != n:
                logger.info(
                    "%s: asked for %d choices, got %d; fanning out one request per seed",
                    self.config.endpoint, n, len(outcome.texts),
                )
                self.supports_n = False
                raise _ServerLacksN(state.attempts)
            self.supports_n = True

        texts = list(outcome.texts)
        parsed: list[Any] | None = None
        if validator is not None:
            parsed = []
            for i, text in enumerate(texts):
                value, error = _validate_reply(text, validator)
                if error is not None:
                    repaired = await self._repair(request, messages, text, error, seed + i, validator, state)
                    if isinstance(repaired, Failure):
                        return repaired
                    texts[i], value = repaired
                parsed.append(value)
        return Completion(
            role=role,
            texts=tuple(texts),
            parsed=None if parsed is None else tuple(parsed),
            usage=state.usage,
            cached=False,
            attempts=state.attempts,
            repairs=state.repairs,
            seeds=(seed,),
            tool_calls=tuple(outcome.tool_calls),
        )

    async def _repair(
        self,
        request: CompletionRequest,
        messages: list[dict[str, Any]],
        text: str,
        error: str,
        seed: int,
        validator: Any,
        state: _CallState,
    ) -> tuple[str, Any] | Failure:
        """Up to ``repair_retries`` requests showing the model its invalid reply and the error.
        Single-choice requests; choice i of a call is repaired with seed ``seed + i``."""
        schema_json = json.dumps(request.response_schema)
        use_response_format = self.supports_response_format is True
        for _ in range(self.config.repair_retries):
            conversation = [
                *messages,
                {"role": "assistant", "content": text},
                {"role": "user", "content": REPAIR_INSTRUCTIONS.format(error=error, schema=schema_json)},
            ]
            self.accounting.record_repair(request.role)
            state.repairs += 1
            body = self._body(
                conversation, request.sampling, seed, 1, request.response_schema if use_response_format else None
            )
            outcome = await self._post(request.role, body, state)
            if isinstance(outcome, _HTTPFailure):
                return Failure(request.role, outcome.reason, state.attempts, outcome.message)
            text = outcome.texts[0]
            value, error = _validate_reply(text, validator)
            if error is None:
                return text, value
        return Failure(
            request.role,
            "invalid_output",
            state.attempts,
            f"reply still invalid after {self.config.repair_retries} repair(s): {error}",
        )

    def _body(
        self,
        messages: list[dict[str, Any]],
        sampling: SamplingParams,
        seed: int,
        n: int,
        response_schema: Mapping[str, Any] | None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "seed": seed,
            **sampling.request_fields(),
        }
        if n > 1:
            body["n"] = n
        if response_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "response", "schema": dict(response_schema)},
            }
        if tools is not None:
            body["tools"] = list(tools)
        if sampling.extra_body:
            # The openai package's own keyword: merged into the JSON body as it stands.
            body["extra_body"] = dict(sampling.extra_body)
        return body

    async def _post(self, role: str, body: dict[str, Any], state: _CallState) -> _Choices | _HTTPFailure:
        """One request with retries. Every attempt, retry and token is accounted here."""
        loop_state = self._loop_state()
        retries = 0
        while True:
            try:
                async with loop_state.semaphore:
                    state.attempts += 1
                    self.accounting.record_request(role)
                    # The openai timeout bounds each network read; this bounds the whole request.
                    async with asyncio.timeout(self.config.timeout_s):
                        text = await loop_state.http.post("/chat/completions", cast_to=str, body=_wire_body(body))
                    choices = _parse_choices(text)
            except (openai.APIError, _MalformedResponse, TimeoutError) as exc:
                reason, status = _classify(exc)
                if reason not in RETRYABLE_REASONS or retries >= self.config.max_retries:
                    return _HTTPFailure(reason, self._describe(exc), status, _error_param(exc))
                retries += 1
                self.accounting.record_retry(role, reason)
                delay = self._backoff(retries, exc)
                logger.info(
                    "%s: %s; retry %d/%d in %.2f s", role, reason, retries, self.config.max_retries, delay
                )
                await asyncio.sleep(delay)
                continue
            cost = (
                choices.prompt_tokens * self.config.price_in_per_1k
                + choices.completion_tokens * self.config.price_out_per_1k
            ) / 1000.0
            self.accounting.record_tokens(role, choices.prompt_tokens, choices.completion_tokens, cost)
            state.usage = state.usage + Usage(choices.prompt_tokens, choices.completion_tokens, cost)
            return choices

    def _describe(self, exc: Exception) -> str:
        """An error's text for Failure records and logs, with the API key scrubbed out: error
        bodies are the server's text, and a careless server may repeat the credentials."""
        if isinstance(exc, TimeoutError):
            return f"TimeoutError: no complete response within {self.config.timeout_s:g} s"
        return self._api_key.scrub(f"{type(exc).__name__}: {exc}")

    def _backoff(self, retry: int, exc: Exception) -> float:
        """Full jitter: uniform in [0, min(max, base * 2**(retry-1))], so that clients that failed
        together do not retry together. A server's Retry-After is honoured up to the maximum."""
        ceiling = min(self.config.backoff_max_s, self.config.backoff_base_s * 2 ** (retry - 1))
        delay = self._rng.uniform(0.0, ceiling)
        if isinstance(exc, openai.APIStatusError):
            retry_after = exc.response.headers.get("retry-after")
            try:
                delay = max(delay, min(float(retry_after), self.config.backoff_max_s))
            except (TypeError, ValueError):
                pass  # absent, or an HTTP date: the jittered delay stands
        return delay

    def _loop_state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        state = self._loops.get(loop)
        if state is None:
            http = openai.AsyncOpenAI(
                api_key=self._api_key.reveal() or NO_KEY_PLACEHOLDER,
                base_url=self.config.base_url,
                timeout=self.config.timeout_s,
                max_retries=0,  # retries are done (and counted) by _post
            )
            state = _LoopState(http, asyncio.Semaphore(self.config.max_concurrency))
            self._loops[loop] = state
        return state

    def _run_sync(self, coroutine: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coroutine.close()
            raise RuntimeError("the *_sync methods cannot run inside an event loop; await the async method instead")

        async def run_and_close() -> Any:
            try:
                return await coroutine
            finally:
                await self.aclose()

        return asyncio.run(run_and_close())


def _cached_completion(role: str, record: dict[str, Any], seeds: tuple[int, ...]) -> Completion:
    parsed = record.get("parsed")
    tool_calls = record.get("tool_calls")
    return Completion(
        role=role,
        texts=tuple(record["texts"]),
        parsed=None if parsed is None else tuple(parsed),
        usage=Usage(),
        cached=True,
        attempts=0,
        seeds=seeds,
        tool_calls=() if tool_calls is None else tuple(tuple(calls) for calls in tool_calls),
    )


def _combine(role: str, parts: Sequence[Completion | Failure], extra_attempts: int = 0) -> Completion | Failure:
    """One result from per-seed choices: the first failure fails the call (the choices that did
    succeed are cached already, so a re-run only redoes the failed ones). ``extra_attempts``:
    requests spent before fanning out."""
    attempts = extra_attempts + sum(p.attempts for p in parts)
    for part in parts:
        if isinstance(part, Failure):
            return Failure(role, part.reason, attempts, part.last_error)
    completions: list[Completion] = list(parts)  # type: ignore[arg-type]
    parsed = None if completions[0].parsed is None else tuple(v for c in completions for v in c.parsed or ())
    usage = Usage()
    for c in completions:
        usage = usage + c.usage
    return Completion(
        role=role,
        texts=tuple(t for c in completions for t in c.texts),
        parsed=parsed,
        usage=usage,
        cached=extra_attempts == 0 and all(c.cached for c in completions),
        attempts=attempts,
        repairs=sum(c.repairs for c in completions),
        seeds=tuple(s for c in completions for s in c.seeds),
        tool_calls=tuple(calls for c in completions for calls in c.tool_calls),
    )
