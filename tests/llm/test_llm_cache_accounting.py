"""ResponseCache and Accounting on their own."""

from __future__ import annotations

import json
import threading

from pipelines.llm import Accounting, ResponseCache, cache_key
from pipelines.llm.cache import CACHE_FORMAT

KEY = {
    "endpoint": "http://127.0.0.1:8000/v1",
    "model": "m",
    "messages": [{"role": "user", "content": "héllo"}],
    "sampling": {"temperature": 0.0},
    "seed": 1,
    "n": 1,
}


def test_keys_are_canonical_and_sensitive_to_every_field():
    reordered = dict(reversed(list(KEY.items())))
    assert cache_key(reordered) == cache_key(KEY)
    variants = [
        {**KEY, "seed": 2},
        {**KEY, "n": 2},
        {**KEY, "model": "m2"},
        {**KEY, "sampling": {"temperature": 0.5}},
        {**KEY, "messages": [{"role": "user", "content": "hello"}]},
        {**KEY, "endpoint": "http://127.0.0.1:8001/v1"},
    ]
    keys = {cache_key(KEY), *(cache_key(v) for v in variants)}
    assert len(keys) == 1 + len(variants)


def test_records_are_sharded_atomic_and_counted(tmp_path):
    cache = ResponseCache(tmp_path)
    assert cache.get(KEY) is None

    path = cache.put(KEY, {"texts": ["hi"]})

    key = cache_key(KEY)
    assert path == tmp_path / key[:2] / f"{key}.json"
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no temporary file may remain"
    record = json.loads(path.read_text(encoding="utf-8"))
    assert record["key"] == KEY and record["response"] == {"texts": ["hi"]}
    assert cache.get(KEY) == {"texts": ["hi"]} and cache.contains(KEY)
    assert cache.stats() == {"hits": 1, "misses": 1, "writes": 1}
    # Same request, same bytes: records carry no timestamps.
    before = path.read_bytes()
    cache.put(KEY, {"texts": ["hi"]})
    assert path.read_bytes() == before


def test_damaged_or_foreign_records_are_misses(tmp_path, caplog):
    cache = ResponseCache(tmp_path)
    path = cache.put(KEY, {"texts": ["hi"]})
    path.write_text('{"format": 1, "key": ', encoding="utf-8")
    assert cache.get(KEY) is None
    path.write_text(json.dumps({"format": CACHE_FORMAT, "key": {**KEY, "seed": 9}, "response": {"texts": ["x"]}}))
    assert cache.get(KEY) is None
    assert cache.stats()["misses"] == 2
    assert "not valid JSON" in caplog.text and "does not match its key" in caplog.text


def test_accounting_is_exact_under_threads():
    accounting = Accounting()

    def work():
        for _ in range(1000):
            accounting.record_request("judge")
            accounting.record_retry("judge", "timeout")
            accounting.record_tokens("synthesizer", 2, 3, 0.001)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    report = accounting.as_dict()
    assert report["roles"]["judge"]["requests"] == 8000
    assert report["roles"]["judge"]["retries_by_reason"] == {"timeout": 8000}
    assert report["roles"]["synthesizer"]["prompt_tokens"] == 16000
    assert report["total"]["completion_tokens"] == 24000
    assert report["total"]["cost"] == 8.0
    assert accounting.role("nobody").requests == 0
