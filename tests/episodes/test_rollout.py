"""Conversation rollouts for GRPO (pipelines/training/rollout.py): the policy's tokens have
env_mask 1, everything injected (the simulator's answers inside the reasoning, its replies,
tool results, template markers) 0; the sequence only grows; TRL's trainer takes the mask as
its loss mask."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipelines.env.tools import Database
from pipelines.rewards.pir import unstated_slots
from pipelines.training.rollout import ConversationRollout, RolloutConfig, prompt_key, trl_rollout_func
from pipelines.episodes.runner import EpisodeSpec
from pipelines.simulators.agenda import AgendaSimulator

pytestmark = pytest.mark.usefixtures("single_torch_thread")


class ScriptedPolicy:
    """A causal LM's ``generate`` that writes fixed segments (the policy's side scripted, as
    the replay agent scripts an agent); every other part of the rollout is real."""

    def __init__(self, tokenizer, segments):
        self.tokenizer = tokenizer
        self.segments = list(segments)
        self.inputs: list[list[int]] = []
        self.training = False
        self.device = torch.device("cpu")

    def eval(self):
        return self

    def train(self, mode=True):
        return self

    def generate(self, input_ids, max_new_tokens, **kwargs):
        self.inputs.append(input_ids[0].tolist())
        text, end = self.segments.pop(0)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + ([self.tokenizer.eos_token_id] if end else [])
        vocab = len(self.tokenizer)
        return SimpleNamespace(sequences=torch.cat([input_ids, torch.tensor([ids])], 1), scores=[torch.zeros(1, vocab) for _ in ids])


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def world(small_corpus):
    database = Database(small_corpus.entities, small_corpus.taxi_options)
    dialogue = next(d for d in small_corpus.dialogues if d.split == "train" and any(g.domain in ("hotel", "restaurant") for g in d.goal.domains))
    return database, dialogue


def test_user_and_tool_tokens_are_masked_and_the_policy_tokens_are_not(world, tokenizer):
    database, dialogue = world
    segments = [
        ("<think>\nThe user wants a place to stay.\n<asking>Which area would you like?</asking>", False),
        ("\nNow the price.\n</think>\n<clarify>What price range would you like?</clarify>", True),
        ("<think>\nDone.\n</think>\nThank you, goodbye! <end>", True),
    ]
    policy = ScriptedPolicy(tokenizer, segments)
    rollout = ConversationRollout(database, AgendaSimulator(database), tokenizer, RolloutConfig(max_exchanges=3, max_total_tokens=4096))
    [played] = rollout.play(policy, [EpisodeSpec(f"{dialogue.dialogue_id}#0", dialogue.goal, 0)], [0])

    assert len(played.completion_ids) == len(played.env_mask) == len(played.logprobs)
    ours = [t for t, m in zip(played.completion_ids, played.env_mask) if m]
    injected = tokenizer.decode([t for t, m in zip(played.completion_ids, played.env_mask) if not m])
    expected = tokenizer(segments[0][0] + segments[1][0], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert ours[: len(expected)] == expected  # exactly what the policy wrote, nothing else
    # The simulator answered the question asked inside the reasoning, injected as <response>, masked.
    [(question, answer)] = played.asks
    assert question == "Which area would you like?" and answer
    assert f"\n<response>{answer.strip()}</response>\n\n" in injected
    assert answer not in tokenizer.decode(ours)
    # Every user turn after the opening was injected, and none of it is the policy's.
    replies = [e.text for e in played.episode.events if e.actor == "user" and e.turn > 0]
    assert replies and all(r in injected for r in replies)
    assert played.ttr == 1 + len(replies)
    assert played.questions == ["Which area would you like?", "What price range would you like?"]
    assert tokenizer.decode(played.prompt_ids).endswith("<|im_start|>assistant\n")
    # Each generation saw exactly the tokens that are trained on: the sequence only grows.
    full = played.prompt_ids + played.completion_ids
    assert len(policy.inputs) == 3 and all(full[: len(seen)] == seen for seen in policy.inputs)
    assert played.episode.ended_by == "agent_end"


def test_a_budget_cut_turn_is_closed_by_an_injected_end_of_turn(world, tiny_model_dir, tokenizer):
    database, dialogue = world
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = RolloutConfig(max_exchanges=2, max_turn_tokens=6, temperature=1.0, ask_inside_reasoning=False)
    rollout = ConversationRollout(database, AgendaSimulator(database), tokenizer, config)
    spec = EpisodeSpec(f"{dialogue.dialogue_id}#0", dialogue.goal, 0)
    first, again = rollout.play(model, [spec, spec], [3, 3])
    assert first.completion_ids == again.completion_ids  # seeded sampling
    mask, ids = first.env_mask, first.completion_ids
    runs, start = [], None
    for i, m in enumerate(mask + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    assert runs
    eos = tokenizer.eos_token_id
    for a, b in runs:
        assert b - a <= config.max_turn_tokens
        # The turn ends with the policy's own end-of-turn token, or an injected one when cut.
        assert ids[b - 1] == eos or (b < len(ids) and ids[b] == eos and mask[b] == 0)

    # A token budget just above the prompt: the conversation stops there, as a limit.
    short = RolloutConfig(max_exchanges=4, max_turn_tokens=6, max_total_tokens=len(first.prompt_ids) + 40, ask_inside_reasoning=False)
    [cut] = ConversationRollout(database, AgendaSimulator(database), tokenizer, short).play(model, [spec], [3])
    assert len(cut.prompt_ids) + len(cut.completion_ids) <= short.max_total_tokens
    assert cut.truncated and cut.episode.ended_by == "turn_limit"


def test_unstated_slots_are_the_goal_values_the_opening_leaves_out(world):
    _, dialogue = world
    values = {s: str(v) for d in dialogue.goal.domains for part in (d.info, d.book) for s, v in part.items()}
    assert set(unstated_slots(dialogue.goal, "")) == {s for s, v in values.items() if v not in ("dontcare", "don't care")}
    assert unstated_slots(dialogue.goal, " and ".join(values.values())) == []


def test_trl_grpo_trainer_trains_only_on_the_policy_tokens(world, tiny_model_dir, tokenizer, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    database, dialogue = world
    rollout = ConversationRollout(database, AgendaSimulator(database), tokenizer, RolloutConfig(max_exchanges=2, max_turn_tokens=8, max_total_tokens=4096))
    spec = EpisodeSpec(f"{dialogue.dialogue_id}#0", dialogue.goal, 0)
    prompt = rollout.prompt(spec)
    seen: dict[str, list] = {}

    def reward(prompts, completions, correct, ttr, **kwargs):
        seen.update(correct=list(correct), ttr=list(ttr))
        return [float(t) for t in ttr]  # varies across the group: a non-zero advantage

    func = trl_rollout_func(rollout, {prompt_key(prompt): spec}, lambda r: {"ttr": r.ttr})
    played: list = []

    def recording(prompts, trainer):
        out = func(prompts, trainer)
        played.append(out)
        return out

    args = GRPOConfig(output_dir=str(tmp_path), bf16=False, gradient_checkpointing=False, max_steps=1, per_device_train_batch_size=2,
                      num_generations=2, max_completion_length=4096, report_to=[], logging_steps=1, disable_tqdm=True)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), reward_funcs=[reward], args=args,
                          train_dataset=Dataset.from_list([{"prompt": prompt}] * 2), processing_class=tokenizer, rollout_func=recording)
    batch = trainer._generate_and_score_completions([{"prompt": prompt}, {"prompt": prompt}])
    out = played[-1]
    assert len(out["completion_ids"]) == 2 and seen["correct"] == out["correct"]
    for row, mask in enumerate(out["env_mask"]):
        loss_mask = (batch["completion_mask"][row] * batch["tool_mask"][row]).tolist()
        assert loss_mask[: len(mask)] == mask and not any(loss_mask[len(mask):])
        assert 0 in mask and 1 in mask
    trainer.train()
    assert trainer.state.global_step == 1


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_conversations_played_together_match_the_one_by_one_play_when_greedy(small_corpus, tiny_model_dir, tokenizer, cuda_graphs):
    """rollout.batch_size > 1: the turns of several conversations decoded as one left-padded
    batch (the batched decoding loop; with ``cuda_graphs`` its fixed-shape steps, run eagerly
    on a CPU); greedy, each conversation is the one the one-by-one path (``generate``) plays
    (tokens, log-probs, episode), and fewer decode calls are made than turns were written."""
    database = Database(small_corpus.entities, small_corpus.taxi_options)
    dialogues = [d for d in small_corpus.dialogues if d.split == "train"][:3]
    specs = [EpisodeSpec(f"{d.dialogue_id}#0", d.goal, 0) for d in dialogues]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    played = {}
    for size in (1, 3):
        config = RolloutConfig(max_exchanges=3, max_turn_tokens=12, max_total_tokens=2048, temperature=0.0,
                               ask_inside_reasoning=False, batch_size=size, cuda_graphs=cuda_graphs and size > 1)
        rollout = ConversationRollout(database, AgendaSimulator(database), tokenizer, config)
        played[size] = (rollout.play(model, specs, [0, 1, 2]), rollout.stats)
    (alone, _), (together, stats) = played[1], played[3]
    for a, b in zip(alone, together):
        assert a.completion_ids == b.completion_ids and a.env_mask == b.env_mask
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert [(e.actor, e.kind, e.text) for e in a.episode.events] == [(e.actor, e.kind, e.text) for e in b.episode.events]
    turns = sum(1 for r in together for e in r.episode.events if e.actor == "agent")
    assert stats["episodes"] == 3 and 0 < stats["batches"] < turns


def test_a_failing_batch_reaches_every_conversation_waiting_on_it(world, tokenizer):
    database, dialogue = world

    class Broken(ScriptedPolicy):
        def generate(self, input_ids, max_new_tokens, **kwargs):
            raise RuntimeError("out of memory (injected)")

    config = RolloutConfig(max_exchanges=2, max_turn_tokens=8, ask_inside_reasoning=False, batch_size=2)
    rollout = ConversationRollout(database, AgendaSimulator(database), tokenizer, config)
    spec = EpisodeSpec(f"{dialogue.dialogue_id}#0", dialogue.goal, 0)
    with pytest.raises(RuntimeError, match="injected"):
        rollout.play(Broken(tokenizer, []), [spec, spec], [0, 1])


def test_batch_size_and_cuda_graphs_are_left_out_of_reports_at_their_defaults():
    from pipelines.training.config import config_dict

    assert "batch_size" not in config_dict(RolloutConfig()) and config_dict(RolloutConfig(batch_size=4))["batch_size"] == 4
    assert "cuda_graphs" not in config_dict(RolloutConfig()) and config_dict(RolloutConfig(cuda_graphs=True))["cuda_graphs"] is True
    from pipelines.errors import ConfigError

    with pytest.raises(ConfigError, match="batch_size"):
        RolloutConfig(batch_size=0)


def test_the_one_by_one_generation_stops_where_its_new_tokens_close_a_question():
    """``_AskStop`` (the ``generate`` path's ask stop) reads only the tokens after the prompt."""
    from pipelines.training.rollout import ASK_CLOSE, _AskStop

    pieces = ["Hi", " there", ASK_CLOSE, " and", " more"]

    class Pieces:
        def decode(self, ids, **kwargs):
            return "".join(pieces[i] for i in ids)

    def stopped(ids, start):
        return bool(_AskStop(Pieces(), start)(torch.tensor([ids]), None)[0])

    assert stopped([0, 1, 2], start=1)            # generated " there</ask>": a closed question
    assert not stopped([0, 2, 3], start=2)        # generated " and": the question was the prompt's
    assert not stopped([0, 1, 2, 3, 4], start=1)  # text went on after the close


def test_tool_results_in_a_rollout_are_cut_as_the_evaluation_prompts_cut_them(world, tokenizer):
    database, _ = world
    observation = {"count": 3, "results": [{"name": f"hotel {i}", "area": "north", "phone": f"0122300000{i}"} for i in range(3)]}
    message = {"role": "user", "content": f"<tool_response>\n{json.dumps(observation)}\n</tool_response>"}

    def results(config):
        shortened = ConversationRollout(database, AgendaSimulator(database), tokenizer, config)._shorten(message)["content"]
        return json.loads(shortened.split("\n")[1])["results"]

    assert results(RolloutConfig(max_tool_results=2)) == [observation["results"][0], {"name": "hotel 1", "area": "north"}]
    assert results(RolloutConfig(max_tool_results=2, tool_result_fields=None)) == observation["results"][:2]
    assert results(RolloutConfig(max_tool_results=None)) == observation["results"]
