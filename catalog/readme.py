"""The README's "What the run produces" block: the results part of ``make run``'s summary,
written from the committed reports (``tests/test_readme_results.py`` compares them).

    python -m catalog.readme [README.md]   # rewrite the block after make run
"""

from __future__ import annotations

import sys
from pathlib import Path

from catalog.repro import results_lines

START = "<!-- make-run-results:start (python -m catalog.readme writes this block from reports/) -->"
END = "<!-- make-run-results:end -->"


def block(root: Path) -> str:
    return "```text\n" + "\n".join(results_lines(root)) + "\n```"


def current_block(readme: str) -> str:
    """The text between the markers (ValueError naming the marker when one is missing)."""
    for marker in (START, END):
        if marker not in readme:
            raise ValueError(f"README.md: marker {marker!r} not found")
    return readme.split(START, 1)[1].split(END, 1)[0].strip("\n")


def with_block(readme: str, root: Path) -> str:
    current_block(readme)
    before, rest = readme.split(START, 1)
    return f"{before}{START}\n{block(root)}\n{END}{rest.split(END, 1)[1]}"


def main(argv: list[str]) -> int:
    path = Path(argv[0] if argv else "README.md")
    path.write_text(with_block(path.read_text(encoding="utf-8"), path.resolve().parent), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
