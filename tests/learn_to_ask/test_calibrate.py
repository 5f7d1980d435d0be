"""Stage calibrate (Auto-Prompt, EXTRACT track) with a real local transformers model: the
runs table, the versioned prompts file hindsight reads, anchors kept apart from the pool,
and curated anchor files validated like every input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.errors import ConfigError, DataError
from pipelines.learn_to_ask.calibration import corpus_anchors, prompt_from_document
from pipelines.learn_to_ask.hindsight import SEED_EXTRACTOR_PROMPT
from pipelines.learn_to_ask.logs import session_from_dialogue
from catalog.io import read_artifact, read_json


def params(tmp_path: Path, source: Path, model: Path, **extra) -> dict:
    return {"source": str(source), "format": "multiwoz",
            "extractor": {"backend": "hf", "model_path": str(model), "batch_size": 8, "sampling": {"max_tokens": 12}},
            "n_anchors": 3, "n_pool": 2, "iterations": 2, "k": 2, "seed": 0,
            "output": {"runs": str(tmp_path / "runs.parquet"), "prompts": str(tmp_path / "prompts.json")},
            "metrics": str(tmp_path / "calibrate.json"), **extra}


def test_calibrate_records_every_candidate_and_writes_the_prompts_hindsight_reads(tmp_path, small_corpus_dir, tiny_model_dir, single_torch_thread):
    from stages.calibrate import run
    from catalog.learn_to_ask import extractor_prompt

    grader = {"backend": "hf", "model_path": str(tiny_model_dir), "batch_size": 8, "sampling": {"max_tokens": 12}}
    policy = {"model_path": str(tiny_model_dir), "samples": 2, "sampling": {"temperature": 1.0, "max_tokens": 8}}
    metrics = run(params(tmp_path, small_corpus_dir, tiny_model_dir, tracks=["extract", "grader", "rollout"], grader=grader, policy=policy),
                  llm={"roles": {"prompt_proposer": {"backend": "rules"}}})
    table = read_artifact(tmp_path / "runs.parquet").to_pylist()  # the calibration_runs suite
    assert [r["position"] for r in table] == list(range(len(table)))
    # An untrained model gives no readable grade: every grade counts as the largest error.
    graded = [r for r in table if r["track"] == "grader"]
    assert graded and all(r["score"] == -1.0 for r in graded) and metrics["grader"]["seed_score"] == -1.0
    assert metrics["grader"]["score"] == "negative_mse" and metrics["grader"]["anchors"] == 3
    # ROLLOUT: the mean L2A reward of the sampled replies, in [0, 4].
    assert metrics["rollout"]["score"] == "mean_reward" and 0.0 <= metrics["rollout"]["seed_score"] <= 4.0
    assert metrics["rollout"]["calibrated_score"] >= metrics["rollout"]["seed_score"]
    runs = [r for r in table if r["track"] == "extract"]
    assert runs[0]["mutation"] == "seed" and runs[0]["parent_id"] is None and runs[0]["iteration"] == 0
    assert {r["iteration"] for r in runs} == {0, 1, 2} and sum(r["selected"] for r in runs) == 3
    selected = {r["prompt_id"] for r in runs if r["selected"]}
    assert all(r["parent_id"] in selected for r in runs[1:])
    document = read_json(tmp_path / "prompts.json")
    assert len(document["version"]) == 16 and document["extract"]["seed_score"] == runs[0]["score"]
    prompt = extractor_prompt(tmp_path / "prompts.json")
    assert prompt.prompt_id == document["extract"]["prompt_id"] == metrics["extract"]["winner"]
    assert extractor_prompt(None) == SEED_EXTRACTOR_PROMPT
    assert prompt_from_document(document, "grader", "prompts.json").prompt_id == metrics["grader"]["winner"]
    assert metrics["extract"]["anchors"] == 3 and metrics["extract"]["pool"] == 2
    assert metrics["extract"]["calibrated_score"] >= metrics["extract"]["seed_score"]


def test_anchors_and_pool_come_from_different_sessions(small_corpus):
    sessions = [session_from_dialogue(d) for d in small_corpus.dialogues]
    anchors, pool = corpus_anchors(sessions, 5, 3, seed=1)
    assert len(anchors) == 5 and len(pool) == 3
    assert not {a.point.session.session_id for a in anchors} & {p.point.session.session_id for p in pool}
    assert all(a.point.user_replies for a in anchors + pool)
    with pytest.raises(DataError, match="annotated sessions"):
        corpus_anchors(sessions[:2], 5, 3)


ANCHOR = {"session_id": "a1", "goal": "a cough", "turn": 1, "info": [{"field": "fever", "value": "absent"}],
          "messages": [{"role": "user", "content": "I cough."}, {"role": "assistant", "content": "Fever?"},
                       {"role": "user", "content": "No."}]}


@pytest.mark.parametrize("edit, message", [
    ({"turn": 2}, "record 'a2', field 'turn'"),
    ({"turn": None}, "record 'a2', field 'turn'"),
    ({"info": [{"field": "fever"}]}, "record 'a2', field 'info'"),
    ({"messages": [{"role": "nurse", "content": "x"}]}, "record 'a2', field 'messages[0].role'"),
])
def test_a_curated_anchor_file_is_validated(tmp_path, edit, message):
    from catalog.learn_to_ask import read_anchors

    path = tmp_path / "anchors.jsonl"
    path.write_text(json.dumps(ANCHOR) + "\n" + json.dumps({**ANCHOR, "session_id": "a2", **edit}) + "\n")
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_anchors(path)
    path.write_text(json.dumps(ANCHOR) + "\n")
    (anchor,) = read_anchors(path)
    assert anchor.info == (("fever", "absent"),) and anchor.point.turn == 1


def test_calibrate_refuses_an_extractor_that_cannot_read_a_prompt(tmp_path, small_corpus_dir):
    from stages.calibrate import run

    with pytest.raises(ConfigError, match="must read its prompt"):
        run(params(tmp_path, small_corpus_dir, tmp_path, extractor={"backend": "rules"}))
    with pytest.raises(ConfigError, match="calibrate.k"):
        run(params(tmp_path, small_corpus_dir, tmp_path, k=0))
    with pytest.raises(DataError, match="no calibrated 'extract' prompt"):
        prompt_from_document({"version": "x"}, "extract", "prompts.json")


def test_grader_anchors_mix_the_grades_and_curated_ones_are_validated(small_corpus, tmp_path):
    from pipelines.learn_to_ask.calibration import corpus_grader_anchors
    from catalog.learn_to_ask import read_anchors
    from pipelines.learn_to_ask.calibration import grader_anchor_from_record

    sessions = [session_from_dialogue(d) for d in small_corpus.dialogues]
    anchors, pool = corpus_grader_anchors(sessions, 6, 3)
    assert {a.grade for a in anchors} == {0.0, 1.0}  # the small corpus's acts request no other slot of a target's domain
    assert not {a.point.session.session_id for a in anchors} & {p.point.session.session_id for p in pool}
    path = tmp_path / "grades.jsonl"
    path.write_text(json.dumps({**ANCHOR, "question": "Any fever?", "grade": 1}) + "\n")
    (anchor,) = read_anchors(path, grader_anchor_from_record)
    assert (anchor.question, anchor.grade) == ("Any fever?", 1.0) and "Any fever?" in anchor.case
    path.write_text(json.dumps({**ANCHOR, "grade": 0.7}) + "\n")
    with pytest.raises(DataError, match="record 'a1', field 'grade'"):
        read_anchors(path, grader_anchor_from_record)


def test_rollout_score_is_the_mean_l2a_reward_of_the_samples(small_corpus):
    from pipelines.learn_to_ask.calibration import SEED_POLICY_PROMPT, corpus_rollout_cases, rollout_score

    sessions = [session_from_dialogue(d) for d in small_corpus.dialogues]
    cases, pool = corpus_rollout_cases(sessions, 4, 2)
    assert [c.decision for c in cases] == ["continue", "stop", "continue", "stop"]
    assert not {c.point.session.session_id for c in cases} & {c.point.session.session_id for c in pool}
    seen = []

    def sampler(conversations):
        seen.extend(conversations)
        return [["<stop />", "Tell me more."] for _ in conversations]

    # continue cases: 0 (wrong stop) and 1 + 2*0 + 0 (no question); stop cases: 4 and 0 (wrong).
    assert rollout_score(SEED_POLICY_PROMPT, cases, sampler, "scripted") == pytest.approx((0 + 1 + 4 + 0) * 2 / 8)
    assert seen[0][0] == {"role": "system", "content": SEED_POLICY_PROMPT.render()}
    assert seen[0][1:] == [{"role": m.role, "content": m.content} for m in cases[0].point.context]



def test_grader_anchors_are_graded_by_the_annotators_acts_not_by_a_grader(monkeypatch):
    """Issue 27: the GRADER track's anchors must not be graded by a grader (the rules grader
    was both the anchors' judge and the reward). On the real MultiWOZ val dialogues (vendored)
    the grades come from the system turns' Request acts against I*_t, with every grade present,
    and they differ from the rules grader's where the wording and the acts disagree."""
    from catalog.learn_to_ask import load_sessions
    from pipelines.learn_to_ask.calibration import annotated_grade, corpus_grader_anchors
    from pipelines.rewards import learn_to_ask as rewards

    root = Path(__file__).resolve().parents[2]
    sessions = load_sessions({"source": str(root / "vendor/multiwoz_val"), "format": "multiwoz", "db_dir": str(root / "vendor/multiwoz_db")})

    def no_grader(*args, **kwargs):
        raise AssertionError("an anchor was graded by the rules grader")

    monkeypatch.setattr(rewards.RulesGrader, "grade", no_grader)
    anchors, pool = corpus_grader_anchors(sessions, 12, 3)
    monkeypatch.undo()
    assert {a.grade for a in anchors} == {0.0, 0.5, 1.0}
    for anchor in anchors + pool:
        assert anchor.grade == annotated_grade(anchor.point.future[0].requests, anchor.info)
        assert anchor.question == anchor.point.future[0].content
    rules = [rewards.RulesGrader().grade(a.question, a.info).score for a in anchors]
    assert rules != [a.grade for a in anchors]
