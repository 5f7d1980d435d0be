"""``askflow``: look into the pipeline's artifacts from the command line, and schedule it.

    askflow tables [--root DIR]
    askflow sql "SELECT speaker, count(*) FROM turns GROUP BY 1" [--format table|csv|json] [--write]
    askflow ui [--host 127.0.0.1] [--port 4200] [--worker]
    askflow deploy [--root DIR] [--api-url URL]
    askflow gpu pack JOB [--split-mib N] | gpu loads JOB --limit-mib N | gpu run JOB [--smoke] [--resume] | gpu import RESULTS

Every Parquet file under ``<root>/data`` becomes a DuckDB view named after its stem, or
after as many trailing path parts as it takes to tell colliding stems apart
(``data/raw/items.parquet`` -> ``raw_items``); the imported GPU runs' tables under
``reports/gpu`` are one view per stem across all runs, with a ``run`` column
(``gpu_episodes``). ``sql`` is read-only unless ``--write`` is
given: SELECT statements over those views, and no other file read or written. Subcommands are subparsers so that more
(e.g. ``askflow stage <name>``) can be added beside these.

``ui`` runs a local Prefect server with its UI (and with ``--worker`` a worker that executes
scheduled runs) in the foreground; ``deploy`` creates the scheduled retraining deployment
(params.yaml ``retrain``) on it. Prefect is imported only by these two.
"""

from __future__ import annotations

import argparse
import csv
import json
import numbers
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import duckdb

from pipelines.errors import ConfigError
from stages.entry import main_wrapper
from catalog.io import read_params

DATA_DIR = "data"
#: Imported GPU runs (``askflow gpu import``): one view per table name across every run.
GPU_DIR = "reports/gpu"
FORMATS = ("table", "csv", "json")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="askflow", description="Inspect askflow's data and run its stages.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # --root on every subcommand rather than on the top parser, where `askflow tables
    # --root DIR` would be refused: options after the subcommand belong to the subparser.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", type=Path, default=Path("."), help="project directory (default: current)")

    tables = commands.add_parser("tables", parents=[common], help=f"list the Parquet artifacts under {DATA_DIR}/ and {GPU_DIR}/")
    tables.set_defaults(run=_tables)

    sql = commands.add_parser("sql", parents=[common], help="run a DuckDB query over the artifacts")
    sql.add_argument("query", help="SQL; every artifact is a view (see `askflow tables`)")
    sql.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    sql.add_argument(
        "--write", action="store_true",
        help="allow any DuckDB statement, including ones that read or write other files "
             "(default: read-only SELECT over the artifact views)",
    )
    sql.set_defaults(run=_sql)

    ui = commands.add_parser("ui", parents=[common], help="start a local Prefect server with its UI (Ctrl-C stops)")
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    ui.add_argument("--port", type=int, default=4200, help="port (default: 4200)")
    ui.add_argument("--worker", action="store_true", help="also start a worker that executes the scheduled retraining runs")
    ui.set_defaults(run=_ui)

    deploy = commands.add_parser("deploy", parents=[common], help="create or update the scheduled retraining deployment")
    deploy.add_argument("--api-url", help="Prefect API, e.g. http://127.0.0.1:4200/api (default: $PREFECT_API_URL)")
    deploy.set_defaults(run=_deploy)
    _gpu_parser(commands, common)
    return parser


def _gpu_parser(commands: Any, common: argparse.ArgumentParser) -> None:
    """``askflow gpu pack|run|import``: the real model on an offline accelerator node
    (:mod:`catalog.gpu_job`, :mod:`flows.gpu`)."""
    gpu = commands.add_parser("gpu", help="pack a job for an offline GPU node, run it there, import its results")
    actions = gpu.add_subparsers(dest="action", required=True, metavar="ACTION")
    pack = actions.add_parser("pack", parents=[common], help="write a self-contained job (code at HEAD, inputs, model, packages)")
    pack.add_argument("job", type=Path, help="the job directory to write (new or empty)")
    pack.add_argument("--split-mib", type=int, default=None, help="cut files above N MiB into parts of at most N MiB")
    pack.add_argument("--python", default=None, help="the node's Python version, e.g. 3.12 (default: params.yaml gpu.vendor.python)")
    pack.add_argument("--wheelhouse", type=Path, default=None, help="take the node's wheels from this folder, offline")
    pack.set_defaults(run=_gpu_pack)
    loads = actions.add_parser("loads", parents=[common],
                               help="group a packed job's files into loads for a channel with a size limit per transfer")
    loads.add_argument("job", type=Path, help="the job directory (askflow gpu pack)")
    loads.add_argument("--limit-mib", type=float, required=True, help="the most one transfer takes, in MiB")
    loads.add_argument("--reserve-mib", type=float, default=0.0, help="MiB of every transfer taken by what travels with it")
    loads.add_argument("--with-checkout", action="store_true",
                       help="reserve the size of this checkout (tracked and unignored files), as a channel that carries it each time")
    loads.add_argument("--max-paths", type=int, default=None, help="the most files one transfer takes")
    loads.add_argument("--node-folder", default=None,
                       help="also print each call: the paths to carry and the node's command, which copies the load into this "
                            "folder (kept while the node is warm); the last runs the job there (e.g. /tmp/job)")
    loads.add_argument("--timeout-s", type=int, default=570, help="with --node-folder: the job's time limit in the last call (the device call allows 600 s: the rest packs the results)")
    loads.add_argument("--profile", default=None, help="with --node-folder: the profile the last call runs (default: the packed one)")
    loads.set_defaults(run=_gpu_loads)
    run = actions.add_parser("run", help="check, unpack and run a job (on the node; offline)")
    run.add_argument("job", type=Path, help="the job directory")
    run.add_argument("--profile", default=None, help="a profile of params.yaml gpu.profiles (default: the packed one)")
    run.add_argument("--smoke", action="store_true", help="the same code path with tiny counts (runs on a CPU)")
    run.add_argument("--out", type=Path, default=None, help="results directory (default: JOB/results)")
    run.add_argument("--resume", action="store_true", help="the results directory holds a stopped run of this job: "
                     "keep the stages it finished, run the rest")
    run.set_defaults(run=_gpu_run)
    take = actions.add_parser("import", parents=[common], help="check a job's results and put them under reports/gpu/")
    take.add_argument("results", type=Path, help="the results directory the job wrote, or the results.tar.gz the node command packs")
    take.add_argument("--dest", type=Path, default=None, help="where to put them (default: reports/gpu/<date>_<device>_<profile>)")
    take.add_argument("--allow-smoke", action="store_true", help="import smoke-run results too")
    take.set_defaults(run=_gpu_import)


def _gpu_pack(args: argparse.Namespace) -> int:
    from catalog.gpu_job import pack
    from flows.gpu import check_profile_inputs

    # The training contracts here, where Great Expectations is: the node trains without it.
    check_profile_inputs(args.root.resolve())
    pack(args.root, args.job, split_mib=args.split_mib, python=args.python, wheelhouse=args.wheelhouse)
    return 0


def _gpu_loads(args: argparse.Namespace) -> int:
    import json

    from catalog.gpu_job import checkout_mib, load_calls, plan_loads, run_command

    reserve = args.reserve_mib + (checkout_mib(args.root.resolve()) if args.with_checkout else 0.0)
    planned = plan_loads(args.job, args.limit_mib, reserve_mib=reserve, max_paths=args.max_paths)
    calls = None
    if args.node_folder:
        # Carried paths are relative to the checkout that travels: the job must lie inside it.
        job = args.job.resolve()
        root = args.root.resolve()
        relative = job.relative_to(root).as_posix() if job.is_relative_to(root) else str(job)
        calls = load_calls(planned, relative, args.node_folder, args.timeout_s, args.profile)
    print(f"gpu loads: {len(planned)} load(s) of at most {args.limit_mib:g} MiB, {reserve:.1f} MiB of each reserved; "
          f"on the node every load goes into one folder, paths kept; the last one runs it (python3 FOLDER/run.py)")
    for number, load in enumerate(planned, 1):
        mib = load["bytes"] / 2**20
        print(f"load {number}/{len(planned)}{' (runs the job)' if load['runs'] else ''}: {mib:.1f} MiB "
              f"({mib + reserve:.1f} with the reserve), {len(load['files'])} file(s): {' '.join(load['files'])}")
        if calls is not None:
            print(f"  carry: {json.dumps(calls[number - 1]['carry'])}")
            print(f"  command: {calls[number - 1]['command']}")
    if calls is not None:
        print("a run cut by its time limit: the next call, at once while the node is warm, finishes it: "
              + run_command(args.node_folder, args.timeout_s, args.profile, resume=True))
    return 0


def _gpu_run(args: argparse.Namespace) -> int:
    from catalog.gpu_job import run_job

    arguments = [*(["--profile", args.profile] if args.profile else []), *(["--smoke"] if args.smoke else []),
                 *(["--out", str(args.out.resolve())] if args.out else []), *(["--resume"] if args.resume else [])]
    return run_job(args.job, arguments)


def _gpu_import(args: argparse.Namespace) -> int:
    from catalog.gpu_job import import_results

    import_results(args.root, args.results, dest=args.dest, allow_smoke=args.allow_smoke)
    return 0


@main_wrapper
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


# --- Views ----------------------------------------------------------------------------------


def _parquet_files(base: Path) -> list[Path]:
    """Every Parquet file under ``base``, relative to it, in order; none where ``base`` is missing."""
    relative = sorted(p.relative_to(base) for p in base.rglob("*.parquet") if p.is_file())
    # Hidden names are temporary files of an atomic write in progress, or tool state.
    return [p for p in relative if not any(part.startswith(".") for part in p.parts)]


def find_artifacts(root: Path) -> dict[str, Path]:
    """View name -> Parquet file, for every Parquet file under ``root/data``."""
    data = root / DATA_DIR
    relative = _parquet_files(data)
    return dict(zip(view_names(relative), (data / p for p in relative)))


def find_gpu_tables(root: Path) -> dict[str, list[Path]]:
    """View name -> its Parquet files across the imported GPU runs under ``root/reports/gpu``
    (``gpu_`` and the file's stem: ``gpu_episodes`` holds every run's ``episodes.parquet``,
    with a ``run`` column naming the run's folder)."""
    tables: dict[str, list[Path]] = {}
    base = root / GPU_DIR
    for path in _parquet_files(base):
        if len(path.parts) > 1:  # inside a run's folder
            tables.setdefault("gpu_" + re.sub(r"\W", "_", path.stem), []).append(base / path)
    return tables


def view_names(paths: Sequence[Path]) -> list[str]:
    """A distinct SQL-friendly name per path: the stem, prefixed by as many parent
    directories as needed to tell it from the others."""
    depth = [1] * len(paths)
    while True:
        names = [_view_name(path, d) for path, d in zip(paths, depth)]
        counts = Counter(names)
        colliding = [i for i, name in enumerate(names) if counts[name] > 1]
        if not colliding:
            return names
        grown = [i for i in colliding if depth[i] < len(paths[i].parts)]
        if not grown:  # e.g. data/a_b.parquet and data/a/b.parquet
            raise ConfigError(f"cannot name a view for each of: {', '.join(str(paths[i]) for i in colliding)}")
        for i in grown:
            depth[i] += 1


def _view_name(path: Path, depth: int) -> str:
    parts = [*path.parent.parts, path.stem][-depth:]
    return re.sub(r"\W", "_", "_".join(parts))


def connect(artifacts: dict[str, Path], gpu: dict[str, list[Path]] | None = None) -> duckdb.DuckDBPyConnection:
    """A connection with a view per artifact, and one per GPU table over all its runs. A file
    DuckDB cannot read as Parquet (damaged, truncated, not Parquet at all) gets no view: it is
    named in a warning on stderr and taken out of ``artifacts`` (or ``gpu``), so that one bad
    file does not stop every query over the others."""
    connection = duckdb.connect()
    for name, path in list(artifacts.items()):
        # The relation API quotes the path and the name itself; no SQL is assembled here.
        try:
            connection.read_parquet(str(path)).create_view(name)
        except duckdb.Error as error:
            print(f"warning: {path}: cannot read as Parquet, skipped (no view {name!r}): {error}", file=sys.stderr)
            del artifacts[name]
    for name, paths in list((gpu or {}).items()):
        if name in artifacts:
            raise ConfigError(f"{paths[0]}: view {name!r} is also the name of {artifacts[name]}")
        for path in list(paths):
            try:
                connection.read_parquet(str(path))  # reads the footer: as the artifacts' views above
            except duckdb.Error as error:
                print(f"warning: {path}: cannot read as Parquet, left out of view {name!r}: {error}", file=sys.stderr)
                paths.remove(path)
        if not paths:
            del gpu[name]
            continue
        # Runs written by different commits may differ in columns: matched by name. The run is
        # the folder under reports/gpu (the greedy match finds the last such folder).
        relation = connection.read_parquet([str(p.resolve()) for p in paths], filename=True, union_by_name=True)
        relation.project(f"regexp_extract(filename, '.*/{GPU_DIR}/([^/]+)/', 1) AS run, * EXCLUDE (filename)").create_view(name)
    return connection


# --- Subcommands ----------------------------------------------------------------------------


def _tables(args: argparse.Namespace) -> int:
    artifacts, gpu = find_artifacts(args.root), find_gpu_tables(args.root)
    if not artifacts and not gpu:
        print(f"no Parquet files under {args.root / DATA_DIR}", file=sys.stderr)
        return 0
    connection = connect(artifacts, gpu)
    where = {name: str(path.relative_to(args.root)) for name, path in artifacts.items()}
    where.update({name: str(paths[0].relative_to(args.root)) if len(paths) == 1 else f"{GPU_DIR}/*: {len(paths)} files"
                  for name, paths in gpu.items()})
    rows = [(name, connection.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0], path) for name, path in where.items()]
    print(format_table(["name", "rows", "path"], rows))
    return 0


# Statements a read-only query may hold: SELECT (with DESCRIBE, SHOW, SUMMARIZE and WITH,
# which DuckDB parses as SELECT) and EXPLAIN.
READ_ONLY_STATEMENTS = ("SELECT", "EXPLAIN")


def read_only(connection: duckdb.DuckDBPyConnection, artifacts: dict[str, Path], gpu: dict[str, list[Path]] | None = None) -> None:
    """Lock ``connection`` down to reading the artifacts: no other file can be read or
    written (``read_csv('/etc/hostname')``, ``COPY ... TO``, ``ATTACH``, extensions), and the
    settings cannot be changed back by the query."""
    paths = [str(path.resolve()) for path in artifacts.values()]
    paths += [str(path.resolve()) for runs in (gpu or {}).values() for path in runs]
    connection.execute("SET allowed_paths = $paths", {"paths": paths})
    connection.execute("SET enable_external_access = false")
    connection.execute("SET lock_configuration = true")


def check_read_only(connection: duckdb.DuckDBPyConnection, query: str) -> None:
    """ConfigError unless every statement of ``query`` only reads."""
    try:
        statements = connection.extract_statements(query)
    except duckdb.Error as error:
        raise ConfigError(f"query failed: {error}") from None
    for statement in statements:
        kind = statement.type.name
        if kind not in READ_ONLY_STATEMENTS:
            raise ConfigError(
                f"askflow sql is read-only: a {kind} statement is not allowed "
                f"({' '.join(statement.query.split())[:80]!r}); pass --write to run it"
            )


def _sql(args: argparse.Namespace) -> int:
    artifacts, gpu = find_artifacts(args.root), find_gpu_tables(args.root)
    connection = connect(artifacts, gpu)
    if not args.write:
        check_read_only(connection, args.query)
        read_only(connection, artifacts, gpu)
    try:
        cursor = connection.execute(args.query)
        columns = [description[0] for description in cursor.description or ()]
        rows = cursor.fetchall() if columns else []
    except duckdb.Error as error:
        # A bad query is bad command-line input: reported like every other askflow error.
        raise ConfigError(f"query failed: {error}") from None
    if args.format == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
    elif args.format == "json":
        records = [dict(zip(columns, row)) for row in rows]
        print(json.dumps(records, indent=2, ensure_ascii=False, default=_json_default))
    else:
        print(format_table(columns, rows))
    return 0


def _retrain_config(root: Path):
    from pipelines.retrain import SECTION, retrain_config

    return retrain_config(read_params(SECTION, root / "params.yaml"), where=f"{root / 'params.yaml'}: {SECTION}")


def _ui(args: argparse.Namespace) -> int:
    from flows.deploy import serve

    root = args.root.resolve()
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port: {args.port} is not a port number")
    # Read before anything starts: a bad retrain section fails at once, not after the server.
    work_pool = _retrain_config(root).work_pool if args.worker else None
    return serve(root, args.host, args.port, work_pool, echo=lambda line: print(line, flush=True))


def _deploy(args: argparse.Namespace) -> int:
    from flows.deploy import check_server, deploy_retrain, resolve_api_url, ui_url

    from prefect.settings import PREFECT_API_URL, temporary_settings

    root = args.root.resolve()
    config = _retrain_config(root)
    api_url = resolve_api_url(args.api_url, PREFECT_API_URL.value())
    check_server(api_url)

    with temporary_settings({PREFECT_API_URL: api_url}):
        deployment_id = deploy_retrain(root, config)
    print(f"deployment retrain/{config.deployment} ({deployment_id})")
    print(f"  schedule: {config.cron} ({config.timezone}); work pool {config.work_pool!r}; project {root}")
    print(f"  targets: {' '.join(config.targets) or 'the whole pipeline'}")
    print(f"  {ui_url(api_url)}/deployments/deployment/{deployment_id}")
    print("Scheduled runs execute on a worker for the pool: `askflow ui --worker`, or")
    print(f"  PREFECT_API_URL={api_url} prefect worker start --pool {config.work_pool}")
    print(f"Run it now: prefect deployment run retrain/{config.deployment}")
    return 0


# --- Output ---------------------------------------------------------------------------------


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns padded to a common width; numbers right-aligned, NULL for None."""
    cells = [[_cell(value) for value in row] for row in rows]
    widths = [max([len(column), *(len(row[i]) for row in cells)]) for i, column in enumerate(columns)]
    numeric = [bool(rows) and all(_is_number(row[i]) or row[i] is None for row in rows) for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        padded = (v.rjust(w) if right else v.ljust(w) for v, w, right in zip(values, widths, numeric))
        return "  ".join(padded).rstrip()

    rule = ["-" * width for width in widths]
    footer = f"({len(rows)} row{'' if len(rows) == 1 else 's'})"
    return "\n".join([line(columns), line(rule), *(line(row) for row in cells), footer])


def _cell(value: Any) -> str:
    return "NULL" if value is None else str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def _json_default(value: Any) -> Any:
    """Values DuckDB returns that json cannot encode: dates, decimals, UUIDs, bytes."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
