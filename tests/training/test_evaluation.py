"""Held-out evaluation, reports and callbacks."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipelines.rewards import REWARD_FUNCTIONS
from pipelines.training.callbacks import TimeBudget, curve_rows
from pipelines.episodes.formats import decision
from pipelines.training.evaluation import generation_metrics, preference_metrics, reward_metrics
from pipelines.training.report import curve_csv, deltas

CLARIFY = "<think>Two areas fit.</think>\n<clarify>Would you like the north or the centre?</clarify>"
CALL = '<think>Searching.</think>\n<tool_call>\n{"name": "query_hotel", "arguments": {}}\n</tool_call>'
RESPOND = "<think>Done.</think>\nYour table is booked."
END = "<think>All set.</think>\nEnjoy your stay! <end>"


def test_decisions_and_generation_metrics():
    assert [decision(t) for t in (CLARIFY, CALL, RESPOND, END, "<clarify>", "")] == ["clarify", "tool_call", "respond", "end", None, None]
    metrics = generation_metrics([CLARIFY, CALL, "plain words", "<think>x</think>"], references=[CLARIFY, CLARIFY, RESPOND, RESPOND])
    assert metrics["n"] == 4
    assert metrics["well_formed"] == 0.5  # think + action: the first two
    assert metrics["format_reward"] == (1 + 1 + 0 + 0.5) / 4
    assert metrics["clarify_rate"] == 0.25
    assert metrics["decision_match"] == 0.5  # clarify = clarify, and a plain response is a response


def test_reward_metrics_are_the_training_rewards():
    functions = [REWARD_FUNCTIONS["format"], REWARD_FUNCTIONS["clarify_verifiable"]]
    rows = [{"prompt": [], "discriminating_slots": ["area"], "candidate_values": json.dumps({"area": ["north", "centre"]}), "known_slots": []}] * 2
    metrics = reward_metrics([[], []], [CLARIFY, CALL], rows, functions, [1.0, 0.5], ["format_reward", "clarify_verifiable"])
    # Both rows are clarification points: the call earns eq. 8's partial credit (think, no clarify).
    assert metrics == {"reward/format_reward": 0.75, "reward/clarify_verifiable": 0.5, "reward/total": (1.5 + 0.5) / 2}
    # At act-here points the call is the right output and the question is over-asking.
    act_here = [{**row, "ask_needed": False, "discriminating_slots": [], "known_slots": ["area"]} for row in rows]
    metrics = reward_metrics([[], []], [CLARIFY, CALL], act_here, functions, [1.0, 0.5], ["format_reward", "clarify_verifiable"])
    assert metrics == {"reward/format_reward": 0.75, "reward/clarify_verifiable": 0.5, "reward/total": (0.5 + 1.5) / 2}


def test_preference_margin_is_antisymmetric(tiny_model_dir, single_torch_thread):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [[{"role": "user", "content": f"a hotel for {n}"}] for n in range(3)]
    good = [[{"role": "assistant", "content": CLARIFY}]] * 3
    bad = [[{"role": "assistant", "content": "Book the first one."}]] * 3

    forward = preference_metrics(model, tokenizer, prompts, good, bad, batch_size=2)
    backward = preference_metrics(model, tokenizer, prompts, bad, good, batch_size=3)
    assert forward["n_pairs"] == 3 and forward["logp_chosen"] < 0
    assert forward["margin"] == pytest.approx(-backward["margin"], abs=1e-3)
    assert forward["accuracy"] + backward["accuracy"] == 1.0


def test_deltas_curves_and_csv():
    before = {"s": {"generation": {"n": 10, "well_formed": 0.25}, "rewards": {"reward/total": 1.0}}}
    after = {"s": {"generation": {"n": 10, "well_formed": 0.75}, "rewards": {"reward/total": 1.5}}}
    assert deltas(before, after) == {"s.generation.well_formed": 0.5, "s.rewards.reward/total": 0.5}

    history = [
        {"loss": 2.0, "reward": 0.5, "step": 1, "epoch": 0.1},
        {"loss": 1.5, "step": 2, "epoch": 0.2},
        {"train_runtime": 3.0, "train_loss": 1.7, "step": 2},
    ]
    rows = curve_rows(history, ["loss", "reward"])
    assert rows == [{"step": 1, "epoch": 0.1, "loss": 2.0, "reward": 0.5}, {"step": 2, "epoch": 0.2, "loss": 1.5, "reward": None}]
    assert curve_csv(rows, ["loss", "rewards/format/mean"]).splitlines() == ["step,epoch,loss,rewards_format_mean", "1,0.1,2,", "2,0.2,1.5,"]


def test_the_time_budget_stops_at_a_step_boundary():
    budget = TimeBudget(0.01)
    state, control = SimpleNamespace(global_step=3, max_steps=10), SimpleNamespace(should_training_stop=False, should_log=False)
    budget.on_train_begin(None, state, control)
    time.sleep(0.02)
    budget.on_step_end(None, state, control)
    assert control.should_training_stop and budget.stopped

    unlimited = TimeBudget(None)
    control = SimpleNamespace(should_training_stop=False, should_log=False)
    unlimited.on_train_begin(None, state, control)
    unlimited.on_step_end(None, state, control)
    assert not control.should_training_stop and not unlimited.stopped


def test_sampled_generations_are_seeded(tiny_model_dir, single_torch_thread):
    from transformers import AutoModelForCausalLM

    from pipelines.training.config import ModelSpec
    from pipelines.training.evaluation import generate
    from pipelines.training.modeling import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = load_tokenizer(ModelSpec(path=str(tiny_model_dir)))
    prompts = [[{"role": "user", "content": "a hotel"}]] * 4
    first = generate(model, tokenizer, prompts, max_new_tokens=6, temperature=1.0, seed=1)
    assert first == generate(model, tokenizer, prompts, max_new_tokens=6, temperature=1.0, seed=1)
    assert len(set(first)) > 1  # each copy of a prompt draws its own sample
    greedy = generate(model, tokenizer, prompts, max_new_tokens=6)
    assert len(set(greedy)) == 1


def test_the_tokenizer_is_loaded_as_its_tokenizer_json_defines_it(tiny_model_dir):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from pipelines.training.config import ModelSpec
    from pipelines.training.modeling import load_tokenizer

    text = "Book a table for two people on Friday at 18:30, please."  # the tiny tokenizer merged "18"
    saved = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")).encode(text).ids
    tokenizer = load_tokenizer(ModelSpec(path=str(tiny_model_dir)))
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == saved
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"
    # What transformers 5 builds for any qwen2 model, whatever its tokenizer.json says:
    assert AutoTokenizer.from_pretrained(tiny_model_dir)(text, add_special_tokens=False)["input_ids"] != saved


def test_the_hf_backend_prompts_a_model_with_the_tokens_it_was_trained_on(tiny_model_dir):
    # JOSH's harvester M and PIR's teacher load through HFBackend.from_config: AutoTokenizer
    # alone would split a qwen2 model's text with Qwen's rules, not the model's own.
    from tokenizers import Tokenizer

    from pipelines.llm.config import HFConfig
    from pipelines.llm.hf import HFBackend

    text = "Book a table for two people on Friday at 18:30, please."
    saved = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json")).encode(text).ids
    backend = HFBackend.from_config(HFConfig(str(tiny_model_dir), "cpu"))
    assert backend.tokenizer(text, add_special_tokens=False)["input_ids"] == saved


def test_no_code_path_builds_a_model_tokenizer_with_autotokenizer_alone():
    # One loader (pipelines/llm/tokenizer.py) for every model askflow prompts; a GGUF file
    # (SmolLM2's, llama architecture) has no tokenizer.json to disagree with.
    import ast

    root = Path(__file__).resolve().parents[2]
    allowed = {"pipelines/llm/tokenizer.py", "pipelines/llm/gguf.py"}
    found = []
    for layer in ("pipelines", "flows", "catalog", "stages"):
        for path in sorted((root / layer).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "from_pretrained"
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "AutoTokenizer" and rel not in allowed):
                    found.append(f"{rel}:{node.lineno}")
    assert not found, f"AutoTokenizer.from_pretrained outside pipelines/llm/tokenizer.py (use faithful_tokenizer / load_tokenizer): {found}"


def test_only_transient_errors_are_retried():
    from flows.train import retry_on_transient
    from pipelines.errors import ConfigError, DataError

    def state(error):
        return SimpleNamespace(data=error)

    assert retry_on_transient(None, None, state(ConnectionError("reset by peer")))
    assert retry_on_transient(None, None, state(TimeoutError()))
    assert not retry_on_transient(None, None, state(FileNotFoundError("models/base")))
    assert not retry_on_transient(None, None, state(ConfigError("bad")))
    assert not retry_on_transient(None, None, state(DataError("x.parquet", "bad row")))
    assert not retry_on_transient(None, None, state(ValueError("a bug")))
