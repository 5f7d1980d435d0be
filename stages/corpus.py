"""DVC stage ``corpus``: write askflow's embedded MultiWOZ-layout corpus.

params.yaml ``corpus``: n_dialogues, seed, val_fraction, test_fraction, output, and
optionally db_dir (ground the goals in another MultiWOZ-schema database, e.g. the real one).
An unknown key, a value of the wrong type or splits that leave no training dialogue stop
the stage with ``error: params.yaml corpus.<key>: ...``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pipelines.config import from_params, positive_int
from pipelines.errors import ConfigError
from pipelines.multiwoz.embedded import generate_corpus, split_sizes
from stages.entry import main_wrapper
from catalog.io import read_params
from catalog.multiwoz_dir import read_raw_database, write_multiwoz


@dataclass(frozen=True)
class CorpusParams:
    n_dialogues: int
    seed: int
    output: str
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    db_dir: str | None = None


def corpus_params(params: Mapping[str, Any]) -> CorpusParams:
    """The ``corpus`` section, checked: types and keys as declared above, and splits that
    leave training dialogues (``n_dialogues: 12.7`` or ``val_fraction: 2.0`` are errors, not
    a truncated or an empty corpus)."""
    where = "params.yaml corpus"
    config = from_params(CorpusParams, params, where)
    positive_int(config.n_dialogues, f"{where}.n_dialogues")
    for name in ("val_fraction", "test_fraction"):
        value = getattr(config, name)
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{where}.{name}: expected a fraction in [0, 1), got {value}")
    held_out = sum(split_sizes(config.n_dialogues, config.val_fraction, config.test_fraction))
    if held_out >= config.n_dialogues:
        raise ConfigError(
            f"{where}: val_fraction {config.val_fraction} + test_fraction {config.test_fraction} of "
            f"{config.n_dialogues} dialogues hold out {held_out}, leaving no training dialogue"
        )
    return config


def run(params: Mapping[str, Any]) -> Path:
    config = corpus_params(params)
    db = read_raw_database(config.db_dir) if config.db_dir else None
    corpus = generate_corpus(
        config.n_dialogues,
        seed=config.seed,
        val_fraction=config.val_fraction,
        test_fraction=config.test_fraction,
        db=db,
    )
    output = Path(config.output)
    write_multiwoz(corpus, output)
    print(f"corpus: wrote {config.n_dialogues} dialogues to {output}")
    return output


@main_wrapper
def main() -> None:
    run(read_params("corpus"))


if __name__ == "__main__":
    main()
