"""The evaluate stage: a real Prefect flow run of tiny models against the agenda simulator,
its Parquet episodes, reports and markdown artifact; bad configuration fails early."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.errors import ConfigError
from stages.evaluate import eval_config, run

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("single_torch_thread")]


def params_for(root: Path, corpus_dir: Path, model_dir: Path, **changes) -> dict:
    params = {
        "source": str(corpus_dir),
        "split": "test",
        "max_goals": 2,
        "seeds": [0, 1],
        "max_exchanges": 3,
        "agent_format": "speakrl",
        "simulator": {"kind": "agenda", "max_stalled_turns": 2},
        "generation": {"temperature": 0.0, "max_new_tokens": 12, "batch_size": 8},
        "prompt": {"compact": True, "max_prompt_tokens": 300, "max_tool_results": 1},
        "models": {"first": {"path": str(model_dir)}, "second": {"path": str(model_dir)}},
        "output": {
            "episodes": str(root / "data" / "episodes" / "eval"),
            "metrics": str(root / "reports" / "eval.json"),
            "markdown": str(root / "reports" / "eval.md"),
            "plot": str(root / "reports" / "eval_plot.csv"),
        },
    }
    params.update(changes)
    return params


@pytest.fixture(scope="module")
def evaluated(prefect_api, small_corpus_dir, tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    report = run(params_for(root, small_corpus_dir, tiny_model_dir))
    return root, report


def test_the_stage_is_a_completed_prefect_flow_run_with_the_table_as_artifact(evaluated):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["evaluate"])), sort=FlowRunSort.START_TIME_DESC, limit=1)
    assert runs and runs[0].state.is_completed()
    # The installed client sends null for filters it was not given, which this server
    # version refuses (422); the REST call with every field set works.
    import httpx
    from prefect.settings import PREFECT_API_URL

    response = httpx.post(
        f"{PREFECT_API_URL.value()}/artifacts/filter",
        json={"artifacts": {"key": {"any_": ["evaluation"]}}, "limit": 20, "offset": 0, "sort": "CREATED_DESC"},
    )
    response.raise_for_status()
    artifacts = response.json()
    assert any(a["flow_run_id"] == str(runs[0].id) and a["type"] == "markdown" for a in artifacts), artifacts
    markdown = next(a for a in artifacts if a["flow_run_id"] == str(runs[0].id))["data"]
    assert "| first |" in markdown and "| second |" in markdown and "Success (%)" in markdown


def test_reports_episodes_and_sql(evaluated, timings_dir):
    root, report = evaluated
    metrics = json.loads((root / "reports" / "eval.json").read_text())
    assert metrics == json.loads(json.dumps(report))
    assert list(metrics["models"]) == ["first", "second"]
    for result in metrics["models"].values():
        assert result["runs"] == 2 and result["episodes"] == 4 and result["seeds"] == [0, 1]
        assert 0.0 <= result["success"]["mean"] <= 1.0 and result["turns"]["mean"] > 0
    # The same weights, greedy: the two entries play the same dialogues.
    assert metrics["models"]["first"]["turns"] == metrics["models"]["second"]["turns"]
    assert metrics["setup"]["goals"] == 2 and metrics["setup"]["max_exchanges"] == 3
    # Intervals over goals on every rate, paired tests between the models, and no clock readings
    # (speeds are in reports/timings/evaluate.json, which DVC does not hash).
    from tests.test_timings import timing_keys

    assert timing_keys(metrics) == []
    for result in metrics["models"].values():
        low, high = result["success"]["ci95_low"], result["success"]["ci95_high"]
        assert low <= result["success"]["mean"] <= high
        assert result["over_asking_per_dialogue"]["mean"] <= result["clarifications_per_dialogue"]["mean"]
    same = metrics["statistics"]["comparisons"]["success"]
    assert [(r["a"], r["b"], r["significant"]) for r in same] == [("first", "second", False)]
    timings = json.loads((timings_dir / "evaluate.json").read_text())
    assert set(timings["models"]) == {"first", "second"} and timings["models"]["first"]["episodes"] == 4
    markdown = (root / "reports" / "eval.md").read_text()
    assert markdown.startswith("# Simulated collaborative evaluation") and "Avg@2" in markdown
    assert "Needless questions / dialogue" in markdown and "## Significant differences" in markdown
    assert "Success (%): no significant difference (1 pair)" in markdown
    plot = (root / "reports" / "eval_plot.csv").read_text().splitlines()
    assert plot[0] == "method,success,success_std,turns,turns_std" and len(plot) == 3

    from stages.cli import main as askflow

    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        askflow(["sql", "--root", str(root), "select agent, count(*) as n, sum(n_turns) as turns from episodes group by 1 order by 1", "--format", "json"])
    rows = json.loads(out.getvalue())
    assert [r["agent"] for r in rows] == ["first", "second"] and all(r["n"] == 4 for r in rows)


def test_an_llm_user_simulator_plays_the_user_through_an_openai_endpoint(prefect_api, server, small_corpus_dir, tiny_model_dir, tmp_path):
    import pyarrow.parquet as pq

    params = params_for(
        tmp_path, small_corpus_dir, tiny_model_dir,
        max_goals=1, seeds=[0, 1], simulator={"kind": "goal_llm", "max_stalled_turns": 2}, models={"only": {"path": str(tiny_model_dir)}},
    )
    llm = {
        "cache_dir": str(tmp_path / "cache"),
        "roles": {"user_simulator": {"backend": "openai", "base_url": server.base_url, "model": "fake-model", "max_retries": 0}},
    }
    report = run(params, llm)
    assert report["models"]["only"]["episodes"] == 2

    episodes = pq.read_table(tmp_path / "data" / "episodes" / "eval" / "episodes.parquet").to_pylist()
    events = pq.read_table(tmp_path / "data" / "episodes" / "eval" / "episode_events.parquet").to_pylist()
    assert {e["simulator"] for e in episodes} == {"goal_llm"}
    # Every user turn is the endpoint's reply (the fake model's text), none a fallback.
    user_turns = [e for e in events if e["actor"] == "user"]
    assert user_turns and all(e["kind"] == "user" for e in user_turns)
    assert server.stats.requests == len(user_turns)
    # A re-run is answered from the response cache: no request, the same dialogues.
    rerun = run(params, llm)
    assert server.stats.requests == len(user_turns)
    assert rerun["models"]["only"]["turns"] == report["models"]["only"]["turns"]


def test_batched_and_one_at_a_time_play_the_same_episodes(small_corpus_dir, tiny_model_dir):
    from pipelines.env.tools import Database
    from pipelines.episodes import RunnerConfig, get_format
    from pipelines.evaluation.agent import PromptSpec
    from pipelines.evaluation.play import EvalPlan, held_out_goals, play_policy
    from pipelines.evaluation.policy import GenerationSpec, PolicySpec, load_policy
    from pipelines.simulators.agenda import AgendaSimulator
    from catalog.multiwoz_dir import load_multiwoz

    corpus = load_multiwoz(small_corpus_dir)
    database = Database(corpus.entities, corpus.taxi_options)
    goals = held_out_goals(corpus.dialogues, "test", 3)
    agent = load_policy(PolicySpec("tiny", path=str(tiny_model_dir), prompt=PromptSpec(max_prompt_tokens=300)), get_format("speakrl"), GenerationSpec(max_new_tokens=12))
    runner = RunnerConfig(max_exchanges=2)
    batched = play_policy(agent, goals, AgendaSimulator(database), database, EvalPlan(seeds=(0,), runner=runner))
    single = play_policy(agent, goals, AgendaSimulator(database), database, EvalPlan(seeds=(0,), runner=runner, batched=False))
    assert [e.episode_id for e in batched] == [e.episode_id for e in single] == [f"tiny/{d.dialogue_id}#0" for d in goals]
    assert [e.transcript() for e in batched] == [e.transcript() for e in single]


def test_the_policy_sees_the_compact_prompt_within_its_budget(tiny_model_dir):
    from pipelines.evaluation.agent import PolicyPromptAgent, PromptSpec
    from pipelines.policy.prompts import COMPACT_SYSTEM_PROMPT
    from pipelines.training.config import ModelSpec
    from pipelines.training.modeling import load_tokenizer

    tokenizer = load_tokenizer(ModelSpec(path=str(tiny_model_dir)))
    observation = {"count": 5, "results": [{"name": f"hotel {i}", "area": "north", "phone": "0123", "address": "x street"} for i in range(5)]}
    messages = [{"role": "system", "content": "a very long prompt " * 200}]
    for i in range(6):
        messages += [{"role": "user", "content": f"turn {i}: I need a hotel in the north"}, {"role": "assistant", "content": "<tool_call>{}</tool_call>"},
                     {"role": "user", "content": f"<tool_response>\n{json.dumps(observation)}\n</tool_response>"}]

    class Inner:
        name, format = "inner", None

    def length(chat):
        return len(tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"])

    # Room for the system prompt and about two messages of history.
    budget = length([{"role": "system", "content": COMPACT_SYSTEM_PROMPT}]) + 250
    agent = PolicyPromptAgent(Inner(), tokenizer, PromptSpec(max_prompt_tokens=budget, max_tool_results=2))
    seen = agent.messages(messages)
    assert seen[0] == {"role": "system", "content": COMPACT_SYSTEM_PROMPT}
    assert 1 < len(seen) < len(messages) and seen[-1]["content"].startswith("<tool_response>")
    assert len(json.loads(seen[-1]["content"].split("\n")[1])["results"]) == 2
    assert length(seen) <= budget
    # User turns outlive the agent's older calls and tool results: between the system prompt
    # and the latest tool result, only the most recent user turns that fit.
    kept_turns = [m["content"] for m in seen[1:-1]]
    assert len(kept_turns) > 1 and kept_turns == [f"turn {i}: I need a hotel in the north" for i in range(6 - len(kept_turns), 6)]
    assert PolicyPromptAgent(Inner(), tokenizer, PromptSpec(compact=False)).messages(messages) == messages
    # Evaluation prompts are the training prompts' format: the same rewrite, fitted to the context.
    from pipelines.training.config import DataSpec, ToolResultsSpec
    from pipelines.training.data import compact

    whole = PolicyPromptAgent(Inner(), tokenizer, PromptSpec(max_prompt_tokens=None, max_tool_results=2)).messages(messages)
    assert whole == compact(messages, DataSpec(sources=(), max_history_messages=None, tool_results=ToolResultsSpec(max_results=2)))
    # tool_result_fields None: the second result keeps its phone and address (to quote them), in
    # evaluation as in training.
    def second(chat):
        return json.loads(chat[-1]["content"].split("\n")[1])["results"][1]

    full = PolicyPromptAgent(Inner(), tokenizer, PromptSpec(max_prompt_tokens=None, max_tool_results=2, tool_result_fields=None)).messages(messages)
    assert second(whole) == {"name": "hotel 1", "area": "north"} and second(full) == observation["results"][1]
    assert full == compact(messages, DataSpec(sources=(), max_history_messages=None, tool_results=ToolResultsSpec(max_results=2, fields=None)))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"unknown_key": 1}, "unknown key(s) ['unknown_key']"),
        ({"models": {}}, "evaluate.models: required"),
        ({"models": {"x": {"path": "/nonexistent/model"}}}, "/nonexistent/model does not exist"),
        ({"models": {"x": {"path": "a", "hub_id": "b"}}}, "exactly one of path and hub_id"),
        ({"seeds": [1, 1]}, "distinct seeds"),
        ({"agent_format": "yaml"}, "unknown 'yaml'"),
        ({"simulator": {"kind": "oracle"}}, "unknown 'oracle'"),
        ({"generation": {"temperature": "hot"}}, "evaluate.generation.temperature: expected a number"),
    ],
)
def test_bad_configuration_fails_before_anything_runs(tmp_path, small_corpus_dir, tiny_model_dir, change, message):
    params = params_for(tmp_path, small_corpus_dir, tiny_model_dir, **change)
    with pytest.raises(ConfigError) as error:
        run(params)
    assert message in str(error.value)
    assert not (tmp_path / "reports").exists() and not (tmp_path / "data").exists()


def test_the_embedded_params_parse():
    import yaml

    from tests.conftest import REPO

    from catalog.profiles import merge

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    config = eval_config(params["evaluate"])  # the default profile
    assert [name for name, _ in config.models] == ["base", "sft", "dpo", "kto", "grpo"]
    assert config.seeds == (0,) and config.max_exchanges == 20 and config.split == "test"
    merge(params, yaml.safe_load((REPO / "profiles/full.yaml").read_text()), "", "full.yaml")
    full = eval_config(params["evaluate"])  # make run PROFILE=full: Avg@5 over 100 goals
    assert full.seeds == (0, 1, 2, 3, 4) and full.max_goals == 100
