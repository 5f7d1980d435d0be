"""The hf agent on a tiny locally built Qwen2 model: one batch per round, the same greedy
outputs as episodes played one at a time and as ``model.generate``, token counts, tools
rendered by the chat template for function calling."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Iterator

import pytest

from pipelines.env.tools import TOOL_SCHEMAS
from pipelines.episodes import (
    AgentContext,
    EpisodeSpec,
    FunctionCallingFormat,
    HFAgent,
    RunnerConfig,
    SpeakRLFormat,
    run_episodes_sync,
)
from pipelines.llm import HFBackend, HFConfig, SamplingParams

from .helpers import gold_user

pytestmark = pytest.mark.usefixtures("single_torch_thread")

# The tiny model has 1024 positions: a short task and no tool list keep the prompts short.
CONFIG = RunnerConfig(max_exchanges=6, malformed_retries=1, task_prompt="Be brief.")
GREEDY = SamplingParams(temperature=0.0, max_tokens=8)
N_EPISODES = 6


@pytest.fixture(scope="module")
def shared_backend(tiny_model_dir) -> HFBackend:
    return HFBackend.from_config(HFConfig(model_path=str(tiny_model_dir), batch_size=N_EPISODES))


@pytest.fixture
def backend(request, shared_backend) -> HFBackend:
    """The module's backend, or one with the test's ``batch_size`` parameter."""
    batch_size = getattr(request, "param", None)
    if batch_size is None:
        return shared_backend
    return HFBackend(shared_backend.model, shared_backend.tokenizer, batch_size=batch_size)


@pytest.fixture
def generate_calls(monkeypatch) -> list[int]:
    """The rows of every batch the agent decodes."""
    from pipelines.episodes import agents

    calls: list[int] = []
    original = agents.decode

    def counting(model, rows, *args, **kwargs):
        calls.append(len(rows))
        return original(model, rows, *args, **kwargs)

    monkeypatch.setattr(agents, "decode", counting)
    return calls


@pytest.fixture
def forward_batches(backend) -> Iterator[list[tuple[int, int]]]:
    """(rows, tokens per row) of every forward pass of the model."""
    seen: list[tuple[int, int]] = []
    handle = backend.model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    yield seen
    handle.remove()


def agent_outputs(episode) -> int:
    """Outputs the agent produced in an episode: each one's cost sits on its first event."""
    return sum(1 for e in episode.events if e.actor == "agent" and e.prompt_tokens is not None)


def content_of(episode):
    return [dataclasses.replace(e, latency_s=None) for e in episode.events]


def specs(small_corpus):
    """Episodes of different lengths: the gold user of a dialogue with k user turns ends
    after k agent replies, so the batches shrink as the short ones finish."""
    by_length = {}
    for dialogue in small_corpus.dialogues:
        by_length.setdefault(sum(1 for t in dialogue.turns if t.speaker == "user"), dialogue)
    chosen = [by_length[k] for k in sorted(by_length)][:N_EPISODES]
    return [EpisodeSpec.from_dialogue(d, seed=i) for i, d in enumerate(chosen)]


def test_episodes_are_generated_with_one_batch_per_round(backend, generate_calls, small_corpus, database):
    agent = HFAgent(backend, SpeakRLFormat(tools=()), GREEDY)
    episodes = run_episodes_sync(specs(small_corpus), agent, gold_user(), database, CONFIG)

    steps = [agent_outputs(e) for e in episodes]
    # Every round steps all live episodes in one call: as many calls as the longest episode
    # has steps, and far fewer than the steps taken.
    assert len(set(steps)) > 1, steps
    assert len(generate_calls) == max(steps)
    assert generate_calls == [sum(1 for n in steps if n > round_) for round_ in range(max(steps))]
    assert sum(generate_calls) == sum(steps)
    assert all(e.prompt_tokens > 0 and e.completion_tokens > 0 for e in episodes)


def test_batched_episodes_equal_episodes_played_one_at_a_time(backend, small_corpus, database):
    agent = HFAgent(backend, SpeakRLFormat(tools=()), GREEDY)
    batched = run_episodes_sync(specs(small_corpus), agent, gold_user(), database, CONFIG)
    alone = [run_episodes_sync([spec], agent, gold_user(), database, CONFIG)[0] for spec in specs(small_corpus)]

    assert [content_of(e) for e in batched] == [content_of(e) for e in alone]
    # The model's outputs depend on the prompt, so the comparison compares something.
    first_outputs = {next(e.text for e in ep.events if e.actor == "agent") for ep in batched}
    assert len(first_outputs) > 1


@pytest.mark.parametrize("backend", [4], indirect=True)
def test_a_round_larger_than_the_batch_size_is_split(backend, generate_calls):
    agent = HFAgent(backend, SpeakRLFormat(tools=()), GREEDY)
    contexts = [
        AgentContext(f"e{i}", i, 0, 1, 0, 0, ({"role": "system", "content": "Be brief."}, {"role": "user", "content": f"hotel {i}"}))
        for i in range(N_EPISODES)
    ]
    outputs = asyncio.run(agent.act(contexts))
    assert generate_calls == [4, 2] and len(outputs) == N_EPISODES


def test_token_counts_are_the_prompt_and_the_generated_tokens(backend):
    agent = HFAgent(backend, SpeakRLFormat(tools=()), SamplingParams(max_tokens=5))
    context = AgentContext("e", 0, 0, 1, 0, 0, ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "a taxi"}))
    [output] = asyncio.run(agent.act([context]))
    assert output.prompt_tokens == len(backend.tokenizer(agent.render(context), add_special_tokens=False)["input_ids"])
    assert 1 <= output.completion_tokens <= 5 and output.latency_s > 0


def test_sampling_is_reproducible(backend, small_corpus, database):
    agent = HFAgent(backend, SpeakRLFormat(tools=()), SamplingParams(temperature=1.0, max_tokens=8), seed=3)
    first = run_episodes_sync(specs(small_corpus)[:3], agent, gold_user(), database, CONFIG)
    second = run_episodes_sync(specs(small_corpus)[:3], agent, gold_user(), database, CONFIG)
    assert [content_of(e) for e in first] == [content_of(e) for e in second]


def test_function_calling_renders_the_tools_with_the_chat_template(backend, small_corpus, database):
    fmt = FunctionCallingFormat(tools=TOOL_SCHEMAS[:1])
    agent = HFAgent(backend, fmt, GREEDY)
    context = AgentContext(
        "e", 0, 0, 1, 0, 0, ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}), tools=fmt.tools
    )
    prompt = agent.render(context)
    assert "<tools>" in prompt and '"query_restaurant"' in prompt
    [episode] = run_episodes_sync(specs(small_corpus)[:1], agent, gold_user(), database, CONFIG)
    assert episode.agent_format == "function_calling" and episode.ended_by in ("turn_limit", "user_end", "agent_end")


def test_the_hf_agent_refuses_unsupported_settings(backend):
    with pytest.raises(ValueError, match="presence_penalty"):
        HFAgent(backend, SpeakRLFormat(), SamplingParams(presence_penalty=0.5))


def test_the_shared_system_prefix_is_computed_once_and_changes_no_output(backend, generate_calls, small_corpus, database):
    cached = HFAgent(backend, SpeakRLFormat(tools=()), GREEDY)
    plain = HFAgent(backend, SpeakRLFormat(tools=()), GREEDY, prefix_cache=False)
    with_cache = run_episodes_sync(specs(small_corpus), cached, gold_user(), database, CONFIG)
    without = run_episodes_sync(specs(small_corpus), plain, gold_user(), database, CONFIG)

    # Same outputs with the [prefix][padding][rest] layout as with plain left padding.
    assert [content_of(e) for e in with_cache] == [content_of(e) for e in without]
    # One prefix (the system message) was computed and kept; it is a prefix of every prompt.
    assert len(cached._prefixes) == 1 and not plain._prefixes
    (prefix,) = cached._prefixes
    system = backend.tokenizer.apply_chat_template([{"role": "system", "content": specs_system(cached, small_corpus, database)}], tokenize=False)
    assert list(prefix) == backend.tokenizer(system, add_special_tokens=False)["input_ids"]


def specs_system(agent, small_corpus, database) -> str:
    """The system prompt the runner gives the agent in these episodes."""
    from pipelines.episodes.runner import EpisodeState

    state = EpisodeState.start(specs(small_corpus)[0], agent, gold_user(), database, CONFIG)
    asyncio.run(state.hear_user())
    return state.context().messages[0]["content"]


def test_contexts_without_a_shared_system_message_are_generated_without_the_cache(backend):
    agent = HFAgent(backend, SpeakRLFormat(tools=()), GREEDY)
    contexts = [
        AgentContext(f"e{i}", i, 0, 1, 0, 0, ({"role": "system", "content": f"Be brief {i}."}, {"role": "user", "content": "a hotel"}))
        for i in range(2)
    ]
    mixed = asyncio.run(agent.act(contexts))
    assert not agent._prefixes
    alone = [asyncio.run(HFAgent(backend, SpeakRLFormat(tools=()), GREEDY, prefix_cache=False).act([c]))[0].text for c in contexts]
    assert [o.text for o in mixed] == alone


def test_rows_that_stopped_leave_the_batch_without_changing_any_output(backend, forward_batches, small_corpus, database):
    longer = SamplingParams(temperature=0.0, max_tokens=12)
    # A share no batch of several rows can miss: every stopped row leaves at once.
    leaving = HFAgent(backend, SpeakRLFormat(tools=()), longer, compact_share=1e-9)
    staying = HFAgent(backend, SpeakRLFormat(tools=()), longer, compact_share=None)
    # The tiny model rarely ends a reply: with a fifth of the vocabulary as stop tokens,
    # rows stop after a few tokens each, at different steps.
    stops = frozenset(range(0, len(backend.tokenizer), 5)) | {backend.tokenizer.eos_token_id}
    for agent in (leaving, staying):
        agent._stop_token_ids = lambda: stops
    left = run_episodes_sync(specs(small_corpus), leaving, gold_user(), database, CONFIG)
    leaving_steps = [rows for rows, width in forward_batches if width == 1]
    del forward_batches[:]
    stayed = run_episodes_sync(specs(small_corpus), staying, gold_user(), database, CONFIG)
    staying_steps = [rows for rows, width in forward_batches if width == 1]

    assert [content_of(e) for e in left] == [content_of(e) for e in stayed]
    assert sum(e.completion_tokens for e in left) == sum(e.completion_tokens for e in stayed)
    # The same decoding steps, over fewer rows: stopped rows no longer compute.
    assert len(leaving_steps) == len(staying_steps)
    assert sum(leaving_steps) < sum(staying_steps), (leaving_steps, staying_steps)


def test_the_decoding_loop_equals_model_generate(backend, small_corpus, database):
    longer = SamplingParams(temperature=0.0, max_tokens=12)
    looped = HFAgent(backend, SpeakRLFormat(tools=()), longer)
    generated = HFAgent(backend, SpeakRLFormat(tools=()), longer, use_generate=True)
    assert not looped.use_generate
    ours = run_episodes_sync(specs(small_corpus), looped, gold_user(), database, CONFIG)
    theirs = run_episodes_sync(specs(small_corpus), generated, gold_user(), database, CONFIG)
    assert [content_of(e) for e in ours] == [content_of(e) for e in theirs]
    # Options only generate knows (here a repetition penalty) go to generate.
    assert HFAgent(backend, SpeakRLFormat(tools=()), SamplingParams(extra_body={"repetition_penalty": 1.3})).use_generate


def test_stop_strings_end_a_reply_while_decoding(backend):
    context = AgentContext("e", 0, 0, 1, 0, 0, ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "a hotel"}))
    free = asyncio.run(HFAgent(backend, SpeakRLFormat(tools=()), SamplingParams(max_tokens=12)).act([context]))[0]
    assert free.completion_tokens == 12, "the tiny model should not stop on its own here"
    # A stop string from the middle of the free reply: two letters first seen there.
    text = free.text
    start = next(i for i in range(3, len(text) - 1) if text[i : i + 2].isalnum() and text.find(text[i : i + 2]) == i)
    stop = text[start : start + 2]
    stopped = asyncio.run(HFAgent(backend, SpeakRLFormat(tools=()), SamplingParams(max_tokens=12, stop=(stop,))).act([context]))[0]
    assert stopped.text == text[:start]
    assert stopped.completion_tokens < 12


def test_each_episodes_cache_is_reused_across_rounds_and_changes_no_output(backend, forward_batches, small_corpus, database):
    reusing = HFAgent(backend, SpeakRLFormat(tools=()), GREEDY)
    plain = HFAgent(backend, SpeakRLFormat(tools=()), GREEDY, episode_cache=False)
    reused = run_episodes_sync(specs(small_corpus), reusing, gold_user(), database, CONFIG)
    prefilled_reusing = sum(rows * width for rows, width in forward_batches if width > 1)
    del forward_batches[:]
    again = run_episodes_sync(specs(small_corpus), plain, gold_user(), database, CONFIG)
    prefilled_plain = sum(rows * width for rows, width in forward_batches if width > 1)
    generated = run_episodes_sync(specs(small_corpus), HFAgent(backend, SpeakRLFormat(tools=()), GREEDY, use_generate=True), gold_user(), database, CONFIG)
    alone = [run_episodes_sync([spec], reusing, gold_user(), database, CONFIG)[0] for spec in specs(small_corpus)]

    # Greedy outputs equal the no-reuse path, model.generate's, and one-at-a-time play.
    assert [content_of(e) for e in reused] == [content_of(e) for e in again] == [content_of(e) for e in generated] == [content_of(e) for e in alone]
    # Later rounds prefill only each episode's new turn: far fewer prompt tokens computed.
    assert prefilled_reusing < prefilled_plain / 2, (prefilled_reusing, prefilled_plain)
    # Only the latest call's episodes are kept (a finished episode's cache goes).
    assert len(reusing._episodes) == 1 and not plain._episodes


def test_a_prompt_rewritten_at_the_front_falls_back_to_its_common_prefix(backend):
    agent = HFAgent(backend, SpeakRLFormat(tools=()), GREEDY)
    plain = HFAgent(backend, SpeakRLFormat(tools=()), GREEDY, episode_cache=False)
    system = {"role": "system", "content": "Be brief."}
    first = AgentContext("e", 0, 0, 1, 0, 0, (system, {"role": "user", "content": "a cheap hotel in the north"}))
    [reply] = asyncio.run(agent.act([first]))
    # The next round's history lost its first user turn (cut to fit): not an extension.
    rewritten = dataclasses.replace(first, exchange=1, turn=3, messages=(system, {"role": "assistant", "content": reply.text}, {"role": "user", "content": "on friday"}))
    _, kept = agent._episodes[("e", 0)]
    ids = backend.tokenizer(agent.render(rewritten), add_special_tokens=False)["input_ids"]
    assert tuple(ids[: len(kept.ids)]) != kept.ids and 0 < len(kept.common(ids).ids) < len(kept.ids)
    assert [o.text for o in asyncio.run(agent.act([rewritten]))] == [o.text for o in asyncio.run(plain.act([rewritten]))]
