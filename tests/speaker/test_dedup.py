"""The SpeakER redundancy filter: near-duplicate removal by word n-gram Jaccard similarity."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from pipelines.speaker import dedup
from pipelines.speaker.dedup import (
    DedupResult,
    jaccard,
    lsh_params,
    near_duplicates,
    near_duplicates_exact,
    shingles,
    words,
)

BOTH = pytest.mark.parametrize("filter_", [near_duplicates, near_duplicates_exact], ids=["lsh", "exact"])

QUESTION = "Just to clarify, would you prefer a restaurant in the centre or in the north of town for dinner on Friday?"


def similarity(a: str, b: str, ngram: int = 3) -> float:
    return jaccard(shingles(a, ngram), shingles(b, ngram))


def bag(*tokens: str) -> str:
    """A document whose unigram set is exactly ``tokens`` (for ``ngram=1`` set algebra)."""
    return " ".join(tokens)


# --- normalisation and shingles ------------------------------------------------------------------


def test_words_lowercase_and_delete_punctuation():
    assert words("Don't BOOK the 'Golden Wok' at 14:15, please!") == ["dont", "book", "the", "golden", "wok", "at", "1415", "please"]
    assert words("snake_case\tand\nnew  lines") == ["snakecase", "and", "new", "lines"]
    assert words(" ?! ... ") == []


def test_shingles_of_short_documents_are_the_whole_sequence():
    assert shingles("Which area?", 3) == {("which", "area")}
    assert shingles("a b c d", 3) == {("a", "b", "c"), ("b", "c", "d")}
    assert shingles("...", 3) == set()
    assert shingles("x y z x y z x", 3) == shingles("y z x y z x y", 3)  # different text, same set


# --- what is removed -----------------------------------------------------------------------------


@BOTH
def test_identical_and_near_identical_questions_are_removed(filter_):
    near = QUESTION.replace("Friday", "Saturday")
    assert similarity(QUESTION, near) == 18 / 20  # the last of 19 trigrams differs
    documents = [QUESTION, QUESTION, QUESTION.upper().replace(",", "").replace("?", " ?"), near]
    result = filter_(documents, 0.8)
    assert result.keep == [0]
    assert result.duplicate_of == {1: 0, 2: 0, 3: 0}
    assert result.n_removed == 3


@BOTH
def test_paraphrases_below_the_threshold_are_kept(filter_):
    documents = [
        QUESTION,
        "Do you want the restaurant to be in the centre or in the north, and is Friday dinner right?",
        "Which part of town should the restaurant be in: centre or north?",
        QUESTION.replace("centre", "south").replace("north", "east").replace("Friday", "Monday"),
    ]
    assert all(similarity(QUESTION, other) < 0.8 for other in documents[1:])
    result = filter_(documents, 0.8)
    assert result.keep == [0, 1, 2, 3]
    assert result.duplicate_of == {}


@BOTH
def test_a_pair_exactly_at_the_threshold_is_a_duplicate(filter_):
    a, b = bag("a", "b", "c", "d", "e"), bag("a", "b", "c", "d")
    assert similarity(a, b, ngram=1) == 0.8
    assert filter_([a, b], 0.8, ngram=1).duplicate_of == {1: 0}
    assert filter_([a, b], 0.81, ngram=1).duplicate_of == {}


# --- greedy semantics ----------------------------------------------------------------------------


@BOTH
def test_a_document_similar_only_to_a_dropped_one_is_kept(filter_):
    # a ~ b (9/11), b ~ c (9/11), a !~ c (8/12): b goes as a duplicate of a, and c stays because
    # only kept documents count.
    core = [f"w{i}" for i in range(8)]
    a, b, c = bag(*core, "p", "q"), bag(*core, "p", "r"), bag(*core, "s", "r")
    assert similarity(a, b, 1) >= 0.8 and similarity(b, c, 1) >= 0.8 and similarity(a, c, 1) < 0.8
    result = filter_([a, b, c], 0.8, ngram=1)
    assert result.keep == [0, 2]
    assert result.duplicate_of == {1: 0}


@BOTH
def test_a_duplicate_maps_to_the_first_similar_kept_document(filter_):
    core = [f"w{i}" for i in range(8)]
    x0, x1 = bag(*core, "p", "q"), bag(*core, "r", "s")  # 8/12 apart: both kept
    y = bag(*core, "p", "r")  # 9/11 from each
    unrelated = "something else entirely"
    result = filter_([unrelated, x0, x1, y, x1, y], 0.8, ngram=1)
    assert result.keep == [0, 1, 2]
    assert result.duplicate_of == {3: 1, 4: 2, 5: 1}
    # The first similar *kept* document is the first kept one when they come in the other order.
    assert filter_([x1, x0, y], 0.8, ngram=1).duplicate_of == {2: 0}


@BOTH
def test_empty_and_short_documents(filter_):
    documents = ["", "  ", "?!", "Which area?", "which AREA", "which area please", "", "Hi", "hi!", "hello"]
    result = filter_(documents, 0.8)
    # No-word documents are kept and never matched, not even by one another; a short document is
    # its own single shingle, so it only matches the same word sequence.
    assert result.duplicate_of == {4: 3, 8: 7}
    assert result.keep == [0, 1, 2, 3, 5, 6, 7, 9]


def test_odd_characters_and_whitespace_are_handled_like_words_does():
    # near_duplicates tokenises a block of documents at once, joined by a NUL separator token;
    # NULs, control separators and Unicode whitespace inside documents must not confuse it.
    documents = [
        "Café au lait?", "CAFÉ, AU LAIT", "a\x00b c d", "ab c d", "x\u2028y z w", "x y z w", "x\x1cy z w",
        "ΟΔΟΣ ΟΔΟΣ ΟΔΟΣ", "οδος οδος οδος", "\x00", "",
    ]
    result = near_duplicates(documents, 1.0)
    assert result == near_duplicates_exact(documents, 1.0)
    assert result.duplicate_of == {1: 0, 3: 2, 5: 4, 6: 4, 8: 7}


def test_no_documents():
    assert near_duplicates([], 0.8) == DedupResult(keep=[], duplicate_of={})
    assert near_duplicates_exact([], 0.8) == DedupResult(keep=[], duplicate_of={})


# --- threshold edge cases ------------------------------------------------------------------------


def test_threshold_one_removes_exactly_the_identical_shingle_sets():
    documents = [
        "x y z x y z x",
        "Y Z X Y Z X Y",  # another text with the same trigram set
        QUESTION,
        QUESTION.replace("dinner", "lunch"),  # J = 16 / 22
        QUESTION + " " + QUESTION,  # the same trigrams and two across the seam: J = 19 / 21
        QUESTION.lower() + "!!",
    ]
    result = near_duplicates(documents, 1.0)
    assert result.duplicate_of == {1: 0, 5: 2}
    assert result == near_duplicates_exact(documents, 1.0)


def test_threshold_one_agrees_exactly_with_the_reference():
    # Identical sets always collide in every band: at threshold 1 LSH cannot miss anything.
    documents = template_corpus(300, random.Random(5))
    assert near_duplicates(documents, 1.0) == near_duplicates_exact(documents, 1.0)


@pytest.mark.parametrize("threshold", [0.0, -0.1, 1.01, float("nan")])
def test_threshold_outside_0_1_is_refused(threshold):
    with pytest.raises(ValueError, match="threshold"):
        near_duplicates(["a"], threshold)
    with pytest.raises(ValueError, match="threshold"):
        near_duplicates_exact(["a"], threshold)


def test_bad_ngram_and_num_perm_are_refused():
    with pytest.raises(ValueError, match="ngram"):
        near_duplicates(["a"], 0.8, ngram=0)
    with pytest.raises(ValueError, match="num_perm"):
        near_duplicates(["a"], 0.8, num_perm=0)


# --- determinism ---------------------------------------------------------------------------------


def test_deterministic_for_a_seed_and_blocks_do_not_matter(monkeypatch):
    documents = template_corpus(400, random.Random(11))
    first = near_duplicates(documents, 0.7, seed=3)
    assert near_duplicates(tuple(documents), 0.7, seed=3) == first
    monkeypatch.setattr(dedup, "_BLOCK", 37)  # blocks that split the corpus anywhere
    assert near_duplicates(documents, 0.7, seed=3) == first


def test_hashing_does_not_depend_on_pythonhashseed():
    # Signatures from two interpreters with different string hashing must be identical.
    script = (
        "import json, sys\n"
        "from pipelines.speaker import dedup\n"
        "v = dedup._Vocabulary()\n"
        "f, c = dedup._shingle_fingerprints(['Which area, north or south?', 'a b', 'x y z w'], 3, v)\n"
        "s = dedup._minhash(f, c, dedup._hash_functions(8, 0))\n"
        "print(json.dumps([f.tolist(), s.tolist()]))\n"
    )
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        outputs.append(json.loads(run.stdout))
    assert outputs[0] == outputs[1]
    assert len(set(outputs[0][0])) == 3 + 1 + 2  # trigrams, one short shingle, trigrams


# --- agreement with the exact reference ----------------------------------------------------------

SLOTS = {
    "area": ("centre", "north", "south", "east", "west"),
    "price range": ("cheap", "moderate", "expensive"),
    "day": ("monday", "tuesday", "friday", "saturday", "sunday"),
    "food": ("italian", "indian", "chinese", "thai", "british", "french"),
}
PLACES = ("golden wok", "kings arms", "river bistro", "old lodge", "city rooms", "green house", "abbey inn")
OPENERS = ("", "Just to clarify,", "Sorry,", "Before I book,", "Quick question:", "Great.")
TEMPLATES = (
    "{opener} would you prefer {a} or {b} for the {slot}?",
    "{opener} when you say {a}, do you mean the {slot} {a} or {b}?",
    "{opener} which one did you mean, the {p1} or the {p2}?",
    "{opener} is the {slot} {a} important to you, or would {b} also be fine for the booking?",
    "{opener} I found the {p1} and the {p2} in the {a}. Which of them should I book for {n} people?",
)


def template_corpus(n: int, rng: random.Random, dup_rate: float = 0.35) -> list[str]:
    """SpeakER-like documents (one to four templated clarification questions); ``dup_rate`` of
    them rewrite an earlier document: a copy, other casing and punctuation, or one or two words
    replaced, deleted or inserted, which lands on either side of common thresholds."""

    def question() -> str:
        slot = rng.choice(tuple(SLOTS))
        a, b = rng.sample(SLOTS[slot], 2)
        p1, p2 = rng.sample(PLACES, 2)
        text = rng.choice(TEMPLATES).format(opener=rng.choice(OPENERS), slot=slot, a=a, b=b, p1=p1, p2=p2, n=rng.randint(2, 8))
        return text.strip()

    documents: list[str] = []
    for _ in range(n):
        if documents and rng.random() < dup_rate:
            tokens = rng.choice(documents).split()
            kind = rng.random()
            if kind < 0.2:
                pass
            elif kind < 0.35:
                tokens = [token.upper().strip(",.?:") for token in tokens]
            else:
                for _ in range(rng.randint(1, 2)):
                    i = rng.randrange(len(tokens))
                    edit = rng.random()
                    if edit < 0.4:
                        tokens[i] = rng.choice(SLOTS[rng.choice(tuple(SLOTS))])
                    elif edit < 0.7 and len(tokens) > 1:
                        del tokens[i]
                    else:
                        tokens.insert(i, rng.choice(("please", "also", "maybe", "really")))
            documents.append(" ".join(tokens))
        else:
            documents.append(" ".join(question() for _ in range(rng.randint(1, 4))))
    return documents


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9])
@pytest.mark.parametrize("corpus_seed", [1, 2])
def test_agrees_with_the_exact_reference(threshold, corpus_seed):
    documents = template_corpus(400, random.Random(corpus_seed))
    exact = near_duplicates_exact(documents, threshold)
    result = near_duplicates(documents, threshold, seed=corpus_seed)
    sets = [shingles(document, 3) for document in documents]

    # The test means something: plenty of removals, some of them close to the threshold.
    assert exact.n_removed > 40
    assert sum(jaccard(sets[d], sets[k]) < min(1.0, threshold + 0.1) for d, k in exact.duplicate_of.items()) >= 10

    # A partition of the indices; every removal verified (precision 1.0) and greedy-consistent.
    assert sorted(result.keep + list(result.duplicate_of)) == list(range(len(documents)))
    assert result.keep == sorted(result.keep)
    kept = set(result.keep)
    for dropped, original in result.duplicate_of.items():
        assert original < dropped and original in kept
        assert jaccard(sets[dropped], sets[original]) >= threshold
        # ... and it is the first similar kept document.
        assert not any(k < original and jaccard(sets[dropped], sets[k]) >= threshold for k in kept)

    # Only LSH misses can differ, and they are rare.
    found = set(result.duplicate_of) & set(exact.duplicate_of)
    assert len(found) / exact.n_removed >= 0.98


def test_few_permutations_still_never_remove_a_non_duplicate():
    documents = template_corpus(300, random.Random(3))
    sets = [shingles(document, 3) for document in documents]
    result = near_duplicates(documents, 0.8, num_perm=8)
    assert result.n_removed > 0
    assert all(jaccard(sets[d], sets[k]) >= 0.8 for d, k in result.duplicate_of.items())


# --- the LSH machinery ---------------------------------------------------------------------------


def test_lsh_params_follow_datasketchs_criterion():
    lsh = pytest.importorskip("datasketch.lsh")
    if not hasattr(lsh, "_optimal_param"):
        pytest.skip("this datasketch has no _optimal_param")
    weights = (dedup.FALSE_POSITIVE_WEIGHT, dedup.FALSE_NEGATIVE_WEIGHT)
    for num_perm in (16, 64, 128):
        for threshold in (0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0):
            assert lsh_params(threshold, num_perm) == lsh._optimal_param(threshold, num_perm, *weights)


def test_lsh_params_for_the_default_rarely_miss_a_pair_at_the_threshold():
    bands, rows = lsh_params(0.8, 64)
    assert bands * rows <= 64
    assert (1 - 0.8**rows) ** bands < 0.01  # probability that a pair at J = 0.8 shares no band
    assert lsh_params(1.0, 64) == (1, 64)


def test_minhash_signatures_agree_in_proportion_to_jaccard():
    rng = random.Random(0)
    documents, expected = [], []
    for overlap in (0, 5, 10, 20, 30, 40, 50, 60):
        common = [f"c{overlap}_{i}" for i in range(overlap)]
        a = common + [f"a{overlap}_{i}" for i in range(60 - overlap)]
        b = common + [f"b{overlap}_{i}" for i in range(60 - overlap)]
        rng.shuffle(a), rng.shuffle(b)
        documents += [" ".join(a), " ".join(b)]
        expected.append(overlap / (120 - overlap))
    fingerprints, counts = dedup._shingle_fingerprints(documents, 1, dedup._Vocabulary())
    signatures = dedup._minhash(fingerprints, counts, dedup._hash_functions(2048, 7))
    agreement = (signatures[0::2] == signatures[1::2]).mean(axis=1)
    # Binomial standard deviation at 2048 hash functions is at most 0.011.
    assert np.abs(agreement - np.array(expected)).max() < 0.04
