"""Test doubles and local servers for the LLM client's tests and benchmarks: a fault-injecting
OpenAI-compatible server, a tiny locally built chat model, and a ``transformers serve`` runner.
Nothing here is used by the pipeline itself."""
