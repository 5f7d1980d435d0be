"""The τ-bench Clarifier: prompts and parsers, task grounding, the runner's Clarifier step,
the backends, the datasets with their judge, the evaluation and the goal-aware GRPO reward.

Offline tests use the hand-made retail domain (tests/taubench/conftest.py); the real-data
ones read τ-bench from the repository (vendor/taubench)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter

import pytest

from pipelines.artifacts.validate import validate
from pipelines.clarifier import NO_NEED, RulesClarifier, parse_clarifier, render_decision
from pipelines.clarifier.agent import GIVE_UP, TauInformedAgent
from pipelines.clarifier.data import collect, dpo_rows, grpo_rows, sft_rows
from pipelines.clarifier.evaluation import DoNothingAgent, agent_steps, clarifications, summarize, table1_markdown
from pipelines.clarifier.grounding import QUESTIONS, missing_details, question_for, task_goal, utility
from pipelines.clarifier.judge import JudgeState, LLMGoalJudge, RulesGoalJudge
from pipelines.clarifier.prompts import ClarifierDecision, parse_preference, parse_scores
from pipelines.clarifier.tables import CLARIFIER_DPO, CLARIFIER_GRPO, CLARIFIER_SFT, table
from pipelines.env.world import TauBenchWorld
from pipelines.episodes import FunctionCallingFormat, episode_tables, run_episodes_sync
from pipelines.episodes.records import AGENT_END
from pipelines.episodes.tables import EPISODE_EVENTS, EPISODES
from pipelines.episodes.taubench import tau_runner_config, tau_specs
from pipelines.errors import DataError
from pipelines.simulators.taubench import TauRulesUser, asked_details, task_details


def _play(domain, tasks, clarifier=None, budget=3, patience=2):
    specs = tau_specs(tasks)
    agent = TauInformedAgent({s.episode_id: s.goal for s in specs}, FunctionCallingFormat(domain.tool_schemas), patience=patience)
    config = tau_runner_config(domain, max_exchanges=30 + budget)
    return run_episodes_sync(specs, agent, TauRulesUser(), TauBenchWorld(domain), config, clarifier, budget)


# -- prompts and parsers --------------------------------------------------------------------


def test_clarifier_answers_are_read_in_both_forms_and_anything_else_is_malformed():
    asks = parse_clarifier("<think>The order id is missing.</think>\nYES [QUESTION] Which  order? [/QUESTION]")
    assert (asks.question, asks.reasoning, asks.malformed) == ("Which order?", "The order id is missing.", False)
    assert asks.final == "YES [QUESTION]Which order?[/QUESTION]"
    for text in ("NO", "NO NEED TO ASK", "<think>fine</think> no need to ask."):
        assert not parse_clarifier(text).asks and not parse_clarifier(text).malformed
    for text in ("YES [QUESTION][/QUESTION]", "Sure, ask for the order.", "YES Which order?", "NO. But maybe ask."):
        decision = parse_clarifier(text)
        assert decision.malformed and not decision.asks, text
    assert parse_clarifier(render_decision("Which order?", "why")).question == "Which order?"
    assert render_decision(None) == NO_NEED


def test_judge_replies_are_parsed_strictly():
    assert [parse_preference(f"PREFERENCE: {p}\nREASON: x") for p in ("A", "[B]", "TIE", "BOTH_BAD")] == ["A", "B", "TIE", "BOTH_BAD"]
    assert parse_preference("I prefer A") is None and parse_preference("PREFERENCE: C") is None
    assert parse_scores('"Ranking": [1, 2]\n"Scores": [12, -1]', 2) == [10.0, 0.0]
    assert parse_scores('"Scores": [1, 2, 3]', 2) is None and parse_scores("7 and 3", 2) is None


# -- grounding --------------------------------------------------------------------------------


def test_every_question_makes_the_rules_user_give_exactly_its_detail(mini_retail):
    names = set()
    for task in mini_retail.tasks["test"]:
        details = task_details(task)
        for detail in details:
            assert [d.name for d in asked_details(question_for(detail), details)] == [detail.name]
            names.add(detail.name)
    assert names <= set(QUESTIONS)


def test_every_question_hits_its_detail_on_every_real_task(retail, airline):
    for task in [*retail.all_tasks(), *airline.all_tasks()]:
        details = task_details(task)
        for detail in details:
            asked = [d.name for d in asked_details(question_for(detail), details)]
            assert asked == [detail.name], (task.task_id, detail.name, asked)


def test_missing_details_follow_what_the_user_said_and_the_utility_ranks_questions(mini_retail):
    task = mini_retail.tasks["test"][0]  # Ann Lee: find her by name and zip, cancel #W1 (no longer needed)
    opening = "User: I'd like to cancel an order."
    assert [d.name for d in missing_details(task, opening)] == ["name_zip", "order_id", "reason"]
    later = opening + "\nUser: I'm Ann Lee, zip code 78701.\nUser: The order is #W1."
    assert [d.name for d in missing_details(task, later)] == ["reason"]
    assert utility(task, later, QUESTIONS["reason"]) == (10.0, "asks_most_urgent")
    assert utility(task, opening, QUESTIONS["reason"]) == (7.0, "asks_missing")
    assert utility(task, later, QUESTIONS["order_id"]) == (2.0, "asks_known")
    assert utility(task, later, "Could you confirm the price of everything?") == (1.0, "asks_nothing_needed")
    assert utility(task, later, None) == (3.0, "no_need_but_missing")
    assert utility(task, later + "\nUser: It's no longer needed.", None) == (10.0, "no_need_correct")
    assert utility(task, later, None, malformed=True)[0] == 0.0


# -- the Clarifier in the runner --------------------------------------------------------------


def test_without_a_clarifier_the_informed_agent_waits_and_gives_up(mini_retail):
    (episode,) = _play(mini_retail, mini_retail.tasks["test"][:1])
    assert not episode.success and episode.ended_by == AGENT_END
    assert [e.text for e in episode.events if e.kind == "respond"][-1] == GIVE_UP
    assert clarifications(episode) == 0 and not any(e.actor == "clarifier" for e in episode.events)


def test_the_rules_clarifier_asks_after_tool_calls_and_its_questions_reach_the_user(mini_retail):
    (episode,) = _play(mini_retail, mini_retail.tasks["test"][:1], RulesClarifier())
    assert episode.success
    events = list(episode.events)
    decisions = [i for i, e in enumerate(events) if e.actor == "clarifier" and e.kind == "think"]
    assert decisions and all(events[i - 1].kind == "observation" for i in decisions)  # only right after a tool result
    asked = [(i, e) for i, e in enumerate(events) if e.actor == "clarifier" and e.kind == "clarify"]
    assert [e.text for _, e in asked] == [QUESTIONS["order_id"], QUESTIONS["reason"]]
    for i, _ in asked:  # the user answers the question next
        assert events[i + 1].kind == "user"
    assert "#W1" in events[asked[0][0] + 1].text and "no longer needed" in events[asked[1][0] + 1].text
    # Clarifications are not agent steps, and not the agent's own clarifications either.
    assert (clarifications(episode), episode.n_clarifications) == (2, 0)
    assert agent_steps(episode) == sum(1 for e in events if e.actor == "agent" and e.kind in ("tool_call", "respond"))
    tables = episode_tables([episode])
    assert validate(tables["episodes"], EPISODES).success
    assert validate(tables["episode_events"], EPISODE_EVENTS, {"episodes": tables["episodes"]}).success


@pytest.mark.parametrize("budget", [0, 1])
def test_the_budget_bounds_questions_per_episode(mini_retail, budget):
    (episode,) = _play(mini_retail, mini_retail.tasks["test"][:1], RulesClarifier(), budget=budget, patience=1)
    assert clarifications(episode) == budget
    assert not episode.success  # with one turn of patience, what was not asked for comes too late
    (full,) = _play(mini_retail, mini_retail.tasks["test"][:1], RulesClarifier(), budget=2, patience=1)
    assert full.success and clarifications(full) == 2


def test_a_forked_episode_keeps_its_own_clarifier_questions(mini_retail):
    from pipelines.episodes.runner import EpisodeState

    spec = tau_specs(mini_retail.tasks["test"][:1])[0]
    agent = TauInformedAgent({spec.episode_id: spec.goal})
    state = EpisodeState.start(spec, agent, TauRulesUser(), TauBenchWorld(mini_retail), tau_runner_config(mini_retail))
    state.clarifier_questions.append("q1")
    twin = state.fork()
    twin.clarifier_questions.append("q2")
    assert state.clarifier_questions == ["q1"]


def test_the_llm_clarifier_sends_the_papers_prompt_and_an_unreadable_answer_asks_nothing(mini_retail):
    """The openai backend against the local fake server, whose replies are not Clarifier
    answers: every decision is malformed, asks nothing and is counted; episodes go on."""
    from pipelines.clarifier import LLMClarifier
    from pipelines.llm import ClientConfig, LLMClient
    from pipelines.llm.testing.fake_server import FakeOpenAIServer

    with FakeOpenAIServer() as server:
        client = LLMClient(ClientConfig(base_url=server.base_url, model="fake-clarifier", timeout_s=5.0, max_retries=1, backoff_base_s=0.001))
        episodes = _play(mini_retail, mini_retail.tasks["test"], LLMClarifier(client))
        bodies = server.stats.bodies
    assert bodies and all(b["messages"][0]["content"].startswith("You are a Clarification Assistant") for b in bodies)
    assert any("Tool[find_user_id_by_name_zip]: ann_lee_1" in b["messages"][0]["content"] for b in bodies)
    decisions = [e for ep in episodes for e in ep.events if e.actor == "clarifier"]
    assert decisions and all(e.kind == "think" and e.detail == "malformed" for e in decisions)
    assert summarize("openai", "retail", episodes, 0).malformed == len(decisions)


# -- datasets ---------------------------------------------------------------------------------


def _collect(domain, tasks, judge=None):
    return collect(
        {"train": tasks}, TauBenchWorld(domain), lambda by_id: TauInformedAgent(by_id), TauRulesUser(), tau_runner_config(domain, max_exchanges=33),
        RulesClarifier(), (RulesClarifier(0.5, 0), RulesClarifier(0.5, 1)), judge or RulesGoalJudge(),
    )


def test_datasets_from_teacher_episodes_keep_only_informative_judgements(mini_retail):
    data = _collect(mini_retail, mini_retail.tasks["train"])
    metrics = data.metrics()
    assert metrics["episodes"] == 2 and metrics["states"] == len(data.states) > 0
    outcomes = metrics["judge_outcomes"]
    assert sum(outcomes.values()) == metrics["states"]
    assert metrics["dpo_pairs"] == outcomes["A"] + outcomes["B"] == len(dpo_rows(data))
    assert metrics["grpo_contexts"] == outcomes["A"] + outcomes["B"] + outcomes["BOTH_BAD"] == len(grpo_rows(data))
    for row in dpo_rows(data):
        state = next(s for s in data.states if s.state_id == row["state_id"])
        judge_state = JudgeState(state.context.history, task_goal(state.task))
        chosen, rejected = parse_clarifier(row["chosen"][0]["content"]), parse_clarifier(row["rejected"][0]["content"])
        (u_c,), (u_r,) = RulesGoalJudge().score(judge_state, [chosen]), RulesGoalJudge().score(judge_state, [rejected])
        assert u_c > u_r
    for row in grpo_rows(data):  # only x and G*: no candidate survives
        assert set(row) == {"state_id", "dialogue_id", "split", "prompt", "history", "goal", "screen"}
        assert json.loads(row["goal"])["instruction"] and row["prompt"][0]["content"].endswith("/think")
    for rows, spec in ((sft_rows(data), CLARIFIER_SFT), (dpo_rows(data), CLARIFIER_DPO), (grpo_rows(data), CLARIFIER_GRPO)):
        if rows:
            assert validate(table(rows, spec), spec).success, spec.name
    kinds = Counter(r["kind"] for r in sft_rows(data))
    assert kinds["ask"] == sum(s.teacher.asks for s in data.states)


def test_an_llm_judge_that_cannot_answer_is_counted_and_keeps_no_pair(mini_retail):
    from pipelines.llm import ClientConfig, LLMClient
    from pipelines.llm.testing.fake_server import FakeOpenAIServer

    with FakeOpenAIServer() as server:
        client = LLMClient(ClientConfig(base_url=server.base_url, model="fake-judge", timeout_s=5.0, max_retries=1, backoff_base_s=0.001))
        data = _collect(mini_retail, mini_retail.tasks["train"], LLMGoalJudge(client))
        prompts = [b["messages"][0]["content"] for b in server.stats.bodies]
    assert prompts and all("PREFERENCE: [A/B/TIE/BOTH_BAD]" in p and "User Detailed Requirement" in p for p in prompts)
    assert all('"instruction"' in p for p in prompts)  # the judge sees G*
    assert data.metrics()["judge_outcomes"]["unparseable"] == data.metrics()["states"]
    assert dpo_rows(data) == [] and grpo_rows(data) == []


def _stage_params(tmp_path, root):
    return {"taubench": str(root), "splits": {"train": "train", "val": "dev"}, "output": str(tmp_path / "out"),
            "metrics": str(tmp_path / "clarifier_data.json"), "cache_dir": str(tmp_path / "cache")}


def test_the_data_stage_publishes_three_validated_artifacts(tmp_path, mini_root, monkeypatch):
    from stages.clarifier_data import run
    from catalog.io import read_artifact

    monkeypatch.chdir(tmp_path)
    metrics = run(_stage_params(tmp_path, mini_root))
    for name in ("clarifier_sft", "clarifier_dpo", "clarifier_grpo"):
        assert read_artifact(tmp_path / "out" / f"{name}.parquet").num_rows == metrics["rows"][name] > 0
    splits = set(read_artifact(tmp_path / "out" / "clarifier_sft.parquet").column("split").to_pylist())
    assert splits == {"train", "val"}
    assert json.loads((tmp_path / "clarifier_data.json").read_text())["judge_outcomes"] == metrics["judge_outcomes"]


def test_the_data_stage_says_where_taubench_is_missing_and_refuses_the_test_split(tmp_path):
    from pipelines.errors import ConfigError
    from stages.clarifier_data import run

    with pytest.raises(DataError, match=r"nowhere.*τ-bench data not found \(params.yaml clarifier.data.taubench\)"):
        run(_stage_params(tmp_path, tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="test split is for evaluation only"):
        run(_stage_params(tmp_path, tmp_path) | {"splits": {"train": "test"}})
    assert not (tmp_path / "out").exists()


def test_the_data_stage_on_real_retail_train(tmp_path, taubench_root, monkeypatch):
    from stages.clarifier_data import run

    monkeypatch.chdir(tmp_path)
    metrics = run(_stage_params(tmp_path, taubench_root))
    assert metrics["episodes"] == 520  # 500 train + 20 dev tasks
    outcomes = metrics["judge_outcomes"]
    assert all(outcomes[k] > 0 for k in ("A", "B", "TIE", "BOTH_BAD")) and outcomes["unparseable"] == 0
    assert metrics["rows"] == {"clarifier_sft": metrics["states"], "clarifier_dpo": outcomes["A"] + outcomes["B"],
                               "clarifier_grpo": outcomes["A"] + outcomes["B"] + outcomes["BOTH_BAD"]}
    assert 0 < metrics["sft"]["no_need"] < metrics["sft"]["ask"]


# -- evaluation -------------------------------------------------------------------------------


def test_evaluation_on_real_test_sets_reports_the_floor_and_labels_the_oracle(tmp_path, taubench_root, monkeypatch):
    """The defaults: the policy agent (never sees the solution), the instruction user, no
    Clarifier and the oracle rules Clarifier; two seeds, pass@1 with its bootstrap interval."""
    from stages.clarifier_eval import run

    monkeypatch.chdir(tmp_path)
    metrics = run({"taubench": str(taubench_root), "seeds": [0, 1], "output": "episodes", "metrics": "eval.json", "markdown": "eval.md"})
    runs = metrics["runs"]
    assert metrics["setting"]["agent"] == "policy" and metrics["setting"]["oracle_rows"] == ["oracle_rules"]
    assert (runs["none"]["retail"]["floor_passed"], runs["none"]["airline"]["floor_passed"]) == (7, 19)
    for domain in ("retail", "airline"):
        none = runs["none"][domain]
        assert none["avg_clarify"] == 0 and 0 < runs["oracle_rules"][domain]["avg_clarify"] <= 3
        assert none["seeds"] == 2 and len(none["passed_by_seed"]) == 2 and sum(none["passed_by_seed"]) == none["passed"]
        assert none["ci95_low"] <= none["pass_at_1"] <= none["ci95_high"]
    assert runs["none"]["retail"]["passed"] / 2 > runs["none"]["retail"]["floor_passed"]  # the agent does solve some tasks
    markdown = (tmp_path / "eval.md").read_text()
    assert "| oracle_rules |" in markdown and "ORACLE upper bound" in markdown and "(6.1; " in markdown
    assert "ORACLE" not in markdown.splitlines()[0]


def test_table1_layout_puts_the_floor_beside_each_pass_rate(mini_retail):
    episodes = _play(mini_retail, mini_retail.tasks["test"], RulesClarifier())
    floor = run_episodes_sync(tau_specs(mini_retail.tasks["test"]), DoNothingAgent(FunctionCallingFormat()), TauRulesUser(),
                              TauBenchWorld(mini_retail), tau_runner_config(mini_retail))
    result = summarize("rules", "retail", episodes, sum(e.success for e in floor))
    assert result.floor_passed == 1  # the read-only status task
    text = table1_markdown([result], ["retail"], ["a note"])
    low, high = result.ci95
    assert f"| rules | {100 * result.pass_at_1:.1f} [{100 * low:.1f}, {100 * high:.1f}] (50.0; {result.passed}/2) |" in text and "- a note" in text
    assert text.splitlines()[2].endswith("| 0.0 |")  # the rules Clarifier's answers are all readable
    unreadable = dataclasses.replace(result, clarifier="hf", malformed=1)  # one answer of all consultations unreadable
    row = table1_markdown([unreadable], ["retail"]).splitlines()[2]
    assert row.endswith(f"| {100 / (result.consultations * result.n_tasks):.1f} |")


# -- goal-aware GRPO reward -------------------------------------------------------------------


def test_goal_aware_reward_scores_groups_against_the_goal_and_centres_them(mini_retail):
    from pipelines.rewards.clarifier import centred_advantages
    from pipelines.rewards import REWARD_FUNCTIONS, resolve_reward
    from pipelines.training.config import GRPOObjective
    from pipelines.training.data import reward_columns

    reward = resolve_reward("clarifier_goal")
    assert reward is REWARD_FUNCTIONS["clarifier_goal"]
    task = mini_retail.tasks["test"][0]
    goal = json.dumps(task_goal(task))
    history = "User: I'd like to cancel an order.\nUser: I'm Ann Lee, zip code 78701.\nTool[find_user_id_by_name_zip]: ann_lee_1"
    group = [f"<think>x</think>YES [QUESTION]{QUESTIONS['order_id']}[/QUESTION]", f"YES [QUESTION]{QUESTIONS['reason']}[/QUESTION]",
             "NO NEED TO ASK", "garbage"]
    other = ["NO"]
    completions = [[{"role": "assistant", "content": c}] for c in group + other]
    done = history + "\nUser: The order is #W1.\nUser: It's no longer needed."
    logged = {}
    rewards = reward(["p"] * 5, completions, goal=[goal] * 5, history=[history] * 4 + [done], log_metric=logged.__setitem__)
    assert rewards == [1.0, 0.7, 0.3, 0.0, 1.0]
    assert centred_advantages(rewards[:4]) == [0.5, 0.2, -0.2, -0.5]
    assert logged["clarifier_goal/asked"] == 0.4 and logged["clarifier_goal/malformed"] == 0.2
    assert reward_columns(GRPOObjective(rewards=(("clarifier_goal", 1.0),))) == ("goal",)
    with pytest.raises(ValueError, match="columns 'goal' and 'history'"):
        reward(["p"], ["NO"])


def test_llm_goal_judge_reward_leaves_an_unscored_group_out(mini_retail):
    from pipelines.llm import ClientConfig, LLMClient
    from pipelines.llm.testing.fake_server import FakeOpenAIServer
    from pipelines.rewards import resolve_reward

    goal = json.dumps(task_goal(mini_retail.tasks["test"][0]))
    with FakeOpenAIServer() as server:
        client = LLMClient(ClientConfig(base_url=server.base_url, model="fake-judge", timeout_s=5.0, max_retries=1, backoff_base_s=0.001))
        reward = resolve_reward("clarifier_goal_llm", client)
        rewards = reward(["p"] * 2, ["NO", "YES [QUESTION]Which order?[/QUESTION]"], goal=[goal] * 2, history=["User: hi"] * 2)
        prompt = server.stats.bodies[0]["messages"][0]["content"]
    assert rewards == [None, None] and reward.judge.stats.unparseable == 1
    assert "1. NO NEED TO ASK\n2. YES [QUESTION]Which order?[/QUESTION]" in prompt and '"instruction"' in prompt


def test_rules_judge_scores_the_extracted_final_output_only(mini_retail):
    task = mini_retail.tasks["test"][0]
    state = JudgeState("User: I'd like to cancel an order.", task_goal(task))
    with_reasoning = parse_clarifier("<think>Ask about the order id maybe.</think>NO NEED TO ASK")
    assert RulesGoalJudge().score(state, [with_reasoning, ClarifierDecision(None)]) == [3.0, 3.0]


@pytest.mark.usefixtures("single_torch_thread")
def test_a_local_model_clarifier_plays_through_the_eval_stage(tmp_path, mini_root, tiny_model_dir, monkeypatch):
    """The hf backend (what a trained Clarifier runs on), here the tiny test model: its
    answers are not Clarifier answers, so each consultation is recorded as malformed and
    asks nothing; the table still has its row. A missing model directory is an error."""
    from stages.clarifier_eval import run

    monkeypatch.chdir(tmp_path)
    params = {"taubench": str(mini_root), "domains": {"retail": "test"}, "output": "episodes", "metrics": "eval.json", "markdown": "eval.md",
              "clarifiers": {"tiny": {"backend": "hf", "model_path": str(tiny_model_dir), "sampling": {"temperature": 0.0, "max_tokens": 8}}}}
    metrics = run(params)
    tiny = metrics["runs"]["tiny"]["retail"]
    assert tiny["avg_consultations"] > 0 and tiny["clarifier_malformed"] == round(tiny["avg_consultations"] * 2)
    assert "| tiny |" in (tmp_path / "eval.md").read_text()
    with pytest.raises(DataError, match="Clarifier model not found"):
        run(params | {"clarifiers": {"sft": {"backend": "hf", "model_path": str(tmp_path / "models" / "clarifier_sft")}}})


def test_the_eval_stage_takes_any_agent_backbone_by_params(tmp_path, mini_root, monkeypatch):
    """An openai agent (here the local fake server) instead of the offline informed one:
    same stage, same table, and the notes say the numbers are a model's."""
    from pipelines.llm.testing.fake_server import FakeOpenAIServer
    from stages.clarifier_eval import run

    monkeypatch.chdir(tmp_path)
    with FakeOpenAIServer() as server:
        agent = {"kind": "openai", "base_url": server.base_url, "model": "fake-agent", "max_retries": 0, "timeout_s": 5.0}
        metrics = run({"taubench": str(mini_root), "domains": {"retail": "test"}, "agent": agent, "output": "episodes",
                       "metrics": "eval.json", "markdown": "eval.md"})
        assert server.stats.bodies and all(b["model"] == "fake-agent" for b in server.stats.bodies)
    assert metrics["setting"]["agent"] == "openai" and set(metrics["runs"]) == {"none", "oracle_rules"}
    text = (tmp_path / "eval.md").read_text()
    assert "A model backbone" in text and "mechanism check" not in text


def test_an_llm_teacher_with_unreadable_answers_publishes_nothing_and_an_outage_stops_the_stage(tmp_path, mini_root, monkeypatch):
    """The openai teacher over the fake server: its answers are not Clarifier answers, so no
    SFT example exists and the stage publishes nothing (every artifact needs rows); a
    teacher endpoint that is down is an outage (exit 1), not an empty dataset."""
    from pipelines.errors import LLMOutage, ValidationFailed
    from pipelines.llm.testing.fake_server import FakeOpenAIServer
    from stages.clarifier_data import run

    monkeypatch.chdir(tmp_path)
    with FakeOpenAIServer() as server:
        teacher = {"backend": "openai", "base_url": server.base_url, "model": "fake-teacher", "max_retries": 0, "timeout_s": 5.0}
        with pytest.raises(ValidationFailed, match="clarifier_sft"):
            run(_stage_params(tmp_path, mini_root) | {"teacher": teacher})
        assert any("You are a Clarification Assistant" in b["messages"][0]["content"] for b in server.stats.bodies)
    down = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m", "max_retries": 0, "timeout_s": 1.0}
    with pytest.raises(LLMOutage, match="clarifier_data: .* clarifier LLM call"):
        run(_stage_params(tmp_path, mini_root) | {"teacher": down})
    assert not (tmp_path / "out").exists()


def test_prompt_cut_is_validated_and_cuts_only_tool_outputs():
    from pipelines.clarifier.prompts import clarifier_messages, prompt_cut
    from pipelines.errors import ConfigError

    assert prompt_cut(None) == (None, None) and prompt_cut({"max_tool_chars": 300, "max_tool_outputs": 1}) == (300, 1)
    for bad in ({"max_tool_chars": 0}, {"max_tool_outputs": True}, {"max_tool_char": 3}, [300]):
        with pytest.raises(ConfigError, match="clarifier.prompt"):
            prompt_cut(bad)
    history = "User: cancel #W1\nTool[get_order_details]: " + "x" * 50 + "\nAgent: ok\nTool[get_user_details]: " + "y" * 50
    cut = clarifier_messages(history, 10, 1)[0]["content"]
    assert "User: cancel #W1" in cut and "Agent: ok" in cut
    assert "Tool[get_order_details]: …" in cut and "Tool[get_user_details]: " + "y" * 10 + "…" in cut
    assert clarifier_messages(history)[0]["content"].count("x") >= 50


# -- a model Clarifier's prompt that outgrows the model's positions ------------------------------


def test_hf_clarifier_compacts_a_history_past_the_model_positions_keeping_what_the_user_said(tiny_model_dir, single_torch_thread):
    """The first user line and the latest lines stay; the oldest agent and tool lines go first;
    a prompt that cannot fit even so is not sent and counts as unreadable."""
    from pipelines.clarifier import HFClarifier
    from pipelines.episodes.clarify import ClarifyContext
    from pipelines.llm import HFBackend, HFConfig, SamplingParams

    backend = HFBackend.from_config(HFConfig(model_path=str(tiny_model_dir)))
    sent: list = []
    generate = backend.generate
    backend.generate = lambda conversations, *args, **kwargs: sent.extend(conversations) or generate(conversations, *args, **kwargs)
    clarifier = HFClarifier(backend, SamplingParams(temperature=0.0, max_tokens=8))
    filler = " ".join(["lorem"] * 30)
    lines = ["User: I want to return an order."]
    for i in range(40):
        lines += [f"Agent: step {i} {filler}", f"Tool[get_order_details]: {{\"n\": {i}, \"x\": \"{filler}\"}}"]
    lines += ["User: The order is #W42.", "Agent: [TOOL_CALL: get_order_details(order_id=#W42)]", 'Tool[get_order_details]: {"status": "delivered"}']
    long = ClarifyContext("e#0", 0, 0, "\n".join(lines), "get_order_details")
    hopeless = ClarifyContext("e#1", 0, 0, "User: " + " ".join(["word"] * 3000), "get_order_details")

    decisions = asyncio.run(clarifier.decide([long, hopeless]))

    assert (clarifier.compacted, clarifier.too_long) == (2, 1)
    assert len(sent) == 1 and decisions[1].malformed and decisions[1].question is None
    prompt = sent[0][0]["content"]
    assert "User: I want to return an order." in prompt and "User: The order is #W42." in prompt
    assert 'Tool[get_order_details]: {"status": "delivered"}' in prompt and "Agent: step 0 " not in prompt and "…" in prompt
    assert len(backend.tokenizer(backend.render(sent[0]))["input_ids"]) + 8 <= backend.model.config.max_position_embeddings
