"""Conformance of askflow's τ-bench tools with τ-bench's own (ground_truth_replay.json).

    python benchmarks/taubench_conformance.py [--root ../shared/data/taubench]

Prints, per domain, tasks / calls / changed records reproduced, and the time taken.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from time import perf_counter

from pipelines.env.taubench.conformance import check_conformance
from stages.taubench_dir import load_ground_truth_replay, load_taubench_domain

DEFAULT_ROOT = Path(os.environ.get("ASKFLOW_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "data" / "taubench"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(DEFAULT_ROOT))
    args = parser.parse_args(argv)
    all_ok = True
    for domain_name in ("retail", "airline"):
        started = perf_counter()
        domain = load_taubench_domain(args.root, domain_name)
        loaded = perf_counter() - started
        report = check_conformance(domain, load_ground_truth_replay(args.root, domain_name))
        took = perf_counter() - started - loaded
        print(
            f"{domain_name}: tasks {report.tasks_conforming}/{report.tasks} conform; "
            f"calls {report.calls_matching}/{report.calls} outputs equal ({report.error_calls} are τ-bench errors); "
            f"changed records {report.records_matching}/{report.records}; load {loaded:.2f} s, replay {took:.2f} s"
        )
        for failure in report.failures[:10]:
            print(f"  {failure}")
        all_ok &= report.ok
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
