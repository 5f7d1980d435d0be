"""DVC stage ``corpus``: write askflow's embedded MultiWOZ-layout corpus.

params.yaml ``corpus``: n_dialogues, seed, val_fraction, test_fraction, output, and
optionally db_dir (ground the goals in another MultiWOZ-schema database, e.g. the real one).
"""

from __future__ import annotations

from pathlib import Path

from pipelines.errors import ConfigError
from pipelines.multiwoz.embedded import generate_corpus
from stages.io import main_wrapper, read_params
from stages.multiwoz_dir import read_raw_database, write_multiwoz


def run(params: dict) -> Path:
    try:
        n_dialogues = int(params["n_dialogues"])
        seed = int(params["seed"])
        output = Path(params["output"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"params.yaml corpus: n_dialogues, seed and output are required ({exc})") from exc
    if n_dialogues < 1:
        raise ConfigError("params.yaml corpus.n_dialogues must be >= 1")
    db = read_raw_database(params["db_dir"]) if params.get("db_dir") else None
    corpus = generate_corpus(
        n_dialogues,
        seed=seed,
        val_fraction=float(params.get("val_fraction", 0.1)),
        test_fraction=float(params.get("test_fraction", 0.1)),
        db=db,
    )
    write_multiwoz(corpus, output)
    print(f"corpus: wrote {n_dialogues} dialogues to {output}")
    return output


@main_wrapper
def main() -> None:
    run(read_params("corpus"))


if __name__ == "__main__":
    main()
