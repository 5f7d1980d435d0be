"""Training data: Parquet tables -> a held-out split, compact prompts that fit, TRL rows.

Column contract (conversational data: messages are ``{"role", "content"}`` lists)
------------------------------------------------------------------------------------

==========  ======================================================================
method      columns (besides the hold-out key, ``dialogue_id`` by default)
==========  ======================================================================
sft         ``prompt`` + ``completion``; or ``prompt`` + a text column named by
            ``SourceSpec.completion_column`` (e.g. ``speaker_grpo.reference``); with
            ``SourceSpec.windows``, whole dialogues in TRL's ``messages`` layout
dpo         ``prompt`` + ``chosen`` + ``rejected`` (SpeakER-DPO)
kto         ``prompt`` + ``completion`` + ``label`` (bool; JOSH's KTO data), or
            ``prompt`` + ``chosen`` + ``rejected``, split into a desirable and an
            undesirable example (clarifying vs acting on a guess)
grpo        ``prompt`` + the columns the rewards read (:mod:`pipelines.rewards`);
            every column reaches the reward functions
==========  ======================================================================

Hold-out
--------

A row is held out when its corpus split (``HoldoutSpec.split_column``) is the val split,
trained on when it is train; a test-split row stops the stage with a DataError (the test
split is for evaluation only, :func:`held_out`). The same dialogues are held out of every
stage and every dataset, so an evaluation prompt was never trained on by an earlier
post-training stage either, nor by the bootstrap pretraining, which reads the train split.
A source without a split column (a dataset that has none) holds out the rows whose key
hashes below ``HoldoutSpec.fraction``.

Fitting
-------

A small model has a short context. Each prompt is rewritten by
:func:`pipelines.policy.prompts.compact_history`, the function evaluation prompts go
through too: the policy's compact system prompt, the agent's earlier reasoning dropped,
tool observations shortened (:func:`shorten_tool_response`), at most
``max_history_messages`` messages (None: the whole conversation). If prompt and
completion still exceed ``max_length`` tokens, the agent's older messages and tool
results go first, oldest first, then the oldest user turns, and inside a single SpeakRL
Table 1 message one rendered turn at a time. The completion is never cut; an example that cannot fit is dropped and
counted. For GRPO the completion is yet to be generated: ``max_completion_length`` tokens
are reserved for it.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

from pipelines.errors import ConfigError, DataError
from pipelines.records import TEST
from pipelines.rewards import JUDGE_REWARDS, resolve_reward
from pipelines.rewards.prompts import SPEAKER_LABELS, SPEAKRL_PROMPT_TEMPLATE
from pipelines.training.config import DataSpec, GRPOObjective, HoldoutSpec, SourceSpec, ToolResultsSpec

Messages = list[dict[str, Any]]
Row = dict[str, Any]

#: Row layouts a source can have.
COMPLETION = "completion"  # prompt + completion
PAIRS = "pairs"  # prompt + chosen + rejected
LABELED = "labeled"  # prompt + completion + label
PROMPTS = "prompts"  # prompt only (+ reward columns)

_LAYOUT_COLUMNS: dict[str, tuple[str, ...]] = {
    COMPLETION: ("prompt", "completion"),
    PAIRS: ("prompt", "chosen", "rejected"),
    LABELED: ("prompt", "completion", "label"),
    PROMPTS: ("prompt",),
}
#: The layouts each method accepts, in order of preference.
METHOD_LAYOUTS: dict[str, tuple[str, ...]] = {
    "sft": (COMPLETION,),
    "dpo": (PAIRS,),
    "kto": (LABELED, PAIRS),
    "grpo": (PROMPTS,),
}


# --- Column contract -------------------------------------------------------------------------


def source_layout(method: str, source: SourceSpec, columns: Iterable[str], holdout_key: str) -> str:
    """The layout in which ``method`` reads a source with these ``columns``; ConfigError
    naming what is missing otherwise."""
    present = set(columns)
    if source.prompt_column is not None:
        present |= {"prompt"} if source.prompt_column in present else set()
    if source.completion_column is not None:
        if method not in ("sft",):
            raise ConfigError(f"{source.path}: completion_column is only for sft sources, not {method}")
        present |= {"completion"} if source.completion_column in present else set()
    missing_key = [] if holdout_key in present else [holdout_key]
    for layout in METHOD_LAYOUTS[method]:
        needed = _LAYOUT_COLUMNS[layout]
        if all(c in present for c in needed) and not missing_key:
            return layout
    wanted = " or ".join("+".join(_LAYOUT_COLUMNS[layout]) for layout in METHOD_LAYOUTS[method])
    if source.completion_column is not None:
        wanted = f"prompt+{source.completion_column} (completion_column)"
    best = min(
        ([c for c in _LAYOUT_COLUMNS[layout] if c not in present] + missing_key for layout in METHOD_LAYOUTS[method]),
        key=len,
    )
    raise ConfigError(
        f"{source.path}: {method} needs columns {wanted} and the hold-out key {holdout_key!r}; "
        f"missing {', '.join(map(repr, best))} (columns: {', '.join(sorted(columns))})"
    )


def reward_columns(objective: GRPOObjective) -> tuple[str, ...]:
    """The dataset columns the configured rewards cannot do without."""
    needed: list[str] = []
    for name, _ in objective.rewards:
        # A judge reward is built over the run's client later; by name or import path, the others now.
        reward = None if name in JUDGE_REWARDS else resolve_reward(name)
        # A reward may declare every column it reads (the Learn-to-Ask reward's targets).
        needed.extend(getattr(reward, "required_columns", ()))
        judge = getattr(reward, "judge", None)
        if judge is not None:
            # A judge declares the columns it reads; the verifiable judge requires the first.
            needed.extend(judge.columns[:1])
    return tuple(dict.fromkeys(needed))


# --- Hold-out --------------------------------------------------------------------------------


def holdout_score(key: Any, salt: str) -> float:
    """A stable number in [0, 1) for a key: SHA-256, independent of Python's hash seed."""
    digest = hashlib.sha256(f"{salt}\x00{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_held_out(key: Any, spec: HoldoutSpec) -> bool:
    """The hash hold-out, for rows without a corpus split."""
    return holdout_score(key, spec.salt) < spec.fraction


def held_out(row: Row, spec: HoldoutSpec, source: str = "training data") -> bool:
    """Whether a row is held out: its split is ``spec.split`` (val); without a split, the
    hash of its key. A test-split row raises DataError: it must never reach training.

    >>> spec = HoldoutSpec()
    >>> held_out({"dialogue_id": "a", "split": "val"}, spec), held_out({"dialogue_id": "a", "split": "train"}, spec)
    (True, False)
    >>> held_out({"dialogue_id": "a", "split": "test"}, spec)
    Traceback (most recent call last):
    ...
    pipelines.errors.DataError: training data, record 'a', field 'split': a test-split dialogue in a training dataset; the test split is for evaluation only
    """
    split = row.get(spec.split_column)
    if split is None:
        return is_held_out(row[spec.key], spec)
    if split == TEST:
        raise DataError(
            source, "a test-split dialogue in a training dataset; the test split is for evaluation only",
            record=str(row.get(spec.key)), field=spec.split_column,
        )
    return split == spec.split


# --- Prompt fitting --------------------------------------------------------------------------

_TABLE1_HEAD, _TABLE1_TAIL = SPEAKRL_PROMPT_TEMPLATE.split("{conversation}")
_TURN_START = re.compile(r"\n(?=(?:%s): )" % "|".join(map(re.escape, SPEAKER_LABELS.values())))


def drop_oldest_rendered_turn(content: str) -> str | None:
    """A SpeakRL Table 1 prompt without its oldest conversation turn; None for another
    text, or when a single turn is left (the final user query is never cut)."""
    if not (content.startswith(_TABLE1_HEAD) and content.endswith(_TABLE1_TAIL)):
        return None
    conversation = content[len(_TABLE1_HEAD) : len(content) - len(_TABLE1_TAIL)]
    turns = _TURN_START.split(conversation)
    if len(turns) < 2:
        return None
    return _TABLE1_HEAD + "\n".join(turns[1:]) + _TABLE1_TAIL


class TokenCounter:
    """Token lengths of chat-templated conversations, with the tokenizer's own template."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def __call__(self, messages: Messages, add_generation_prompt: bool = False) -> int:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def _without_oldest(prompt: Messages, k: int) -> Messages | None:
    """``prompt`` without its ``k`` oldest history units: whole messages first (never the
    system message or the last message), then rendered turns inside a last Table 1
    message. None when fewer than ``k`` units can go."""
    first = 1 if prompt and prompt[0]["role"] == "system" else 0
    droppable = max(len(prompt) - first - 1, 0)
    messages = [*prompt[:first], *prompt[first + min(k, droppable) :]]
    for _ in range(k - droppable):
        if len(messages) <= first:
            return None
        shorter = drop_oldest_rendered_turn(messages[-1]["content"])
        if shorter is None:
            return None
        messages[-1] = {**messages[-1], "content": shorter}
    return messages


def _droppable_units(prompt: Messages) -> int:
    first = 1 if prompt and prompt[0]["role"] == "system" else 0
    if len(prompt) <= first:
        return 0
    units = len(prompt) - first - 1
    content = prompt[-1]["content"]
    while (content := drop_oldest_rendered_turn(content)) is not None:
        units += 1
    return units


def fit_prompt(
    prompt: Messages,
    completions: Sequence[Messages],
    count: Callable[..., int],
    max_length: int,
    reserve: int = 0,
) -> Messages | None:
    """``prompt`` cut from the left until it fits in ``max_length`` tokens with the longest
    of ``completions`` (or, with no completion, with ``reserve`` tokens left for one); None
    when it cannot. History goes in :func:`~pipelines.policy.prompts.compact_history`'s
    order (the agent's side before user turns); the system message and the last message are
    never dropped, only the oldest turns of a last Table 1 message when it alone is too
    long. The fewest units are dropped (a binary search: a handful of tokenizations per
    example)."""

    def fits(messages: Messages | None) -> bool:
        if messages is None:
            return False
        if completions:
            return max(count(messages + list(c)) for c in completions) <= max_length
        return count(messages, add_generation_prompt=True) + reserve <= max_length

    prompt = [dict(m) for m in prompt]
    if fits(prompt):
        return prompt
    from pipelines.policy.prompts import compact_history

    # History goes in compact_history's order (every user turn as long as the agent's side
    # can make room); only when the last message alone is too long are its turns cut.
    kept = compact_history(prompt, fits, system_prompt=None)
    if kept is not None:
        return kept
    first = 1 if prompt and prompt[0]["role"] == "system" else 0
    prompt = [*prompt[:first], *prompt[-1:]] if len(prompt) > first else prompt
    most = _droppable_units(prompt)
    if not fits(_without_oldest(prompt, most)):
        return None
    low, high = 0, most  # low does not fit, high does
    while high - low > 1:
        middle = (low + high) // 2
        if fits(_without_oldest(prompt, middle)):
            high = middle
        else:
            low = middle
    return _without_oldest(prompt, high)


_TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*)\n</tool_response>", re.DOTALL)


def shorten_tool_response(content: str, spec: ToolResultsSpec) -> str:
    """A ``<tool_response>`` message with at most ``spec.max_results`` results, all but the
    first reduced to ``spec.fields`` (None: kept whole); any other content unchanged."""
    match = _TOOL_RESPONSE.fullmatch(content)
    if match is None:
        return content
    try:
        observation = json.loads(match.group(1))
    except json.JSONDecodeError:
        return content
    results = observation.get("results") if isinstance(observation, dict) else None
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        return content
    kept = results[: spec.max_results]
    if spec.fields is not None:
        kept = kept[:1] + [{k: v for k, v in r.items() if k in spec.fields} for r in kept[1:]]
    return f"<tool_response>\n{json.dumps({**observation, 'results': kept}, ensure_ascii=False)}\n</tool_response>"


def system_prompt_name(spec: DataSpec, source: SourceSpec | None = None) -> str:
    """The system prompt a source's prompts get: its own ``system_prompt`` setting, else
    the run's ``compact_prompts`` (``compact``, or ``own``: the rows' system message).

    >>> system_prompt_name(DataSpec(sources=()), SourceSpec("josh_sft.parquet", system_prompt="toolwoz_react"))
    'toolwoz_react'
    >>> system_prompt_name(DataSpec(sources=(), compact_prompts=False))
    'own'
    """
    if source is not None and source.system_prompt is not None:
        return source.system_prompt
    return "compact" if spec.compact_prompts else "own"


def compact(prompt: Messages, spec: DataSpec, source: SourceSpec | None = None, *, keep_reasoning: bool = False) -> Messages:
    """The prompt as :func:`pipelines.policy.prompts.compact_history` rewrites it (the one
    rewrite evaluation prompts get too): the source's system prompt
    (:func:`system_prompt_name`), earlier reasoning dropped (``keep_reasoning``: kept, for a
    dialogue whose every assistant message is a target), shortened tool observations (with
    ``spec.tool_results``), at most ``spec.max_history_messages`` messages of history."""
    from functools import partial

    from pipelines.policy.prompts import compact_history, named_system_prompt

    shorten = partial(shorten_tool_response, spec=spec.tool_results) if spec.tool_results is not None else None
    system_prompt = named_system_prompt(system_prompt_name(spec, source))
    return compact_history(prompt, shorten=shorten, system_prompt=system_prompt, max_history_messages=spec.max_history_messages,
                           keep_reasoning=keep_reasoning)


def ungrounded_values(prompt: Messages, completion: Messages, grammar: str = "speakrl") -> list[str]:
    """The values a completion's reply states in SpeakER's answer shape (``For <venue>: the
    <slot> is <value>; ...``, :func:`pipelines.speaker.phrasing.parse_reqt_answer`) that no
    message of ``prompt`` holds. A training row with any teaches the model to state what it
    has not seen (``DataSpec.drop_ungrounded``); the evaluated SFT model did just that when its
    prompt lacked the search result (``benchmarks/grounding.py``). ``grammar`` names the agent
    format the reply is written in (a reply in another grammar is read whole).

    >>> reply = [{"role": "assistant", "content": "<think>It is in the results.</think>\\n"
    ...           "For lucky inn: the phone number is 01223 4567; the postcode is cb11aa. Is there anything else?"}]
    >>> ungrounded_values([{"role": "user", "content": '{"name": "lucky inn", "phone": "01223 4567"}'}], reply)
    ['cb11aa']
    >>> ungrounded_values([{"role": "user", "content": "Book it."}], [{"role": "assistant", "content": "Booked."}])
    []
    """
    from pipelines.episodes.formats import FORMATS, RESPOND, get_format
    from pipelines.speaker.phrasing import parse_reqt_answer

    fmt = get_format(grammar) if grammar in FORMATS else None
    seen = "\n".join(str(message.get("content") or "") for message in prompt)
    missing: list[str] = []
    for message in completion:
        content = str(message.get("content") or "")
        actions = fmt.parse(content) if fmt is not None else None
        texts = [a.text for a in actions if a.kind == RESPOND] if isinstance(actions, tuple) else [content]
        for text in texts:
            parsed = parse_reqt_answer(text)
            missing += [value for value in (parsed[1].values() if parsed else ()) if value not in seen]
    return missing


# --- Sources -> rows -------------------------------------------------------------------------


@dataclass
class SourceRows:
    """One source, prepared: training and held-out rows in the source's layout."""

    name: str
    layout: str
    train: list[Row]
    heldout: list[Row]
    stats: dict[str, Any] = field(default_factory=dict)
    windows: bool = False  # training rows are dialogue windows ({"messages"})
    grammar: str = "speakrl"  # how held-out generations are read (SourceSpec.grammar)


JOIN_COLUMN = "step"


def join_prompts(rows: Sequence[Row], prompt_rows: Sequence[Row], key: str) -> tuple[list[Row], int]:
    """``rows`` with the ``prompt`` of the ``prompt_rows`` row at the same (``key``,
    ``step``); rows without one are left out and counted."""
    prompts = {(r[key], r[JOIN_COLUMN]): r["prompt"] for r in prompt_rows}
    joined = [{**row, "prompt": prompts[(row[key], row[JOIN_COLUMN])]} for row in rows if (row[key], row[JOIN_COLUMN]) in prompts]
    return joined, len(rows) - len(joined)


def _messages(value: Any, where: str) -> Messages:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ConfigError(f"{where}: expected a list of chat messages, got {type(value).__name__}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _normalize(row: Row, layout: str, source: SourceSpec) -> Row:
    where = f"{source.path} ({row.get('dialogue_id', '?')})"
    out = dict(row)
    if source.prompt_column is not None:
        out["prompt"] = [{"role": "user", "content": str(row[source.prompt_column])}]
    out["prompt"] = _messages(out["prompt"], f"{where} prompt")
    if source.completion_column is not None:
        out["completion"] = [{"role": "assistant", "content": str(row[source.completion_column])}]
    for column in ("completion", "chosen", "rejected"):
        if column in _LAYOUT_COLUMNS[layout]:
            out[column] = _messages(out[column], f"{where} {column}")
    if layout == LABELED:
        out["label"] = bool(row["label"])
    return out


def _completions(row: Row, layout: str) -> list[Messages]:
    if layout == PAIRS:
        return [row["chosen"], row["rejected"]]
    if layout in (COMPLETION, LABELED):
        return [row["completion"]]
    return []


def dialogue_chats(rows: Iterable[Row], key: str) -> dict[Any, Messages]:
    """Whole dialogues from their decision rows: per key, the last row's prompt followed by
    its completion (every earlier row's prompt is a prefix of it)."""
    last: dict[Any, Row] = {}
    for row in rows:
        if row[key] not in last or row[JOIN_COLUMN] > last[row[key]][JOIN_COLUMN]:
            last[row[key]] = row
    return {k: [*row["prompt"], *row["completion"]] for k, row in last.items()}


def chat_windows(chat: Messages, count: Callable[..., int], max_length: int) -> list[Messages]:
    """A chat (system message first) cut into windows of at most ``max_length`` tokens:
    the system message and consecutive messages, ending with an assistant message and
    beginning with another role. Cut greedily from the end: the last assistant message gets
    the longest history that fits, the assistant messages before it in the window are
    targets too, and the next window ends where this one begins; so every assistant
    message is the target of one window, or of none when it does not fit with at least
    one message of history."""
    system, messages = chat[0], chat[1:]
    base = count([system])
    # Message lengths are additive in a ChatML template (each message is its own block);
    # the full count below checks the assumption for any other template.
    lengths = [count([system, m]) - base for m in messages]
    windows: list[Messages] = []
    end = len(messages)
    while end > 0:
        if messages[end - 1]["role"] != "assistant":
            end -= 1
            continue
        start, used = end, base
        while start > 0 and used + lengths[start - 1] <= max_length:
            start -= 1
            used += lengths[start]
        while start < end and (messages[start]["role"] == "assistant" or count([system, *messages[start:end]]) > max_length):
            start += 1
        if start == end:
            end -= 1  # no history fits with it
            continue
        windows.append([system, *messages[start:end]])
        end = start
    windows.reverse()
    return windows


def _prepare_windows(
    rows: Sequence[Row], source: SourceSpec, spec: DataSpec, count: Callable[..., int], max_length: int, stats: dict[str, Any]
) -> list[Row]:
    """Training windows of the dialogues not held out, in seeded dialogue order, up to
    ``source.max_rows`` windows."""
    chats = dialogue_chats((r for r in rows if not held_out(r, spec.holdout, source.path)), spec.holdout.key)
    order = sorted(chats, key=str)
    random.Random(spec.seed).shuffle(order)
    whole = replace(spec, max_history_messages=None)
    windows: list[Row] = []
    targets = covered = 0
    for key in order:
        if source.max_rows is not None and len(windows) >= source.max_rows:
            break
        # Every assistant message is a target: its reasoning stays, as in a decision row's completion.
        chat = compact(_messages(chats[key], f"{source.path} ({key})"), whole, source, keep_reasoning=True)
        cut = chat_windows(chat, count, max_length)
        targets += sum(m["role"] == "assistant" for m in chat)
        covered += sum(m["role"] == "assistant" for w in cut for m in w)
        windows.extend({spec.holdout.key: key, "messages": w} for w in cut)
    if source.max_rows is not None:
        windows = windows[: source.max_rows]
    stats.update(train_targets=covered, train_targets_dropped_too_long=targets - covered)
    return windows


def joining_prompts(table: Any, key: str, records: Sequence[Mapping[str, Any]]) -> list[dict]:
    """The (key, step, prompt) rows of the Arrow ``table`` that join ``records``, and only
    those: a table of chat prompts is hundreds of MB as Python objects."""
    wanted = {(r[key], r[JOIN_COLUMN]) for r in records}
    pairs = zip(table[key].to_pylist(), table[JOIN_COLUMN].to_pylist())
    take = [i for i, pair in enumerate(pairs) if pair in wanted]
    return table.select([key, JOIN_COLUMN, "prompt"]).take(take).to_pylist()


def prepare_source(
    rows: Sequence[Row],
    columns: Iterable[str],
    source: SourceSpec,
    method: str,
    spec: DataSpec,
    count: Callable[..., int],
    max_length: int,
    *,
    reserve: int = 0,
    max_heldout: int | None = None,
    prompt_rows: Sequence[Row] | None = None,
    workers: int | None = None,
) -> SourceRows:
    """Split one source's rows (dicts, as ``pyarrow.Table.to_pylist`` gives them; ``columns``
    are the table's) into training and held-out rows, each with a compact prompt that fits
    (module docstring).

    Training rows are a seeded sample of ``source.max_rows``; held-out rows the first
    ``max_heldout`` in hash order (a stable sample). Only sampled rows are fitted. With
    ``prompt_rows`` (``source.prompts_from``), prompts are joined from them first.
    ``workers`` > 1 fits the prompts in that many forked processes (:func:`fit_rows`):
    the same rows in the same order."""
    layout = source_layout(method, source, columns, spec.holdout.key)
    stats: dict[str, Any] = {"rows": len(rows)}
    if prompt_rows is not None:
        rows, stats["no_prompt"] = join_prompts(rows, prompt_rows, spec.holdout.key)
    train_rows, heldout_rows = [], []
    for row in rows:
        (heldout_rows if held_out(row, spec.holdout, source.path) else train_rows).append(row)
    random.Random(spec.seed).shuffle(train_rows)
    heldout_rows.sort(key=lambda r: holdout_score(f"{r[spec.holdout.key]}/{r.get('step', '')}", spec.holdout.salt))
    stats["heldout_rows"] = len(heldout_rows)

    def fitted(candidates: list[Row], limit: int | None, part: str) -> list[Row]:
        kept, start = [], 0
        dropped = {TOO_LONG: 0, **({UNGROUNDED: 0} if spec.drop_ungrounded else {})}
        job = _FitJob(layout, source, spec, count, max_length, reserve)
        while start < len(candidates) and (limit is None or len(kept) < limit):
            # Only as many rows as are still wanted (a dropped row makes another round).
            end = len(candidates) if limit is None else min(len(candidates), start + limit - len(kept))
            for row in fit_rows(job, candidates[start:end], workers):
                if isinstance(row, str):
                    dropped[row] += 1
                else:
                    kept.append(row)
            start = end
        stats.update({f"{part}_dropped_{why}": n for why, n in dropped.items()})
        return kept

    if source.windows:
        train = _prepare_windows(rows, source, spec, count, max_length, stats)
    else:
        train = fitted(train_rows, source.max_rows, "train")
    heldout = fitted(heldout_rows, max_heldout, "heldout")
    stats["train"] = len(train)
    stats["heldout"] = len(heldout)
    return SourceRows(source.name, layout, train, heldout, stats, windows=source.windows, grammar=source.grammar)


@dataclass(frozen=True)
class _FitJob:
    """What fitting one row needs (:func:`prepare_source`)."""

    layout: Any
    source: SourceSpec
    spec: DataSpec
    count: Callable[..., int]
    max_length: int
    reserve: int

    def __call__(self, row: Row) -> Row | str:
        row = _normalize(row, self.layout, self.source)
        prompt = fit_prompt(compact(row["prompt"], self.spec, self.source), _completions(row, self.layout), self.count, self.max_length, self.reserve)
        if prompt is None:
            return TOO_LONG
        if self.spec.drop_ungrounded and ungrounded_values(prompt, row["completion"], self.source.grammar):
            return UNGROUNDED
        return {**row, "prompt": prompt}


#: Why :class:`_FitJob` leaves a row out (the stats count ``<part>_dropped_<why>``).
TOO_LONG, UNGROUNDED = "too_long", "ungrounded"


_FORKED_JOB: _FitJob | None = None  # the job a forked worker inherits (a tokenizer does not pickle cheaply)


def _fit_in_worker(row: Row) -> Row | str:
    assert _FORKED_JOB is not None
    return _FORKED_JOB(row)


def fit_rows(job: Callable[[Row], Row | str], rows: Sequence[Row], workers: int | None = None, chunk: int = 64) -> Iterable[Row | str]:
    """``job`` applied to every row, in order (the fitted row, or why it was left out). With
    ``workers`` > 1 and the ``fork`` start method, in that many processes: a fork shares the
    tokenizer with the workers instead of pickling it, and tokenizing is pure CPU work the
    GIL would serialise in threads. Without ``fork`` (Windows, macOS defaults) it runs here.

    >>> list(fit_rows(lambda r: r if r["n"] % 2 else TOO_LONG, [{"n": n} for n in range(4)], workers=2))
    ['too_long', {'n': 1}, 'too_long', {'n': 3}]
    """
    import multiprocessing

    if not workers or workers < 2 or len(rows) < 2 * chunk or "fork" not in multiprocessing.get_all_start_methods():
        yield from (job(row) for row in rows)
        return
    global _FORKED_JOB
    _FORKED_JOB = job  # type: ignore[assignment]
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            yield from pool.imap(_fit_in_worker, rows, chunksize=chunk)
    finally:
        _FORKED_JOB = None


# --- Rows -> TRL's layout --------------------------------------------------------------------

IGNORE_INDEX = -100


def loss_mask_function(path: str) -> Callable[[str], list[tuple[int, int]]]:
    """The span function an ``SFTObjective.loss_mask`` names (``package.module:name``).

    >>> loss_mask_function("pipelines.pir.sft:response_spans")("a<response>b</response>")
    [(1, 23)]
    """
    import importlib

    module_name, _, attribute = path.rpartition(":")
    try:
        function = getattr(importlib.import_module(module_name), attribute) if module_name else None
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"sft loss_mask {path!r}: cannot import it ({exc})") from None
    if not callable(function):
        raise ConfigError(f"sft loss_mask {path!r}: expected an import path package.module:function")
    return function


def masked_example(
    tokenizer: Any, prompt: Messages, completion: str, masked: Sequence[tuple[int, int]] = (), max_length: int | None = None
) -> dict[str, list[int]]:
    """``input_ids`` and ``labels`` of one prompt-completion example: the prompt rendered
    with the chat template up to the reply (no loss), then the completion and the
    end-of-sequence token (loss), except the completion tokens whose characters overlap one
    of the ``masked`` character spans of ``completion`` (label -100). SFTTrainer takes such
    rows as they are."""
    prefix = tokenizer.apply_chat_template([dict(m) for m in prompt], tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    encoded = tokenizer(completion, add_special_tokens=False, return_offsets_mapping=True)
    labels = [
        IGNORE_INDEX if any(start < b and a < end for a, b in masked) else token_id
        for token_id, (start, end) in zip(encoded["input_ids"], encoded["offset_mapping"])
    ]
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    input_ids = prompt_ids + list(encoded["input_ids"]) + eos
    labels = [IGNORE_INDEX] * len(prompt_ids) + labels + eos
    if max_length is not None:
        input_ids, labels = input_ids[:max_length], labels[:max_length]
    return {"input_ids": input_ids, "labels": labels}


def masked_rows(rows: Sequence[Row], tokenizer: Any, loss_mask: str) -> list[Row]:
    """SFT rows (``prompt`` + one-message ``completion``) tokenized with the spans that
    ``loss_mask`` finds in each completion left out of the loss (:func:`masked_example`)."""
    spans = loss_mask_function(loss_mask)
    out = []
    for row in rows:
        text = "".join(str(m["content"]) for m in row["completion"])
        out.append(masked_example(tokenizer, row["prompt"], text, spans(text)))
    return out


def trainer_rows(method: str, prepared: SourceRows) -> list[Row]:
    """The training rows in the columns the method's TRL trainer reads. KTO reads pairs as
    two unpaired examples; GRPO keeps every column (the rewards read them)."""
    rows = prepared.train
    if method == "sft" and prepared.windows:
        return [{"messages": r["messages"]} for r in rows]
    if method == "sft":
        return [{"prompt": r["prompt"], "completion": r["completion"]} for r in rows]
    if method == "dpo":
        return [{"prompt": r["prompt"], "chosen": r["chosen"], "rejected": r["rejected"]} for r in rows]
    if method == "kto":
        if prepared.layout == LABELED:
            return [{"prompt": r["prompt"], "completion": r["completion"], "label": r["label"]} for r in rows]
        unpaired = []
        for r in rows:
            unpaired.append({"prompt": r["prompt"], "completion": r["chosen"], "label": True})
            unpaired.append({"prompt": r["prompt"], "completion": r["rejected"], "label": False})
        return unpaired
    if method == "grpo":
        return [dict(r) for r in rows]
    raise ConfigError(f"unknown method {method!r}")


def build_train_dataset(method: str, prepared: Sequence[SourceRows], seed: int = 0, *, tokenizer: Any = None,
                        loss_mask: str | None = None) -> Any:
    """All sources' training rows as one shuffled ``datasets.Dataset``; with ``loss_mask``
    (SFT), tokenized with the masked spans out of the loss (:func:`masked_rows`)."""
    from datasets import Dataset

    if len({source.windows for source in prepared}) > 1:
        raise ConfigError(f"{method}: either every source is read as dialogue windows or none is")
    rows = [row for source in prepared for row in trainer_rows(method, source)]
    if not rows:
        raise ConfigError(
            f"{method}: no training example left after the hold-out and length fitting "
            f"({', '.join(f'{s.name}: {s.stats}' for s in prepared)}); raise max_length or max_history_messages"
        )
    if method == "grpo":
        # Arrow needs one type per column across sources: keep the columns all sources share.
        shared = set.intersection(*(set(source.train[0]) for source in prepared if source.train))
        rows = [{k: v for k, v in row.items() if k in shared} for row in rows]
    if loss_mask is not None:
        if method != "sft" or any(source.windows for source in prepared):
            raise ConfigError(f"{method}: loss_mask is for sft prompt-completion rows (not dialogue windows)")
        rows = masked_rows(rows, tokenizer, loss_mask)
    random.Random(seed).shuffle(rows)
    return Dataset.from_list(rows)


__all__ = [
    "COMPLETION",
    "LABELED",
    "METHOD_LAYOUTS",
    "PAIRS",
    "PROMPTS",
    "SourceRows",
    "TokenCounter",
    "build_train_dataset",
    "chat_windows",
    "dialogue_chats",
    "compact",
    "system_prompt_name",
    "drop_oldest_rendered_turn",
    "fit_prompt",
    "held_out",
    "holdout_score",
    "is_held_out",
    "loss_mask_function",
    "masked_example",
    "masked_rows",
    "prepare_source",
    "reward_columns",
    "shorten_tool_response",
    "source_layout",
    "trainer_rows",
]
