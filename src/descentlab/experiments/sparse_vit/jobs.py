"""sparse-vit's job: train one ViT with one method (AC/DC at one sparsity, or dense) and evaluate it.

Top level and picklable, so the jobs can run in worker processes; each process loads the image splits once
(:func:`load_data`, the pool's initializer).
"""

from __future__ import annotations

import json
from dataclasses import replace

import torch
from safetensors.torch import load_file

from descentlab.data.image_folder import FolderImages
from descentlab.data.images import ImageSet, load_image_splits
from descentlab.experiments.sparse_vit.config import SparseViTConfig
from descentlab.experiments.sparse_vit.tables import BEFORE, FINAL
from descentlab.experiments.sparse_vit.timm_setup import (
    build_model,
    correct_on,
    load_folder_data,
    num_classes,
    train_collate,
    uses_timm,
)
from descentlab.io import atomic_write_text, load_arrays
from descentlab.sparsity import select_prunable, sparsity_report
from descentlab.sparsity.report import tensor_shape_stats
from descentlab.train.checkpoint import load_latest
from descentlab.train.loop import fit, seed_everything
from descentlab.train.recipe import MethodConfig, build_recipe, prunable_filter
from descentlab.train.rundir import RunDir

# the splits, loaded once per process (main, or each worker): tensors, or an image folder read on demand
DATA: dict[str, ImageSet | FolderImages] = {}


def load_data(cfg: SparseViTConfig) -> str:
    """Load the train / val / test splits into :data:`DATA`; returns the dataset's name. With ``timm.model``
    they are the image folder's, decoded on demand (:mod:`~descentlab.experiments.sparse_vit.timm_setup`)."""
    if uses_timm(cfg):
        data, name = load_folder_data(cfg)
    else:
        data, name = load_image_splits(
            cfg.dataset, n_train=cfg.n_train, n_val=cfg.n_val, n_test=cfg.n_test, split_seed=cfg.split_seed
        )
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
    classes = num_classes(cfg, DATA)
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
