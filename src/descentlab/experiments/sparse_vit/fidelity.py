"""sparse-vit against HORST's DeiT experiments: what the presets change, and which of the paper's claims no
row judges (rendered into docs/results/sparse-vit.md by :mod:`descentlab.experiments.fidelity`)."""

from __future__ import annotations

from descentlab.report.fidelity import Deviation, Fidelity, NotTested, percent, seeds

DEIT = "vision transformer results (DeiT on ImageNet)"
PRUNE = {
    "all": "every Linear/Conv weight (patch embedding and head included)",
    "blocks": "the block Linears only (attention and MLP)",
}


def _model(c) -> str:
    if c.timm.model:
        return f"{c.timm.model} (timm), random init, {c.timm.img_size} px"
    v = c.vit
    return f"small ViT: {v.num_layers} layers, width {v.hidden_size}, patch {v.patch_size}"


def _data(c) -> str:
    return f"{c.dataset}: {c.n_train:,} training, {c.n_val:,} validation, {c.n_test:,} test images"


def _schedule(c) -> str:
    a = c.acdc
    # None: the reference fraction of the run (ACDCConfig): dense 10 %, phases 5 %, last dense 10 %, final 15 %
    parts = [(a.warmup, "10 %"), (a.phase, "5 %"), (a.last_decompressed, "10 %"), (a.final, "15 %")]
    dense, phase, last, final = (f"{v:g} {a.unit}" if v is not None else ref for v, ref in parts)
    return (
        f"{a.scope} magnitude; dense {dense}, phases of {phase}, last decompressed {last}, "
        f"final compressed {final}"
    )


def _prunable(c) -> str:
    text = PRUNE.get(c.acdc.prune, c.acdc.prune)
    if c.paper_like_seeds:
        text += f"; paper-like arm: the block Linears at {100 * c.paper_like_sparsity:g} %"
    return text


def _optimizers(c) -> str:
    grid = ", ".join(f"{k} α ∈ {v}" for k, v in c.tune_alpha.items()) if c.tune else "no tuning"
    return f"{', '.join(c.methods)}; {grid}"


DEVIATIONS = [
    Deviation("model", "DeiT-small and DeiT-base", _model, DEIT),
    Deviation("data", "ImageNet", _data, DEIT),
    Deviation("sparsity", "70 / 80 / 90 %", lambda c: percent(c.sparsities), DEIT),
    Deviation("prunable set", "not stated", _prunable),
    Deviation("AC/DC schedule", "AC/DC (schedule not stated)", _schedule, DEIT),
    Deviation("optimizers", "AdamW, HORST-AdamW, HAM (α not stated)", _optimizers, DEIT),
    Deviation(
        "training",
        "not stated",
        lambda c: (
            f"{c.train.max_steps or c.train.epochs} {'steps' if c.train.max_steps else 'epochs'}, batch {c.train.batch_size * c.train.grad_accum_steps}"
        ),
    ),
    Deviation("seeds", "not stated", lambda c: seeds(c.seeds, c.tune_seed if c.tune else None)),
]

NOT_TESTED = [
    NotTested(
        "the gains are most pronounced at high sparsity (80–90 %), where AdamW's performance degrades sharply",
        "no preset compares the HORST − AdamW gap across levels: `full` runs one level (99 %), `full-levels` runs 98 / 99 / 99.5 % without a row on the gap's growth, and none runs 70–90 % with every method.",
        "a row on (HORST − AdamW) at 90 % minus at 70 %, from a run at the paper's three levels (the `paper` preset, or the small ViT with `sparsities=[0.7,0.8,0.9]`).",
        DEIT,
    ),
    NotTested(
        "HORST requires no additional gradient evaluations, only one exponential update per parameter",
        "a property of the update rule, not a result of this study; no row measures it.",
        "a row on benchmarks/horst_step.py's step-time ratio of HORST to fused AdamW (it is timed there, not judged), "
        "and a count of gradient calls per step.",
        "contribution 4",
    ),
    NotTested(
        "at 90 % on DeiT-base, 76.83 % against AdamW's 68.86 %; on DeiT-small, HORST 70.5 % against HAM's 60.06 %",
        "the sizes belong to DeiT on ImageNet; the small ViT's accuracies are on another scale.",
        "the `paper` preset (docs/paper-scale.md), with sized rows at these gaps.",
        DEIT,
    ),
]

FIDELITY = Fidelity(DEVIATIONS, NOT_TESTED)
