"""The pir_augment stage on a small embedded corpus with a tiny local teacher: the published
artifact validates, a re-run writes the same bytes, bad input stops it with a clear message."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.artifacts.validate import validate
from pipelines.pir.tables import SPECS
from pipelines.pir.traces import split_steps
from stages import pir_augment
from catalog.io import read_artifact

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def _params(tmp_path: Path, corpus: Path, model: Path, **overrides) -> dict:
    return {
        "source": str(corpus), "db_dir": None, "traces": None, "max_traces": 12, "seed": 0,
        "teacher": {"backend": "hf", "model_path": str(model), "batch_size": 4}, "threads": 1,
        "top_k_percent": 20, "scope": "trace", "inserter": {"backend": "rules"},
        "output": str(tmp_path / "pir"), "metrics": str(tmp_path / "pir.json"), **overrides,
    }


@pytest.fixture(scope="module")
def stage_run(tmp_path_factory, small_corpus_dir, tiny_model_dir):
    tmp = tmp_path_factory.mktemp("pir")
    params = _params(tmp, small_corpus_dir, tiny_model_dir)
    return params, pir_augment.run(dict(params))


def test_stage_publishes_valid_augmented_traces(stage_run):
    params, metrics = stage_run
    path = Path(params["output"]) / "pir_traces.parquet"
    table = read_artifact(path)  # runs the expectation suite
    assert validate(table, SPECS["pir_traces"]).success
    rows = table.to_pylist()
    assert len(rows) == metrics["traces"] == 12
    assert json.loads(Path(params["metrics"]).read_text()) == metrics
    assert metrics["insertions"] == sum(r["n_insertions"] for r in rows)
    # Every selected step gets its pair: the inserter does not know where the assumptions are.
    assert metrics["insertions"] == metrics["selected_steps"] and metrics["skipped"] == {}
    assert metrics["insertions_at_assumption_steps"] + metrics["insertions_elsewhere"] == metrics["insertions"]
    for row in rows:
        steps = row["steps"]
        assert len(steps) == len(row["step_entropies"]) == len(split_steps(row["reasoning_content"]))
        assert len(row["selected_steps"]) == max(1, round(0.2 * len(steps)))
        # The selected steps are the highest-entropy ones.
        floor = min(row["step_entropies"][i] for i in row["selected_steps"])
        assert sum(v > floor for v in row["step_entropies"]) < len(row["selected_steps"])
        assert row["inserted_steps"] == row["selected_steps"]
        aug = row["augmented_trace"]
        assert aug.startswith("<think>\n") and aug.endswith("</think>\n\n" + row["content"])
        assert aug.count("<asking>") == aug.count("<response>") == row["n_insertions"]
        for step, question in zip(row["inserted_steps"], row["questions"]):
            assert f"{steps[step]}\n\n<asking>{question}</asking>" in row["augmented_reasoning"]
    assert metrics["insertions_at_assumption_steps"] == sum(len(set(r["inserted_steps"]) & set(r["assumption_steps"])) for r in rows)
    fid = metrics["fidelity"]
    offsets = fid["selected_offset_from_assumption"]
    assert sum(offsets.values()) == metrics["selected_steps"]
    headline, sweep = fid["headline"], fid["sweep"]
    assert (headline["k_percent"], headline["scope"]) == (20, "trace") and offsets.get("0", 0) == headline["hits"]
    assert set(sweep) == {"10", "20", "30"}
    assert {k: v for k, v in sweep["20"]["trace"].items()} == {k: v for k, v in headline.items() if k not in ("k_percent", "scope")}
    assert fid["bootstrap"]["unit"] == "trace" and fid["bootstrap"]["resamples"] >= 1000
    for k in sweep:
        for scope in ("trace", "corpus"):
            cell = sweep[k][scope]
            assert cell["positives"] == sum(len(r["assumption_steps"]) for r in rows)
            for key in ("precision", "recall", "random_precision", "random_recall"):
                value, low, high = cell[key]["value"], cell[key]["ci95_low"], cell[key]["ci95_high"]
                assert 0.0 <= low <= high <= 1.0 and low - 1e-9 <= value <= high + 1e-9, (k, scope, key, cell[key])
            assert cell["precision_minus_random"]["value"] == round(cell["precision"]["value"] - cell["random_precision"]["value"], 4)


def test_rerun_writes_the_same_bytes(stage_run, tmp_path):
    params, metrics = stage_run
    path = Path(params["output"]) / "pir_traces.parquet"
    before = path.read_bytes()
    again = pir_augment.run(dict(params))
    assert path.read_bytes() == before and again == metrics


def test_a_trace_file_with_the_rules_inserter_is_refused_before_the_model_loads(tmp_path, small_corpus_dir):
    traces = tmp_path / "traces.jsonl"
    traces.write_text(json.dumps({"input": "x", "reasoning_content": "a\n\nb", "content": "c"}) + "\n")
    params = _params(tmp_path, small_corpus_dir, tmp_path / "no-model", traces=str(traces))
    with pytest.raises(Exception, match="rules inserter needs the embedded traces"):
        pir_augment.run(params)


def test_bad_input_exits_non_zero_naming_file_record_and_field(tmp_path, small_corpus_dir, monkeypatch, capsys):
    traces = tmp_path / "traces.jsonl"
    traces.write_text(json.dumps({"id": "q1", "input": "x", "reasoning_content": ["a"], "content": "c"}) + "\n")
    params = _params(tmp_path, small_corpus_dir, tmp_path / "no-model", traces=str(traces),
                     inserter={"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"})
    (tmp_path / "params.yaml").write_text(json.dumps({"pir": params}))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        pir_augment.main()
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert f"error: {traces}, record 'q1', field 'reasoning_content': expected a string, got list" in err
    assert not (tmp_path / "pir").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"top_k_percent": 0}, "top_k_percent must be in"),
        ({"scope": "global"}, "scope must be one of"),
        ({"teacher": {"backend": "rules"}}, "pir.teacher.backend: 'rules' is not supported"),
        ({"max_traces": 0}, "max_traces"),
        ({"bogus": 1}, "unknown key"),
    ],
)
def test_bad_params_are_config_errors(tmp_path, small_corpus_dir, override, message):
    from pipelines.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        pir_augment.run(_params(tmp_path, small_corpus_dir, tmp_path / "m", **override))


def test_trace_file_with_the_llm_inserter(tmp_path, small_corpus_dir, tiny_model_dir, make_server, monkeypatch):
    from pipelines.llm.testing import fake_server

    def scripted(messages, seed, index, as_json):
        prompt = str(messages[-1]["content"])
        if "UNPARSABLE" in prompt:
            return "I would ask something."
        return "Assistant: Which one do you mean?\nUser: The second one."

    monkeypatch.setattr(fake_server, "reply_text", scripted)
    server = make_server()
    records = [
        {"id": "r1", "input": "Find a hotel.", "reasoning_content": "Many hotels match.\n\nI pick the cheap one.\n\nIt is the Acorn.", "content": "The Acorn."},
        {"id": "r2", "input": "UNPARSABLE", "reasoning_content": "One.\n\nTwo.", "content": "x"},
    ]
    traces = tmp_path / "traces.jsonl"
    traces.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    params = _params(tmp_path, small_corpus_dir, tiny_model_dir, traces=str(traces), top_k_percent=50,
                     cache_dir=str(tmp_path / "cache"),
                     inserter={"backend": "openai", "base_url": server.base_url, "model": "fake", "max_retries": 0})
    metrics = pir_augment.run(params)
    rows = {r["trace_id"]: r for r in pq.read_table(Path(params["output"]) / "pir_traces.parquet").to_pylist()}
    assert rows["r1"]["assumption_steps"] is None and "fidelity" not in metrics
    # 50 % of 3 steps rounds to 2: two pairs, the second asked with the first as its history.
    assert len(rows["r1"]["selected_steps"]) == 2 == rows["r1"]["n_insertions"]
    assert rows["r1"]["questions"] == ["Which one do you mean?"] * 2 and rows["r1"]["answers"] == ["The second one."] * 2
    assert "<asking>Which one do you mean?</asking>\n<response>The second one.</response>" in rows["r1"]["augmented_trace"]
    assert rows["r2"]["n_insertions"] == 0 and rows["r2"]["skipped_reasons"] == ["unparsable"]
    assert metrics["skipped"] == {"unparsable": 1} and metrics["llm"]["total"]["requests"] == server.stats.requests == 3
    bodies = [b["messages"] for b in server.stats.bodies]
    assert all(m[0]["content"].startswith('Your task is to transform the given "self-thinking process"') for m in bodies)
    with_history = [m for m in bodies if "history:\nAssistant: Which one do you mean?\nUser: The second one." in m[1]["content"]]
    assert len(with_history) == 1 and "Find a hotel." in with_history[0][1]["content"]
