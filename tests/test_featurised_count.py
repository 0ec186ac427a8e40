"""The featurised parameter count read from a checkpoint's safetensors headers equals what a replica featurises
from the live model (LoRA's lora_B, lora_A and lora_B for task vectors, every weight for `full`), so the driver
refuses a projection.dim wider than it before any worker starts; where the headers cannot tell, it says so."""

from __future__ import annotations

import shutil

import pytest
from conftest import tiny_run_config

from convalue.engine.config import ConfigError, FeaturesConfig, LoraConfig, config_from_dict
from convalue.engine.driver.checks import check_projection
from convalue.engine.features.replica import featurised_parameters
from convalue.engine.model.loading import featurised_count, load_model


@pytest.mark.parametrize(("parameters", "representation", "targets"), [
    ("lora", "one_step", ["q_proj", "v_proj"]),
    ("lora", "task_vector", ["q_proj", "v_proj"]),
    ("lora", "one_step", ["gate_proj", "o_proj", "k_proj"]),
    ("full", "one_step", ["q_proj", "v_proj"]),
])
def test_the_headers_count_what_a_replica_featurises(tiny_model_dir, parameters, representation, targets):
    lora = LoraConfig(r=4, alpha=8, target_modules=targets)
    features = FeaturesConfig(parameters=parameters, representation=representation)
    _, named = featurised_parameters(load_model(tiny_model_dir), features, lora)
    live = sum(p.numel() for _, p in named)
    assert featurised_count(tiny_model_dir, lora, parameters, with_a=representation == "task_vector") == live


@pytest.mark.filterwarnings("ignore:fan_in_fan_out is set to False:UserWarning")  # peft's note on Conv1D
@pytest.mark.parametrize("representation", ["one_step", "task_vector"])
def test_gpt2s_conv1d_projections_are_counted_by_their_output(tmp_path, representation):
    """GPT-2 keeps its projections as Conv1D, weights (in, out): lora_B has r x out parameters all the same."""
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)).save_pretrained(
        tmp_path)
    lora = LoraConfig(r=4, alpha=8, target_modules=["c_attn", "c_fc"])
    features = FeaturesConfig(parameters="lora", representation=representation)
    _, named = featurised_parameters(load_model(tmp_path), features, lora)
    assert featurised_count(tmp_path, lora, "lora", with_a=representation == "task_vector") == sum(
        p.numel() for _, p in named)


def test_a_checkpoint_the_headers_cannot_count_is_left_to_the_workers(tiny_model_dir, tmp_path):
    lora = LoraConfig(r=4, alpha=8, target_modules=["q_proj", "lm_head"])  # the tiny Llama ties its head: no weight
    assert featurised_count(tiny_model_dir, lora, "lora", with_a=False) is None
    bare = tmp_path / "bare"
    shutil.copytree(tiny_model_dir, bare, ignore=shutil.ignore_patterns("*.safetensors"))
    assert featurised_count(bare, LoraConfig(), "lora", with_a=False) is None


def test_the_driver_refuses_a_projection_wider_than_any_representation(tiny_model_dir, target_jsonl, pool_jsonl,
                                                                       tmp_path):
    # the tiny Llama's LoRA (r 4 on q_proj and v_proj, 2 layers): 768 lora_B, 768 + 2 x 2 x 64 x 4 = 1792 with A
    data = tiny_run_config(tmp_path, tiny_model_dir, target_jsonl, pool_jsonl,
                           projection={"kind": "countsketch", "dim": 1000, "seed": 0},
                           features={"representations": ["task_vector", "one_step"]})
    with pytest.raises(ConfigError, match="larger than the 768 parameters featurised") as err:
        check_projection(config_from_dict(data), tiny_model_dir)
    assert err.value.field == "projection.dim" and err.value.value == 1000
    check_projection(config_from_dict(data | {"features": {"representation": "task_vector"}}), tiny_model_dir)
    identity = data | {"projection": {"kind": "identity", "dim": 1000, "seed": 0}}
    check_projection(config_from_dict(identity), tiny_model_dir)  # identity keeps every dimension: no refusal
