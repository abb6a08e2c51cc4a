"""Build one of the unrolled video denoisers (UT, DUST) from plain arguments; their ERM loss."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor, nn

from descentlab.errors import ConfigError
from descentlab.models.dust import DUST
from descentlab.models.unrolled import UnrolledTransformer

__all__ = ["DENOISERS", "UnrolledConfig", "build_denoiser", "final_mse"]

DENOISERS = ("ut", "dust")


@dataclass
class UnrolledConfig:
    depth: int = 6
    width: int = 64
    heads: int = 4
    patch_size: int = 8  # = crop: one token per frame
    mlp_ratio: float = 2.0  # UT
    num_atoms: int = 256  # DUST dictionary size (a perfect square for the DCT initialisation)
    threshold_init: float = 0.02  # DUST
    causal: bool = False  # DUST frame attention


def build_denoiser(
    arch: str,
    *,
    image_size: int,
    num_frames: int,
    patch_size: int,
    depth: int,
    width: int,
    heads: int,
    mlp_ratio: float = 2.0,
    num_atoms: int = 256,
    threshold_init: float = 0.02,
    causal: bool = False,
) -> nn.Module:
    """``"ut"``: :class:`UnrolledTransformer` (uses ``mlp_ratio``); ``"dust"``: :class:`DUST` (uses
    ``num_atoms``, ``threshold_init``, ``causal``). Clips are ``[N, num_frames, image_size, image_size]``.    ``build_denoiser(arch, image_size=..., num_frames=..., **asdict(UnrolledConfig()))`` takes a config's fields.
    """
    shared = {
        "image_size": image_size,
        "num_frames": num_frames,
        "patch_size": patch_size,
        "depth": depth,
        "width": width,
        "heads": heads,
    }
    if arch == "ut":
        return UnrolledTransformer(**shared, mlp_ratio=mlp_ratio)
    if arch == "dust":
        return DUST(**shared, num_atoms=num_atoms, causal=causal, threshold_init=threshold_init)
    raise ConfigError(f"unknown denoiser {arch!r}; choose from {list(DENOISERS)}")


def final_mse(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """ERM's loss: the MSE of the final estimate ``model(batch["noisy"]).final`` against ``batch["target"]``."""
    return nn.functional.mse_loss(model(batch["noisy"]).final, batch["target"])
