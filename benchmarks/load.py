"""Load + validate time of the seeds stage's work for the embedded corpus and a 10x corpus.

    python benchmarks/load.py [--sizes 2500 25000]

For each size: generate the corpus and write it in the official layout (not timed),
then time (1) load_multiwoz (parse data.json + database), (2) building the Arrow tables,
(3) publish: Parquet write + Great Expectations validation. Prints seconds and peak RSS.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import yaml

from pipelines.multiwoz.embedded import generate_corpus
from pipelines.multiwoz.tables import SPECS, corpus_tables
from catalog.io import publish
from catalog.multiwoz_dir import load_multiwoz, write_multiwoz


def measure(n: int, seed: int, workdir: Path) -> dict:
    source = workdir / f"mw{n}"
    write_multiwoz(generate_corpus(n, seed=seed), source)
    t0 = time.perf_counter()
    corpus = load_multiwoz(source)
    t1 = time.perf_counter()
    tables = corpus_tables(corpus)
    t2 = time.perf_counter()
    out = workdir / f"out{n}"
    publish({out / f"{name}.parquet": (table, SPECS[name]) for name, table in tables.items()}, out / "report.json")
    t3 = time.perf_counter()
    return {
        "dialogues": n,
        "turns": tables["turns"].num_rows,
        "load_s": t1 - t0,
        "tables_s": t2 - t1,
        "write_validate_s": t3 - t2,
        "total_s": t3 - t0,
        "data_json_mb": (source / "data.json").stat().st_size / 2**20,
    }


def main() -> None:
    params = yaml.safe_load(Path("params.yaml").read_text()) if Path("params.yaml").exists() else {}
    default = int(params.get("corpus", {}).get("n_dialogues", 2500))
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[default, default * 10])
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    print(f"{'dialogues':>10} {'turns':>9} {'data.json MB':>13} {'load s':>8} {'tables s':>9} {'write+validate s':>17} {'total s':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            r = measure(n, args.seed, Path(tmp))
            print(f"{r['dialogues']:>10} {r['turns']:>9} {r['data_json_mb']:>13.1f} {r['load_s']:>8.2f} {r['tables_s']:>9.2f} {r['write_validate_s']:>17.2f} {r['total_s']:>8.2f}")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
