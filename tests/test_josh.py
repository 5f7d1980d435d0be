"""JOSH: Algorithm 1's branching, collapse and labelling, the SFT/KTO extraction, the rules
agent's ToolWOZ calls and the ToolWOZ goal split."""

from __future__ import annotations

import asyncio
import json
from typing import Sequence

import pytest

from pipelines.env.toolwoz import API_SPECS, ToolWozDatabase, toolwoz_tools
from pipelines.episodes.agents import AgentContext, AgentOutput
from pipelines.episodes.formats import AgentAction, get_format
from pipelines.josh.agent import RulesPolicy, RulesToolWozAgent
from pipelines.josh.beam import (
    ENDED,
    EXPANDED,
    FAILED,
    GOLDEN,
    PRUNED,
    ROOT,
    SUCCESSFUL,
    BeamConfig,
    JoshTree,
    TreeNode,
    children_per_leaf,
    collapse,
    harvest_tree,
    label_tree,
    node_seed,
)
from pipelines.josh.goals import JoshGoal, evaluation_goals, harvest_goals, toolwoz_goals
from pipelines.josh.tables import JOSH_KTO, JOSH_SFT, JOSH_TREES, josh_tables, kto_rows, sft_rows
from pipelines.artifacts.validate import validate
from pipelines.env.tools import Database
from pipelines.simulators.agenda import SimulatorSpec, AgendaSimulator
from tests.test_toolwoz import CHINESE_GOAL, DB, ENTITIES, belief, dialogue, shared_file

# --------------------------------------------------------------------------------------
# Branching and collapse
# --------------------------------------------------------------------------------------


def test_branching_factor_two_while_twice_the_leaves_fit_the_beam():
    config = BeamConfig(max_beam=8, branching_factor=2)
    assert [children_per_leaf(n, config) for n in (1, 2, 3, 4, 5, 8)] == [2, 2, 2, 2, 1, 1]
    narrow = BeamConfig(max_beam=4, branching_factor=3)
    assert [children_per_leaf(n, narrow) for n in (1, 2)] == [3, 1]


def test_first_leaf_left_to_right_wins_and_consumes_every_goal_it_met():
    # Leaf 1 met goals 0 and 2 in one sub-step: both are consumed (the reference kept only
    # the first); leaf 2 met goal 2 too, so it is successful-but-not-golden; leaf 3 met
    # only goal 1, which was not consumed, so it gets no partial credit.
    assert collapse([set(), {0, 2}, {2}, {1}]) == (1, frozenset({0, 2}), (2,))
    assert collapse([set(), set(), set()]) is None
    assert collapse([{3}]) == (0, frozenset({3}), ())


def test_sibling_seeds_are_distinct_and_stable():
    seeds = {node_seed("MUL0001.json", 0, f"0.{b}") for b in range(2)} | {node_seed("MUL0001.json", 0, f"0.1.{b}") for b in range(2)}
    assert len(seeds) == 4
    assert node_seed("MUL0001.json", 0, "0.1") == node_seed("MUL0001.json", 0, "0.1")
    assert node_seed("MUL0001.json", 1, "0.1") != node_seed("MUL0001.json", 0, "0.1")


# --------------------------------------------------------------------------------------
# Labelling and extraction on a hand-built tree
# --------------------------------------------------------------------------------------


def _node(node_id: str, *, status: str = EXPANDED, hit=(), consumed=(), shared=False, errors=0, reply: str | None = None) -> TreeNode:
    parent = node_id.rsplit(".", 1)[0] if "." in node_id else None
    depth = node_id.count(".")
    messages = []
    steps = []
    if parent is not None:
        messages = [{"role": "user", "content": f"user says at depth {depth}"},
                    {"role": "assistant", "content": reply or f"reply of {node_id}"}]
        steps = [{"offset": 1, "malformed": False}]
    return TreeNode(node_id, parent, depth, int(node_id[-1]) if parent else 0, 0, status=status, messages=messages, steps=steps,
                    goals_hit=list(hit), consumed=list(consumed), shared_hit=shared, errors=errors)


def hand_built_tree(*, golden_error: bool = False) -> JoshTree:
    """Goal APIs 0 and 1.

    * round 1: 0.1 consumes goal 0; its sibling 0.0 met it too (successful, not golden);
    * round 2: no hit, both children of 0.1 stay leaves;
    * round 3: 0.1.1.0 consumes goal 1 (the last collapse); 0.1.0.0 is pruned; 0.1.1.1 sampled
      exactly what 0.1.1.0 said.

    The golden path is 0 -> 0.1 -> 0.1.1 -> 0.1.1.0; 0.1.0 is a failed sibling of the golden
    0.1.1 whose subtree met nothing."""
    nodes = [
        _node("0"),
        _node("0.0", status=PRUNED, hit=[0], shared=True),
        _node("0.1", hit=[0], consumed=[0]),
        _node("0.1.0"),
        _node("0.1.1", errors=1 if golden_error else 0),
        _node("0.1.0.0", status=PRUNED),
        _node("0.1.1.0", status="open", hit=[1], consumed=[1]),
        _node("0.1.1.1", status=PRUNED, reply="reply of 0.1.1.0"),  # sampled the same output as the golden node
    ]
    label_tree(nodes)
    return JoshTree("MUL0001.json", "train", ["restaurant"], [{"name": "search_restaurant", "parameters": {}},
                    {"name": "book_restaurant", "parameters": {}}], "SYSTEM", nodes, 1.0, 10, 5)


def test_labels_golden_path_successful_and_failed():
    tree = hand_built_tree()
    labels = {n.node_id: n.label for n in tree.nodes}
    assert labels == {
        "0": ROOT, "0.0": SUCCESSFUL, "0.1": GOLDEN, "0.1.0": FAILED, "0.1.1": GOLDEN,
        "0.1.0.0": FAILED, "0.1.1.0": GOLDEN, "0.1.1.1": FAILED,
    }


def test_no_collapse_means_no_golden_path():
    nodes = [_node("0"), _node("0.0", status="open"), _node("0.1", status="open")]
    assert label_tree(nodes) == []
    assert [n.label for n in nodes] == [ROOT, FAILED, FAILED]


def test_sft_rows_are_the_golden_path_with_its_history():
    rows = sft_rows(hand_built_tree())
    assert [r["node_id"] for r in rows] == ["0.1", "0.1.1", "0.1.1.0"]
    last = rows[-1]
    # System message, then the two exchanges before, then this exchange's user turn.
    assert [m["role"] for m in last["prompt"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert last["prompt"][2]["content"] == "reply of 0.1"
    assert last["completion"] == [{"role": "assistant", "content": "reply of 0.1.1.0"}]


def test_error_marker_or_partial_reward_on_the_golden_path_gives_no_training_data():
    assert sft_rows(hand_built_tree(golden_error=True)) == []
    assert kto_rows(hand_built_tree(golden_error=True)) == []
    partial = hand_built_tree()
    partial.reward = 0.5
    assert sft_rows(partial) == [] and kto_rows(partial) == []
    assert len(sft_rows(partial, min_reward=0.5)) == 3


def test_kto_negatives_are_failed_siblings_at_a_positive_prompt_only():
    rows = kto_rows(hand_built_tree())
    desirable = [(r["node_id"], r["step"]) for r in rows if r["label"]]
    undesirable = [(r["node_id"], r["golden_node_id"]) for r in rows if not r["label"]]
    assert desirable == [("0.1", 0), ("0.1.1", 0), ("0.1.1.0", 0)]
    # 0.0 met a goal (partial credit, never negative); 0.1.1.1 said exactly what the golden
    # node said (a row both desirable and undesirable is dropped); 0.1.0 is the only one.
    assert undesirable == [("0.1.0", "0.1.1")]
    negative = next(r for r in rows if not r["label"])
    positive = next(r for r in rows if r["node_id"] == "0.1.1")
    assert negative["prompt"] == positive["prompt"] and negative["completion"] != positive["completion"]


def test_a_sibling_whose_subtree_met_a_goal_is_not_a_negative():
    tree = hand_built_tree()
    for node in tree.nodes:
        if node.node_id == "0.1.0.0":
            node.goals_hit = [1]  # met the booking goal, but its branch lost
    assert all(r["label"] for r in kto_rows(tree))


def test_tables_pass_their_suites():
    tables = josh_tables([hand_built_tree()])
    for spec in (JOSH_TREES, JOSH_SFT, JOSH_KTO):
        report = validate(tables[spec.name], spec, {"josh_trees": tables["josh_trees"]})
        assert report.success, report.to_text()
    trees = tables["josh_trees"].to_pylist()
    root = next(r for r in trees if r["node_id"] == "0")
    assert root["parent_id"] is None and root["label"] == ROOT
    assert next(r for r in trees if r["node_id"] == "0.1.1.0")["consumed"] == ["book_restaurant#1"]


# --------------------------------------------------------------------------------------
# Algorithm 1 end to end with a scripted agent (real runner, environment, simulator)
# --------------------------------------------------------------------------------------

GOAL_ID = "PMUL0001.json"
NODE_IDS = ["0"]
for _ in range(4):
    NODE_IDS += [f"{n}.{b}" for n in NODE_IDS for b in (0, 1) if f"{n}.{b}" not in NODE_IDS]


class ScriptedAgent:
    """Knows which node it plays from the node's seed and follows ``script``: node id ->
    list of outputs (one per sub-step); other nodes only ask."""

    name = "scripted"

    def __init__(self, script: dict[str, list[AgentAction]]):
        self.format = get_format("react", toolwoz_tools())
        self.script = script
        self.node_of_seed = {node_seed(GOAL_ID, 0, n): n for n in NODE_IDS}
        self.seen_seeds: list[tuple[str, int]] = []

    async def act(self, contexts: Sequence[AgentContext]) -> list[AgentOutput]:
        outputs = []
        for context in contexts:
            node = self.node_of_seed[context.seed]
            self.seen_seeds.append((node, context.seed))
            plan = self.script.get(node, [])
            action = plan[context.step] if context.step < len(plan) else AgentAction.respond("What area would you like?")
            text, calls = self.format.render([action])
            outputs.append(AgentOutput(text, calls))
        return outputs


def _goal() -> JoshGoal:
    booked = ({"name": "King's Kitchen", "reference": "REF00001"},)
    d = dialogue(GOAL_ID, [CHINESE_GOAL], [(belief("restaurant", booked=booked),)])
    from pipelines.env.toolwoz import derive_goal_apis

    return JoshGoal(d, derive_goal_apis(d, DB), "train")


SEARCH = AgentAction.tool_call("search_restaurant", {"food": "chinese", "pricerange": "moderate", "area": "north"})
BOOK = AgentAction.tool_call("book_restaurant", {"name": "kings kitchen", "people": "4", "day": "friday", "time": "19:30"})
SAY = AgentAction.respond("Done.")


def _harvest(script, config=BeamConfig(max_beam=8, branching_factor=2, max_turns=4)) -> tuple[JoshTree, ScriptedAgent]:
    agent = ScriptedAgent(script)
    simulator = AgendaSimulator(Database(ENTITIES), SimulatorSpec(max_stalled_turns=10))
    return asyncio.run(harvest_tree(_goal(), agent, simulator, DB, config)), agent


def test_harvest_collapses_on_the_first_hit_and_labels_the_tree():
    # Round 1: 0.1 searches right (goal 0), 0.0 asks. Round 2: 0.1.0 and 0.1.1 both book
    # right in the same sub-step: 0.1.0 (left) wins, 0.1.1 is successful-not-golden.
    tree, agent = _harvest({"0.1": [SEARCH, SAY], "0.1.0": [BOOK, SAY], "0.1.1": [BOOK, SAY]})
    nodes = {n.node_id: n for n in tree.nodes}
    assert set(nodes) == {"0", "0.0", "0.1", "0.1.0", "0.1.1"}
    assert nodes["0.1"].consumed == [0] and nodes["0.0"].status == PRUNED and nodes["0.0"].label == FAILED
    assert nodes["0.1.0"].consumed == [1] and nodes["0.1.0"].label == GOLDEN
    assert nodes["0.1.1"].label == SUCCESSFUL and nodes["0.1.1"].status == PRUNED and nodes["0.1.1"].consumed == []
    assert tree.reward == 1.0 and tree.success
    # The pruned sibling stopped after the sub-step that decided; the winner finished its turn.
    assert len(nodes["0.1.1"].steps) == 1 and len(nodes["0.1.0"].steps) == 2
    assert nodes["0.1.0"].reward == 1.0 and nodes["0.1"].reward == 0.5
    # Siblings played under distinct seeds.
    seeds = dict(agent.seen_seeds)
    assert seeds["0.0"] != seeds["0.1"] and seeds["0.1.0"] != seeds["0.1.1"]


def test_every_reward_of_a_turn_is_consumed():
    # 0.0 searches and books in one turn: both goal APIs are consumed there, and the
    # search stops (all goals met) without another round.
    tree, _ = _harvest({"0.0": [SEARCH, BOOK, SAY]})
    nodes = {n.node_id: n for n in tree.nodes}
    assert nodes["0.0"].consumed == [0, 1] and tree.success
    assert set(nodes) == {"0", "0.0", "0.1"}


def test_beam_grows_to_max_beam_then_one_child_per_leaf_and_keeps_late_branches():
    # Goal 0 is met in round 1 by 0.0; nobody books, so the tree grows after that collapse
    # until max_turns: 2 -> 4 leaves, then 8 > max_beam 4 so one child per leaf. Those
    # branches stay in the tree (failed), and the golden path ends at 0.0.
    tree, _ = _harvest({"0.0": [SEARCH, SAY]}, BeamConfig(max_beam=4, branching_factor=2, max_turns=4))
    by_depth: dict[int, int] = {}
    for node in tree.nodes:
        by_depth[node.depth] = by_depth.get(node.depth, 0) + 1
    assert by_depth == {0: 1, 1: 2, 2: 2, 3: 4, 4: 4}
    assert tree.reward == 0.5
    assert [n.node_id for n in tree.nodes if n.label == GOLDEN] == ["0.0"]
    assert all(n.label == FAILED for n in tree.nodes if n.depth >= 2)
    assert sft_rows(tree) == [] and len(sft_rows(tree, min_reward=0.5)) == 2


def test_a_conversation_the_user_ends_stays_a_leaf():
    # The agenda user gives up after max_stalled_turns turns without progress.
    agent = ScriptedAgent({})
    simulator = AgendaSimulator(Database(ENTITIES), SimulatorSpec(max_stalled_turns=1))
    tree = asyncio.run(harvest_tree(_goal(), agent, simulator, DB, BeamConfig(max_turns=6)))
    ended = [n for n in tree.nodes if n.status == ENDED]
    assert ended and all(n.ended_by == "user_end" for n in ended)
    assert tree.reward == 0.0 and not any(n.label == GOLDEN for n in tree.nodes)


# --------------------------------------------------------------------------------------
# The rules agent and the goal split
# --------------------------------------------------------------------------------------


def test_rules_agent_branches_differ_and_reruns_repeat(small_corpus):
    database = ToolWozDatabase(small_corpus.entities)
    goals = harvest_goals(toolwoz_goals(small_corpus.dialogues, small_corpus.splits, database), 6)
    agent = RulesToolWozAgent(database, get_format("react", toolwoz_tools()), RulesPolicy(p_ask=0.4, p_keep=0.7, p_wrong=0.2))
    simulator = AgendaSimulator(Database(small_corpus.entities, small_corpus.taxi_options), SimulatorSpec())
    config = BeamConfig(max_turns=6)

    def run() -> list[JoshTree]:
        return [asyncio.run(harvest_tree(g, agent, simulator, database, config)) for g in goals]

    first, second = run(), run()
    assert [json.dumps(t.to_record(), sort_keys=True) for t in first] == [json.dumps(t.to_record(), sort_keys=True) for t in second]
    # Branching matters: somewhere two siblings took different turns.
    differing = 0
    for tree in first:
        children: dict[str, list[str]] = {}
        for node in tree.nodes:
            if node.parent_id is not None:
                children.setdefault(node.parent_id, []).append(json.dumps(node.messages[1:2]))
        differing += sum(1 for turns in children.values() if len(set(turns)) > 1)
    assert differing > 0
    assert any(t.reward > 0 for t in first)


_CALLS: list[dict] = []


def rules_agent_calls(corpus) -> list[dict]:
    """The tool-call events of a small rules-agent harvest (computed once per session)."""
    if not _CALLS:
        database = ToolWozDatabase(corpus.entities)
        goals = harvest_goals(toolwoz_goals(corpus.dialogues, corpus.splits, database), 8)
        agent = RulesToolWozAgent(database, get_format("react", toolwoz_tools()))
        simulator = AgendaSimulator(Database(corpus.entities, corpus.taxi_options), SimulatorSpec())
        for goal in goals:
            tree = asyncio.run(harvest_tree(goal, agent, simulator, database, BeamConfig(max_turns=5)))
            _CALLS.extend(e for n in tree.nodes for e in n.events if e["kind"] == "tool_call")
    return _CALLS


def test_rules_agent_calls_only_toolwoz_apis_with_their_parameters(small_corpus):
    calls = rules_agent_calls(small_corpus)
    assert {c["tool_name"] for c in calls} >= {"search_restaurant", "search_hotel", "search_train"}
    for call in calls:
        assert call["tool_name"] in API_SPECS
        assert set(json.loads(call["arguments_json"])) <= set(API_SPECS[call["tool_name"]].parameter_names)


@pytest.mark.real_data
def test_rules_agent_calls_match_toolwoz_tools_json(small_corpus):
    # Every call the agent makes names an API of ToolWOZ's own tools.json, with its
    # parameters only and enum values from its enums.
    reference = json.loads(shared_file("toolwoz", "tools.json").read_text())
    theirs = {t["function"]["name"]: t["function"]["parameters"]["properties"] for t in reference}
    for call in rules_agent_calls(small_corpus):
        assert call["tool_name"] in theirs, call
        for param, value in json.loads(call["arguments_json"]).items():
            assert param in theirs[call["tool_name"]], call
            enum = theirs[call["tool_name"]][param].get("enum")
            assert enum is None or value in enum, call


def test_goals_leave_out_taxi_police_hospital_and_split_train_from_test(small_corpus):
    database = ToolWozDatabase(small_corpus.entities)
    goals = toolwoz_goals(small_corpus.dialogues, small_corpus.splits, database)
    assert goals and all(set(g.dialogue.goal.domain_names) <= {"restaurant", "hotel", "attraction", "train"} for g in goals)
    assert all(g.task.has_goal_apis for g in goals)
    with_taxi = [d for d in small_corpus.dialogues if "taxi" in d.goal.domain_names]
    assert with_taxi and not {d.dialogue_id for d in with_taxi} & {g.goal_id for g in goals}
    train = harvest_goals(goals)
    assert train and all(g.split == "train" for g in train)
    assert harvest_goals(goals, 2) == train[:2]
    test_ids = [d for d, split in small_corpus.splits.items() if split == "test"]
    test = evaluation_goals(goals, test_ids, limit=3)
    assert [g.goal_id for g in test] == sorted(g.goal_id for g in goals if g.split == "test")[:3]


# --------------------------------------------------------------------------------------
# The training flows read the JOSH tables as sources
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("method, name", [("sft", "josh_sft"), ("kto", "josh_kto")])
def test_training_data_layer_reads_josh_tables(method, name, tmp_path):
    import pyarrow.parquet as pq

    from pipelines.training.config import DataSpec, SourceSpec
    from pipelines.training.data import COMPLETION, LABELED, prepare_source, trainer_rows
    from catalog.io import read_artifact

    tables = josh_tables([hand_built_tree()])
    for table_name, table in tables.items():
        pq.write_table(table, tmp_path / f"{table_name}.parquet")
    table = read_artifact(tmp_path / f"{name}.parquet")  # validated with its suite, references included
    source = SourceSpec(str(tmp_path / f"{name}.parquet"))
    # compact_prompts off: JOSH prompts carry their own (ToolWOZ, ReAct) system prompt.
    spec = DataSpec((source,), compact_prompts=False, max_history_messages=None)
    prepared = prepare_source(table.to_pylist(), table.column_names, source, method, spec,
                              lambda messages: sum(len(m["content"]) for m in messages), 10_000)
    assert prepared.layout == (COMPLETION if method == "sft" else LABELED)
    assert prepared.heldout == []  # harvested goals are train goals only
    rows = trainer_rows(method, prepared)
    assert len(rows) == table.num_rows
    assert all(r["prompt"][0] == {"role": "system", "content": "SYSTEM"} for r in rows)
    if method == "kto":
        assert sorted(r["label"] for r in rows) == [False, True, True, True]


# --------------------------------------------------------------------------------------
# ToolWOZ evaluation
# --------------------------------------------------------------------------------------


class OneTurnAgent:
    """Plays ``plan`` (one output per step) in the first exchange, then only asks."""

    name = "one_turn"

    def __init__(self, plan: list[AgentAction]):
        self.format = get_format("react", toolwoz_tools())
        self.plan = plan

    async def act(self, contexts: Sequence[AgentContext]) -> list[AgentOutput]:
        outputs = []
        for c in contexts:
            action = self.plan[c.step] if c.exchange == 0 and c.step < len(self.plan) else AgentAction.respond("Anything else?")
            outputs.append(AgentOutput(*self.format.render([action])))
        return outputs


def test_toolwoz_evaluation_scores_average_reward_and_full_success():
    from pipelines.josh.evaluate import play_toolwoz, toolwoz_scores

    simulator = AgendaSimulator(Database(ENTITIES), SimulatorSpec(max_stalled_turns=2))
    goal = _goal()
    calls = []
    full = asyncio.run(play_toolwoz([goal], OneTurnAgent([SEARCH, BOOK, SAY]), simulator, DB, seeds=(0, 1), max_turns=4,
                                    progress=lambda done, total: calls.append((done, total))))
    assert calls[-1] == (2, 2) and all(total == 2 for _, total in calls)  # finished episodes after every round
    half = asyncio.run(play_toolwoz([goal], OneTurnAgent([SEARCH, SAY]), simulator, DB, max_turns=4))
    assert [(e.reward, e.success, e.n_met, e.n_goal_apis) for e in full] == [(1.0, True, 2, 2)] * 2
    assert [(e.reward, e.success) for e in half] == [(0.5, False)]
    assert toolwoz_scores(full + half) == {"episodes": 3, "goals": 1, "avg_reward": 2.5 / 3, "success_rate": 2 / 3}
    from pipelines.josh.tables import JOSH_EVAL, eval_table

    table = eval_table(full + half)
    assert validate(table, JOSH_EVAL).success is False  # (goal, seed 0, agent) twice: the key is unique per agent
    assert validate(eval_table(full), JOSH_EVAL).success


def test_all_leaves_of_all_trees_in_a_round_go_to_the_agent_as_one_call(small_corpus):
    from pipelines.josh.beam import RoundBatcher, harvest

    database = ToolWozDatabase(small_corpus.entities)
    goals = harvest_goals(toolwoz_goals(small_corpus.dialogues, small_corpus.splits, database), 4)
    agent = RulesToolWozAgent(database, get_format("react", toolwoz_tools()))
    simulator = AgendaSimulator(Database(small_corpus.entities, small_corpus.taxi_options), SimulatorSpec())
    config = BeamConfig(max_turns=5)
    together, alone = RoundBatcher(agent), RoundBatcher(agent)
    trees = asyncio.run(harvest(goals, together, simulator, database, config, concurrency=4))
    one_by_one = asyncio.run(harvest(goals, alone, simulator, database, config, concurrency=1))
    assert [t.to_record() for t in trees] == [t.to_record() for t in one_by_one]
    # Four trees of up to 8 leaves each: a round's call carries more than one tree's leaves.
    assert max(together.batches) > config.max_beam >= max(alone.batches)
    assert sum(together.batches) == sum(alone.batches) == sum(t.agent_calls for t in trees)


def test_an_endpoint_agent_has_no_round_barrier_between_trees(small_corpus):
    """With an agent whose calls may overlap (an endpoint), one tree's slow request holds up
    no other tree: here goal A's requests are answered only once goal B's whole tree is done,
    which a round barrier (every tree waiting for the slowest request of the round) would
    turn into a deadlock. The trees are the ones a one-tree-at-a-time run makes."""
    from pipelines.josh.beam import harvest

    database = ToolWozDatabase(small_corpus.entities)
    goals = harvest_goals(toolwoz_goals(small_corpus.dialogues, small_corpus.splits, database), 2)
    rules = RulesToolWozAgent(database, get_format("react", toolwoz_tools()))
    simulator = AgendaSimulator(Database(small_corpus.entities, small_corpus.taxi_options), SimulatorSpec())
    config = BeamConfig(max_turns=4)
    slow, fast = goals[0].goal_id, goals[1].goal_id

    class Endpoint:
        name, format, overlapping_calls = rules.name, rules.format, True

        def __init__(self) -> None:
            self.release = asyncio.Event()
            self.order: list[str] = []

        async def act(self, contexts: Sequence[AgentContext]) -> list[AgentOutput]:
            if any(c.episode_id == slow for c in contexts):
                await self.release.wait()
            self.order.extend(c.episode_id for c in contexts)
            return await rules.act(contexts)

    endpoint = Endpoint()

    def done(tree: JoshTree) -> None:
        if tree.goal_id == fast:
            endpoint.release.set()

    async def both() -> list[JoshTree]:
        return await asyncio.wait_for(harvest(goals, endpoint, simulator, database, config, concurrency=2, done=done), 30)

    trees = asyncio.run(both())
    one_by_one = asyncio.run(harvest(goals, rules, simulator, database, config, concurrency=1))
    assert [t.to_record() for t in trees] == [t.to_record() for t in one_by_one]
    # Goal B's tree finished before goal A's first request was answered.
    assert endpoint.order.index(slow) == endpoint.order.count(fast) > 0
