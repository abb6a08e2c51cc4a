"""timm's vision transformers (DeiT-small, DeiT-base, ...) behind the interface the training loop expects.

``timm`` is the field's reference implementation of DeiT. :func:`build_timm_classifier` builds one with
``timm.create_model(name, pretrained=False, ...)`` (random initialisation, nothing downloaded) and wraps it in
:class:`TimmImageClassifier`, which takes ``pixel_values`` and ``labels`` and returns ``loss`` and
``logits`` as a ``transformers`` image classifier does, so ``fit``'s objectives, AC/DC and the pruning
reports treat both alike. Two adaptations:

* the loss: integer labels give the cross-entropy; soft targets ``[B, classes]`` (Mixup / CutMix, label
  smoothing) give ``mean_b Σ_c -t_bc log softmax(z_b)_c`` (timm's ``SoftTargetCrossEntropy``);
* the blocks: timm keeps them in an ``nn.Sequential``; they move, unchanged and under the same names, into a
  :class:`BlockList` (an ``nn.ModuleList`` that runs them in order), which
  :func:`~descentlab.sparsity.masks.find_blocks` recognises as the transformer block list. The block
  Linears (``attn.qkv``, ``attn.proj``, ``mlp.fc1``, ``mlp.fc2``) are then AC/DC's ``prune=blocks`` set.

Shape overrides (``depth``, ``embed_dim``, ``num_heads``, ``img_size``, ``patch_size``) build a small model
of the same architecture, e.g. for a CPU test.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from descentlab.errors import ConfigError


class BlockList(nn.ModuleList):
    """An ``nn.ModuleList`` of transformer blocks that, called, runs them in order (as ``nn.Sequential``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self:
            x = block(x)
        return x


class TimmImageClassifier(nn.Module):
    """A timm classifier with the ``transformers`` call convention: ``model(pixel_values=x, labels=y)`` returns
    an ``ImageClassifierOutput`` with ``logits`` ``[B, classes]`` and, with labels, ``loss``."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        blocks = getattr(net, "blocks", None)
        if isinstance(blocks, nn.Sequential):
            net.blocks = BlockList(list(blocks))
        self.net = net

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None, **_: Any):
        from transformers.modeling_outputs import ImageClassifierOutput

        logits = self.net(pixel_values)
        loss = None if labels is None else classification_loss(logits, labels)
        return ImageClassifierOutput(loss=loss, logits=logits)


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against integer labels ``[B]`` or soft targets ``[B, C]``, in float32."""
    logits = logits.float()
    if labels.is_floating_point():
        if labels.shape != logits.shape:
            raise ValueError(f"soft targets {tuple(labels.shape)} do not match logits {tuple(logits.shape)}")
        return torch.sum(-labels * F.log_softmax(logits, dim=-1), dim=-1).mean()
    return F.cross_entropy(logits, labels)


def build_timm_classifier(
    name: str,
    num_classes: int,
    *,
    seed: int | None = None,
    drop_path: float = 0.0,
    activation_checkpointing: bool = False,
    **shape: int | None,
) -> TimmImageClassifier:
    """``timm.create_model(name, pretrained=False, num_classes=..., drop_path_rate=..., **shape)``, wrapped.

    Args:
        name: a timm model name, e.g. ``deit_small_patch16_224``, ``deit_base_patch16_224``.
        num_classes: classes of the head.
        seed: seeds the initialisation (None: the current global RNG).
        drop_path: stochastic depth rate (DeiT: 0.1).
        activation_checkpointing: recompute each block in the backward pass (timm's ``set_grad_checkpointing``).
        shape: overrides of the architecture's own sizes; None entries are left out.

    Raises:
        ConfigError: timm is missing, or does not know ``name``.
    """
    try:
        import timm
    except ImportError as exc:
        raise ConfigError(
            f"the timm backbone {name!r} needs timm: pip install 'descentlab[paper]' ({exc})"
        ) from exc
    if not timm.is_model(name):
        raise ConfigError(f"timm has no model {name!r}; e.g. deit_small_patch16_224, deit_base_patch16_224")
    kwargs = {k: v for k, v in shape.items() if v is not None}
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        net = timm.create_model(
            name, pretrained=False, num_classes=num_classes, drop_path_rate=drop_path, **kwargs
        )
    if activation_checkpointing:
        net.set_grad_checkpointing(True)
    return TimmImageClassifier(net)


__all__ = ["BlockList", "TimmImageClassifier", "build_timm_classifier", "classification_loss"]
