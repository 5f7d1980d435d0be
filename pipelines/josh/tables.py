"""The JOSH artifacts: Arrow schemas, expectation suites, trees -> tables.

``josh_trees``
    One row per node of every goal's tree (:mod:`pipelines.josh.beam`): the goal, parent,
    depth and branch, the exchange (the user turn, the agent's events, its visible reply),
    the goal APIs the turn met and consumed, the reward of the path so far, and the label
    (root / golden / successful / failed).
``josh_sft``
    The golden paths of trees with reward 1 and no error marker on the path (malformed
    output, fallback turn, tool error, simulator fallback), one row per agent output in
    TRL's conversational prompt-completion layout: ``prompt`` is the system message and
    the conversation up to that output, ``completion`` the output. What the agent saw from
    the tools (``APIRETURN``) is in the prompt, never in a completion.
``josh_eval``
    The harvesting agent on the ToolWOZ test goals, one row per goal and seed, no branching.
``josh_kto``
    ``prompt``, ``completion``, ``label``: every golden-path output of those trees is
    desirable; the outputs of the failed siblings of golden nodes (no goal API met in
    their subtree) are undesirable, kept only where the prompt equals a desirable row's
    prompt and the completion differs from it.

Every table has the goal's corpus ``split`` and its ``dialogue_id`` (the training hold-out
key). Harvesting reads only train goals.
"""

from __future__ import annotations

import dataclasses

import json
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa

from pipelines.artifacts.spec import ArtifactSpec, Reference, between, in_set
from pipelines.josh.beam import FAILED, GOLDEN, LABELS, STATUSES, JoshTree, TreeNode

MESSAGE = pa.struct([pa.field("role", pa.string(), nullable=False), pa.field("content", pa.string(), nullable=False)])
MESSAGES = pa.list_(MESSAGE)
_STRINGS = pa.list_(pa.string())


def _required(name: str, data_type: pa.DataType) -> pa.Field:
    return pa.field(name, data_type, nullable=False)


JOSH_TREES = ArtifactSpec(
    name="josh_trees",
    min_rows=1,
    description="One row per node of the JOSH beam-search trees (Algorithm 1), one tree per harvested ToolWOZ goal.",
    schema=pa.schema([
        _required("dialogue_id", pa.string()),  # the goal's seed dialogue
        _required("node_id", pa.string()),  # "0" is the root; a child appends ".<branch>"
        ("parent_id", pa.string()),  # null for the root
        _required("split", pa.string()),
        _required("goal_domains", _STRINGS),
        _required("goal_apis_json", pa.string()),  # [{name, parameters}] of the goal
        _required("depth", pa.int32()),  # exchanges from the root
        _required("branch", pa.int32()),  # position among its siblings, left to right
        _required("seed", pa.int64()),
        _required("status", pa.string()),
        ("ended_by", pa.string()),
        _required("label", pa.string()),
        ("user_text", pa.string()),  # the user turn this exchange answers (null for the root)
        ("agent_text", pa.string()),  # the agent's visible reply, when it gave one
        _required("n_steps", pa.int32()),
        _required("n_tool_calls", pa.int32()),
        _required("events_json", pa.string()),  # the exchange's events, user turn first
        _required("messages_json", pa.string()),  # what the exchange added to the agent's history
        _required("goals_hit", _STRINGS),  # goal APIs (name#index) this turn's calls met, among the remaining ones
        _required("consumed", _STRINGS),  # goal APIs this node removed from the goal set
        _required("reward", pa.float64()),  # goal APIs met by the path's calls / all
        _required("errors", pa.int32()),
        _required("tree_reward", pa.float64()),  # consumed / all, for the whole tree
    ]),
    keys=("dialogue_id", "node_id"),
    expectations=(
        in_set("label", LABELS), in_set("status", STATUSES), between("depth", 0, None), between("branch", 0, None),
        between("reward", 0.0, 1.0), between("tree_reward", 0.0, 1.0), between("errors", 0, None),
    ),
)

# One agent output of a tree at its prompt: the rows of josh_sft, and of josh_kto with a label.
_TURN_ROW = [
    _required("dialogue_id", pa.string()),
    _required("split", pa.string()),
    _required("node_id", pa.string()),
    _required("step", pa.int32()),
    _required("prompt", MESSAGES),
    _required("completion", MESSAGES),
]
_TURN_ROW_CHECKS = dict(
    keys=("dialogue_id", "node_id", "step"),
    expectations=(between("step", 0, None), in_set("split", ("train", "val"))),
    references=(Reference("dialogue_id", "josh_trees", "dialogue_id"),),
)

JOSH_SFT = ArtifactSpec(
    name="josh_sft",
    min_rows=1,
    description="SFT (TRL prompt-completion, conversational): every agent output on the golden paths of fully successful JOSH trees.",
    schema=pa.schema(_TURN_ROW),
    **_TURN_ROW_CHECKS,
)

JOSH_KTO = ArtifactSpec(
    name="josh_kto",
    min_rows=1,
    description="KTO (TRL unpaired preference): golden-path outputs desirable, failed sibling outputs at the same prompt undesirable.",
    schema=pa.schema([
        *_TURN_ROW,
        _required("label", pa.bool_()),
        _required("golden_node_id", pa.string()),  # the golden node whose prompt this row shares
    ]),
    **_TURN_ROW_CHECKS,
)

JOSH_EVAL = ArtifactSpec(
    name="josh_eval",
    min_rows=1,
    description="ToolWOZ evaluation: one row per test goal and seed played without branching (average reward, 100% success).",
    schema=pa.schema([
        _required("dialogue_id", pa.string()),
        _required("seed", pa.int64()),
        _required("agent", pa.string()),
        _required("n_goal_apis", pa.int32()),
        _required("n_met", pa.int32()),
        _required("reward", pa.float64()),  # n_met / n_goal_apis
        _required("success", pa.bool_()),  # reward 1
        _required("exchanges", pa.int32()),
        _required("ended_by", pa.string()),
        _required("errors", pa.int32()),
        _required("tool_calls", pa.int32()),
        _required("malformed", pa.int32()),  # unparseable agent outputs (malformed, fallback)
        _required("rejected_calls", pa.int32()),  # api calls the environment rejected
        _required("messages_json", pa.string()),  # the conversation after the system prompt
    ]),
    keys=("dialogue_id", "seed", "agent"),
    expectations=(between("reward", 0.0, 1.0), between("n_met", 0, None), between("n_goal_apis", 1, None), between("errors", 0, None),
                  between("tool_calls", 0, None), between("malformed", 0, None), between("rejected_calls", 0, None)),
)

# Stage josh_evaluate: the same rows for every evaluated model (``agent`` names it).
TOOLWOZ_EVAL = dataclasses.replace(
    JOSH_EVAL, name="toolwoz_eval",
    description="ToolWOZ evaluation of models: one row per model, test goal and seed played without branching (average reward, 100% success).",
)

SPECS: dict[str, ArtifactSpec] = {s.name: s for s in (JOSH_TREES, JOSH_SFT, JOSH_KTO, JOSH_EVAL)}
HARVEST_SPECS: tuple[str, ...] = ("josh_trees", "josh_sft", "josh_kto")


def _goal_names(tree: JoshTree, indices: Iterable[int]) -> list[str]:
    return [f"{tree.goal_apis[i]['name']}#{i}" for i in indices]


def _agent_text(node: TreeNode) -> str | None:
    texts = [e["text"] for e in node.events if e["actor"] == "agent" and e["kind"] in ("respond", "clarify", "fallback")]
    return texts[-1] if texts else None


def tree_rows(tree: JoshTree) -> list[dict[str, Any]]:
    goal_apis_json = json.dumps(tree.goal_apis, ensure_ascii=False, sort_keys=True)
    rows = []
    for node in tree.nodes:
        rows.append({
            "dialogue_id": tree.goal_id, "node_id": node.node_id, "parent_id": node.parent_id, "split": tree.split,
            "goal_domains": list(tree.domains), "goal_apis_json": goal_apis_json, "depth": node.depth, "branch": node.branch,
            "seed": node.seed, "status": node.status, "ended_by": node.ended_by, "label": node.label,
            "user_text": node.user_text, "agent_text": _agent_text(node), "n_steps": len(node.steps),
            "n_tool_calls": sum(1 for e in node.events if e["kind"] == "tool_call"),
            "events_json": json.dumps(node.events, ensure_ascii=False, sort_keys=True),
            "messages_json": json.dumps(node.messages, ensure_ascii=False, sort_keys=True),
            "goals_hit": _goal_names(tree, node.goals_hit), "consumed": _goal_names(tree, node.consumed),
            "reward": node.reward, "errors": node.errors, "tree_reward": tree.reward,
        })
    return rows


def _message(m: Mapping[str, Any]) -> dict[str, str]:
    return {"role": str(m["role"]), "content": str(m.get("content") or "")}


class _TreeView:
    """Parents, children and the conversation up to any node of one tree."""

    def __init__(self, tree: JoshTree):
        self.tree = tree
        self.by_id = {n.node_id: n for n in tree.nodes}
        self.children: dict[str, list[TreeNode]] = {}
        for node in tree.nodes:
            if node.parent_id is not None:
                self.children.setdefault(node.parent_id, []).append(node)

    def history(self, node: TreeNode) -> list[dict[str, str]]:
        """System message and every message of the exchanges before ``node``."""
        chain = []
        parent = self.by_id.get(node.parent_id) if node.parent_id is not None else None
        while parent is not None:
            chain.append(parent)
            parent = self.by_id.get(parent.parent_id) if parent.parent_id is not None else None
        messages = [{"role": "system", "content": self.tree.system_prompt}]
        for ancestor in reversed(chain):
            messages.extend(_message(m) for m in ancestor.messages)
        return messages

    def step_rows(self, node: TreeNode) -> list[tuple[int, list[dict[str, str]], list[dict[str, str]]]]:
        """``(step, prompt, completion)`` of every parsed agent output of the node."""
        before = self.history(node)
        rows = []
        for k, step in enumerate(node.steps):
            offset = step["offset"]
            if step["malformed"] or offset >= len(node.messages):
                continue
            prompt = before + [_message(m) for m in node.messages[:offset]]
            rows.append((k, prompt, [_message(node.messages[offset])]))
        return rows

    def subtree_hit(self, node: TreeNode) -> bool:
        return bool(node.goals_hit) or any(self.subtree_hit(c) for c in self.children.get(node.node_id, ()))

    def golden(self) -> list[TreeNode]:
        return [n for n in self.tree.nodes if n.label == GOLDEN]


def clean_golden_path(tree: JoshTree, min_reward: float = 1.0) -> bool:
    """Whether the tree's golden path is training data: reward at least ``min_reward``
    (paper: 1) and no error marker on the path."""
    golden = [n for n in tree.nodes if n.label == GOLDEN]
    return bool(golden) and tree.reward >= min_reward and all(n.errors == 0 for n in golden)


def sft_rows(tree: JoshTree, min_reward: float = 1.0) -> list[dict[str, Any]]:
    if not clean_golden_path(tree, min_reward):
        return []
    view = _TreeView(tree)
    return [
        {"dialogue_id": tree.goal_id, "split": tree.split, "node_id": node.node_id, "step": step, "prompt": prompt, "completion": completion}
        for node in view.golden()
        for step, prompt, completion in view.step_rows(node)
    ]


def kto_rows(tree: JoshTree, min_reward: float = 1.0) -> list[dict[str, Any]]:
    if not clean_golden_path(tree, min_reward):
        return []
    view = _TreeView(tree)
    rows: list[dict[str, Any]] = []
    for node in view.golden():
        positives = {_key(prompt): completion for _, prompt, completion in view.step_rows(node)}
        for step, prompt, completion in view.step_rows(node):
            rows.append(_kto(tree, node.node_id, step, prompt, completion, True, node.node_id))
        for sibling in view.children.get(node.parent_id or "", ()):
            if sibling is node or sibling.label != FAILED or view.subtree_hit(sibling):
                continue
            for step, prompt, completion in view.step_rows(sibling):
                positive = positives.get(_key(prompt))
                # Only at a prompt a desirable row has, and never the desirable output itself.
                if positive is not None and positive != completion:
                    rows.append(_kto(tree, sibling.node_id, step, prompt, completion, False, node.node_id))
    return rows


def _key(messages: Sequence[Mapping[str, str]]) -> str:
    return json.dumps(list(messages), ensure_ascii=False, sort_keys=True)


def _kto(tree: JoshTree, node_id: str, step: int, prompt: list, completion: list, label: bool, golden: str) -> dict[str, Any]:
    return {"dialogue_id": tree.goal_id, "split": tree.split, "node_id": node_id, "step": step, "prompt": prompt,
            "completion": completion, "label": label, "golden_node_id": golden}


def josh_tables(trees: Sequence[JoshTree], min_reward: float = 1.0) -> dict[str, pa.Table]:
    """The three artifacts of a harvest, keyed by artifact name."""
    rows = {
        "josh_trees": [r for t in trees for r in tree_rows(t)],
        "josh_sft": [r for t in trees for r in sft_rows(t, min_reward)],
        "josh_kto": [r for t in trees for r in kto_rows(t, min_reward)],
    }
    return {name: pa.Table.from_pylist(rows[name], schema=SPECS[name].schema) for name in HARVEST_SPECS}


def eval_table(episodes: Iterable[Any]) -> pa.Table:
    """``josh_eval`` of :class:`pipelines.josh.evaluate.ToolWozEpisode` records."""
    from dataclasses import asdict

    return pa.Table.from_pylist([asdict(e) for e in episodes], schema=JOSH_EVAL.schema)


def harvest_metrics(trees: Sequence[JoshTree], tables: Mapping[str, pa.Table]) -> dict[str, Any]:
    """The harvest's figures, a function of the trees only (no clock): goals, nodes, golden
    paths, reward distribution, labels, dataset sizes, agent and simulator calls."""
    n = len(trees)
    rewards = [t.reward for t in trees]
    distribution: dict[str, int] = {}
    for reward in rewards:
        key = f"{reward:.2f}"
        distribution[key] = distribution.get(key, 0) + 1
    labels: dict[str, int] = {label: 0 for label in LABELS}
    for tree in trees:
        for node in tree.nodes:
            labels[node.label] += 1
    kto = tables["josh_kto"].column("label").to_pylist()
    sft_goals = set(tables["josh_sft"].column("dialogue_id").to_pylist())
    return {
        "goals": n,
        "nodes": sum(len(t.nodes) for t in trees),
        "golden_paths": len(sft_goals),
        "trees_with_golden_path": sum(1 for t in trees if any(x.label == GOLDEN for x in t.nodes)),
        "success_rate": sum(t.success for t in trees) / n if n else 0.0,
        "avg_reward": sum(rewards) / n if n else 0.0,
        "reward_distribution": dict(sorted(distribution.items())),
        "labels": labels,
        # nodes whose exchange met a goal API (golden or successful-but-not-golden)
        "successful_nodes": labels["golden"] + labels["successful"],
        "max_depth": max((x.depth for t in trees for x in t.nodes), default=0),
        "sft_rows": tables["josh_sft"].num_rows,
        "kto_rows": {"desirable": sum(kto), "undesirable": len(kto) - sum(kto)},
        "agent_calls": sum(t.agent_calls for t in trees),
        "user_turns": sum(t.user_turns for t in trees),
    }
