"""Wall time of schema calls while the endpoint is down (every request answers 500), before
the client knows whether the server takes ``response_format``.

    python benchmarks/llm_outage.py [--calls 64] [--concurrency 8] [--latency-ms 50] [--retries 1]

Against the local fake OpenAI-compatible server. One call probes the capability and the
others wait for that call only; after it they run side by side within ``max_concurrency``.
Printed: seconds, the server's highest number of requests in flight and its request count.
"""

from __future__ import annotations

import argparse
import time

from pipelines.llm import ClientConfig, CompletionRequest, LLMClient, SamplingParams
from pipelines.llm.testing.fake_server import FakeOpenAIServer, FaultPlan

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--retries", type=int, default=1)
    args = parser.parse_args()
    faults = FaultPlan(rate=1.0, kinds=("http_500",))
    with FakeOpenAIServer(faults, latency_s=args.latency_ms / 1000, keep_bodies=False) as server:
        config = ClientConfig(
            base_url=server.base_url, model="fake-model", max_concurrency=args.concurrency,
            max_retries=args.retries, backoff_base_s=0.001, backoff_max_s=0.002,
        )
        client = LLMClient(config)
        requests = [
            CompletionRequest([{"role": "user", "content": f"q{i}"}], "judge", SamplingParams(), seed=i, response_schema=SCHEMA)
            for i in range(args.calls)
        ]
        started = time.perf_counter()
        results = client.complete_many_sync(requests)
        wall = time.perf_counter() - started
    failed = sum(not r.ok for r in results)
    print(
        f"{args.calls} schema calls, endpoint down (500, {args.latency_ms:g} ms), max_concurrency {args.concurrency}: "
        f"{wall:.2f} s, {failed} failed, max in flight {server.stats.max_in_flight}, {server.stats.requests} requests"
    )


if __name__ == "__main__":
    import logging

    logging.disable(logging.WARNING)
    main()
