"""Small GPT-2-architecture language models built from a :class:`transformers.GPT2Config`.

The model is the stock :class:`transformers.GPT2LMHeadModel` (no architectural change), so everything that
handles Hugging Face causal LMs (Accelerate, checkpoints, generation) works on it. Inside each block GPT-2
uses ``transformers.pytorch_utils.Conv1D`` (a Linear with the weight stored transposed, ``[in, out]``), not
``nn.Linear``. The default pruning selection (:class:`descentlab.sparsity.masks.Selection`) visits both kinds
inside the block list, so it takes the four matrices per block (``attn.c_attn``, ``attn.c_proj``,
``mlp.c_fc``, ``mlp.c_proj``) and leaves the token / position embeddings and the (tied) LM head dense.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from descentlab.errors import ConfigError


@dataclass
class GPT2LMConfig:
    """Shape of a small GPT-2.

    Attributes:
        n_layer: transformer blocks.
        n_embd: width; must be divisible by ``n_head``.
        n_head: attention heads.
        n_positions: context length (maximum block size).
        dropout: residual, embedding and attention dropout (0 for short runs: no regularisation needed).
        tie_word_embeddings: share the LM head with the token embedding, as GPT-2 does.
    """

    n_layer: int = 4
    n_embd: int = 192
    n_head: int = 4
    n_positions: int = 128
    dropout: float = 0.0
    tie_word_embeddings: bool = True


def build_gpt2(cfg: GPT2LMConfig, vocab_size: int, *, eos_id: int | None = None, seed: int | None = None):
    """A freshly initialised :class:`transformers.GPT2LMHeadModel` of the given shape.

    Args:
        cfg: the shape.
        vocab_size: size of the tokenizer's id space.
        eos_id: written to ``bos_token_id`` / ``eos_token_id`` of the config (GPT-2 uses one id for both).
        seed: seeds the initialisation; ``None`` uses the current global RNG.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    if cfg.n_embd % cfg.n_head:
        raise ConfigError(f"n_embd={cfg.n_embd} is not divisible by n_head={cfg.n_head}")
    if vocab_size < 2:
        raise ConfigError(f"vocab_size={vocab_size} must be at least 2")
    hf = GPT2Config(
        vocab_size=vocab_size,
        n_positions=cfg.n_positions,
        n_embd=cfg.n_embd,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        resid_pdrop=cfg.dropout,
        embd_pdrop=cfg.dropout,
        attn_pdrop=cfg.dropout,
        bos_token_id=eos_id if eos_id is not None else vocab_size - 1,
        eos_token_id=eos_id if eos_id is not None else vocab_size - 1,
        tie_word_embeddings=cfg.tie_word_embeddings,
        use_cache=False,
    )
    if seed is None:
        model = GPT2LMHeadModel(hf)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = GPT2LMHeadModel(hf)
    # transformers infers the loss from the class name, which for GPT2LMHeadModel matches nothing; it then
    # warns and falls back to the causal-LM loss. Name that loss explicitly.
    model.loss_type = "ForCausalLM"
    return model


__all__ = ["GPT2LMConfig", "build_gpt2", "num_params"]


def num_params(model: nn.Module) -> int:
    """Distinct parameters (a tied embedding / LM head counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
