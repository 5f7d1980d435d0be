"""SpeakRL's table across training seeds (issue 28): the `seeds` profile trains sft/dpo/kto/grpo
again under further seeds and stage evaluate_seeds pools each trained row over its seeds, its
intervals and paired tests resampling the seeds and then the goals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from catalog.io import read_artifact
from catalog.profiles import merge
from pipelines.errors import ConfigError
from pipelines.evaluation.metrics import EpisodeScore, bootstrap_summary, bootstrap_summary_seeds
from stages.common import seeds_table_section
from stages.evaluate import eval_config, run
from tests.evaluation.test_stage import params_for

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("sft", "dpo", "kto", "grpo")


def _profile_params() -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    merge(params, yaml.safe_load((ROOT / "profiles" / "seeds.yaml").read_text()), "", "profiles/seeds.yaml")
    return params


def test_the_default_runs_no_seed_stage_and_the_profile_lists_every_seed():
    """The default keeps its 20 minutes (no seed stage); under the profile evaluate_seeds
    names each seed's model and depends on each (so it runs after the seed stages)."""
    default = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert default["train"]["more_seeds"] == [] and default["evaluate_seeds"]["tables"] == []
    params = _profile_params()
    seeds = params["train"]["more_seeds"]
    assert len(seeds) >= 2 and 0 not in seeds and params["evaluate_seeds"]["tables"]
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    deps = stages["evaluate_seeds"]["do"]["deps"]
    models = params["evaluate_seeds"]["models"]
    assert models["base"] == params["evaluate"]["models"]["base"]
    for method in METHODS:
        base = params["train"][method]["output"]["model_dir"]
        assert params["train"][method]["optim"].get("seed", 0) == 0
        assert models[method] == [{"path": base}, *[{"path": f"{base}_s{k}"} for k in seeds]]
        assert [f"${{train.{method}.output.model_dir}}_s{k}" for k in seeds] == [d for d in deps if d.startswith(f"${{train.{method}.")]
        stage = stages[f"train_{method}_seeds"]
        assert stage["foreach"] == "${train.more_seeds}"
        assert f"stages.train {method} --seed ${{item}}" in stage["do"]["cmd"]
        if method != "sft":  # from SFT of the same seed
            assert "--start ${train.sft.output.model_dir}_s${item}" in stage["do"]["cmd"]
    # every setting but the models and outputs is evaluate's: the same goals and decoding
    section = seeds_table_section(params["evaluate"], params["evaluate_seeds"], "eval_seeds", "evaluate_seeds", {"output": {}})
    assert {k: v for k, v in section.items() if k not in ("models", "output")} == {
        k: v for k, v in params["evaluate"].items() if k not in ("models", "output")}
    config = eval_config(section)
    assert [len(specs) for specs in config.rows().values()] == [1, 3, 3, 3, 3]
    assert [s.name for s in config.rows()["sft"]] == ["sft", "sft@1", "sft@2"]


@pytest.mark.parametrize("seeds, table, message", [
    ({"tables": ["t"], "models": {}, "extra": 1}, "t", "unknown key(s) ['extra']"),
    ({"tables": [], "models": {}}, "t", "'t' is not one of them"),
    ({"tables": ["../t"], "models": {}}, "../t", "a file name of letters"),
])
def test_bad_seeds_sections_are_refused(seeds, table, message):
    with pytest.raises(ConfigError, match="params.yaml evaluate_seeds") as error:
        seeds_table_section({}, seeds, table, "evaluate_seeds", {})
    assert message in str(error.value)


def test_an_empty_list_of_seed_models_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"evaluate.models.sft: an empty list"):
        eval_config({"source": str(tmp_path), "models": {"sft": []}})


def _score(goal: int, ok: bool, questions: int) -> EpisodeScore:
    return EpisodeScore(f"e{goal}", f"g{goal:02d}", 0, ok, 6 + questions, "done", {"hotel": ok}, (int(ok), 1), (0, 0), (0, 0),
                        questions, 0, 0, 0)


def test_one_seed_per_row_gives_the_figures_of_before_and_seeds_widen_the_interval():
    first = [_score(g, g % 2 == 0, g % 3) for g in range(30)]
    second = [_score(g, g % 5 == 0, g % 2) for g in range(30)]
    base = [_score(g, g % 7 == 0, 0) for g in range(30)]
    before = bootstrap_summary({"base": base, "sft": first}, resamples=400, seed=1)
    assert json.dumps(bootstrap_summary_seeds({"base": [base], "sft": [first]}, resamples=400, seed=1)) == json.dumps(before)
    results, statistics = bootstrap_summary_seeds({"base": [base], "sft": [first, second]}, resamples=400, seed=1)
    sft = results["sft"]
    assert sft["training_seeds"] == 2 and sft["runs"] == 2 and sft["episodes"] == 60
    assert sft["success"]["mean"] == pytest.approx((15 / 30 + 6 / 30) / 2) and sft["success"]["std"] > 0
    one_seed = before[0]["sft"]["success"]
    assert sft["success"]["ci95_high"] - sft["success"]["ci95_low"] > one_seed["ci95_high"] - one_seed["ci95_low"]
    assert statistics["method"]["training_seeds"] == {"base": 1, "sft": 2}
    assert "training seeds" in statistics["method"]["test"]
    with pytest.raises(ValueError, match="as many to be paired"):
        bootstrap_summary_seeds({"a": [first, second], "b": [first, second, first]}, resamples=100)


def test_a_row_of_seeds_is_pooled_and_each_seed_reported(prefect_api, small_corpus_dir, tiny_model_dir, tmp_path):
    copy = tmp_path / "copy"  # the same weights as a second "seed" (the directories must differ)
    shutil.copytree(tiny_model_dir, copy)
    params = params_for(tmp_path, small_corpus_dir, tiny_model_dir, seeds=[0],
                        models={"one": {"path": str(tiny_model_dir)}, "seeded": [{"path": str(tiny_model_dir)}, {"path": str(copy)}]})
    report = run(params)
    one, seeded = report["models"]["one"], report["models"]["seeded"]
    assert "training_seeds" not in one and seeded["training_seeds"] == 2 and seeded["runs"] == 2
    # the same greedy model twice: each seed scores as the single row, and so does the pool
    assert seeded["per_training_seed"]["seeded"] == seeded["per_training_seed"]["seeded@1"]
    assert seeded["per_training_seed"]["seeded"]["turns"] == one["turns"]["mean"] == seeded["turns"]["mean"]
    assert report["statistics"]["method"]["training_seeds"] == {"one": 1, "seeded": 2}
    episodes = read_artifact(tmp_path / "data" / "episodes" / "eval" / "episodes.parquet")
    assert sorted(set(episodes.column("agent").to_pylist())) == ["one", "seeded", "seeded@1"]
    markdown = (tmp_path / "reports" / "eval.md").read_text()
    assert "Training seeds: seeded were each trained under 2 seeds" in markdown
    assert "## Per training seed" in markdown and "| seeded@1 |" in markdown
    # the first seed alone, beside the pooled tests: the same greedy model, so the same verdicts
    assert set(report["statistics"]["first_seed_only"]) == set(report["statistics"]["comparisons"])
    assert "## With one training seed" in markdown and "With the first seed alone" in markdown


def test_under_the_profile_dvc_orders_every_seed_stage_before_its_table(tmp_path):
    """`dvc dag` of dvc.yaml with the seeds profile: each table's stage runs after every seed
    stage whose model it plays (its literal deps), and the default has no seed stage at all."""
    import subprocess
    import sys

    from catalog.profiles import apply_profile

    (tmp_path / "profiles").mkdir()
    for name in ("dvc.yaml", "params.yaml", "profiles/seeds.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=tmp_path, check=True)

    def edges() -> set[tuple[str, str]]:
        dot = subprocess.run([sys.executable, "-m", "dvc", "dag", "--dot"], cwd=tmp_path, check=True, capture_output=True, text=True).stdout
        return {tuple(part.strip().strip('"') for part in line.strip().rstrip(";").split("->")) for line in dot.splitlines() if "->" in line}

    assert not any("seeds@" in a + b and "l2a" not in a + b for a, b in edges())
    apply_profile(tmp_path, "seeds")
    found = edges()
    tables = {"evaluate_seeds@eval_seeds": [f"train_{m}_seeds@{k}" for m in METHODS for k in (1, 2)],
              "pir_eval_seeds@pir_eval_seeds": [f"train_pir_{m}_seeds@{k}" for m in ("sft", "grpo") for k in (1, 2)],
              "clarifier_eval_seeds@clarifier_eval_seeds": [f"train_clarifier_{m}_seeds@{k}" for m in ("sft", "dpo", "grpo") for k in (1, 2)]}
    for table, seed_stages in tables.items():
        for stage in seed_stages:
            assert (stage, table) in found, (stage, table)
    for k in (1, 2):  # DPO/KTO/GRPO of seed k after SFT of seed k
        assert {(f"train_sft_seeds@{k}", f"train_{m}_seeds@{k}") for m in ("dpo", "kto", "grpo")} <= found
        assert (f"train_pir_sft_seeds@{k}", f"train_pir_grpo_seeds@{k}") in found


def _listed(values: list[float]) -> str:
    """``a, b and c`` as the README writes a row's seeds."""
    text = [f"{v:.2f}" for v in values]
    return ", ".join(text[:-1]) + f" and {text[-1]}"


def test_the_readme_figures_are_the_committed_seeds_tables():
    """The figures the README's "Tables across training seeds" quotes, read from the
    committed reports of the seeds profile (reports/training_seeds/)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    text = " ".join(readme.split("### Tables across training seeds", 1)[1].split("\n### ", 1)[0].split())
    tables = ROOT / "reports" / "training_seeds"

    speakrl = json.loads((tables / "eval_seeds.json").read_text())
    sft, grpo = ([v["malformed_per_dialogue"] for v in speakrl["models"][row]["per_training_seed"].values()] for row in ("sft", "grpo"))
    assert f"from {sft[0]:.2f} (seed 0) to {sft[1]:.2f} (seed 1) and {sft[2]:.2f} (seed 2), GRPO's from {_listed(grpo).replace(', ', ' to ', 1)}" in text
    first = sum(r["significant"] for rows in speakrl["statistics"]["first_seed_only"].values() for r in rows)
    pooled = sum(r["significant"] for rows in speakrl["statistics"]["comparisons"].values() for r in rows)
    assert f"this machine's table called {first} differences significant" in text and f"pooled over three seeds {pooled} remain" in text
    assert all(v["success"] == 0.0 for row in speakrl["models"].values() for v in (row.get("per_training_seed") or {}).values())
    held = {(key, r["a"], r["b"]) for key, rows in speakrl["statistics"]["comparisons"].items() for r in rows if r["significant"]}
    kept = sum((key, r["a"], r["b"]) in held for key, rows in speakrl["statistics"]["first_seed_only"].items() for r in rows if r["significant"])
    assert f"of the {first} SpeakRL differences one seed called significant on the Intel Xeon, {kept} hold" in " ".join(readme.split())

    pir = json.loads((tables / "pir_eval_seeds.json").read_text())["results"]
    sft_seeds = list(pir["pir_sft"]["per_training_seed"].values())
    assert f"resolution are {_listed([m['ttr'] for m in sft_seeds])}" in text and f"tokens {_listed([m['tokens'] for m in sft_seeds])}" in text
    assert f"{pir['base']['ttr']:.2f} and {pir['base']['tokens']:.2f}" in text
    assert [m["ttr"] for m in pir["pir_grpo"]["per_training_seed"].values()] == [m["ttr"] for m in sft_seeds]

    clarifier = json.loads((tables / "clarifier_eval_seeds.json").read_text())["runs"]
    none = {domain: clarifier["none"][domain]["passed"] for domain in ("retail", "airline")}
    same = [row for row in ("sft", "dpo", "grpo")
            if all(clarifier[row][domain]["passed_by_training_seed"] == [none[domain]] * 3 for domain in none)]
    assert f"retail {'/'.join([str(none['retail'])] * 3)}, airline {'/'.join([str(none['airline'])] * 3)}" in text
    named = {"sft": "SFT", "dpo": "DPO", "grpo": "GRPO"}
    assert f"the {' and '.join(named[row] for row in same)} Clarifiers pass the same tasks under every seed" in text
    for row in sorted(set(named) - set(same)):  # a row whose success moved with the seed: each such seed quoted
        for domain in none:
            for k, passed in enumerate(clarifier[row][domain]["passed_by_training_seed"]):
                if passed != none[domain]:
                    assert f"{named[row]}'s seed {k} Clarifier" in text
                    assert f"({passed} of {clarifier[row][domain]['n_tasks'] * clarifier[row][domain]['seeds']} episodes passed against {none[domain]}" in text
    for row, name in (("sft", "SFT's questions per retail episode are"), ("dpo", "DPO's"), ("grpo", "GRPO's")):
        assert f"{name} {_listed(clarifier[row]['retail']['avg_clarify_by_training_seed'])}" in text
