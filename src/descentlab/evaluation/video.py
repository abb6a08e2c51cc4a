"""Evaluate an unrolled video denoiser: RMSE of the final estimate and MSE of every layer, per noise level.

An unrolled model maps a noisy clip ``y`` to estimates ``x̂_0, ..., x̂_L`` of the clean clip ``x`` (its
output's ``layer_estimates``, ``final = x̂_L``). Over a test set of N clips at one noise level,

    MSE_l = Σ_n ||x̂_l(y_n) - x_n||² / (N · T · H · W),      RMSE = sqrt(MSE_L),

and the noisy input's own RMSE, ``sqrt(mean((y - x)²))``, is the do-nothing baseline. The noisy clips are
drawn by the caller (one fixed draw per level, shared by every method), so this module loads no data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["ValidationCurve", "denoise_frames", "evaluate_denoiser"]


@torch.no_grad()
def evaluate_denoiser(
    model: nn.Module,
    clean: Tensor,
    noisy_levels: Sequence[Tensor],
    *,
    batch_size: int,
    per_example: bool = False,
) -> dict[str, Any]:
    """RMSE of the final estimate and the MSE at every layer, for each noisy version of ``clean``.

    Args:
        model: an unrolled denoiser; ``model(y)`` returns an output with ``layer_estimates`` ``[L+1, B, ...]``.
        clean: ``[N, T, H, W]`` clean test clips.
        noisy_levels: one ``[N, T, H, W]`` noisy copy of ``clean`` per noise level.
        batch_size: clips per forward pass (memory only: the sums are per clip, then added in order).
        per_example: also return ``"example_mse"``, a float32 tensor ``[levels, L+1, N]`` of every clip's
            MSE at every layer (the cells of a paired bootstrap over clips).

    Returns:
        ``{"rmse": [per level], "noisy_rmse": [per level], "layer_mse": [per level: [MSE_0..MSE_L]]}``.
    """
    model.eval()
    device = next(model.parameters()).device  # the clips stay where they are; each batch visits the model
    rmse, noisy_rmse, layer_mse, examples = [], [], [], []
    for noisy in noisy_levels:
        sse = None
        per_clip = []
        for s in range(0, len(clean), batch_size):
            out = model(noisy[s : s + batch_size].to(device))
            target = clean[s : s + batch_size].to(device)
            sq = (out.layer_estimates - target).pow(2).flatten(2)  # [L+1, B, pixels]
            if per_example:
                per_clip.append(sq.mean(2))
            err = sq.flatten(1).sum(1)
            sse = err if sse is None else sse + err
        if per_example:
            examples.append(torch.cat(per_clip, 1).float().cpu())
        per_layer = (sse / clean.numel()).tolist()
        layer_mse.append(per_layer)
        rmse.append(math.sqrt(per_layer[-1]))
        noisy_rmse.append(float((noisy - clean).pow(2).mean().sqrt()))
    result: dict[str, Any] = {"rmse": rmse, "noisy_rmse": noisy_rmse, "layer_mse": layer_mse}
    if per_example:
        result["example_mse"] = torch.stack(examples)
    return result


@torch.no_grad()
def denoise_frames(model: nn.Module, noisy: Tensor, tile: int) -> Tensor:
    """Denoise whole frames ``[T, H, W]`` tile by tile (non-overlapping ``tile x tile`` sequences).

    H and W are cropped to multiples of ``tile``; the result is ``[T, tile·⌊H/tile⌋, tile·⌊W/tile⌋]``.
    """
    model.eval()
    t, h, w = noisy.shape
    nh, nw = h // tile, w // tile
    x = noisy[:, : nh * tile, : nw * tile].reshape(t, nh, tile, nw, tile).permute(1, 3, 0, 2, 4)
    out = model(x.reshape(nh * nw, t, tile, tile).to(next(model.parameters()).device)).final.cpu()
    return out.reshape(nh, nw, t, tile, tile).permute(2, 0, 3, 1, 4).reshape(t, nh * tile, nw * tile)


class ValidationCurve:
    """A training callback ``(step, model, logs)``: the RMSE on fixed validation clips at step 0 (on
    construction), every ``every`` steps and at step ``total``, in ``points = {"step": [...], "rmse": [...]}``.
    Each evaluation leaves the model in training mode."""

    def __init__(
        self, model: nn.Module, clean: Tensor, noisy: Tensor, *, every: int, total: int, batch_size: int
    ) -> None:
        self.clean, self.noisy, self.every, self.total, self.batch_size = (
            clean,
            noisy,
            every,
            total,
            batch_size,
        )
        self.points: dict[str, list] = {"step": [0], "rmse": [self.rmse(model)]}

    def rmse(self, model: nn.Module) -> float:
        value = evaluate_denoiser(model, self.clean, [self.noisy], batch_size=self.batch_size)["rmse"][0]
        model.train()
        return value

    def __call__(self, step: int, model: nn.Module, _logs: dict[str, float]) -> None:
        if step % self.every == 0 or step == self.total:
            self.points["step"].append(step)
            self.points["rmse"].append(self.rmse(model))
