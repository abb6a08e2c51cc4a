"""What each study's ``paper`` preset costs under the stated cost model (:mod:`descentlab.report.cost`): an
estimate, never a measurement.

Per study a :class:`Workload`: its trainable parameters ``N`` (closed forms from the architecture's config
numbers), the tokens ``T`` one run trains on and ``T_eval`` it scores (steps × batch × sequence, from the
resolved preset), a per-layer readout head's extra passes, and the runs the preset trains: tuning candidates
on the tuning seed, then every arm on every evaluation seed, counted from the config as the study counts
them (tests/experiments/test_paper_scale.py checks the counts against the studies' own tuning plans). Each
workload also says, in words, what the model leaves out where that is likely to dominate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

from descentlab.report.cost import (
    CostModel,
    evaluation_flops,
    gpt2_params,
    llama_params,
    roberta_classifier_params,
    training_flops,
    vit_classifier_params,
)

COST = CostModel()  # 40 % of one H100 SXM's 989 TFLOP/s dense bf16, sustained

# Architecture numbers the presets name by id, from each model's published config (nothing is downloaded).
GPT2_VOCAB = 50_257  # tokenizer=gpt2: 50,256 BPE merges' ids + <|endoftext|>
ENCODERS = {  # id -> (vocab, max positions, token types, width, layers, MLP width)
    "roberta-base": (50_265, 514, 1, 768, 12, 3_072),
    "roberta-large": (50_265, 514, 1, 1_024, 24, 4_096),
}
DEITS = {  # timm id -> (width, layers, patch); MLP ratio 4, one class token
    "deit_tiny_patch16_224": (192, 12, 16),
    "deit_small_patch16_224": (384, 12, 16),
    "deit_base_patch16_224": (768, 12, 16),
}
LLAMAS = {  # id -> (vocab, width, layers, MLP width, heads, key/value heads)
    "meta-llama/Llama-3.1-8B-Instruct": (128_256, 4_096, 32, 14_336, 32, 8),
    "meta-llama/Llama-3.1-8B": (128_256, 4_096, 32, 14_336, 32, 8),
}
DATASET_SIZE = {"imdb": 25_000}  # training examples where the preset takes a whole split (n_train: null)
LABELS = {"imdb": 2, "imagenet": 1_000}


@dataclass(frozen=True)
class RunGroup:
    """Runs of one kind, with what one of them processes.

    Attributes:
        what: which runs, in words (e.g. "tuning candidates on seed 1000").
        runs: how many.
        n_params: trainable parameters N of the model they train.
        train_tokens: T, tokens (patches) trained on by one run.
        eval_tokens: T_eval, tokens scored by one run.
        head_params / head_tokens: a per-layer readout head and the tokens it reads beyond the pass in N.
    """

    what: str
    runs: int
    n_params: int
    train_tokens: float
    eval_tokens: float
    head_params: int = 0
    head_tokens: float = 0.0

    def flops(self) -> float:
        """``runs · (6·N·T + 6·P_head·T_head + 2·N·T_eval)``."""
        one = training_flops(self.n_params, self.train_tokens, self.head_params, self.head_tokens)
        return self.runs * (one + evaluation_flops(self.n_params, self.eval_tokens))


@dataclass(frozen=True)
class Workload:
    """What the cost model sees of one paper preset.

    Attributes:
        params: N in words, with the closed form or count that gives it.
        tokens: how T and T_eval are counted.
        groups: the runs.
        head: the readout head's extra passes, or "" when the study has none.
        outside: what the model does not capture for this study (printed beside the estimate).
    """

    params: str
    tokens: str
    groups: tuple[RunGroup, ...]
    head: str = ""
    outside: str = ""

    @property
    def runs(self) -> int:
        return sum(g.runs for g in self.groups)

    def flops(self) -> float:
        return sum(g.flops() for g in self.groups)

    def gpu_hours(self, cost: CostModel = COST) -> float:
        return cost.gpu_hours(self.flops())


def known(table: dict[str, Any], key: str, what: str) -> Any:
    """``table[key]``, or one ValueError naming what the cost model lacks."""
    if key not in table:
        raise ValueError(f"the cost model knows no {what} {key!r}; add its config numbers to paper_cost")
    return table[key]


def _steps_tokens(train: Any, per_example: int, n_train: int | None = None) -> tuple[float, str]:
    """Examples-times-tokens of one run: ``max_steps x batch x accumulation``, else ``epochs x n_train``."""
    if train.max_steps:
        batch = train.batch_size * train.grad_accum_steps
        return float(train.max_steps * batch * per_example), f"{train.max_steps:,} steps x {batch}"
    if n_train is None:
        raise ValueError("an epoch budget needs the training set's size")
    return float(train.epochs * n_train * per_example), f"{train.epochs} epochs x {n_train:,}"


def _sparse_lm_work(cfg: Any) -> Workload:
    m = cfg.model
    vocab = GPT2_VOCAB if cfg.tokenizer == "gpt2" else cfg.bpe_vocab
    n = gpt2_params(vocab, m.n_positions, m.n_embd, m.n_layer, tied=m.tie_word_embeddings)
    t, how = _steps_tokens(cfg.train, m.n_positions)
    levels = 1 + len(cfg.sparsities)
    t_eval = float((cfg.eval_blocks + cfg.test_blocks) * m.n_positions * levels)
    if cfg.tune and (cfg.lr_from is not None or cfg.lr_first):
        raise ValueError(
            "the cost model counts sparse-lm's joint tuning grid only (lr_from=null, lr_first=false)"
        )
    tuning = sum(cfg.candidate_counts().values()) if cfg.tune else 0
    group = partial(RunGroup, n_params=n, train_tokens=t, eval_tokens=t_eval)
    return Workload(
        params=f"{n:,} (GPT-2, vocabulary {vocab:,}, {'tied' if m.tie_word_embeddings else 'untied'} head: "
        "`descentlab.report.cost.gpt2_params`)",
        tokens=f"T = {how} x {m.n_positions:,} tokens = {t:.3g} a run; T_eval = ({cfg.eval_blocks:,} "
        f"validation + {cfg.test_blocks:,} test blocks) x {m.n_positions:,} tokens x {levels} (dense and each "
        f"sparsity) = {t_eval:.3g}",
        groups=(
            group(f"tuning candidates on seed {cfg.tune_seed}", tuning),
            group(f"{len(cfg.methods)} methods x {len(cfg.seeds)} seeds", len(cfg.methods) * len(cfg.seeds)),
        ),
    )


def _sparse_vit_work(cfg: Any) -> Workload:
    from descentlab.experiments import get

    paper_like_methods = get("sparse-vit").part("config").PAPER_LIKE_METHODS  # through the registry
    width, layers, patch = known(DEITS, cfg.timm.model, "timm model")
    width, layers = cfg.timm.embed_dim or width, cfg.timm.depth or layers
    patch = cfg.timm.patch_size or patch
    classes = known(LABELS, cfg.dataset, "dataset")
    n = vit_classifier_params(cfg.timm.img_size, patch, 3, width, layers, 4, classes)
    tokens = (cfg.timm.img_size // patch) ** 2 + 1
    t, how = _steps_tokens(cfg.train, tokens, cfg.n_train)
    t_eval = float((cfg.n_val + cfg.n_test) * tokens)
    if cfg.tune and cfg.lr_from is not None:
        raise ValueError("the cost model counts sparse-vit's one-round tuning only (lr_from=null)")
    tuning = sum(len(g) for g in cfg.tuning_grids().values() if len(g) > 1) if cfg.tune else 0
    group = partial(RunGroup, n_params=n, train_tokens=t, eval_tokens=t_eval)
    s, like = len(cfg.seeds), f"{len(paper_like_methods)} methods x {len(cfg.paper_like_seeds)} seeds"
    groups = [
        group(f"tuning candidates on seed {cfg.tune_seed}", tuning),
        group(f"{len(cfg.methods)} methods x {len(cfg.sparsities)} sparsities x {s} seeds",
              len(cfg.methods) * len(cfg.sparsities) * s),
        *([group(f"dense `{cfg.dense}` x {s} seeds", s)] if cfg.dense else []),
        *([group(f"paper-like arm: {like}", len(paper_like_methods) * len(cfg.paper_like_seeds))]
          if cfg.paper_like_seeds else []),
    ]  # fmt: skip
    return Workload(
        params=f"{n:,} (DeiT, {layers} layers x {width}, patch {patch}, {classes:,} classes: "
        "`descentlab.report.cost.vit_classifier_params`)",
        tokens=f"T = {how} images x {tokens} tokens (patches + class token) = {t:.3g} a run; T_eval = "
        f"({cfg.n_val:,} validation + {cfg.n_test:,} test images) x {tokens} = {t_eval:.3g}",
        groups=tuple(groups),
        outside="AC/DC's masks leave the matrix products dense, so sparsity saves no FLOPs here; "
        "DeiT's augmentation (RandAugment, mixup/cutmix, random erasing) runs on the CPU and often bounds "
        "the step time",
    )


def _trains_readout(method_spec: str) -> bool:
    return "objective=constrained" in method_spec or "objective=deep-supervision" in method_spec


def _text_work(cfg: Any) -> Workload:
    vocab, positions, types, width, layers, hidden = known(ENCODERS, cfg.model, "encoder")
    layers = cfg.model_layers or layers
    classes = known(LABELS, cfg.data.name, "dataset")
    n = roberta_classifier_params(vocab, positions, types, width, layers, hidden, classes)
    n_train = cfg.data.n_train or known(DATASET_SIZE, cfg.data.name, "dataset")
    t, how = _steps_tokens(cfg.train, cfg.data.max_length, n_train)
    ev = cfg.evaluation
    passes = len(ev.kinds) * len(ev.gammas) * ev.draws
    t_eval = float(cfg.data.n_eval * cfg.data.max_length * passes)
    head = width * width + width + width * classes + classes
    examples = t / cfg.data.max_length
    sel = {m: c for m, c in cfg.selection.candidates.items() if m in cfg.methods}
    tuned = sum(len(c) for c in sel.values() if len(c) > 1)
    specs = [*(c for cs in sel.values() for c in cs), *(cfg.specs[m] for m in cfg.methods)]
    erm_tuning = 1 if tuned or any("alpha_from=erm" in c for c in specs) else 0
    readout = [m for m in cfg.methods if _trains_readout(cfg.specs[m])]
    plain = [m for m in cfg.methods if m not in readout]
    s = len(cfg.seeds)
    group = partial(RunGroup, n_params=n, train_tokens=t, eval_tokens=t_eval)
    readout_group = partial(group, head_params=head, head_tokens=layers * examples)
    groups = (
        group(f"ERM on seed {cfg.tune_seed}", erm_tuning),
        readout_group(f"selection candidates on seed {cfg.tune_seed}", tuned),
        readout_group(f"{len(readout)} readout methods x {s} seeds", len(readout) * s),
        group(f"{len(plain)} other methods x {s} seeds", len(plain) * s),
    )
    return Workload(
        params=f"{n:,} (`{cfg.model}`, {layers} layers, with RoBERTa's {classes}-label classification head: "
        "`descentlab.report.cost.roberta_classifier_params`)",
        tokens=f"T = {how} reviews x {cfg.data.max_length} tokens = {t:.3g} a run (an upper bound: the split's "
        "validation fraction is held out of it, and shorter reviews are padded only to their length group's "
        f"longest); T_eval = {cfg.data.n_eval:,} test "
        f"reviews x {cfg.data.max_length} x {passes} noisy passes ({len(ev.kinds)} kinds x {len(ev.gammas)} "
        f"γ x {ev.draws} draws) = {t_eval:.3g}",
        head=f"the classification head ({head:,} parameters) read at each of {layers} layers on the pooled "
        f"token, in {', '.join(f'`{m}`' for m in readout)}: {layers} x {examples:,.0f} head passes a run",
        groups=groups,
    )


def _llm_work(cfg: Any) -> Workload:
    vocab, width, layers, hidden, heads, kv = known(LLAMAS, cfg.model.name, "model")
    n = llama_params(vocab, width, layers, hidden, heads, kv)
    t, how = _steps_tokens(cfg.train, cfg.data.seq_len)
    g = cfg.grid
    passes = 1 + len(g.kinds) * len(g.ratios) * g.draws
    t_eval = float(cfg.data.n_eval * cfg.data.seq_len * passes)
    head = width * vocab + width  # the final RMSNorm and the LM head, the logit lens of every layer
    micro = cfg.train.max_steps * cfg.train.grad_accum_steps
    sampled = cfg.readout.sample_tokens
    if sampled is None or not isinstance(sampled, int):
        raise ValueError(f"the cost model needs readout.sample_tokens as a number, got {sampled!r}")
    head_tokens = float(layers * sampled * micro)
    tuned = {m: len(cfg.candidates(m)) for m in cfg.methods if len(cfg.candidates(m)) > 1}
    readout = [m for m in cfg.methods if _trains_readout(cfg.specs[m])]
    plain = [m for m in cfg.methods if m not in readout]
    s = len(cfg.seeds)
    group = partial(RunGroup, n_params=n, train_tokens=t, eval_tokens=t_eval)
    readout_group = partial(group, head_params=head, head_tokens=head_tokens)
    groups = (
        group(f"ERM on seed {cfg.tune_seed}", 1),
        readout_group(f"selection candidates on seed {cfg.tune_seed}", sum(tuned.values())),
        readout_group(f"{len(readout)} constrained methods x {s} seeds", len(readout) * s),
        group(f"{len(plain)} other methods x {s} seeds", len(plain) * s),
    )
    state_gb = 16 * n / 1e9
    return Workload(
        params=f"{n:,} (`{cfg.model.name}`, every parameter fine-tuned: `descentlab.report.cost.llama_params`)",
        tokens=f"T = {how} sequences x {cfg.data.seq_len} tokens = {t:.3g} a run (an upper bound: shorter "
        f"examples are not padded to {cfg.data.seq_len}); T_eval = {cfg.data.n_eval:,} prompts x "
        f"{cfg.data.seq_len} x {passes} likelihood passes (clean + {len(g.kinds)} kinds x {len(g.ratios)} "
        f"ratios x {g.draws} draws) = {t_eval:.3g}",
        head=f"the logit lens (final norm + LM head, {head:,} parameters) at each of {layers} layers on "
        f"{sampled} sampled targets per micro-batch, in {', '.join(f'`{m}`' for m in readout)}: "
        f"{head_tokens:.3g} head passes a run (every layer: an upper bound on the constrained ones)",
        groups=groups,
        outside=f"**not in the estimate, and likely most of the cost**: each run generates up to "
        f"{cfg.generative.max_new_tokens} new tokens per prompt under {len(cfg.generative.conditions)} "
        f"conditions (decoding is memory-bound, far below the assumed FLOP rate), and "
        f"`{cfg.generative.model}` judges every pair. Memory: {cfg.model.dtype} weights with AdamW's "
        f"gradients and two moments take about 16 bytes a parameter, {state_gb:.0f} GB before activations, "
        "more than one 80 GB GPU holds (the estimate counts GPU-hours, not GPUs)",
    )


def _video_group(
    arch: str, n: int, t: float, t_eval: float, head: int, extra: float, what: str, runs: int, f: float = 1.0
) -> RunGroup:
    """``runs`` runs of one architecture at ``f`` of the preset's steps (tokens and head passes scale)."""
    return RunGroup(f"{arch}{what}", runs, n, f * t, t_eval, head, f * extra)


def _video_work(cfg: Any) -> Workload:
    import torch

    from descentlab.models.denoisers import build_denoiser

    per_clip = cfg.data.num_frames * (cfg.data.crop // cfg.model.patch_size) ** 2
    t, how = _steps_tokens(cfg.train, per_clip)
    t_eval = float((cfg.data.n_val + cfg.data.n_test * len(cfg.gammas)) * per_clip)
    groups, params, heads = [], [], []
    s = len(cfg.seeds)
    for arch in cfg.architectures:
        with torch.device("meta"):  # shapes only: the count needs no memory
            model = build_denoiser(
                arch, image_size=cfg.data.crop, num_frames=cfg.data.num_frames, **asdict(cfg.model)
            )
        n = sum(p.numel() for p in model.parameters())
        decoder = [model.decoder.weight, model.decoder.bias] if arch == "ut" else [model.dictionary]
        head = sum(p.numel() for p in decoder)
        extra = cfg.model.depth * t  # L + 1 estimates a clip, one of them inside N
        tuning = sum(len(cfg.candidates(lab)) for lab in cfg.trained_labels if len(cfg.candidates(lab)) > 1)
        group = partial(_video_group, arch.upper(), n, t, t_eval, head, extra)
        groups += [
            group(f" tuning candidates on seed {cfg.tune_seed}", tuning),
            group(f": {len(cfg.labels)} methods x {s} seeds", len(cfg.labels) * s),
            *([group(f" ERM at {cfg.budget_check:g}x the steps", 1, cfg.budget_check)] if cfg.budget_check else []),
            *(group(f" {lab} at {steps:,} steps", 1, steps / cfg.train.max_steps)
              for steps in cfg.budget_curve for lab in cfg.budget_labels),
        ]  # fmt: skip
        params.append(f"{arch.upper()} {n:,}")
        heads.append(f"{arch.upper()} {head:,}")
    steps = round(sum(g.runs * g.train_tokens for g in groups) / (cfg.train.batch_size * per_clip))
    return Workload(
        params=f"{', '.join(params)} (counted on the models the study builds, on the meta device)",
        tokens=f"T = {how} clips x {per_clip} tokens ({cfg.data.num_frames} frames x "
        f"{(cfg.data.crop // cfg.model.patch_size) ** 2} patch(es) a frame) = {t:.3g} a run; T_eval = "
        f"({cfg.data.n_val:,} validation + {cfg.data.n_test:,} test clips x {len(cfg.gammas)} noise levels) "
        f"x {per_clip} = {t_eval:.3g}",
        head=f"every arm decodes each of the {cfg.model.depth} layers' estimates (UT's decoder, DUST's dictionary: "
        f"{', '.join(heads)} parameters): {cfg.model.depth} x T head passes a run",
        groups=tuple(groups),
        outside="**a floor, not a forecast**: models this small (about 1 M parameters, "
        f"{per_clip} tokens a clip) are bound by kernel launches, the per-step dual update and data loading, "
        f"not by FLOPs, so the time per step, over the {steps:,} optimizer steps of these runs, sets the real "
        "cost, which can be orders of magnitude above this figure; the classical baselines "
        f"({', '.join(cfg.baselines)}) run on the CPU and are not counted",
    )


WORK: dict[str, Callable[[Any], Workload]] = {
    "sparse-lm": _sparse_lm_work,
    "sparse-vit": _sparse_vit_work,
    "text-robustness": _text_work,
    "llm-robustness": _llm_work,
    "video-denoising": _video_work,
}
