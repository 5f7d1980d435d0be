"""Pretraining data for the base policy: gold seed dialogues as agent chats, cut into
token windows with an assistant-only loss mask.

**Chats.** :func:`seed_chat` renders a MultiWOZ seed dialogue as the chat an agent in the
SpeakRL format would have had if it had replayed the dialogue's system side: the seed's
user turns; for each system turn its gold tool calls (one ``<tool_call>`` output each,
run in a :class:`ToolEnvironment` seeded like an episode's, the observation handed back as
a ``<tool_response>`` user message), then the gold system text, with MultiWOZ's booking
references replaced by the environment's; the last response ends with ``<end>``. This is
what :class:`~pipelines.episodes.agents.ReplayAgent` says in an episode, rendered by the
same format methods (``tests/policy`` checks the two agree message for message). There are
no ``<think>`` parts and no clarifications: a base model that acts but does not ask.

**Windows.** A whole chat is up to about 1,600 tokens with the default tokenizer (700 on
average); the model is trained on a few hundred at a time. :func:`chat_windows` cuts a chat into training windows, each the compact system
prompt (:mod:`pipelines.policy.prompts`) followed by consecutive messages, as
:func:`~pipelines.policy.prompts.compact_messages` would hand them to the agent. Every
assistant output is the target of exactly one window: the one in which it comes with as
much preceding history as fits. Windows are tokenized with the tokenizer's chat template
(TRL's training variant, whose ``{% generation %}`` markers give the assistant mask), and
the loss covers the assistant outputs and their ``<|im_end|>``; system, user and tool
tokens are context only.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

from pipelines.config import positive_int
from pipelines.env.replay import replay
from pipelines.env.tools import Database, ToolEnvironment
from pipelines.episodes.formats import AgentAction, AgentFormat, Message, SpeakRLFormat
from pipelines.policy.prompts import COMPACT_SYSTEM_PROMPT
from pipelines.policy.tokenizer import IM_START
from pipelines.records import Dialogue, ToolCall

if TYPE_CHECKING:
    import torch

IGNORE_INDEX = -100  # labels of positions without loss (PyTorch's cross-entropy default)


def seed_chat(dialogue: Dialogue, database: Database, *, env_seed: int = 0, fmt: AgentFormat | None = None) -> list[Message]:
    """The dialogue as the replaying agent's chat, without the system message (module
    docstring). ``env_seed`` seeds the tool environment as an episode's seed does."""
    fmt = fmt or SpeakRLFormat()
    result = replay(dialogue, ToolEnvironment(database, dialogue.goal, env_seed))
    calls_by_turn: dict[int, list[ToolCall]] = defaultdict(list)
    for turn, call in result.calls:
        calls_by_turn[turn].append(call)
    texts = dict(result.system_texts)
    last_system = max(texts, default=None)
    messages: list[Message] = []
    for turn in dialogue.turns:
        if turn.speaker == "user":
            messages.append({"role": "user", "content": turn.text})
            continue
        for call in calls_by_turn[turn.index]:
            action = AgentAction.tool_call(call.name, call.arguments)
            messages.append(_output(fmt, [action]))
            messages.append(fmt.observation_message(action, call.observation))
        response = [AgentAction.respond(texts[turn.index])]
        if turn.index == last_system:
            response.append(AgentAction.end())
        messages.append(_output(fmt, response))
    return messages


def _output(fmt: AgentFormat, actions: Sequence[AgentAction]) -> Message:
    text, tool_calls = fmt.render(actions)
    return fmt.assistant_message(text, tool_calls, actions)


# --------------------------------------------------------------------------------------
# Token windows
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """One training sequence: token ids and labels (``IGNORE_INDEX`` where there is no loss)."""

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.labels):
            raise ValueError("input_ids and labels must have the same length")

    @property
    def n_targets(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


def encode_chat(tokenizer: Any, messages: Sequence[Mapping[str, Any]], chat_template: str) -> Window:
    """Token ids of the rendered chat, labelled on the assistant tokens only.

    ``chat_template`` must carry ``{% generation %}`` markers (TRL's training variant of the
    tokenizer's template, see :func:`pipelines.policy.tokenizer.training_chat_template`)."""
    encoded = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        chat_template=chat_template,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ids = list(encoded["input_ids"])
    mask = encoded["assistant_masks"]
    return Window(tuple(ids), tuple(token if keep else IGNORE_INDEX for token, keep in zip(ids, mask)))


def chat_windows(chat: Window, im_start_id: int, max_length: int) -> list[Window]:
    """Training windows of one encoded chat (:func:`encode_chat` of the compact system
    message and the chat), each at most ``max_length`` tokens; in chat order.

    A window is the system message followed by consecutive messages. The Qwen2.5 template
    (without tools) renders every message on its own, ``<|im_start|>role\\n...<|im_end|>\\n``,
    so a window's tokens are the system message's followed by those messages' tokens:
    exactly what rendering the window's messages would give, with no re-rendering.

    Windows are cut greedily from the end: the last assistant output gets the longest
    history that fits, the outputs before it in the window are targets too, and the next
    window ends where this one begins. A window begins with a non-assistant message, so
    every target has history; an output that does not fit with at least one message of
    history is left out."""
    spans = _message_spans(chat.input_ids, im_start_id)
    if not spans:
        return []
    (system_start, system_end), messages = spans[0], spans[1:]
    if system_start != 0:
        raise ValueError("the encoded chat must begin with <|im_start|>")
    system_ids, system_labels = chat.input_ids[:system_end], (IGNORE_INDEX,) * system_end
    is_output = [any(label != IGNORE_INDEX for label in chat.labels[a:b]) for a, b in messages]
    windows: list[Window] = []
    end = len(messages)  # exclusive end of the next window, in messages
    while end > 0:
        if not is_output[end - 1]:
            end -= 1
            continue
        start, used = end, system_end
        while start > 0 and used + _length(messages[start - 1]) <= max_length:
            start -= 1
            used += _length(messages[start])
        while start < end and is_output[start]:
            start += 1
        if start == end:
            end -= 1  # the output does not fit with any history
            continue
        first, last = messages[start][0], messages[end - 1][1]
        windows.append(Window(system_ids + chat.input_ids[first:last], system_labels + chat.labels[first:last]))
        end = start
    windows.reverse()
    return windows


def _message_spans(input_ids: Sequence[int], im_start_id: int) -> list[tuple[int, int]]:
    """[start, end) token spans of the rendered messages: each begins at an <|im_start|>."""
    starts = [i for i, token in enumerate(input_ids) if token == im_start_id]
    return list(zip(starts, starts[1:] + [len(input_ids)]))


def _length(span: tuple[int, int]) -> int:
    return span[1] - span[0]


def chats_to_windows(
    tokenizer: Any,
    chats: Iterable[Sequence[Mapping[str, Any]]],
    max_length: int,
    *,
    chat_template: str,
    system_prompt: str = COMPACT_SYSTEM_PROMPT,
) -> list[Window]:
    """The windows of every chat (messages without a system message), in order."""
    im_start_id = tokenizer.convert_tokens_to_ids(IM_START)
    windows: list[Window] = []
    for chat in chats:
        encoded = encode_chat(tokenizer, [{"role": "system", "content": system_prompt}, *chat], chat_template)
        windows += chat_windows(encoded, im_start_id, max_length)
    return windows


def without_loss_mask(window: Window) -> Window:
    """The window labelled on every token (plain language-model loss)."""
    return Window(window.input_ids, window.input_ids)


# --------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------


def length_grouped_batches(windows: Sequence[Window], batch_size: int, rng: random.Random) -> list[list[Window]]:
    """One epoch of batches: ``windows`` shuffled by ``rng``, then sorted by length within
    groups of 16 batches, so that a batch pads little; the batches in random order."""
    positive_int(batch_size, "batch_size")
    order = list(range(len(windows)))
    rng.shuffle(order)
    group = 16 * batch_size
    batches: list[list[Window]] = []
    for begin in range(0, len(order), group):
        members = sorted(order[begin : begin + group], key=lambda i: len(windows[i].input_ids))
        batches += [[windows[i] for i in members[k : k + batch_size]] for k in range(0, len(members), batch_size)]
    rng.shuffle(batches)
    return batches


def batch_stream(windows: Sequence[Window], batch_size: int, seed: int) -> Iterator[list[Window]]:
    """Endless batches, epoch after epoch, each epoch shuffled anew; the same for a seed."""
    if not windows:
        raise ValueError("no training windows")
    rng = random.Random(seed)
    while True:
        yield from length_grouped_batches(windows, batch_size, rng)


def collate(windows: Sequence[Window], pad_id: int) -> dict[str, "torch.Tensor"]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` tensors."""
    import torch

    width = max(len(w.input_ids) for w in windows)
    ids = torch.full((len(windows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(windows), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(windows), width), dtype=torch.long)
    for row, window in enumerate(windows):
        n = len(window.input_ids)
        ids[row, :n] = torch.tensor(window.input_ids)
        labels[row, :n] = torch.tensor(window.labels)
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
