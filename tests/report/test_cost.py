"""The cost model's parameter counts equal the models built from the same config numbers, at tiny sizes on the
CPU and at the papers' sizes on the meta device; its FLOPs and hours are the stated arithmetic."""

from __future__ import annotations

import pytest
import torch

from descentlab.models.gpt2 import GPT2LMConfig, build_gpt2, num_params
from descentlab.report.cost import (
    CostModel,
    evaluation_flops,
    gpt2_params,
    llama_params,
    roberta_classifier_params,
    training_flops,
    vit_classifier_params,
)

transformers = pytest.importorskip("transformers")


def count(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return num_params(model)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize(("vocab", "positions", "width", "layers"), [(97, 16, 8, 1), (50, 33, 12, 3)])
def test_gpt2_closed_form_equals_build_gpt2(vocab, positions, width, layers, tied) -> None:
    cfg = GPT2LMConfig(
        n_layer=layers, n_embd=width, n_head=2, n_positions=positions, tie_word_embeddings=tied
    )
    assert gpt2_params(vocab, positions, width, layers, tied=tied) == count(build_gpt2(cfg, vocab))


@pytest.mark.parametrize(("types", "labels", "hidden"), [(1, 2, 24), (2, 5, 40)])
def test_roberta_closed_form_equals_the_sequence_classifiers(types, labels, hidden) -> None:
    kw = dict(
        vocab_size=101,
        max_position_embeddings=40,
        type_vocab_size=types,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=hidden,
        num_labels=labels,
    )
    want = roberta_classifier_params(101, 40, types, 16, 2, hidden, labels)
    roberta = transformers.RobertaForSequenceClassification(transformers.RobertaConfig(**kw))
    # BERT's pooler (d² + d) and classifier (d·C + C) have the same count as RoBERTa's two-layer head
    bert = transformers.BertForSequenceClassification(transformers.BertConfig(**kw))
    assert count(roberta) == want == count(bert)


@pytest.mark.parametrize(("image", "patch", "channels", "ratio"), [(32, 8, 3, 4), (28, 7, 1, 2)])
def test_vit_closed_form_equals_hf_vit(image, patch, channels, ratio) -> None:
    config = transformers.ViTConfig(
        image_size=image,
        patch_size=patch,
        num_channels=channels,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=16 * ratio,
        num_labels=7,
    )
    model = transformers.ViTForImageClassification(config)
    assert vit_classifier_params(image, patch, channels, 16, 2, ratio, 7) == count(model)


def test_vit_closed_form_equals_timm_deit() -> None:
    timm = pytest.importorskip("timm")
    model = timm.create_model("deit_tiny_patch16_224", pretrained=False, img_size=64, num_classes=10)
    assert vit_classifier_params(64, 16, 3, 192, 12, 4, 10) == count(model)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize(("heads", "kv", "head_dim"), [(4, 2, None), (4, 1, 16), (2, 2, None)])
def test_llama_closed_form_equals_llama_for_causal_lm(heads, kv, head_dim, tied) -> None:
    extra = {} if head_dim is None else {"head_dim": head_dim}
    config = transformers.LlamaConfig(
        vocab_size=101,
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=48,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        tie_word_embeddings=tied,
        **extra,
    )
    want = llama_params(101, 32, 2, 48, heads, kv, head_dim=head_dim, tied=tied)
    assert want == count(transformers.LlamaForCausalLM(config))


def test_the_papers_models_at_full_size_on_the_meta_device() -> None:
    with torch.device("meta"):
        llama = transformers.LlamaForCausalLM(
            transformers.LlamaConfig(
                vocab_size=128_256,
                hidden_size=4_096,
                num_hidden_layers=32,
                intermediate_size=14_336,
                num_attention_heads=32,
                num_key_value_heads=8,
                tie_word_embeddings=False,
            )
        )
        roberta = transformers.RobertaForSequenceClassification(
            transformers.RobertaConfig(vocab_size=50_265, max_position_embeddings=514, type_vocab_size=1)
        )
        deit = transformers.ViTForImageClassification(
            transformers.ViTConfig(
                hidden_size=384, num_attention_heads=6, intermediate_size=1_536, num_labels=1_000
            )
        )
        gpt2 = build_gpt2(GPT2LMConfig(n_layer=12, n_embd=768, n_head=12, n_positions=1_024), 50_257)
    assert count(llama) == llama_params(128_256, 4_096, 32, 14_336, 32, 8) == 8_030_261_248
    assert count(roberta) == roberta_classifier_params(50_265, 514, 1, 768, 12, 3_072, 2) == 124_647_170
    assert count(deit) == vit_classifier_params(224, 16, 3, 384, 12, 4, 1_000) == 22_050_664
    assert count(gpt2) == gpt2_params(50_257, 1_024, 768, 12) == 124_439_808


def test_flops_and_hours_are_the_stated_arithmetic() -> None:
    # 6 · (1,000 · 50 + 10 · 7) and 2 · 1,000 · 3, by hand
    assert training_flops(1_000, 50) == 300_000
    assert training_flops(1_000, 50, head_params=10, head_tokens=7) == 300_420
    assert evaluation_flops(1_000, 3) == 6_000
    # 1.8e15 FLOPs at half of 1e12 FLOP/s: 3,600 s
    model = CostModel(peak_flops=1e12, utilisation=0.5)
    assert model.sustained == 5e11
    assert model.gpu_hours(1.8e15) == pytest.approx(1.0, rel=1e-12)
    assert CostModel().sustained == pytest.approx(0.4 * 989e12)
    with pytest.raises(ValueError, match="utilisation"):
        CostModel(utilisation=0.0)
