"""PIR's evaluation on the GPU job with a model trained under several seeds: each seed's
model plays the goals, the row pools them as stage pir_eval_seeds does, and the success
intervals resample the seeds and then the goals (flows.gpu.evaluate_pir), played with the
tiny model on a small corpus on the CPU."""

from __future__ import annotations

import copy
import shutil

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import REPO


@pytest.mark.usefixtures("single_torch_thread")
def test_a_pir_row_of_seeds_is_pooled_and_its_interval_resamples_the_seeds(tiny_model_dir, small_corpus_dir, tmp_path):
    from flows.gpu import evaluate_pir

    copy_dir = tmp_path / "copy"  # the same weights as a second "seed"
    shutil.copytree(tiny_model_dir, copy_dir)
    section = copy.deepcopy(yaml.safe_load((REPO / "params.yaml").read_text())["gpu"]["profiles"]["pir"]["pir_eval"])
    section.update(source=str(small_corpus_dir), max_goals=2, stats={"resamples": 100, "seed": 0})
    section["rollout"] = {**section["rollout"], "max_exchanges": 2, "max_turn_tokens": 32, "max_total_tokens": 96,
                          "batch_size": 4, "cuda_graphs": False}
    played: dict = {}
    report = evaluate_pir(section, {"one": str(tiny_model_dir), "seeded": [str(tiny_model_dir), str(copy_dir)]}, tmp_path, played)
    one, seeded = report["results"]["one"], report["results"]["seeded"]
    assert seeded["training_seeds"] == 2 and seeded["conversations"] == 2 * one["conversations"] == 4
    assert list(seeded["per_training_seed"]) == ["seeded", "seeded@1"] and list(report["speed"]) == ["one", "seeded", "seeded@1"]
    for key in ("success", "ttr", "tokens", "questions"):  # the same greedy model twice: pooled = single
        assert seeded[key] == one[key] and seeded["seed_range"][key] == [one[key], one[key]]
    intervals = report["intervals"]
    assert intervals["training_seeds"] == {"one": 1, "seeded": 2} and intervals["models"]["seeded"]["success"] == one["success"]
    # identical seeds: drawing seeds changes nothing, so the pooled interval is the single model's
    assert intervals["models"]["seeded"]["ci95"] == intervals["models"]["one"]["ci95"]
    assert [c["models"] for c in intervals["comparisons"]] == [["seeded", "one"]]
    episodes = pq.read_table(tmp_path / "episodes.parquet").column("episode_id").to_pylist()
    assert sorted({e.split("/")[0] for e in episodes}) == ["one", "seeded", "seeded@1"] and len(episodes) == 6
    assert "the mean over the training seeds, then each seed alone" in report["markdown"]
    assert "over 2 training seeds of seeded (seed k with seed k) and then the goals" in report["markdown"]
    # played models are not played again: a second call with the same cache plays nothing new
    again = evaluate_pir(section, {"seeded": [str(tiny_model_dir), str(copy_dir)]}, tmp_path, played)
    assert again["results"]["seeded"] == seeded and set(played) == {"one", "seeded", "seeded@1"}


def test_pooled_success_intervals_resample_the_seeds_paired():
    """Two seeds that disagree on every goal: the pooled interval spreads over what a
    re-training moves, where the mean per goal would give a point; a model of one seed keeps
    success_intervals' figures; seeds are paired (seed k of one model with seed k of another)."""
    from flows.gpu import pooled_success_intervals
    from pipelines.pir.evaluate import success_intervals

    goals = 40
    ones, zeros = [1.0] * goals, [0.0] * goals
    out = pooled_success_intervals({"base": [zeros], "a": [ones, zeros], "b": [ones, zeros]}, 400, 0)
    assert out["models"]["a"]["success"] == 0.5
    low, high = out["models"]["a"]["ci95"]
    assert low == 0.0 and high == 1.0  # the seeds drawn: both 0, both 1, or one of each
    assert success_intervals({"a": [0.5] * goals}, 400, 0)["models"]["a"]["ci95"] == [0.5, 0.5]
    paired = next(c for c in out["comparisons"] if c["models"] == ["b", "a"])
    assert paired["difference"] == 0.0 and paired["ci95"] == [0.0, 0.0]  # seed k with seed k: a and b move together
    with pytest.raises(ValueError, match="as many to be paired"):
        pooled_success_intervals({"a": [ones, zeros], "b": [ones, zeros, ones]}, 10, 0)
    rng = np.random.default_rng(1)
    single = {name: [list(rng.integers(0, 2, goals).astype(float))] for name in ("x", "y")}
    assert pooled_success_intervals(single, 200, 3) == success_intervals({k: v[0] for k, v in single.items()}, 200, 3)
