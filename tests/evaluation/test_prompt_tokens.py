"""PromptTokens counts a chat's tokens as the whole rendered prompt tokenised does (what
prompt_fits counted before), piece by piece between the tokenizer's added tokens, and falls
back to the whole prompt where that split is not exact; the policy therefore sees the same
prompts either way."""

from __future__ import annotations

import json
import random
from functools import partial

import pytest

from pipelines.evaluation.agent import PolicyPromptAgent, PromptSpec, PromptTokens
from pipelines.policy.prompts import compact_history, named_system_prompt, prompt_fits
from pipelines.training.config import ToolResultsSpec
from pipelines.training.data import shorten_tool_response


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from pipelines.training.config import ModelSpec
    from pipelines.training.modeling import load_tokenizer

    return load_tokenizer(ModelSpec(path=str(tiny_model_dir)))


def whole(tokenizer, chat) -> int:
    return len(tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"])


def random_chats(tokenizer, n: int, seed: int = 0) -> list[list[dict]]:
    """Chats whose contents hold the tokenizer's own added tokens, whitespace runs, unicode and
    JSON: where a split at the added tokens could go wrong."""
    rnd = random.Random(seed)
    added = [t.content for t in tokenizer.added_tokens_decoder.values()]
    words = ["hello", " world", "\n", "  ", "\n\n", "café", "🙂", "{\"a\": 1}", "<think>", "</think>", "\t", "TR1234", "ok.", " ", *added]
    return [[{"role": "system", "content": "S"}] + [
        {"role": rnd.choice(["user", "assistant"]), "content": "".join(rnd.choice(words) for _ in range(rnd.randrange(0, 40)))}
        for _ in range(rnd.randrange(1, 7))] for _ in range(n)]


def test_pieces_count_what_the_whole_prompt_tokenised_counts(tokenizer):
    counter = PromptTokens(tokenizer)
    assert counter.added, "the tiny tokenizer's added tokens split exactly: the piece path runs"
    chats = random_chats(tokenizer, 300)
    assert [counter(chat) for chat in chats] == [whole(tokenizer, chat) for chat in chats]
    # Counted again, nothing is tokenised anew: every piece is remembered.
    misses = counter.piece.cache_info().misses
    assert [counter(chat) for chat in chats[:50]] == [whole(tokenizer, chat) for chat in chats[:50]]
    assert counter.piece.cache_info().misses == misses


def test_an_added_token_that_strips_whitespace_means_whole_prompts(tiny_model_dir):
    """Such a token takes its neighbours' spaces: the pieces between would count them again."""
    from tokenizers import AddedToken

    from pipelines.training.config import ModelSpec
    from pipelines.training.modeling import load_tokenizer

    stripping = load_tokenizer(ModelSpec(path=str(tiny_model_dir)))
    stripping.add_tokens([AddedToken("<mark>", lstrip=True, rstrip=True)])
    counter = PromptTokens(stripping)
    assert counter.added is None
    chat = [{"role": "user", "content": "a   <mark>   b"}]
    assert counter(chat) == whole(stripping, chat)


def test_whole_tokenises_every_prompt_whole(tokenizer):
    counter = PromptTokens(tokenizer, whole=True)
    chats = random_chats(tokenizer, 20, seed=2)
    assert counter.added is None and [counter(chat) for chat in chats] == [whole(tokenizer, chat) for chat in chats]
    assert counter.piece.cache_info().misses == 0


def test_the_policy_sees_the_prompts_prompt_fits_chose(tokenizer):
    """A growing episode under a budget that forces history out (the bisection runs): the
    agent's prompts are those the whole-prompt test chose, round after round."""
    # Room for the compact system prompt and a few messages.
    spec = PromptSpec(max_prompt_tokens=whole(tokenizer, [{"role": "system", "content": named_system_prompt("compact")}]) + 200,
                      max_tool_results=2)

    class Inner:
        name, format = "inner", None

    agent = PolicyPromptAgent(Inner(), tokenizer, spec)
    shorten = partial(shorten_tool_response, spec=ToolResultsSpec(spec.max_tool_results, spec.tool_result_fields))
    rnd = random.Random(1)
    messages = [{"role": "system", "content": "the runner's long prompt " * 50}]

    cut = 0
    for turn in range(12):
        results = [{"name": f"hotel {i}", "area": rnd.choice(["north", "east"]), "phone": f"01223 {rnd.randrange(10**6):06d}"} for i in range(4)]
        messages += [{"role": "user", "content": f"turn {turn}: somewhere {'quiet ' * rnd.randrange(1, 6)}please"},
                     {"role": "assistant", "content": "<think>look</think><tool_call>{}</tool_call>"},
                     {"role": "user", "content": f"<tool_response>\n{json.dumps({'count': 4, 'results': results})}\n</tool_response>"}]
        seen = agent.messages(messages)
        reference = compact_history(messages, prompt_fits(tokenizer, spec.max_prompt_tokens), shorten=shorten,
                                    system_prompt=named_system_prompt(spec.system_prompt))
        assert seen == reference, turn
        assert whole(tokenizer, seen) <= spec.max_prompt_tokens
        cut += len(seen) < len(messages)
    assert cut > 6  # most rounds had to drop history
