"""Seed chats (agreement with the runner's replay agent) and training windows."""

from __future__ import annotations

import asyncio
import random

import pytest

from pipelines.episodes import EpisodeSpec, EpisodeState, ReplayAgent, RunnerConfig, play
from pipelines.episodes.formats import CLARIFY, END, THINK, TOOL_CALL, Malformed, SpeakRLFormat
from pipelines.policy.pretrain_data import (
    IGNORE_INDEX,
    Window,
    batch_stream,
    chat_windows,
    chats_to_windows,
    collate,
    encode_chat,
    length_grouped_batches,
    seed_chat,
    without_loss_mask,
)
from pipelines.policy.prompts import COMPACT_SYSTEM_PROMPT
from pipelines.policy.tokenizer import IM_START, training_chat_template
from pipelines.simulators.base import UserTurn

SYSTEM = {"role": "system", "content": COMPACT_SYSTEM_PROMPT}


class _SeedUser:
    """A user who says the seed dialogue's user turns, whatever the agent says."""

    name = "seed_user"

    def session(self, goal, seed, reference):
        return _SeedSession([t.text for t in reference.turns if t.speaker == "user"])


class _SeedSession:
    def __init__(self, texts):
        self.texts = iter(texts)

    async def opening(self):
        return UserTurn(next(self.texts))

    async def respond(self, agent_text):
        text = next(self.texts, None)
        return UserTurn("", end=True) if text is None else UserTurn(text)

    def fork(self):
        raise NotImplementedError


def test_seed_chats_are_what_the_replay_agent_says_in_an_episode(small_corpus, database):
    dialogues = small_corpus.dialogues[:25]
    agent = ReplayAgent()
    config = RunnerConfig(max_exchanges=50, max_steps=20)
    states = [EpisodeState.start(EpisodeSpec.from_dialogue(d, seed=3), agent, _SeedUser(), database, config) for d in dialogues]
    episodes = asyncio.run(play(states, agent))
    for dialogue, state, episode in zip(dialogues, states, episodes):
        assert episode.ended_by == "agent_end" and episode.n_malformed == 0
        assert state.messages[1:] == seed_chat(dialogue, database, env_seed=3), dialogue.dialogue_id
    assert any(m["content"].startswith("<tool_call>") for m in seed_chat(dialogues[0], database))


def test_seed_chats_act_but_never_ask_and_end_with_end(chats):
    fmt = SpeakRLFormat()
    with_calls = 0
    for chat in chats["train"]:
        outputs = [fmt.parse(m["content"]) for m in chat if m["role"] == "assistant"]
        assert not any(isinstance(p, Malformed) for p in outputs)
        kinds = [a.kind for p in outputs for a in p]
        assert CLARIFY not in kinds and THINK not in kinds
        assert kinds[-1] == END and kinds.count(END) == 1
        with_calls += TOOL_CALL in kinds  # not all: e.g. the hospital and police domains have no tools
        calls = [i for i, m in enumerate(chat) if m["content"].startswith("<tool_call>")]
        assert all(chat[i + 1]["role"] == "user" and chat[i + 1]["content"].startswith("<tool_response>") for i in calls)
    assert with_calls > 0.8 * len(chats["train"])


@pytest.fixture(scope="module")
def template(tokenizer):
    return training_chat_template(tokenizer)


def _rendered_messages(tokenizer, chat):
    return [tokenizer.apply_chat_template([SYSTEM, m], tokenize=False)[len(tokenizer.apply_chat_template([SYSTEM], tokenize=False)) :] for m in chat]


def test_windows_are_renderings_of_consecutive_messages_and_every_output_is_trained_once(tokenizer, template, chats):
    im_start = tokenizer.convert_tokens_to_ids(IM_START)
    system_ids = tokenizer.apply_chat_template([SYSTEM], tokenize=True, return_dict=True)["input_ids"]
    max_length = 320
    n_windows = 0
    for chat in chats["train"][:20]:
        windows = chat_windows(encode_chat(tokenizer, [SYSTEM, *chat], template), im_start, max_length)
        rendered = _rendered_messages(tokenizer, chat)
        targeted = []
        n_windows += len(windows)
        for window in windows:
            assert len(window.input_ids) <= max_length
            assert list(window.input_ids[: len(system_ids)]) == system_ids
            text = tokenizer.decode(window.input_ids[len(system_ids) :])
            start = next(i for i in range(len(chat)) if text.startswith(rendered[i]) and "".join(rendered[i:]).startswith(text))
            end = start + next(n for n in range(1, len(chat) - start + 1) if "".join(rendered[start : start + n]) == text)
            assert chat[start]["role"] != "assistant"  # every target has history
            expected = tokenizer.apply_chat_template([SYSTEM, *chat[start:end]], tokenize=True, return_dict=True)["input_ids"]
            assert list(window.input_ids) == expected
            outputs = [i for i in range(start, end) if chat[i]["role"] == "assistant"]
            targets = tokenizer.decode([t for t in window.labels if t != IGNORE_INDEX])
            assert targets == "".join(f"\n{chat[i]['content']}<|im_end|>\n" for i in outputs)
            targeted += outputs
        assert targeted == sorted(set(targeted))  # in order, none twice
        fits = [
            i for i, m in enumerate(chat)
            if m["role"] == "assistant" and len(system_ids) + len(tokenizer(rendered[i - 1] + rendered[i])["input_ids"]) <= max_length
        ]
        assert set(fits) <= set(targeted)
    assert n_windows > 20


def test_an_output_without_room_for_history_is_left_out(tokenizer, template):
    chat = [
        {"role": "user", "content": "word " * 300},
        {"role": "assistant", "content": "A reply."},
        {"role": "user", "content": "Thanks."},
        {"role": "assistant", "content": "Bye <end>"},
    ]
    windows = chats_to_windows(tokenizer, [chat], 200, chat_template=template)
    assert len(windows) == 1
    assert tokenizer.decode([t for t in windows[0].labels if t != IGNORE_INDEX]) == "\nBye <end><|im_end|>\n"
    assert chats_to_windows(tokenizer, [chat[:2]], 200, chat_template=template) == []


def test_plain_lm_windows_label_every_token():
    window = Window((5, 6, 7), (IGNORE_INDEX, 6, IGNORE_INDEX))
    assert without_loss_mask(window) == Window((5, 6, 7), (5, 6, 7))
    with pytest.raises(ValueError):
        Window((1, 2), (1,))


def test_batches_cover_every_window_once_per_epoch_and_repeat_for_a_seed():
    windows = [Window(tuple(range(n)), tuple(range(n))) for n in range(1, 38)]
    batches = length_grouped_batches(windows, 4, random.Random(1))
    assert sorted(len(w.input_ids) for b in batches for w in b) == list(range(1, 38))
    assert all(len(b) <= 4 for b in batches)
    assert batches == length_grouped_batches(windows, 4, random.Random(1))
    stream = batch_stream(windows, 4, seed=1)
    first_epochs = [next(stream) for _ in range(2 * len(batches))]
    assert first_epochs[: len(batches)] == batches and first_epochs[len(batches) :] != batches


def test_collate_pads_on_the_right_without_loss_on_padding():
    batch = collate([Window((1, 2, 3), (IGNORE_INDEX, 2, 3)), Window((4,), (4,))], pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[IGNORE_INDEX, 2, 3], [4, IGNORE_INDEX, IGNORE_INDEX]]
