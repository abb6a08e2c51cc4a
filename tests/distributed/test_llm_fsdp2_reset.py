"""llm-robustness under FSDP2: after a fine-tune sharded the model in place, ``model_for`` resets it to the
pretrained weights on every rank (2 gloo CPU ranks; the unsharded reset is load_state_dict, its twin)."""

from __future__ import annotations

from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("llm_reset_worker.py")


@pytest.mark.distributed
def test_model_for_resets_a_sharded_model_to_the_pretrained_weights(torchrun, tmp_path) -> None:
    from tiny_models import tiny_llama

    tiny_llama(layers=2, hidden=32, heads=4, kv_heads=2, vocab=64, seed=0).save_pretrained(tmp_path / "llama")
    from tiny_tokenizers import llama_tokenizer

    llama_tokenizer([f"word {i} and more words" for i in range(40)], tmp_path / "llama", vocab_size=300)
    ranks, _ = torchrun(WORKER, tmp_path)
    for r in ranks:
        assert r["same_object"] and r["sharded"] and r["keys_equal"]
        assert r["max_error"] == 0.0  # the +1 of "training" is gone: every rank holds the pretrained rows


def test_the_fsdp2_launch_config_is_one_accelerate_reads() -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    path = Path(__file__).resolve().parents[2] / "examples" / "accelerate" / "fsdp2.yaml"
    config = load_config_from_file(str(path))
    assert config.distributed_type == "FSDP" and config.mixed_precision == "bf16"
    assert config.fsdp_config["fsdp_version"] == 2
    assert config.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    assert not config.fsdp_config["fsdp_activation_checkpointing"]  # the study checkpoints its own blocks
