"""sparse-vit's job: train one ViT with one method (AC/DC at one sparsity, or dense) and evaluate it.

Top level and picklable, so the jobs can run in worker processes; each process loads the image splits once
(:func:`load_data`, the pool's initializer). ``timm.model`` None: the small ``transformers`` ViT of ``vit`` on
the tensors of ``dataset``; set (the ``paper`` preset): that timm model, random init, on the image folder
``dataset`` through DeiT's recipe (:class:`~descentlab.experiments.sparse_vit.config.TimmSetup`);
evaluation reads each image once, in batches, under bf16 autocast when training used it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import DataLoader

from descentlab.data.image_folder import FolderImages, MixupCollate, folder_splits, pillow_safe
from descentlab.data.images import ImageSet, load_image_splits
from descentlab.experiments.sparse_vit.config import BEFORE, FINAL, TIMM_SHAPE, SparseViTConfig, TimmSetup
from descentlab.io import atomic_write_text, load_arrays
from descentlab.models.timm_vit import build_timm_classifier
from descentlab.models.vit import build_vit, correct_predictions
from descentlab.sparsity import select_prunable, sparsity_report
from descentlab.sparsity.report import tensor_shape_stats
from descentlab.train.checkpoint import load_latest
from descentlab.train.loop import fit, seed_everything
from descentlab.train.recipe import MethodConfig, build_recipe, prunable_filter
from descentlab.train.rundir import RunDir


@dataclass
class Outcome:
    """What a run gathered, every job list in seed order.

    Attributes:
        sparse: method -> sparsity -> its jobs; dense: method -> its dense reference's jobs; paper_like:
            method -> the paper-like arm's jobs (on ``paper_like_seeds``).
        grids: method -> the tuning-seed job of every tuning candidate (a method with one has no entry).
        picks: method -> the index of its chosen candidate in ``grids``.
        weights: label (``<method>`` or ``<method>-dense``) -> the weights file the histograms read.
    """

    sparse: dict[str, dict[float, list[dict]]]
    dense: dict[str, list[dict]]
    paper_like: dict[str, list[dict]]
    grids: dict[str, list[dict]]
    picks: dict[str, int]
    weights: dict[str, str]


# the splits, loaded once per process (main, or each worker): tensors, or an image folder read on demand
DATA: dict[str, ImageSet | FolderImages] = {}


def load_data(cfg: SparseViTConfig) -> str:
    """Load the train / val / test splits into :data:`DATA`; returns the dataset's name. With ``timm.model``
    they are the image folder's (:func:`~descentlab.data.image_folder.folder_splits`: ``train/`` minus a fixed
    validation draw, ``val/`` for test), decoded on demand with timm's transforms."""
    sizes = {"n_train": cfg.n_train, "n_val": cfg.n_val, "n_test": cfg.n_test, "split_seed": cfg.split_seed}
    if uses_timm(cfg):
        data, classes = folder_splits(cfg.dataset, **sizes, **_transforms(cfg.timm))
        name = f"image folder {cfg.dataset} ({len(classes)} classes)"
    else:
        data, name = load_image_splits(cfg.dataset, **sizes)
    DATA.update(data)
    return name


def _block_weights(prunable: list) -> torch.Tensor:
    # on the CPU: saved as numpy arrays (twice a run, at the final pruning and at the end)
    return torch.cat([t.param.detach().flatten() for t in prunable]).cpu()


def train_job(
    cfg: SparseViTConfig, run: RunDir, method: MethodConfig, seed: int, tag: str, capture: bool
) -> dict:
    """Train one model with ``method`` (AC/DC at ``method.acdc.sparsity``, dense when None) and evaluate it.

    The shape of the prunable weights (:func:`~descentlab.sparsity.report.tensor_shape_stats`) is
    read when the final pruning sees them (end of the last decompressed phase) in a sparse run, at the end
    in a dense one, and written to ``weights/<tag>-shape.json`` at once, so a resumed fit keeps it. With
    ``capture`` the prunable weights themselves are saved to ``weights/<tag>.npz`` too, then and at the
    end. The result holds every test image's correctness (``test_correct``), the cells of the claims.
    """
    seed_everything(seed)
    # the head's classes: the folder's class folders (timm path), else vit.num_labels
    classes = len(DATA["train"].classes) if uses_timm(cfg) else cfg.vit.num_labels
    model = build_model(cfg, seed, classes)  # the small transformers ViT, or timm's (timm.model)
    train_cfg = replace(cfg.train, seed=seed)
    n_train = len(DATA["train"])
    select = (method.acdc or cfg.acdc).selection()  # a dense run: the set its sparse twins prune
    recipe = build_recipe(
        method,
        model,
        total_steps=train_cfg.total_steps(n_train),
        steps_per_epoch=-(-n_train // train_cfg.batch_size),
        mirror_filter=prunable_filter(model, select) if method.optimizer.mirror == "prunable" else None,
    )
    prunable = select_prunable(model, select)
    weights, shape_file = f"weights/{tag}.npz", run.path / f"weights/{tag}-shape.json"

    def record_shape() -> None:
        stats = tensor_shape_stats([t.param for t in prunable], cfg.small_weight)
        shape_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(shape_file, json.dumps(stats))

    def snapshot(step: int, _model: torch.nn.Module, _logs: dict) -> None:
        acdc = recipe.sparsity
        if acdc is not None and step == acdc.phases[-1].start - 1:
            record_shape()
            if capture:
                run.save_arrays(weights, **{BEFORE: _block_weights(prunable)})

    collate = train_collate(cfg, seed, classes)
    fit(
        model,
        DATA["train"],
        cfg=train_cfg,
        run=run,
        tag=tag,
        callbacks=(snapshot,),
        collate_fn=collate,
        **recipe.fit_kwargs(),
    )
    if recipe.sparsity is None:
        record_shape()
    ckpt = load_latest(run.checkpoint_dir(tag))
    saved = sparsity_report(load_file(str(ckpt.path / "model.safetensors")), names=[t.name for t in prunable])
    if capture:
        earlier = load_arrays(run.path / weights) if (run.path / weights).is_file() else {}
        run.save_arrays(weights, **{**earlier, FINAL: _block_weights(prunable)})
    hits = correct_on(cfg, model, DATA["test"])
    out = {
        "val": float(correct_on(cfg, model, DATA["val"]).double().mean()),
        "test": float(hits.double().mean()),
        "checkpoint_sparsity": saved.global_sparsity,
        "block_sparsity": [c.sparsity for c in saved.blocks.values()],
        "lr": method.optimizer.lr,
        "alpha": float(recipe.optimizer.defaults.get("alpha", 0.0)),  # the mirror strength used; 0: none
        "weights": weights if capture else None,
        "shape": json.loads(shape_file.read_text()) if shape_file.is_file() else None,
        "test_correct": hits.int().tolist(),
    }
    run.log(tag=tag, **{k: v for k, v in out.items() if isinstance(v, float)})
    return out


def uses_timm(cfg: SparseViTConfig) -> bool:
    """Whether the study runs the timm path (``timm.model`` is set)."""
    return cfg.timm.model is not None


def _transforms(spec: TimmSetup) -> dict[str, Any]:
    """``folder_splits``' transforms: DeiT's training augmentation, and resize + centre crop to evaluate."""
    from timm.data import create_transform

    # Pillow 13 refuses the 0-bit posterize that RandAugment's top magnitudes ask for (pillow_safe)
    train = create_transform(
        input_size=spec.img_size,
        is_training=True,
        scale=(spec.scale_min, 1.0),
        auto_augment=spec.auto_augment,
        interpolation="bicubic",
        re_prob=spec.re_prob,
        re_mode="pixel",
        re_count=1,
    )
    evaluation = create_transform(
        input_size=spec.img_size, is_training=False, interpolation="bicubic", crop_pct=spec.eval_crop_pct
    )
    return {"train_transform": pillow_safe(train), "eval_transform": evaluation}


def build_model(cfg: SparseViTConfig, seed: int, num_classes: int) -> nn.Module:
    """The model of one run: the timm classifier, or the small ``transformers`` ViT of ``cfg.vit``."""
    if not uses_timm(cfg):
        return build_vit(cfg.vit, seed=seed)
    spec = cfg.timm
    return build_timm_classifier(
        spec.model,
        num_classes,
        seed=seed,
        drop_path=spec.drop_path,
        activation_checkpointing=spec.activation_checkpointing,
        **{k: getattr(spec, k) for k in ("img_size", *TIMM_SHAPE)},
    )


def train_collate(cfg: SparseViTConfig, seed: int, num_classes: int) -> Any:
    """``fit``'s ``collate_fn``: Mixup / CutMix and soft targets on the timm path, None (torch's default
    collation) on the small-ViT path. timm's Mixup draws from numpy's global RNG, which ``seed_everything``
    leaves alone: it is seeded here so that ``train.loader_workers=0`` repeats too (a worker's own numpy RNG
    is seeded by the DataLoader)."""
    if not uses_timm(cfg):
        return None
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
        return correct_predictions(model, data.x.to(device), data.y.to(device)).cpu()
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


def describe_model(cfg: SparseViTConfig) -> str:
    """The model in the protocol table."""
    if not uses_timm(cfg):
        return f"ViT {cfg.vit.num_layers}x{cfg.vit.hidden_size}, patch {cfg.vit.patch_size}"
    spec = cfg.timm
    sizes = {k: getattr(spec, k) for k in TIMM_SHAPE}
    shrunk = ", ".join(f"{k} {v}" for k, v in sizes.items() if v is not None)
    return f"timm {spec.model}{f' ({shrunk})' if shrunk else ''}, {spec.img_size} px, random init"
