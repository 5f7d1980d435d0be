"""Tiny training data in the SpeakER layouts, a Prefect test API, and config builders."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.speaker.tables import SPECS
from pipelines.training.config import (
    DataSpec,
    EvalSpec,
    GRPOObjective,
    HoldoutSpec,
    ModelSpec,
    OptimSpec,
    SourceSpec,
    TrainConfig,
    method_outputs,
)

SYSTEM = {"role": "system", "content": "You are a travel agent."}
AREAS = ("north", "south", "east", "west", "centre")
CLARIFY = "<think>Several hotels match; the area is unknown.</think>\n<clarify>Which area would you like: the {a} or the {b}?</clarify>"
GUESS = "<think>I'll pick one.</think>\nThe {a} lodge is a good choice. Shall I book it?"
NEEDLESS = "<think>Let me double-check the area.</think>\n<clarify>Which area of town would you like?</clarify>"
SEARCH = '<think>Searching.</think>\n<tool_call>\n{{"name": "query_hotel", "arguments": {{"area": "{a}"}}}}\n</tool_call>'


def _dialogues(n: int) -> Iterator[tuple[str, str, str, str]]:
    for i in range(n):
        a, b = AREAS[i % 5], AREAS[(i + 2) % 5]
        yield f"D{i:03d}.json", a, b, f"I need a hotel for {i % 4 + 1} people."


def tiny_tables(n: int = 40) -> dict[str, pa.Table]:
    """speaker_sft / speaker_grpo / speaker_dpo shaped tables (only the columns training reads):
    every fifth dialogue in the val split; step 0 asks, step 1 acts (an act-here point in the
    GRPO and DPO data)."""
    sft, grpo, dpo = [], [], []
    for i, (dialogue_id, a, b, request) in enumerate(_dialogues(n)):
        split = "val" if i % 5 == 0 else "train"
        prompt = [SYSTEM, {"role": "user", "content": request}]
        answered = [*prompt, {"role": "assistant", "content": CLARIFY.format(a=a, b=b)}, {"role": "user", "content": f"The {a}."}]
        sft.append({"dialogue_id": dialogue_id, "split": split, "step": 0, "prompt": prompt,
                    "completion": [{"role": "assistant", "content": CLARIFY.format(a=a, b=b)}]})
        sft.append({"dialogue_id": dialogue_id, "split": split, "step": 1, "prompt": answered,
                    "completion": [{"role": "assistant", "content": SEARCH.format(a=a)}]})
        grpo.append({"dialogue_id": dialogue_id, "split": split, "step": 0, "ask_needed": True,
                     "prompt": [{"role": "user", "content": f"User: {request}\nAgent:"}],
                     "discriminating_slots": ["area"], "candidate_values": json.dumps({"area": [a, b]}),
                     "known_slots": [], "reference": CLARIFY.format(a=a, b=b)})
        grpo.append({"dialogue_id": dialogue_id, "split": split, "step": 1, "ask_needed": False,
                     "prompt": [{"role": "user", "content": f"User: {request}\nAgent: Which area?\nUser: The {a}.\nAgent:"}],
                     "discriminating_slots": [], "candidate_values": "{}",
                     "known_slots": ["area"], "reference": SEARCH.format(a=a)})
        dpo.append({"dialogue_id": dialogue_id, "split": split, "step": 0, "ask_needed": True, "prompt": prompt,
                    "chosen": [{"role": "assistant", "content": CLARIFY.format(a=a, b=b)}],
                    "rejected": [{"role": "assistant", "content": GUESS.format(a=a)}]})
        dpo.append({"dialogue_id": dialogue_id, "split": split, "step": 1, "ask_needed": False, "prompt": answered,
                    "chosen": [{"role": "assistant", "content": SEARCH.format(a=a)}],
                    "rejected": [{"role": "assistant", "content": NEEDLESS}]})
    # Typed as the artifacts are (training validates its inputs with their suites), over the
    # columns given here.
    rows = {"speaker_sft": sft, "speaker_grpo": grpo, "speaker_dpo": dpo}
    return {name: pa.Table.from_pylist(r, schema=SPECS[name].restricted_to(r[0]).schema) for name, r in rows.items()}


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("speaker")
    for name, table in tiny_tables().items():
        pq.write_table(table, directory / f"{name}.parquet")
    return directory


SOURCES = {
    "sft": ("speaker_sft",),
    "dpo": ("speaker_dpo",),
    "kto": ("speaker_dpo",),
    "grpo": ("speaker_grpo",),
}


def tiny_config(method: str, model_dir: Path, data_dir: Path, out: Path, **changes: Any) -> TrainConfig:
    """A run of a few steps on the tiny model and data, writing under ``out``."""
    objective = GRPOObjective(num_generations=2, max_completion_length=16) if method == "grpo" else None
    config = TrainConfig(
        method=method,
        model=ModelSpec(path=str(model_dir)),
        data=DataSpec(
            sources=tuple(
                # GRPO takes the chat prompts of the same decision points, as the embedded params do.
                SourceSpec(str(data_dir / f"{name}.parquet"), prompts_from=str(data_dir / "speaker_sft.parquet") if method == "grpo" else None)
                for name in SOURCES[method]
            ),
            holdout=HoldoutSpec(fraction=0.2),
            compact_prompts=False,
            max_history_messages=2,
        ),
        output=method_outputs(method, str(out / "models"), str(out / "reports")),
        optim=OptimSpec(max_steps=2, batch_size=4, max_length=320, logging_steps=1, learning_rate=1e-3),
        eval=EvalSpec(max_examples=4, max_new_tokens=8, batch_size=4),
        objective=objective,
    )
    return replace(config, **changes)


def run_flow(method: str, config):
    """Run the method's flow; return its report and the flow run as the API stored it."""
    from prefect import get_client

    from flows.train import FLOWS

    state = FLOWS[method](config, return_state=True)
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(state.state_details.flow_run_id)
    return state, flow_run


@pytest.fixture(scope="session")
def trained(prefect_api, tiny_model_dir, tiny_data_dir, tmp_path_factory):
    """Every method trained once: {method: (config, state, flow_run)}. One torch thread, as
    in the ``single_torch_thread`` fixture (which, module-scoped, would be set up after this)."""
    import torch

    out = tmp_path_factory.mktemp("trained")
    runs = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for method in ("sft", "dpo", "kto", "grpo"):
            config = tiny_config(method, tiny_model_dir, tiny_data_dir, out)
            runs[method] = (config, *run_flow(method, config))
    finally:
        torch.set_num_threads(threads)
    return runs
