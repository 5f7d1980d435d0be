"""The ``bootstrap`` stage end to end on a small corpus, and the generation metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from pipelines.errors import ConfigError
from pipelines.policy.bootstrap import score_generations
from pipelines.policy.model import Generation
from catalog.io import directory_sha256
from stages.bootstrap import bootstrap_config, run
from tests.policy.conftest import TINY

TOOL_CALL = '<tool_call>\n{"name": "query_hotel", "arguments": {"area": "north"}}\n</tool_call>'


@pytest.fixture(scope="module")
def stage(small_corpus_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("bootstrap")
    params = {
        "source": str(small_corpus_dir),
        "db_dir": None,
        "env_seed": 0,
        "seed": 0,
        "threads": 1,
        "vocab_size": 1000,
        "max_length": 384,
        "assistant_only_loss": True,
        "model": dict(TINY.__dict__),
        "train": {"steps": 6, "batch_size": 4, "learning_rate": 0.01, "warmup_steps": 1, "max_seconds": 60},
        "eval": {"windows": 8, "prompts": 6, "max_new_tokens": 16},
        "output": str(root / "models" / "base"),
        "metrics": str(root / "reports" / "bootstrap.json"),
    }
    return params, run(params)


def test_the_stage_writes_a_loadable_model_its_card_and_metrics(stage, small_corpus_dir):
    params, metrics = stage
    written = json.loads(Path(params["metrics"]).read_text(encoding="utf-8"))
    assert written == metrics
    assert metrics["training"]["steps"] == 6 and metrics["vocab_size"] <= 1000
    assert metrics["parameters"] > 0
    assert metrics["held_out_loss"] > 0 and metrics["data"]["train_windows"] > 0
    assert metrics["generation"]["prompts"] == metrics["opening"]["prompts"] == 6
    assert 0 <= metrics["generation"]["format_valid_share"] <= 1
    assert metrics["data_version"]["sha256"] == directory_sha256(small_corpus_dir)
    assert metrics["data_version"]["dialogues"] == {"train": 96, "val": 12}

    assert all(path.stat().st_mode & 0o044 == 0o044 for path in Path(params["output"]).iterdir())  # readable by all
    model = AutoModelForCausalLM.from_pretrained(params["output"])
    tokenizer = AutoTokenizer.from_pretrained(params["output"])
    assert len(tokenizer) == metrics["vocab_size"] == model.config.vocab_size
    card = (Path(params["output"]) / "README.md").read_text(encoding="utf-8")
    assert metrics["data_version"]["sha256"] in card
    # the card's way to load the tokenizer gives the tokens the model was trained on
    assert f'tokenizer = PreTrainedTokenizerFast.from_pretrained("{params["output"]}")' in card
    text = "Book a table for two people on Friday at 18:30, please."
    saved = Tokenizer.from_file(str(Path(params["output"]) / "tokenizer.json")).encode(text).ids
    assert PreTrainedTokenizerFast.from_pretrained(params["output"])(text, add_special_tokens=False)["input_ids"] == saved
    assert f"| held-out loss, nats per assistant token (8 val windows) | {metrics['held_out_loss']} |" in card
    assert yaml.safe_load(card.split("```yaml\n")[1].split("```")[0]) == params


def test_a_rerun_replaces_the_model_directory_and_repeats_the_numbers(stage):
    params, metrics = stage
    stale = Path(params["output"]) / "stale.txt"
    stale.touch()
    again = run(params)
    assert not stale.exists()
    assert sorted(p.name for p in Path(params["output"]).parent.iterdir()) == ["base"]  # no staging left
    for key in ("parameters", "vocab_size", "training", "held_out_loss", "generation", "data"):
        assert again[key] == metrics[key], key


@pytest.mark.parametrize(
    "change, message",
    [
        ({"learning_rate": 0.1}, "unknown key"),
        ({"model": {"hidden_size": 30, "num_attention_heads": 4}}, "divisible"),
        ({"train": {"seed": 1}}, "bootstrap.seed"),
        ({"train": {"stepz": 1}}, "stepz"),
        ({"eval": {"prompt": 3}}, "bootstrap.eval"),
        ({"max_length": 2048}, "max_position_embeddings"),
    ],
)
def test_bad_params_are_config_errors(stage, change, message):
    params = {**stage[0], **change}
    with pytest.raises(ConfigError, match=message):
        bootstrap_config(params)


def test_generation_metrics_count_what_replies_do():
    gold = [TOOL_CALL, TOOL_CALL, "Here you are. <end>", "It is in the north."]
    replies = [
        Generation(TOOL_CALL, True, 20),  # the gold call
        Generation(TOOL_CALL.replace("north", "south"), True, 20),  # the gold tool, other arguments
        Generation("<clarify>Which area?</clarify>", True, 8),
        Generation('<tool_call>\n{"name": broken', False, 16),
    ]
    metrics = score_generations(replies, gold)
    assert metrics == {
        "prompts": 4,
        "format_valid_share": 0.75,
        "finished_share": 0.75,
        "same_kind_share": 0.5,
        "gold_tool_calls": 2,
        "same_tool_share": 1.0,
        "same_call_share": 0.5,
        "clarify_share": 0.25,
        "kinds": {"clarify": 1, "malformed": 1, "tool_call": 2},
    }
