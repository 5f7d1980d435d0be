"""Redundancy filter for SpeakER dialogues: near-duplicate removal by word n-gram similarity.

SpeakRL (section 3.4) filters every synthesized dialogue "to remove redundant clarification
questions using n-gram similarity". Here a dialogue is one document, the concatenation of its
clarification questions, and :func:`near_duplicates` drops each document that is a
near-duplicate of a document kept before it.

Similarity
    A document is lower-cased, its punctuation deleted ("don't" -> "dont") and the rest split
    on whitespace into words (:func:`words`). Its shingles are the *set* of its word n-grams; a
    document of 1 to n-1 words has a single shingle, its whole word sequence (:func:`shingles`).
    Two documents are near-duplicates when the Jaccard index of their shingle sets is
    >= ``threshold``. A document without words (empty, or punctuation only) has no shingles and
    no meaningful similarity: it is always kept and nothing is ever a duplicate of it.

Greedy, in input order
    A document is dropped when it is a near-duplicate of an earlier *kept* document, and maps to
    the first (lowest-index) such document. With a ~ b, b ~ c but not a ~ c, a and c are kept
    and b is dropped as a duplicate of a: each kept document stands for its duplicates, and a
    dropped document never causes another to be dropped.

How :func:`near_duplicates` avoids comparing all pairs
    1. Shingle fingerprints. Every distinct word gets a 64-bit BLAKE2b hash (stable across runs,
       machines and ``PYTHONHASHSEED``, and independent of the rest of the corpus); the
       fingerprints of all n-grams are chained from the word hashes in a few vectorised numpy
       passes. One hashlib call per distinct word instead of one per shingle: 3x faster.
    2. MinHash. ``bands * rows`` (<= ``num_perm``) seeded 2-universal hash functions of the
       fingerprints; a document's signature is their minima over its shingles, so two
       signatures agree in one position with probability (very nearly) the Jaccard index.
    3. LSH banding. Signatures are cut into ``bands`` bands of ``rows`` rows; documents with an
       identical band share a bucket. (bands, rows) come from :func:`lsh_params`.
    4. Verification. A greedy pass visits the documents that share a bucket with another one and
       compares each with the kept documents of its buckets by the exact Jaccard index of their
       fingerprint sets. Every removal is therefore a true near-duplicate; the only error left
       is an LSH miss (a similar pair that shares no band), which keeps a duplicate.

Steps 1-3 are vectorised and linear in the corpus but for one sort of the band keys. Step 4 is a
Python loop whose cost is the number of candidate pairs, which grows faster than the corpus
when many documents are similar just below the threshold (one phrasing, other slot values):
such pairs share a band now and then, and there are more of them per document as it grows.

Shingles are compared by their 64-bit fingerprints: two distinct n-grams of a corpus with S
distinct n-grams share a fingerprint with probability about S**2 / 2**65 (3e-6 for ten million),
far below the LSH miss rate. :func:`near_duplicates_exact` compares the word tuples themselves,
against every kept document; it is the reference for tests on small inputs.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from dataclasses import dataclass
from itertools import islice
from typing import AbstractSet, Sequence

import numpy as np

from pipelines.config import positive_int

# The relative costs of the two LSH errors when choosing (bands, rows). A false positive costs
# one exact Jaccard check; a false negative silently keeps a duplicate. Equal weights (the
# datasketch default) choose 5 bands x 11 rows for threshold 0.8 and 64 permutations, which
# misses 64% of the pairs at exactly the threshold; these choose 12 x 5, which misses 1%.
FALSE_POSITIVE_WEIGHT = 0.01
FALSE_NEGATIVE_WEIGHT = 0.99

_NON_WORD = re.compile(r"[^\w\s]|_")
_SEPARATOR = "\x00"  # neither a word character nor whitespace: no cleaned document contains it
_BLOCK = 1 << 14  # documents per block, see near_duplicates
_MIX_1 = np.uint64(0xFF51AFD7ED558CCD)
_MIX_2 = np.uint64(0xC4CEB9FE1A85EC53)
_SHIFT_33 = np.uint64(33)
_SHIFT_32 = np.uint64(32)


@dataclass(frozen=True)
class DedupResult:
    """``keep``: the kept indices, ascending. ``duplicate_of``: each dropped index -> the kept
    index it duplicates (always a smaller one)."""

    keep: list[int]
    duplicate_of: dict[int, int]

    @property
    def n_removed(self) -> int:
        return len(self.duplicate_of)


def words(text: str) -> list[str]:
    """The lower-cased words of ``text``, punctuation (and underscores) deleted."""
    return _NON_WORD.sub("", text.lower()).split()


def shingles(text: str, ngram: int) -> set[tuple[str, ...]]:
    """The word n-gram set of ``text``; one shingle (all words) when it has fewer than ``ngram``."""
    tokens = words(text)
    if 0 < len(tokens) < ngram:
        return {tuple(tokens)}
    return {tuple(tokens[i : i + ngram]) for i in range(len(tokens) - ngram + 1)}


def jaccard(a: AbstractSet, b: AbstractSet) -> float:
    """|a & b| / |a | b|, and 0.0 for two empty sets."""
    common = len(a & b)
    union = len(a) + len(b) - common
    return common / union if union else 0.0


def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows), ``bands * rows <= num_perm``, minimising the weighted areas under the
    false-positive curve on [0, threshold] and the false-negative curve on [threshold, 1] (the
    criterion of datasketch's ``MinHashLSH``, with the weights above). Ties go to fewer bands,
    then fewer rows, as in datasketch."""
    _check(threshold, num_perm=num_perm)
    pairs = np.array([(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)])
    bands, rows = pairs[:, :1], pairs[:, 1:]
    grid = (np.arange(1000) + 0.5) / 1000  # midpoint rule on [0, 1], rescaled to each interval
    below = grid * threshold
    above = threshold + grid * (1 - threshold)
    false_positive = (1 - (1 - below**rows) ** bands).mean(axis=1) * threshold
    false_negative = ((1 - above**rows) ** bands).mean(axis=1) * (1 - threshold)
    best = np.argmin(FALSE_POSITIVE_WEIGHT * false_positive + FALSE_NEGATIVE_WEIGHT * false_negative)
    return int(pairs[best, 0]), int(pairs[best, 1])


def near_duplicates(
    documents: Sequence[str], threshold: float, ngram: int = 3, num_perm: int = 64, seed: int = 0
) -> DedupResult:
    """Greedy near-duplicate removal by Jaccard similarity of word ``ngram`` sets (see the module
    docstring), candidates found by MinHash (at most ``num_perm`` hash functions, drawn from
    ``seed``) and LSH, and confirmed by their exact Jaccard index. Deterministic for a seed;
    another seed can only change which LSH misses occur."""
    _check(threshold, ngram, num_perm)
    bands, rows = lsh_params(threshold, num_perm)
    hash_functions = _hash_functions(bands * rows, seed)
    vocabulary = _Vocabulary()
    fingerprint_blocks: list[np.ndarray] = []
    count_blocks: list[np.ndarray] = [np.zeros(0, dtype=np.int64)]  # concatenable without documents
    key_blocks: list[np.ndarray] = []
    # Blocks of documents bound the temporaries (token strings at some 60 bytes each, one hash
    # function's values) to a few MB instead of letting them grow with the corpus. Only the
    # fingerprints and the band keys are kept.
    remaining = iter(documents)
    while block := list(islice(remaining, _BLOCK)):
        fingerprints, counts = _shingle_fingerprints(block, ngram, vocabulary)
        fingerprint_blocks.append(fingerprints)
        count_blocks.append(counts)
        key_blocks.append(_band_keys(_minhash(fingerprints, counts, hash_functions), bands, rows))
    counts = np.concatenate(count_blocks)
    with_shingles = np.flatnonzero(counts > 0)  # the documents that have keys, in key order
    duplicate_of: dict[int, int] = {}
    if len(with_shingles) > 1:
        offsets = np.concatenate(([0], np.cumsum(counts)))
        buckets = _shared_buckets(np.concatenate(key_blocks))
        duplicate_of = _greedy(with_shingles, buckets, np.concatenate(fingerprint_blocks), offsets, threshold)
    keep = [i for i in range(len(counts)) if i not in duplicate_of]
    return DedupResult(keep=keep, duplicate_of=duplicate_of)


def near_duplicates_exact(documents: Sequence[str], threshold: float, ngram: int = 3) -> DedupResult:
    """The same filter, comparing each document's n-gram tuples with every kept document's:
    quadratic, the reference for tests."""
    _check(threshold, ngram)
    kept: list[tuple[int, set[tuple[str, ...]]]] = []
    duplicate_of: dict[int, int] = {}
    for i, document in enumerate(documents):
        own = shingles(document, ngram)
        if not own:
            continue
        match = next((j for j, other in kept if jaccard(own, other) >= threshold), None)
        if match is None:
            kept.append((i, own))
        else:
            duplicate_of[i] = match
    keep = [i for i in range(len(documents)) if i not in duplicate_of]
    return DedupResult(keep=keep, duplicate_of=duplicate_of)


def _check(threshold: float, ngram: int = 1, num_perm: int = 1) -> None:
    if not 0 < threshold <= 1:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    positive_int(ngram, "ngram")
    positive_int(num_perm, "num_perm")


def _mix(x: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finalizer, a bijection with full avalanche, into a new array."""
    x = x ^ (x >> _SHIFT_33)
    x *= _MIX_1
    x ^= x >> _SHIFT_33
    x *= _MIX_2
    x ^= x >> _SHIFT_33
    return x


class _Vocabulary:
    """Word -> id, and ``hashes[id]``: the word's stable 64-bit hash (BLAKE2b of its UTF-8 bytes,
    computed once per distinct word). Id 0 is the document separator; its hash is never used."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {_SEPARATOR: 0}
        self.hashes = np.zeros(1, dtype=np.uint64)

    def ids(self, tokens: list[str]) -> np.ndarray:
        known = self._ids
        new = [token for token in dict.fromkeys(tokens) if token not in known]
        if new:
            known.update(zip(new, range(len(known), len(known) + len(new))))
            digests = b"".join(hashlib.blake2b(token.encode("utf-8", "surrogatepass"), digest_size=8).digest() for token in new)
            self.hashes = np.concatenate((self.hashes, np.frombuffer(digests, dtype="<u8")))
        return np.fromiter(map(known.__getitem__, tokens), dtype=np.int64, count=len(tokens))


def _shingle_fingerprints(block: list[str], ngram: int, vocabulary: _Vocabulary) -> tuple[np.ndarray, np.ndarray]:
    """The 64-bit fingerprints of the block's shingles, document after document, and how many
    each document has. A shingle repeated within a document is repeated; the consumers (a
    minimum, a set) do not care."""
    # One token list for the whole block, the documents separated by a separator token: a list
    # per document costs one more object per document and about twice the time.
    cleaned = [_NON_WORD.sub("", document.lower()) for document in block]
    ids = vocabulary.ids(f" {_SEPARATOR} ".join(cleaned).split())
    is_word = ids != 0
    n_words = np.diff(np.flatnonzero(np.concatenate(([True], ~is_word, [True])))) - 1
    hashes = vocabulary.hashes[ids[is_word]]

    counts = np.where(n_words >= ngram, n_words - ngram + 1, np.minimum(n_words, 1))
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.uint64), counts
    document = np.repeat(np.arange(len(block)), counts)
    first_word = np.cumsum(n_words) - n_words
    first_shingle = np.cumsum(counts) - counts
    start = (first_word - first_shingle)[document] + np.arange(total)  # each shingle's first word
    length = np.minimum(n_words, ngram)[document]
    # Chain the mixer over the shingle's word hashes, from a start state that encodes the
    # shingle's length: a short document's whole-sequence shingle and the n-grams of longer
    # ones live in separate hash domains.
    fingerprints = _mix(length.astype(np.uint64))
    shortest = int(length.min())
    for j in range(ngram):
        step = _mix(fingerprints ^ hashes[np.minimum(start + j, len(hashes) - 1)])
        fingerprints = step if j < shortest else np.where(j < length, step, fingerprints)
    return fingerprints, counts


def _hash_functions(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Multipliers and increments of ``n`` hash functions ``x -> a * x + b mod 2**64``."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**64, size=n, dtype=np.uint64), rng.integers(0, 2**64, size=n, dtype=np.uint64)


def _minhash(fingerprints: np.ndarray, counts: np.ndarray, hash_functions: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """(documents with shingles, hash functions) MinHash signatures. Hash k maps a fingerprint's
    top 32 bits x to ``a_k * x + b_k mod 2**64``, whose high half is Dietzfelbinger's 2-universal
    multiply-add-shift hash; the minimum of the full value orders by that high half first."""
    multipliers, increments = hash_functions
    starts = (np.cumsum(counts) - counts)[counts > 0]
    keys = fingerprints >> _SHIFT_32
    values = np.empty_like(keys)
    signatures = np.empty((len(starts), len(multipliers)), dtype=np.uint64)
    for k, (a, b) in enumerate(zip(multipliers, increments)):
        np.multiply(keys, a, out=values)
        values += b
        signatures[:, k] = np.minimum.reduceat(values, starts)
    return signatures


def _band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(documents, bands) 64-bit keys of the signature bands, the band number mixed in so that
    equal rows in different bands do not share a bucket."""
    by_band = signatures.reshape(len(signatures), bands, rows)
    keys = np.broadcast_to(np.arange(1, bands + 1, dtype=np.uint64), (len(signatures), bands))
    for j in range(rows):
        keys = _mix(keys ^ by_band[:, :, j])
    return keys


def _shared_buckets(keys: np.ndarray) -> np.ndarray:
    """Bucket id per (document, band), or -1 where the document is alone in its bucket. Keys
    collide only by a 64-bit hash collision, which adds a candidate that verification rejects."""
    _, bucket, size = np.unique(keys.ravel(), return_inverse=True, return_counts=True)
    bucket = bucket.reshape(keys.shape)
    return np.where(size[bucket] > 1, bucket, -1)


def _greedy(
    documents: np.ndarray, buckets: np.ndarray, fingerprints: np.ndarray, offsets: np.ndarray, threshold: float
) -> dict[int, int]:
    """The greedy pass, in input order, over the ``documents`` (rows of ``buckets``) that share a
    bucket with another: each is compared with the kept documents of its buckets, lowest index
    first, and dropped at the first that is similar enough."""
    shared = np.flatnonzero((buckets >= 0).any(axis=1))
    kept_in: defaultdict[int, list[int]] = defaultdict(list)  # bucket -> its kept documents, ascending
    kept_sets: dict[int, frozenset[int]] = {}
    duplicate_of: dict[int, int] = {}
    for document, row in zip(documents[shared].tolist(), buckets[shared].tolist()):
        members = [kept_in[bucket] for bucket in row if bucket >= 0]
        own = frozenset(fingerprints[offsets[document] : offsets[document + 1]].tolist())
        size = len(own)
        match = None
        for kept in sorted(set().union(*members)):
            other = kept_sets[kept]
            # J <= the ratio of the set sizes, and float division is monotone, so this cheap
            # test never rejects a pair that jaccard() accepts; it does reject most false
            # positives, at a fraction of the cost of an intersection.
            other_size = len(other)
            ratio = other_size / size if other_size < size else size / other_size
            if ratio >= threshold and jaccard(own, other) >= threshold:
                match = kept
                break
        if match is None:
            kept_sets[document] = own
            for bucket_members in members:
                bucket_members.append(document)
        else:
            duplicate_of[document] = match
    return duplicate_of
