"""Perplexity of any Hugging Face causal LM over fixed-length blocks of token ids.

    PPL = exp( Σ_blocks Σ_{t=1}^{T-1} -log p(x_t | x_<t)  /  N_tokens ),   N_tokens = Σ_blocks (T - 1)

Token-weighted over the whole set (not a mean of per-batch means), so the result does not depend on the
batch size. :func:`block_nlls` keeps one number per block instead, ``nll_b = Σ_{t=1}^{T-1} -log p(x_t | x_<t)
/ (T - 1)``, the unit of a paired bootstrap over blocks (with equal-length blocks, ``mean_b nll_b`` is the
token-weighted NLL). Logits of a batch are turned into per-token losses chunk by chunk along time, so a
``[batch, T, vocab]`` float32 copy for the log-softmax never has to exist for a large vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from descentlab.errors import DataError, NumericalError
from descentlab.losses import next_token_nll


@dataclass(frozen=True)
class LMEval:
    """Result of :func:`evaluate_lm`.

    Attributes:
        nll: mean next-token negative log-likelihood (nats per token).
        perplexity: ``exp(nll)``.
        tokens: number of predicted tokens.
    """

    nll: float
    perplexity: float
    tokens: int


def _as_blocks(data) -> torch.Tensor:
    blocks = getattr(data, "blocks", data)
    if isinstance(blocks, dict):
        blocks = blocks["input_ids"]
    if not isinstance(blocks, torch.Tensor) or blocks.ndim != 2:
        raise DataError("evaluate_lm expects an int64 tensor [N, T] of input ids (or an LMBlocks dataset)")
    if blocks.shape[1] < 2:
        raise DataError(f"blocks of length {blocks.shape[1]} have no next token to predict; use T >= 2")
    return blocks.long()


def _batch_logits(
    model: nn.Module, blocks: torch.Tensor, batch_size: int, device: torch.device | str | None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(input_ids, logits)`` of each batch of ``blocks``, the model in eval mode meanwhile (restored after)."""
    if blocks.shape[0] == 0:
        raise DataError("no blocks to evaluate: the evaluation split is shorter than one block")
    if device is None:
        device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        for s in range(0, blocks.shape[0], batch_size):
            x = blocks[s : s + batch_size].to(device)
            yield x, model(input_ids=x).logits
    finally:
        model.train(was_training)


def token_nll_sum(logits: torch.Tensor, input_ids: torch.Tensor, *, chunk: int = 256) -> torch.Tensor:
    """Sum over the batch of ``-log p(x_t | x_<t)`` for t = 1..T-1, in float64.

    Args:
        logits: ``[B, T, V]`` next-token logits (position t predicts token t+1).
        input_ids: ``[B, T]`` the tokens.
        chunk: time steps per log-softmax call (bounds the float32 upcast of half-precision logits).
    """
    return next_token_nll(logits, input_ids, chunk=chunk, reduction="sum")


@torch.no_grad()
def evaluate_lm(
    model: nn.Module, data, *, batch_size: int = 8, device: torch.device | str | None = None
) -> LMEval:
    """Next-token NLL and perplexity of ``model`` on ``data``, with no gradients and the model in eval mode.

    Args:
        model: any causal LM whose forward takes ``input_ids`` and returns ``.logits`` (Hugging Face style).
        data: an int64 tensor ``[N, T]`` of blocks, or an object with a ``.blocks`` tensor (``LMBlocks``).
        batch_size: blocks per forward pass.
        device: where to run; defaults to the device of the model's first parameter.

    Returns:
        :class:`LMEval` with the token-weighted mean NLL, its exponential and the token count.
    """
    blocks = _as_blocks(data)
    total = torch.zeros((), dtype=torch.float64)
    for x, logits in _batch_logits(model, blocks, batch_size, device):
        total += token_nll_sum(logits, x).cpu()
    tokens = blocks.shape[0] * (blocks.shape[1] - 1)
    nll = float(total) / tokens
    if not math.isfinite(nll):
        raise NumericalError("the evaluation loss is not finite: the model produced NaN/Inf logits")
    # exp overflows float for nll > ~709; a diverged model then reports inf, which is still an honest number
    ppl = math.exp(nll) if nll < 700 else math.inf
    return LMEval(nll=nll, perplexity=ppl, tokens=tokens)


@torch.no_grad()
def block_nlls(
    model: nn.Module, data, *, batch_size: int = 8, device: torch.device | str | None = None
) -> torch.Tensor:
    """Mean next-token NLL of each block, ``[N]`` float64 (nats per token), in eval mode with no gradients.

    Args:
        model, data, batch_size, device: as for :func:`evaluate_lm`.

    Raises:
        DataError: no blocks, or blocks shorter than 2 tokens.
        NumericalError: a block's NLL is not finite.
    """
    blocks = _as_blocks(data)
    parts = [
        next_token_nll(lg, x, chunk=256).mean(1).cpu()
        for x, lg in _batch_logits(model, blocks, batch_size, device)
    ]
    out = torch.cat(parts)
    if not bool(torch.isfinite(out).all()):
        raise NumericalError("a block's evaluation loss is not finite: the model produced NaN/Inf logits")
    return out


def perplexity(
    model: nn.Module, data, *, batch_size: int = 8, device: torch.device | str | None = None
) -> float:
    """``exp`` of the token-weighted mean next-token NLL; see :func:`evaluate_lm`."""
    return evaluate_lm(model, data, batch_size=batch_size, device=device).perplexity


__all__ = ["LMEval", "block_nlls", "evaluate_lm", "perplexity", "token_nll_sum"]
