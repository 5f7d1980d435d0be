"""The README's results blocks, written from the committed reports
(``tests/test_readme_results.py`` compares them): "What the run produces" (the results part of
``make run``'s summary) and "Tables across training seeds" (the headline rows of the seeds
profile's tables, ``reports/training_seeds/``).

    python -m catalog.readme [README.md]   # rewrite both blocks after make run
"""

from __future__ import annotations

import sys
from pathlib import Path

from catalog.repro import results_lines

START = "<!-- make-run-results:start (python -m catalog.readme writes this block from reports/) -->"
END = "<!-- make-run-results:end -->"
SEEDS_START = "<!-- training-seeds-results:start (python -m catalog.readme writes this block from reports/training_seeds/) -->"
SEEDS_END = "<!-- training-seeds-results:end -->"
SEEDS_DIR = "reports/training_seeds"


def block(root: Path) -> str:
    return "```text\n" + "\n".join(results_lines(root)) + "\n```"


def seeds_block(root: Path) -> str:
    """The seeds profile's tables (``make run PROFILE=seeds``), as committed."""
    paths = sorted(str(p.relative_to(root)) for p in (root / SEEDS_DIR).glob("*.md"))
    return "```text\n" + "\n".join(results_lines(root, paths)[1:]) + "\n```"


def current_block(readme: str, start: str = START, end: str = END) -> str:
    """The text between the markers (ValueError naming the marker when one is missing)."""
    for marker in (start, end):
        if marker not in readme:
            raise ValueError(f"README.md: marker {marker!r} not found")
    return readme.split(start, 1)[1].split(end, 1)[0].strip("\n")


def with_block(readme: str, root: Path) -> str:
    for start, end, text in ((START, END, block(root)), (SEEDS_START, SEEDS_END, seeds_block(root))):
        current_block(readme, start, end)
        before, rest = readme.split(start, 1)
        readme = f"{before}{start}\n{text}\n{end}{rest.split(end, 1)[1]}"
    return readme


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "README.md")
    path.write_text(with_block(path.read_text(encoding="utf-8"), path.resolve().parent), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
