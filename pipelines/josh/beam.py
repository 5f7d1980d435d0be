"""JOSH's beam search over conversations (Algorithm 1), with the reference's flaws fixed.

One tree per goal. A node is one exchange: the user's turn and the agent's full turn
(thoughts, API calls and their results, the reply). The root is the empty conversation.
Each round:

1. every open leaf hears the user (a leaf whose user ends the conversation stays a leaf);
2. every open leaf gets ``branching_factor`` children while ``branching_factor * leaves
   <= max_beam``, else one child (:func:`children_per_leaf`); children are forks of the
   episode (:meth:`EpisodeState.fork`) with **distinct seeds** (:func:`node_seed`), so
   siblings sample different turns;
3. the agent plays all children's turns together, one sub-step (one agent output) at a
   time; after every sub-step the new API calls of every child are checked against the
   remaining goal APIs. The first child, left to right, that met any becomes the new
   root: **every** goal API it met is consumed (not only the first), the other children
   are pruned, and each of them that met one of the consumed goal APIs too is
   successful-but-not-golden. The winner finishes its turn, and goal APIs it meets on
   the way are consumed as well.

The search stops when every goal API is consumed or after ``max_turns`` rounds. The
golden path runs from the root to the node that consumed the last goal API; everything
else, the branches explored after the last collapse included, **stays in the tree**.

Labels: ``root``; ``golden`` (on the golden path); ``successful`` (met a goal API that a
sibling consumed in the same sub-step: partial credit, never a negative); ``failed``.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from pipelines.config import positive_int
from pipelines.env.toolwoz import ToolWozDatabase, ToolWozEnvironment, call_meets_goal
from pipelines.episodes.agents import Agent
from pipelines.episodes.records import AGENT_NO_OUTPUT, EpisodeEvent
from pipelines.episodes.runner import DONE, WAITS_FOR_AGENT, EpisodeSpec, EpisodeState, RunnerConfig
from pipelines.josh.env import RunnerToolWoz
from pipelines.josh.goals import JoshGoal
from pipelines.simulators.base import UserSimulator

ROOT, GOLDEN, SUCCESSFUL, FAILED = "root", "golden", "successful", "failed"
LABELS: tuple[str, ...] = (ROOT, GOLDEN, SUCCESSFUL, FAILED)
# What became of a node: expanded (has children), pruned (a sibling won), ended (the
# conversation ended on it), open (the search stopped with it as a leaf).
EXPANDED, PRUNED, ENDED, OPEN = "expanded", "pruned", "ended", "open"
STATUSES: tuple[str, ...] = (EXPANDED, PRUNED, ENDED, OPEN)
# Event kinds that mark a turn as erroneous: such a path is never SFT data.
ERROR_EVENT_KINDS = frozenset({"malformed", "fallback"})


@dataclass(frozen=True)
class BeamConfig:
    """Algorithm 1's parameters (paper: beam 8, branching 2)."""

    max_beam: int = 8
    branching_factor: int = 2
    max_turns: int = 12

    def __post_init__(self) -> None:
        for name in ("max_beam", "branching_factor", "max_turns"):
            positive_int(getattr(self, name), f"josh.beam.{name}")


def children_per_leaf(n_leaves: int, config: BeamConfig) -> int:
    """Algorithm 1, line 12: branch while ``leaves * branching_factor <= max_beam``.

    >>> [children_per_leaf(n, BeamConfig()) for n in (1, 2, 4, 8)]
    [2, 2, 2, 1]
    """
    return config.branching_factor if n_leaves * config.branching_factor <= config.max_beam else 1


def node_seed(goal_id: str, seed: int, node_id: str) -> int:
    """The seed of one node: distinct for siblings, the same on every re-run."""
    digest = hashlib.sha256(f"{goal_id}\x00{seed}\x00{node_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def collapse(hits: Sequence[Iterable[int]]) -> tuple[int, frozenset[int], tuple[int, ...]] | None:
    """Who wins a sub-step: ``(winner, consumed, also)`` or None when no child met a goal API.

    ``hits[i]``: the remaining goal APIs child ``i`` met in this sub-step, children left
    to right. The winner is the first child with a hit and consumes all of its hits;
    ``also`` are the other children that met one of the consumed goal APIs.

    >>> collapse([set(), {2}, {0, 2}, {1}])
    (1, frozenset({2}), (2,))
    >>> collapse([set(), set()]) is None
    True
    """
    sets = [frozenset(h) for h in hits]
    winner = next((i for i, h in enumerate(sets) if h), None)
    if winner is None:
        return None
    consumed = sets[winner]
    also = tuple(i for i, h in enumerate(sets) if i != winner and h & consumed)
    return winner, consumed, also


@dataclass
class TreeNode:
    """One node (exchange) of a JOSH tree. ``messages``: what this exchange added to the
    agent's history (the user turn first); ``steps``: one per agent output, ``offset`` =
    how many of ``messages`` preceded it, ``malformed`` whether it parsed."""

    node_id: str
    parent_id: str | None
    depth: int
    branch: int
    seed: int
    status: str = OPEN
    ended_by: str | None = None
    user_text: str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    goals_hit: list[int] = field(default_factory=list)  # remaining goal APIs this turn's calls met
    consumed: list[int] = field(default_factory=list)  # goal APIs this node removed (collapses)
    shared_hit: bool = False  # met a goal API a sibling consumed in the same sub-step
    reward: float = 0.0  # goal APIs met by the calls of the whole path to here / all
    errors: int = 0  # malformed outputs, fallbacks, tool errors and simulator fallbacks in this exchange
    label: str = FAILED


@dataclass
class JoshTree:
    """The harvest of one goal: its nodes (parents before children) and the outcome."""

    goal_id: str
    split: str
    domains: list[str]
    goal_apis: list[dict[str, Any]]
    system_prompt: str
    nodes: list[TreeNode]
    reward: float  # consumed goal APIs / all
    agent_calls: int
    user_turns: int
    # Agent outputs lost to a backend failure and simulator fallback turns: such a tree is
    # not checkpointed, so an outage is never resumed from.
    backend_failures: int = 0

    @property
    def success(self) -> bool:
        return self.reward == 1.0

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> JoshTree:
        fields = dict(record)
        fields["nodes"] = [TreeNode(**n) for n in record["nodes"]]
        return cls(**fields)


@dataclass
class _Branch:
    node: TreeNode
    state: EpisodeState
    start_message: int  # index of the exchange's user message in state.messages
    start_event: int
    checked_calls: int  # calls of the path already checked against the goal APIs

    def new_hits(self, goal: JoshGoal, remaining: set[int]) -> set[int]:
        calls = [call for _, call in self.state.calls[self.checked_calls:]]
        self.checked_calls = len(self.state.calls)
        return {i for i in remaining for call in calls if call_meets_goal(goal.task.goal_apis[i], call)}


def label_tree(nodes: Sequence[TreeNode]) -> list[str]:
    """The node ids of the golden path, and every node's label set in place.

    The golden path ends at the last node that consumed goal APIs; without one there is
    no golden path and every non-root node is successful or failed."""
    by_id = {n.node_id: n for n in nodes}
    last = None
    for node in nodes:  # parents before children, and collapses only go deeper
        if node.consumed:
            last = node
    golden: list[str] = []
    while last is not None:
        golden.append(last.node_id)
        last = by_id.get(last.parent_id) if last.parent_id is not None else None
    golden_ids = set(golden)
    for node in nodes:
        if node.parent_id is None:
            node.label = ROOT
        elif node.node_id in golden_ids:
            node.label = GOLDEN
        elif node.shared_hit:
            node.label = SUCCESSFUL
        else:
            node.label = FAILED
    return list(reversed(golden))


async def harvest_tree(
    goal: JoshGoal,
    agent: Agent,
    simulator: UserSimulator,
    database: ToolWozDatabase,
    config: BeamConfig = BeamConfig(),
    *,
    seed: int = 0,
    task_prompt: str | None = None,
) -> JoshTree:
    """Algorithm 1 on one goal (see the module docstring)."""
    runner = RunnerConfig(max_exchanges=config.max_turns, **({"task_prompt": task_prompt} if task_prompt else {}))
    root_seed = node_seed(goal.goal_id, seed, "0")
    spec = EpisodeSpec(goal.goal_id, goal.dialogue.goal, root_seed, goal.dialogue)
    state = EpisodeState(
        spec,
        agent_name=agent.name,
        fmt=agent.format,
        simulator_name=simulator.name,
        environment=RunnerToolWoz(ToolWozEnvironment(database, goal.task)),  # type: ignore[arg-type]
        session=simulator.session(goal.dialogue.goal, root_seed, goal.dialogue),
        config=runner,
    )
    root = TreeNode("0", None, 0, 0, root_seed)
    nodes = [root]
    leaves: list[tuple[TreeNode, EpisodeState]] = [(root, state)]
    remaining = set(range(len(goal.task.goal_apis)))
    total = len(goal.task.goal_apis)
    agent_calls = user_turns = 0
    depth = 0
    while remaining and leaves and depth < config.max_turns:
        starts = [len(s.events) for _, s in leaves]
        await asyncio.gather(*(s.hear_user() for _, s in leaves))
        user_turns += len(leaves)
        open_leaves = []
        for (node, leaf), start in zip(leaves, starts):
            if leaf.phase == DONE:
                node.status, node.ended_by = ENDED, leaf.ended_by
                node.events.extend(_event_dicts(leaf.events[start:]))  # the user's closing turn
            else:
                open_leaves.append((node, leaf, start))
        if not open_leaves:
            break
        width = children_per_leaf(len(open_leaves), config)
        children: list[_Branch] = []
        for node, leaf, start in open_leaves:
            node.status = EXPANDED
            user_event = leaf.events[start]
            for b in range(width):
                child_id = f"{node.node_id}.{b}"
                twin = leaf.fork()
                twin.spec = replace(twin.spec, seed=node_seed(goal.goal_id, seed, child_id))
                child = TreeNode(child_id, node.node_id, depth + 1, b, twin.spec.seed, user_text=user_event.text)
                children.append(_Branch(child, twin, len(leaf.messages) - 1, start, len(leaf.calls)))
        live = children
        winner: _Branch | None = None
        while True:
            waiting = [b for b in live if b.state.phase == WAITS_FOR_AGENT]
            if not waiting:
                break
            offsets = [len(b.state.messages) - b.start_message for b in waiting]
            outputs = await agent.act([b.state.context() for b in waiting])
            agent_calls += len(waiting)
            for branch, offset, output in zip(waiting, offsets, outputs):
                before = len(branch.state.events)
                branch.state.take(output)
                malformed = any(e.kind == "malformed" for e in branch.state.events[before:])
                branch.node.steps.append({"offset": offset, "malformed": malformed})
            hits = [b.new_hits(goal, remaining) for b in live]
            for branch, hit in zip(live, hits):
                branch.node.goals_hit.extend(sorted(hit))
            if winner is None:
                found = collapse(hits)
                if found is not None:
                    index, consumed, also = found
                    winner = live[index]
                    winner.node.consumed.extend(sorted(consumed))
                    for i in also:
                        live[i].node.shared_hit = True
                    for i, branch in enumerate(live):
                        if i != index:
                            branch.node.status = PRUNED
                    remaining -= consumed
                    live = [winner]
            elif hits[0]:
                winner.node.consumed.extend(sorted(hits[0]))
                remaining -= hits[0]
        for branch in children:
            _close(branch, total)
        nodes.extend(b.node for b in children)
        leaves = []
        for branch in live:
            if branch.state.phase == DONE:
                branch.node.status, branch.node.ended_by = ENDED, branch.state.ended_by
            else:
                leaves.append((branch.node, branch.state))
        depth += 1
    label_tree(nodes)
    consumed_total = sum(len(n.consumed) for n in nodes)
    return JoshTree(
        goal_id=goal.goal_id,
        split=goal.split,
        domains=list(goal.domains),
        goal_apis=[{"name": g.name, "parameters": dict(g.parameters)} for g in goal.task.goal_apis],
        system_prompt=str(state.messages[0]["content"]),
        nodes=nodes,
        reward=consumed_total / total if total else 0.0,
        agent_calls=agent_calls,
        user_turns=user_turns,
        backend_failures=sum(1 for n in nodes for e in n.events if _backend_failure(e)),
    )


def _backend_failure(event: Mapping[str, Any]) -> bool:
    if event["actor"] == "user":
        return event["kind"] == "fallback"
    return event["kind"] == "malformed" and str(event.get("detail") or "").startswith(AGENT_NO_OUTPUT)


def _close(branch: _Branch, total: int) -> None:
    node, state = branch.node, branch.state
    node.messages = [dict(m) for m in state.messages[branch.start_message:]]
    events = state.events[branch.start_event:]
    node.events = _event_dicts(events)
    node.errors = sum(
        1 for e in events
        if e.kind in ERROR_EVENT_KINDS or (e.kind == "observation" and e.detail is not None)
    )
    progress = state.environment.progress()  # type: ignore[attr-defined]
    node.reward = progress.n_met / total if total else 0.0


def _event_dicts(events: Iterable[EpisodeEvent]) -> list[dict[str, Any]]:
    keep = ("turn", "kind", "actor", "text", "detail", "tool_name", "arguments_json", "observation_json")
    return [{k: getattr(e, k) for k in keep} for e in events]


async def harvest(
    goals: Sequence[JoshGoal],
    agent: Agent,
    simulator: UserSimulator,
    database: ToolWozDatabase,
    config: BeamConfig = BeamConfig(),
    *,
    seed: int = 0,
    task_prompt: str | None = None,
    concurrency: int = 8,
    done: Any = None,
) -> list[JoshTree]:
    """Every goal's tree, ``concurrency`` trees in play at a time (a finished tree's place
    goes to the next goal at once); the agent steps of all their leaves in a round go to a
    local model as one call, to an endpoint as each tree makes them (:class:`RoundBatcher`).
    ``done(tree)`` is called as each tree finishes, e.g. to checkpoint it; trees come back in
    goal order."""
    semaphore = asyncio.Semaphore(max(1, concurrency))
    batched = agent if isinstance(agent, RoundBatcher) else RoundBatcher(agent)

    async def one(goal: JoshGoal) -> JoshTree:
        async with semaphore:
            tree = await harvest_tree(goal, batched, simulator, database, config, seed=seed, task_prompt=task_prompt)
        if done is not None:
            done(tree)
        return tree

    return list(await asyncio.gather(*(one(g) for g in goals)))



class RoundBatcher:
    """One agent for many trees.

    A local model (the default): the ``act`` calls that the trees in play make in the same
    round (before the event loop runs anything else) go to the wrapped agent as **one**
    call, so it decodes all leaves of all trees as one batch; never two calls at once (a
    local model is not shared between threads): trees that ask while a batch decodes wait
    for it and go in the next one.

    An agent whose calls may overlap (``overlapping_calls``: an endpoint, whose client
    bounds the requests in flight): each tree's call goes to it at once and comes back as
    soon as that tree's own requests have, so the leaves of all trees in play are in flight
    together and no tree waits for another's slowest request (a round barrier would idle
    the server at the end of every round)."""

    def __init__(self, agent: Agent):
        self.agent = agent
        self.name = agent.name
        self.format = agent.format
        self.overlapping = bool(getattr(agent, "overlapping_calls", False))
        self.batches: list[int] = []  # contexts per call to the wrapped agent
        self._pending: list[tuple[list[Any], asyncio.Future]] = []
        self._lock = asyncio.Lock()
        self._flushes: set[asyncio.Task] = set()  # the loop keeps only weak references to tasks

    async def act(self, contexts: Sequence[Any]) -> list[Any]:
        if self.overlapping:
            self.batches.append(len(contexts))
            return list(await self.agent.act(contexts))
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._pending:
            loop.call_soon(self._start_flush)
        self._pending.append((list(contexts), future))
        return await future

    def _start_flush(self) -> None:
        flush = asyncio.ensure_future(self._flush())
        self._flushes.add(flush)
        flush.add_done_callback(self._flushes.discard)

    async def _flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        contexts = [c for batch, _ in pending for c in batch]
        try:
            async with self._lock:
                self.batches.append(len(contexts))
                outputs = await self.agent.act(contexts)
        except BaseException as error:  # every waiting tree sees the failure
            for _, future in pending:
                if not future.done():
                    future.set_exception(error)
            return
        start = 0
        for batch, future in pending:
            future.set_result(list(outputs[start : start + len(batch)]))
            start += len(batch)
