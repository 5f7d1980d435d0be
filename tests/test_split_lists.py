"""MultiWOZ split lists under every name the releases and ConvLab use (issue 29): none is
silently ignored, two that disagree are an error, a missing one is a warning (an error with
``strict``) saying what its dialogues become."""

from __future__ import annotations

import shutil

import pytest

from catalog.multiwoz_dir import load_multiwoz
from pipelines.errors import DataError


@pytest.fixture
def corpus_dir(small_corpus_dir, tmp_path):
    target = tmp_path / "multiwoz"
    shutil.copytree(small_corpus_dir, target)
    return target


def _splits(corpus) -> dict[str, int]:
    counts: dict[str, int] = {}
    for dialogue in corpus.dialogues:
        counts[dialogue.split] = counts.get(dialogue.split, 0) + 1
    return counts


@pytest.mark.parametrize("test_name, val_name", [
    ("testListFile.txt", "valListFile.txt"),      # MultiWOZ 2.1's zip
    ("testListFile", "valListFile"),              # ConvLab's copies
    ("testListFile.json", "devListFile.txt"),
])
def test_every_naming_of_the_split_lists_is_read(corpus_dir, test_name, val_name, capsys):
    expected = _splits(load_multiwoz(corpus_dir))
    (corpus_dir / "testListFile.json").rename(corpus_dir / test_name)
    (corpus_dir / "valListFile.json").rename(corpus_dir / val_name)
    assert _splits(load_multiwoz(corpus_dir, strict=True)) == expected
    assert expected["test"] > 0 and expected["val"] > 0
    assert "warning" not in capsys.readouterr().err


def test_no_split_list_warns_that_every_dialogue_becomes_train(corpus_dir, capsys):
    (corpus_dir / "testListFile.json").unlink()
    (corpus_dir / "valListFile.json").unlink()
    corpus = load_multiwoz(corpus_dir)
    assert set(_splits(corpus)) == {"train"}
    err = capsys.readouterr().err
    assert f"warning: {corpus_dir}: no test or val split list" in err and "every dialogue becomes train" in err
    with pytest.raises(DataError, match="every dialogue becomes train"):
        load_multiwoz(corpus_dir, strict=True)


def test_a_missing_val_list_is_named(corpus_dir, capsys):
    (corpus_dir / "valListFile.json").unlink()
    corpus = load_multiwoz(corpus_dir)
    assert "val" not in _splits(corpus) and _splits(corpus)["test"] > 0
    assert "no val split list (valListFile.json or its other names): no dialogue is val" in capsys.readouterr().err
    with pytest.raises(DataError, match="no val split list"):
        load_multiwoz(corpus_dir, strict=True)


def test_two_lists_of_one_split_that_disagree_are_refused(corpus_dir):
    ids = (corpus_dir / "testListFile.json").read_text().split()
    (corpus_dir / "testListFile.txt").write_text("\n".join(ids))  # the same list: fine
    load_multiwoz(corpus_dir, strict=True)
    (corpus_dir / "testListFile.txt").write_text("\n".join(ids[1:]))
    with pytest.raises(DataError, match="testListFile.txt.*differs from testListFile.json"):
        load_multiwoz(corpus_dir)
