"""Stages train_l2a_sft, train_l2a_grpo and l2a_eval: the test split never reaches training,
the evaluation scores real generations, and the DVC chain is idempotent."""

from __future__ import annotations

import json
import sys

import pytest

from catalog.io import read_artifact
from pipelines.errors import ConfigError, DataError

LOGS = [
    {"session_id": f"s{i}", "split": split, "messages": [
        {"role": "user", "content": "A table please.", "info": [{"field": "restaurant-area", "value": "north"}]},
        {"role": "assistant", "content": "Which area would you like?"},
        {"role": "user", "content": "The north.", "info": [{"field": "restaurant-food", "value": "thai"}]},
        {"role": "assistant", "content": "What food would you like?"},
        {"role": "user", "content": "Thai, for two.", "info": [{"field": "restaurant-book-people", "value": "2"}]},
        {"role": "assistant", "content": "Booked."},
    ]}
    for i, split in enumerate(["train", "train", "val", "test", "test", "test"])
]


def samples_rows():
    from pipelines.learn_to_ask.hindsight import RulesExtractor, hindsight_samples
    from pipelines.learn_to_ask.logs import parse_chat_logs
    from pipelines.learn_to_ask.tables import samples_table

    sessions = parse_chat_logs([(f"line {i}", r) for i, r in enumerate(LOGS)], "logs.jsonl")
    return samples_table(hindsight_samples(sessions, RulesExtractor(), "no_info")).to_pylist()


def test_held_out_samples_are_the_usable_rows_of_the_split_a_stable_sample():
    from pipelines.evaluation.learn_to_ask import held_out_samples

    rows = samples_rows()
    rows[0] = {**rows[0], "split": "test", "failure": "empty_info"}  # a dropped sample never counts
    chosen = held_out_samples(rows, "test", None)
    assert {r["session_id"] for r in chosen} == {"s3", "s4", "s5"} and all(r["failure"] is None for r in chosen)
    assert held_out_samples(rows, "test", 2) == held_out_samples(list(reversed(rows)), "test", 2)
    assert len(held_out_samples(rows, "test", 2)) == 2
    broken = [{**r, "decision_truth": None} if r["split"] == "test" else r for r in rows]
    with pytest.raises(DataError, match="without its target"):
        held_out_samples(broken, "test", None)


def test_a_test_split_row_stops_l2a_training():
    """The training leak check holds for the l2a layout: train/val rows train, a test row is an error."""
    from pipelines.learn_to_ask.tables import train_table
    from pipelines.learn_to_ask.hindsight import RulesExtractor, hindsight_samples
    from pipelines.learn_to_ask.logs import parse_chat_logs
    from pipelines.training.config import DataSpec, SourceSpec
    from pipelines.training.data import prepare_source

    sessions = parse_chat_logs([(f"line {i}", r) for i, r in enumerate(LOGS)], "logs.jsonl")
    table = train_table(hindsight_samples(sessions, RulesExtractor(), "no_info"), "Ask or <stop />.")
    rows = table.to_pylist()
    assert {r["split"] for r in rows} == {"train", "val"}
    source = SourceSpec("l2a_train.parquet", system_prompt="own")
    spec = DataSpec(sources=(source,), max_history_messages=None)
    count = lambda messages, add_generation_prompt=False: sum(len(m["content"].split()) for m in messages)  # noqa: E731
    for method in ("sft", "grpo"):
        prepared = prepare_source(rows, table.column_names, source, method, spec, count, 512)
        assert prepared.train and prepared.heldout and all(r["prompt"][0]["content"] == "Ask or <stop />." for r in prepared.train)
    leaked = [*rows, {**rows[0], "dialogue_id": "s3", "split": "test"}]
    with pytest.raises(DataError, match="test-split dialogue"):
        prepare_source(leaked, table.column_names, source, "sft", spec, count, 512)


def test_bad_eval_params_are_config_errors(tmp_path):
    from stages.l2a_eval import check_params, run

    good = {"samples": "s.parquet", "models": {"a": "m"}, "output": {"generations": "g.parquet", "metrics": "m.json", "markdown": "m.md"}}
    assert check_params(good)["split"] == "test"
    for bad, message in (({"nope": 1}, "unknown key"), ({"models": {}}, "l2a.eval.models"),
                         ({"compare": [["a", "zzz"]]}, "l2a.eval.compare"), ({"max_samples": 0}, "max_samples"),
                         ({"output": {"metrics": "m.json"}}, "l2a.eval.output")):
        with pytest.raises(ConfigError, match=message):
            check_params({**good, **bad})
    import pyarrow.parquet as pq
    from pipelines.learn_to_ask.tables import L2A_SAMPLES
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(samples_rows(), schema=L2A_SAMPLES.schema), tmp_path / "l2a_samples.parquet")
    with pytest.raises(ConfigError, match="does not exist"):
        run({**good, "samples": str(tmp_path / "l2a_samples.parquet"), "models": {"a": str(tmp_path / "missing")}})


def test_eval_scores_real_generations_and_writes_every_report(tmp_path, tiny_model_dir, single_torch_thread):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.learn_to_ask.tables import L2A_SAMPLES
    from stages.l2a_eval import run

    pq.write_table(pa.Table.from_pylist(samples_rows(), schema=L2A_SAMPLES.schema), tmp_path / "l2a_samples.parquet")
    output = {"generations": str(tmp_path / "g/l2a_eval.parquet"), "metrics": str(tmp_path / "l2a.json"), "markdown": str(tmp_path / "l2a.md")}
    params = {"samples": str(tmp_path / "l2a_samples.parquet"), "models": {"one": str(tiny_model_dir), "two": str(tiny_model_dir)},
              "generation": {"max_new_tokens": 8, "batch_size": 4}, "stats": {"resamples": 20, "alpha": 0.1, "seed": 0},
              "compare": [["two", "one"]], "output": output,
              "model_grader": {"samples": 4, "backend": "hf", "model_path": str(tiny_model_dir), "batch_size": 4,
                               "sampling": {"temperature": 0.0, "max_tokens": 8}}}
    report = run(params)
    table = read_artifact(tmp_path / "g/l2a_eval.parquet")  # the l2a_eval suite
    # Two models and the two reference rows, on the same samples.
    assert table.num_rows == 4 * report["samples"] and set(table.column("model").to_pylist()) == {"one", "two", "expert", "catch_all"}
    expert, catch_all = report["references"]["expert"], report["references"]["catch_all"]
    # The logs' expert asks about the slot the user has just given (area, then food): a slot of
    # the domain, not of I*_t (0.5); its decisions are s*_t itself.
    assert expert["metrics"]["WA"] == 0.5 and expert["metrics"]["AA"] == 1.0
    assert catch_all["metrics"]["WA"] == 0.0 and catch_all["metrics"]["WS"] == 0.0
    assert catch_all["reasons"] == {"mostly_beyond_target": 6, "wrong_decision": 3}
    # The model grader (a real, tiny hf model) read the fixed sample: 4 CONTINUE samples, only
    # the outputs with a question called it; its unreadable replies are counted, not scored.
    grading = report["model_grader"]
    assert grading["samples"] == 4 and grading["backend"] == "hf" and grading["prompt"] == "seed"
    assert grading["calls"] >= 8  # the expert's and the catch-all's questions at least
    assert set(grading["rows"]) == {"one", "two", "expert", "catch_all"}
    rows = grading["rows"].values()
    assert grading["calls"] == sum(r["graded"] + r["unreadable"] for r in rows) == grading["agreement"]["pairs"] + sum(grading["agreement"]["unreadable"].values())
    assert len(grading["unreadable_replies"]) == min(3, sum(r["unreadable"] for r in rows))
    assert report["samples"] == 9  # 3 test sessions x (2 CONTINUE + 1 STOP)
    saved = json.loads((tmp_path / "l2a.json").read_text())
    assert set(saved["models"]["one"]["metrics"]) == {"WA", "WA-GH", "WC", "WS", "AA", "FC", "TR"}
    assert saved["models"]["one"]["counts"]["stop"] == 3
    # The same model twice, greedy: identical outputs, zero difference.
    assert all(v in (0.0, None) for v in saved["compare"]["two - one"]["difference"].values())
    markdown = (tmp_path / "l2a.md").read_text()
    assert "| one | 9 |" in markdown and "| ref: expert | 9 |" in markdown and "| ref: catch_all | 9 |" in markdown
    assert "Model grader beside the rules grader" in markdown


def test_model_grader_agreement_counts_pairs_and_unreadable_grades():
    from pipelines.learn_to_ask.autoprompt import Prompt
    from pipelines.learn_to_ask.metrics import reference_outputs, score_output
    from pipelines.rewards.learn_to_ask import GRADER_FORMAT, GRADER_INSTRUCTION, LLMGrader, QuestionGrader, RulesGrader
    from pipelines.evaluation.learn_to_ask import grading_sample, model_grader_agreement

    samples = [r for r in samples_rows() if r["failure"] is None]
    outputs = reference_outputs(samples)
    grader = QuestionGrader(RulesGrader())
    scored = {n: [score_output(t, s["decision_truth"], s["info_truth"], grader) for t, s in zip(texts, samples)] for n, texts in outputs.items()}
    seen = []

    def complete(conversations):  # a grader that gives every question 0.5, except one unreadable reply to the catch-all
        seen.extend(conversations)
        catch_all = [i for i, c in enumerate(conversations) if "star rating" in c[-1]["content"]]
        return ["I cannot tell" if i == catch_all[0] else "<content_score>0.5</content_score>" for i in range(len(conversations))]

    chosen = grading_sample(samples, 5)
    assert chosen == grading_sample(list(samples), 5) and all(samples[i]["decision_truth"] == "continue" for i in chosen)
    result = model_grader_agreement(samples, [s["context"] for s in samples], outputs, scored, 5,
                                    LLMGrader(complete, "fake", Prompt(GRADER_INSTRUCTION, rules=(GRADER_FORMAT,))))
    assert result["samples"] == 5 and result["calls"] == len(seen) == 10  # expert and catch-all ask on every sample
    assert result["rows"]["expert"]["model"]["WA"] == 0.5 and result["rows"]["expert"]["rules"]["WA"] == 0.5
    # The catch-all: 0 by the rules grader, 0.5 by this model grader; one reply unreadable.
    assert result["rows"]["catch_all"]["graded"] == 4 and result["rows"]["catch_all"]["unreadable"] == 1
    assert result["rows"]["catch_all"]["model"]["WA"] == 0.5 and result["unreadable_replies"] == ["I cannot tell"]
    assert result["agreement"] == {"pairs": 9, "exact": 5 / 9, "confusion": {"0->0.5": 4, "0.5->0.5": 5}, "unreadable": {"unreadable_grade": 1}}


def test_model_grader_in_chunks_grades_as_in_one_call_and_tells_progress():
    """The stage calls the grader one backend batch at a time (to print progress): a grader
    that answers each conversation on its own gives the same agreement either way."""
    from pipelines.learn_to_ask.autoprompt import Prompt
    from pipelines.learn_to_ask.metrics import reference_outputs, score_output
    from pipelines.rewards.learn_to_ask import GRADER_FORMAT, GRADER_INSTRUCTION, LLMGrader, QuestionGrader, RulesGrader
    from pipelines.evaluation.learn_to_ask import model_grader_agreement

    samples = [r for r in samples_rows() if r["failure"] is None]
    outputs = reference_outputs(samples)
    grader = QuestionGrader(RulesGrader())
    scored = {n: [score_output(t, s["decision_truth"], s["info_truth"], grader) for t, s in zip(texts, samples)] for n, texts in outputs.items()}
    calls = []

    def complete(conversations):
        calls.append(len(conversations))
        return ["I cannot tell" if "star rating" in c[-1]["content"] else "<content_score>1.0</content_score>" for c in conversations]

    prompt = Prompt(GRADER_INSTRUCTION, rules=(GRADER_FORMAT,))
    whole = model_grader_agreement(samples, [s["context"] for s in samples], outputs, scored, 5, LLMGrader(complete, "fake", prompt))
    assert calls == [10]
    calls.clear()
    chunked = model_grader_agreement(samples, [s["context"] for s in samples], outputs, scored, 5, LLMGrader(complete, "fake", prompt), chunk=3)
    assert calls == [3, 3, 3, 1] and chunked == whole


def _shrink_l2a(params: dict) -> None:
    from tests.test_dvc_pipeline import shrink

    shrink(params)
    l2a = params["l2a"]
    for name in ("sft", "grpo"):
        section = l2a["train"][name]
        section["data"]["sources"][0]["max_rows"] = 8
        section["optim"].update(max_steps=2, batch_size=4, logging_steps=1)
        section["eval"].update(max_examples=4, max_new_tokens=8)
    l2a["train"]["grpo"]["objective"].update(num_generations=2, max_completion_length=8)
    l2a["eval"].update(model_grader=None, max_samples=6, generation={"max_new_tokens": 8, "batch_size": 6}, stats={"resamples": 20, "alpha": 0.05, "seed": 0})


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_dvc_repro_l2a_eval_trains_both_policies_and_is_idempotent(tmp_path):
    from tests.conftest import REPO
    from tests.test_dvc_pipeline import _run, pipeline_project

    project = pipeline_project(tmp_path / "project", _shrink_l2a)
    if not (project / "catalog").exists():  # pipeline_project predates catalog/ (the stages import it)
        import shutil

        shutil.copytree(REPO / "catalog", project / "catalog", ignore=shutil.ignore_patterns("__pycache__"))
        _run(["git", "add", "-A"], project)
        _run(["git", "commit", "-q", "-m", "catalog"], project)
    # seven stages (six trainings): 4 min on an idle 2-core machine, past 10 on a loaded one
    first = _run([sys.executable, "-m", "dvc", "repro", "l2a_eval"], project, timeout=1500)
    for stage in ("hindsight", "train_l2a_sft", "train_l2a_grpo", "train_l2a_sft_seeds@1", "train_l2a_grpo_seeds@2", "l2a_eval"):
        assert f"Running stage '{stage}'" in first.stdout
    sft = json.loads((project / "reports/train/l2a_sft.json").read_text())
    grpo = json.loads((project / "reports/train/l2a_grpo.json").read_text())
    assert sft["train"]["steps"] == 2 and grpo["train"]["steps"] == 2
    assert (project / "models/l2a_grpo/config.json").is_file()
    report = json.loads((project / "reports/l2a.json").read_text())
    assert set(report["models"]) == {"base", "l2a_sft", "l2a_grpo"} and report["split"] == "test"
    # the trained rows pool three training seeds (issue 28); GRPO of seed 2 started from SFT of seed 2
    assert report["models"]["l2a_grpo"]["seeds"] == 3 and report["models"]["l2a_sft"]["path"][2] == "models/l2a_sft_s2"
    seed2 = json.loads((project / "reports/train/l2a_grpo_s2.json").read_text())
    assert json.dumps(seed2).count("models/l2a_sft_s2") >= 1 and (project / "models/l2a_grpo_s2/config.json").is_file()
    assert set(report["references"]) == {"expert", "catch_all"}  # scored beside the models, on the same samples
    outputs = sum(m.get("seeds", 1) for m in report["models"].values()) + len(report["references"])  # a row per seed
    rows = outputs * (report["samples"] - report["dropped_too_long"])
    assert read_artifact(project / "data/processed/l2a/l2a_eval.parquet").num_rows == rows
    second = _run([sys.executable, "-m", "dvc", "repro", "l2a_eval"], project)
    assert "Running stage" not in second.stdout and "Data and pipelines are up to date" in second.stdout
