"""The training stages: params -> configs, and bad configurations failing before training."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.errors import ConfigError
from pipelines.training.config import DeviceSpec, GRPOObjective, LoraSpec, ModelSpec, QuantizationSpec
from pipelines.training.device import Machine, resolve_device
from stages import train as stage
from tests.conftest import REPO

CPU = Machine("cpu", bf16_supported=False)
GPU = Machine("cuda", bf16_supported=True, n_gpus=1)


def params(model_dir: Path, data_dir: Path, method: str = "sft", **section) -> dict:
    source = {"sft": "speaker_sft", "dpo": "speaker_dpo", "kto": "speaker_dpo", "grpo": "speaker_grpo"}[method]
    body = {
        "model": {"path": str(model_dir)},
        "data": {"sources": [{"path": str(data_dir / f"{source}.parquet")}]},
        "optim": {"max_steps": 1},
    }
    body.update(section)
    return {"holdout": {"fraction": 0.2}, method: body}


def test_params_become_a_train_config(tiny_model_dir, tiny_data_dir):
    grpo = params(tiny_model_dir, tiny_data_dir, "grpo", objective={"num_generations": 4, "rewards": {"format": 1.0, "clarify_verifiable": 0.5}},
                  device={"bf16": "auto", "gradient_checkpointing": None}, optim={"learning_rate": "1e-4", "batch_size": 8})
    grpo["grpo"]["model"]["lora"] = {"r": 8, "target_modules": ["q_proj", "v_proj"]}
    config = stage.train_config("grpo", grpo)

    assert config.objective == GRPOObjective(num_generations=4, rewards=(("format", 1.0), ("clarify_verifiable", 0.5)))
    assert config.optim.learning_rate == 1e-4 and config.optim.batch_size == 8
    assert config.device.bf16 is None and config.model.lora == LoraSpec(r=8, target_modules=("q_proj", "v_proj"))
    assert config.data.holdout.fraction == 0.2
    assert config.output.model_dir == "models/grpo" and config.output.curve == "reports/train/grpo_curve.csv"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"optim": {"max_stepz": 3}}, r"train.sft.optim: unknown key\(s\) \['max_stepz'\]"),
        ({"optim": {"max_steps": "many"}}, r"train.sft.optim.max_steps: expected int"),
        ({"trainer": {}}, r"train.sft: unknown key\(s\) \['trainer'\]"),
        ({"objective": {"beta": 0.1}}, r"train.sft.objective: unknown key\(s\) \['beta'\]"),
    ],
)
def test_bad_params_name_the_setting(tiny_model_dir, tiny_data_dir, change, message):
    with pytest.raises(ConfigError, match=message):
        stage.train_config("sft", params(tiny_model_dir, tiny_data_dir, **change))


def test_bad_configurations_fail_before_training(tiny_model_dir, tiny_data_dir, tmp_path):
    good = params(tiny_model_dir, tiny_data_dir)
    with pytest.raises(ConfigError, match="unknown training method 'ppo'; methods: sft, dpo, kto, grpo"):
        stage.run("ppo", good)

    wrong_data = params(tiny_model_dir, tiny_data_dir, "sft")
    wrong_data["sft"]["data"]["sources"] = [{"path": str(tiny_data_dir / "speaker_dpo.parquet")}]
    with pytest.raises(ConfigError, match=r"speaker_dpo.parquet: sft needs columns prompt\+completion .* missing 'completion'"):
        stage.run("sft", wrong_data)

    no_model = params(tmp_path / "models" / "base", tiny_data_dir)
    with pytest.raises(ConfigError, match=r"model path '.*models/base' does not exist \(run `dvc repro bootstrap` first\)"):
        stage.run("sft", no_model)

    no_data = params(tiny_model_dir, tmp_path)
    with pytest.raises(ConfigError, match="speaker_sft.parquet' does not exist"):
        stage.run("sft", no_data)

    grpo = params(tiny_model_dir, tiny_data_dir, "grpo", objective={"num_generations": 3}, optim={"batch_size": 8})
    with pytest.raises(ConfigError, match="must be a multiple of num_generations"):
        stage.run("grpo", grpo)

    unknown_reward = params(tiny_model_dir, tiny_data_dir, "grpo", objective={"num_generations": 2, "rewards": {"style": 1.0}})
    with pytest.raises(ConfigError, match="grpo reward 'style' is unknown"):
        stage.run("grpo", unknown_reward)


@pytest.mark.skipif(Machine.detect().accelerator != "cpu", reason="bf16 is refused on a CPU-only machine")
def test_bf16_on_a_cpu_only_machine_fails_the_stage(tiny_model_dir, tiny_data_dir):
    with pytest.raises(ConfigError, match="bf16 is true but a CPU-only machine does not support bf16"):
        stage.run("sft", params(tiny_model_dir, tiny_data_dir, device={"bf16": True}))


def test_device_settings_follow_the_machine():
    auto = DeviceSpec()
    model = ModelSpec()

    def precision(spec, machine):
        settings = resolve_device(spec, model, "sft", machine)
        return settings.bf16, settings.gradient_checkpointing

    assert precision(auto, CPU) == (False, False)
    assert precision(auto, GPU) == (True, True)
    assert precision(DeviceSpec(bf16=False, gradient_checkpointing=False), GPU) == (False, False)
    with pytest.raises(ConfigError, match="4-bit.*needs a CUDA GPU"):
        resolve_device(auto, ModelSpec(lora=LoraSpec(), quantization=QuantizationSpec()), "sft", CPU)
    with pytest.raises(ConfigError, match="needs model.lora"):
        resolve_device(auto, ModelSpec(quantization=QuantizationSpec()), "sft", GPU)
    with pytest.raises(ConfigError, match="use_vllm needs a CUDA GPU"):
        resolve_device(DeviceSpec(use_vllm=True), model, "grpo", CPU)
    with pytest.raises(ConfigError, match="use_vllm is for grpo"):
        resolve_device(DeviceSpec(use_vllm=True), model, "dpo", GPU)
    # resolved: every choice made, the accelerator the run uses
    assert resolve_device(auto, model, "sft", GPU).accelerator == "cuda" and auto.accelerator is None
    assert resolve_device(DeviceSpec(accelerator="cpu"), model, "sft", CPU).accelerator == "cpu"
    with pytest.raises(ConfigError, match="device.accelerator is cuda but this machine runs on cpu"):
        resolve_device(DeviceSpec(accelerator="cuda"), model, "sft", CPU)
    with pytest.raises(ConfigError, match="must be cuda, cpu or null"):
        resolve_device(DeviceSpec(accelerator="tpu"), model, "sft", CPU)


def test_the_stage_exits_1_with_the_message(tiny_model_dir, tiny_data_dir, tmp_path):
    bad = params(tiny_model_dir, tiny_data_dir, device={"bf16": True}, optim={"max_steps": 0})
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"train": bad}))
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    proc = subprocess.run([sys.executable, "-m", "stages.train", "sft", "--params", str(path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "error: optim.max_steps: expected an integer >= 1, got 0"
    assert not (tmp_path / ".prefect").exists()  # no flow run was started

    proc = subprocess.run([sys.executable, "-m", "stages.train", "rlhf", "--params", str(path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "unknown training method 'rlhf'" in proc.stderr


@pytest.mark.parametrize("method", ["sft", "dpo", "kto", "grpo"])
def test_the_stage_and_the_gpu_job_read_a_training_section_alike(method):
    """One reader of a training section (TrainSectionConfig.train_config): the GPU job's run of a
    stage's section differs from the stage's only where the job decides (start model, outputs)."""
    from dataclasses import replace

    from flows.gpu import train_config as job_config

    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))["train"]
    ours = stage.train_config(method, params)
    section = {key: value for key, value in params[method].items() if key != "output"}  # the job writes its own
    section["data"] = {**section["data"], "holdout": params["holdout"]}  # the stages' shared hold-out, given here
    theirs = job_config(method, section, model_path=str(ours.model.path), output_dir=Path("job/sft"), where=f"gpu {method}")
    assert theirs.output.model_dir == str(Path("job/sft/model"))
    assert replace(theirs, output=ours.output) == ours
