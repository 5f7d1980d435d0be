"""Learn-to-Ask's table across training seeds (issue 28): the SFT and GRPO rows pool three
training seeds and their intervals resample the seeds, not only the samples."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from catalog.io import read_artifact
from tests.learn_to_ask.test_l2a_stages import samples_rows

ROOT = Path(__file__).resolve().parents[2]


def test_params_and_dvc_yaml_list_every_training_seed():
    """l2a.eval.models names each seed's model, and l2a_eval depends on each (so it runs after
    the seed stages): the literal deps in dvc.yaml must follow l2a.train.more_seeds."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    l2a = params["l2a"]
    seeds = l2a["train"]["more_seeds"]
    assert len(seeds) >= 2 and 0 not in seeds  # seed 0 is the sections' own run (optim.seed 0)
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    deps = stages["l2a_eval"]["deps"]
    for method in ("sft", "grpo"):
        base = l2a["train"][method]["output"]["model_dir"]
        assert l2a["train"][method]["optim"].get("seed", 0) == 0
        assert l2a["eval"]["models"][f"l2a_{method}"] == [base, *[f"{base}_s{k}" for k in seeds]]
        for k in seeds:
            assert f"${{l2a.train.{method}.output.model_dir}}_s{k}" in deps
        assert stages[f"train_l2a_{method}_seeds"]["foreach"] == "${l2a.train.more_seeds}"


def test_eval_pools_the_seeds_of_a_row_and_keeps_each_seeds_outputs(tmp_path, tiny_model_dir, single_torch_thread):
    from pipelines.evaluation.learn_to_ask import readme_block
    from stages.l2a_eval import run
    from pipelines.learn_to_ask.tables import L2A_SAMPLES

    import shutil

    copy = tmp_path / "copy"  # the same model under a second "seed" (the directories must differ)
    shutil.copytree(tiny_model_dir, copy)
    pq.write_table(pa.Table.from_pylist(samples_rows(), schema=L2A_SAMPLES.schema), tmp_path / "l2a_samples.parquet")
    output = {"generations": str(tmp_path / "l2a_eval.parquet"), "metrics": str(tmp_path / "l2a.json"), "markdown": str(tmp_path / "l2a.md")}
    report = run({"samples": str(tmp_path / "l2a_samples.parquet"),
                  "models": {"one": str(tiny_model_dir), "seeded": [str(tiny_model_dir), str(copy)]},
                  "generation": {"max_new_tokens": 8, "batch_size": 4}, "stats": {"resamples": 20, "alpha": 0.1, "seed": 0},
                  "compare": [["seeded", "one"]], "output": output, "model_grader": None})
    saved = json.loads((tmp_path / "l2a.json").read_text())["models"]
    seeded, one = saved["seeded"], saved["one"]
    assert seeded["seeds"] == 2 and seeded["path"] == [str(tiny_model_dir), str(copy)]
    # the same model under two "seeds": each seed's metrics are the single row's, and so is the pool
    assert seeded["per_seed"] == [one["metrics"]] * 2 and seeded["metrics"] == one["metrics"]
    assert "seeds" not in report["models"]["one"]  # a one-seed row is reported as before
    table = read_artifact(tmp_path / "l2a_eval.parquet")
    assert set(table.column("model").to_pylist()) == {"one", "seeded", "seeded@1", "expert", "catch_all"}
    assert "Rows trained under several seeds (`seeded` 2)" in (tmp_path / "l2a.md").read_text()
    assert "Per training seed, `seeded`: WA-GH" in readme_block(report)
