"""askflow's τ-bench tools against τ-bench's own outputs (ground_truth_replay.json), and the
reward against τ-bench's published do-nothing floor. Skipped without the real data."""

from __future__ import annotations

import pytest

from pipelines.env.taubench import TauEnvironment, replay, tau_reward
from pipelines.env.taubench.conformance import check_conformance
from catalog.taubench_dir import load_ground_truth_replay


@pytest.mark.parametrize(("name", "n_tasks"), [("retail", 635), ("airline", 50)])
def test_every_ground_truth_output_and_changed_record_is_reproduced(request, taubench_root, name, n_tasks):
    domain = request.getfixturevalue(name)
    report = check_conformance(domain, load_ground_truth_replay(taubench_root, name))
    assert report.failures == []
    assert (report.tasks, report.tasks_conforming) == (n_tasks, n_tasks)
    assert report.calls_matching == report.calls > 0
    assert report.records_matching == report.records > 0
    if name == "retail":
        assert report.error_calls == 44  # SOURCE.md: 44 retail ground-truth calls return an error upstream


@pytest.mark.parametrize(
    ("name", "split", "floor"),
    [("airline", "test", 19), ("retail", "test", 7), ("retail", "train", 5)],
)
def test_doing_nothing_passes_exactly_tau_benchs_floor(request, name, split, floor):
    """An agent that changes nothing and lets the user stop passes only the tasks whose
    ground truth changes nothing (gift card 9 -> 9.0 counts as a change, as in τ-bench's hash)
    and that require no output."""
    domain = request.getfixturevalue(name)
    passed = sum(tau_reward(TauEnvironment(domain), task, []).success for task in domain.tasks[split])
    assert passed == floor


def test_ground_truth_scores_one_only_with_the_outputs_said(retail):
    with_outputs = [t for t in retail.tasks["test"] if t.outputs][:5]
    assert with_outputs
    for task in with_outputs:
        env = replay(retail, task.actions)
        assert tau_reward(env, task, ["Done."]).reward == 0.0
        # τ-bench removes commas from the reply before looking for the output.
        replies = ["Here you are: " + ", ".join(o.upper() for o in task.outputs).replace("0", "0,", 1) + "."]
        result = tau_reward(env, task, replies)
        assert (result.reward, result.database_ok, result.outputs_ok) == (1.0, True, True)
        assert all(result.actions_matched)
        assert tau_reward(env, task, replies, finished=False).reward == 0.0


def test_a_wrong_write_names_the_records_that_differ(retail):
    task = next(t for t in retail.tasks["test"] if any(a.name == "cancel_pending_order" for a in t.actions))
    env = TauEnvironment(retail)
    for action in task.actions:
        if action.name == "cancel_pending_order":
            reason = "ordered by mistake" if action.kwargs["reason"] == "no longer needed" else "no longer needed"
            env.call(action.name, dict(action.kwargs, reason=reason))
        else:
            env.call(action.name, action.kwargs)
    result = tau_reward(env, task, [o for o in task.outputs])
    assert result.reward == 0.0 and not result.database_ok
    cancelled = [a.kwargs["order_id"] for a in task.actions if a.name == "cancel_pending_order"]
    assert result.mismatched_records == tuple(sorted(f"orders/{order_id}" for order_id in cancelled))
    assert result.actions_matched.count(False) == len(cancelled)
