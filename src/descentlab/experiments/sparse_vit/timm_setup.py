"""sparse-vit at the paper's scale: a timm DeiT on an ImageNet-style folder, through timm's data pipeline.

With ``timm.model`` set (the ``paper`` preset: ``deit_small_patch16_224`` or ``deit_base_patch16_224``) the
study trains that model (:func:`~descentlab.models.timm_vit.build_timm_classifier`, random init) on the
folder ``dataset`` (:func:`~descentlab.data.image_folder.folder_splits`: ``train/`` minus a fixed
validation draw for training and tuning, ``val/`` for test). Images are decoded and augmented in ``fit``'s
DataLoader workers (``train.loader_workers``) with DeiT's recipe through timm: random resized crop, flip,
RandAugment ``rand-m9-mstd0.5-inc1``, random erasing 0.25, then Mixup 0.8 / CutMix 1.0 with label smoothing
0.1 on each micro-batch (:class:`~descentlab.data.image_folder.MixupCollate`). Evaluation resizes, centre-
crops (``eval_crop_pct``) and reads each image once, in batches, under bf16 autocast when training used it.

Without ``timm.model`` every function here gives the study's small ``transformers`` ViT path unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from descentlab.experiments.sparse_vit.config import SparseViTConfig, TimmSetup


def uses_timm(cfg: SparseViTConfig) -> bool:
    """Whether the study runs the timm path (``timm.model`` is set)."""
    return cfg.timm.model is not None


def _transforms(spec: TimmSetup) -> tuple[Any, Any]:
    from timm.data import create_transform

    from descentlab.data.image_folder import pillow_safe

    # Pillow 13 refuses the 0-bit posterize that RandAugment's top magnitudes ask for (pillow_safe)
    train = pillow_safe(
        create_transform(
            input_size=spec.img_size,
            is_training=True,
            scale=(spec.scale_min, 1.0),
            auto_augment=spec.auto_augment,
            interpolation="bicubic",
            re_prob=spec.re_prob,
            re_mode="pixel",
            re_count=1,
        )
    )
    evaluation = create_transform(
        input_size=spec.img_size, is_training=False, interpolation="bicubic", crop_pct=spec.eval_crop_pct
    )
    return train, evaluation


def load_folder_data(cfg: SparseViTConfig) -> tuple[dict[str, Any], str]:
    """The train / val / test splits of the folder ``cfg.dataset`` with timm's transforms, and its name."""
    from descentlab.data.image_folder import folder_splits

    train_tf, eval_tf = _transforms(cfg.timm)
    data, classes = folder_splits(
        cfg.dataset,
        n_train=cfg.n_train,
        n_val=cfg.n_val,
        n_test=cfg.n_test,
        split_seed=cfg.split_seed,
        train_transform=train_tf,
        eval_transform=eval_tf,
    )
    return data, f"image folder {cfg.dataset} ({len(classes)} classes)"


def build_model(cfg: SparseViTConfig, seed: int, num_classes: int) -> nn.Module:
    """The model of one run: the timm classifier, or the small ``transformers`` ViT of ``cfg.vit``."""
    if not uses_timm(cfg):
        from descentlab.models.vit import build_vit

        return build_vit(cfg.vit, seed=seed)
    from descentlab.models.timm_vit import build_timm_classifier

    spec = cfg.timm
    return build_timm_classifier(
        spec.model,
        num_classes,
        seed=seed,
        drop_path=spec.drop_path,
        activation_checkpointing=spec.activation_checkpointing,
        img_size=spec.img_size,
        depth=spec.depth,
        embed_dim=spec.embed_dim,
        num_heads=spec.num_heads,
        patch_size=spec.patch_size,
    )


def train_collate(cfg: SparseViTConfig, seed: int, num_classes: int) -> Any:
    """``fit``'s ``collate_fn``: Mixup / CutMix and soft targets on the timm path, None (torch's default
    collation) on the small-ViT path. timm's Mixup draws from numpy's global RNG, which ``seed_everything``
    leaves alone: it is seeded here so that ``train.loader_workers=0`` repeats too (a worker's own numpy RNG
    is seeded by the DataLoader)."""
    if not uses_timm(cfg):
        return None
    from descentlab.data.image_folder import MixupCollate

    np.random.seed(seed)
    spec = cfg.timm
    return MixupCollate(num_classes, mixup=spec.mixup, cutmix=spec.cutmix, smoothing=spec.label_smoothing)


@torch.no_grad()
def correct_on(cfg: SparseViTConfig, model: nn.Module, data: Any) -> torch.Tensor:
    """Per image of ``data``: whether the model's arg-max class is its label (bool ``[N]``, on the CPU).

    Tensor splits are scored on the model's device in batches of 500; folder splits stream through a
    DataLoader with ``train.loader_workers`` workers, under bf16 autocast when training used it. The hits stay
    on the device until the end: one transfer per split.
    """
    device = next(model.parameters()).device
    if not uses_timm(cfg):
        from descentlab.models.vit import correct_predictions

        return correct_predictions(model, data.x.to(device), data.y.to(device)).cpu()
    from torch.utils.data import DataLoader

    loader = DataLoader(
        data,
        batch_size=cfg.timm.eval_batch_size,
        num_workers=cfg.train.loader_workers,
        pin_memory=device.type == "cuda",
    )
    bf16 = cfg.train.mixed_precision == "bf16"
    was_training = model.training
    model.eval()
    hits = []
    try:
        for batch in loader:
            x = batch["pixel_values"].to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(pixel_values=x).logits
            hits.append(logits.argmax(-1) == batch["labels"].to(device, non_blocking=True))
    finally:
        model.train(was_training)
    return torch.cat(hits).cpu()


def num_classes(cfg: SparseViTConfig, data: dict[str, Any]) -> int:
    """Classes of the head: the folder's class folders (timm path), else ``vit.num_labels``."""
    return len(data["train"].classes) if uses_timm(cfg) else cfg.vit.num_labels


def describe_model(cfg: SparseViTConfig) -> str:
    """The model in the protocol table."""
    if not uses_timm(cfg):
        return f"ViT {cfg.vit.num_layers}x{cfg.vit.hidden_size}, patch {cfg.vit.patch_size}"
    spec = cfg.timm
    sizes = {k: getattr(spec, k) for k in ("depth", "embed_dim", "num_heads", "patch_size")}
    shrunk = ", ".join(f"{k} {v}" for k, v in sizes.items() if v is not None)
    return f"timm {spec.model}{f' ({shrunk})' if shrunk else ''}, {spec.img_size} px, random init"


__all__ = [
    "TimmSetup",
    "build_model",
    "correct_on",
    "describe_model",
    "load_folder_data",
    "num_classes",
    "train_collate",
    "uses_timm",
]
