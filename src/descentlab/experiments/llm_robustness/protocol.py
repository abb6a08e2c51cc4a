"""llm-robustness's protocol record: what a run did, in words built from its config and what it measured.

Every sentence that restates the config is a function of the config here (``selection_text``,
``level_search_text``, ...), so the record cannot drift from what ran; :func:`protocol` assembles them with
the run's measured values (example counts, noise levels, σ_E, constrained layers, wall time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from descentlab.experiments.llm_robustness.config import LlmRobustnessConfig
from descentlab.experiments.llm_robustness.selection import tuned_methods

SEED_PAIRING = (
    "each method on evaluation seed s against ERM on seed s (claims cells [seed, draw, example], the seed the "
    "unit of replication); the null control: ERM on seed s_i against ERM on s_(i+1 mod S)"
)
NOISE = (
    "added to the input-embedding output, keyed by example content (every model sees the same draws). "
    "gaussian: std gamma * sigma_E; neftune: uniform, alpha / sqrt(n d) (n real tokens, d width)"
)
LIKELIHOOD_JUDGE = "likelihood: lower NLL of the reference continuation wins, ties split"


def selection_text(cfg: LlmRobustnessConfig, examples: int) -> str:
    """The selection rule on the tuning seed, ``examples`` validation examples per candidate."""
    sel, tune = cfg.selection, cfg.tune_seed
    tuned = tuned_methods(cfg)
    if not tuned:
        return (
            f"nothing to choose (one candidate per method); ERM's run on the tuning seed {tune} gives the "
            "noise levels"
        )
    binding = (
        f", binding (Σλ over the second half > {sel.min_binding:g}) first"
        if sel.min_binding is not None
        else ""
    )
    return (
        f"on the tuning seed {tune} and {examples} validation examples (never an evaluation seed, never the "
        f"held-out set): ERM's run gives the levels and the clean reference; candidates "
        f"{ {m: cfg.candidates(m) for m in tuned} } (equal budgets); rule: the highest {sel.criterion} "
        f"validation win rate against ERM's tuning run (mean over the {cfg.grid.profile_kind} levels) among "
        f"candidates whose clean win rate is >= 50 % - {sel.max_clean_drop:g}{binding}; the chosen candidate "
        "trains afresh on every evaluation seed"
    )


def level_search_text(cfg: LlmRobustnessConfig) -> str:
    """How the noise levels are found: bisection on ERM's validation perplexity ratio."""
    g = cfg.grid
    return (
        "ERM's validation perplexity ratio, bisection on log level (descentlab.robustness.levels) for ratios "
        f"{ {k: g.ratios_of(k) for k in g.kinds} } on {g.val_examples} validation examples"
    )


def constraints_record(cfg: LlmRobustnessConfig, facts: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict:
    """The constraint choice of the config and, per constrained method, the layers, α and candidate its
    first evaluation seed's fine-tune ran with (``facts``: method -> its fine-tunes' records)."""
    per_method = {
        m: {
            **{k: facts[m][0].get(k) for k in ("constrained_layers", "alphas")},
            "candidate": facts[m][0].get("candidate") or "(as configured)",
        }
        for m in cfg.methods
        if "constrained_layers" in facts[m][0]
    }
    c = cfg.method.constraint
    return {
        "select": cfg.constraints.select,
        "per method": per_method,
        "detach_prev": c.detach_prev,
        "dual_lr": c.dual_lr,
    }


def convergence_text(cfg: LlmRobustnessConfig) -> dict[str, str]:
    """``{"convergence": ...}`` with ``val_every``; empty without a validation curve."""
    if not cfg.val_every:
        return {}
    return {
        "convergence": f"validation loss every {cfg.val_every} steps on {cfg.val_curve_examples} validation "
        "examples; converged: |change over the last doubling of steps| < 2 %"
    }


def readout_text(cfg: LlmRobustnessConfig) -> str:
    """Where the logit lens reads and how many targets it samples."""
    return (
        f"logit lens, {cfg.readout.sample_tokens or 'all'} sampled targets at the read layers (l and l-1 of "
        "each constrained l), every target at layer L"
    )


def generative_text(cfg: LlmRobustnessConfig, judged: Mapping[str, Any] | None, world: int) -> dict[str, str]:
    """``{"generative_judge": ...}``: what the generate-then-judge phase did, or why it was skipped (it
    runs in one process only); empty without ``generative.model``."""
    gen = cfg.generative
    if not gen.model:
        return {}
    if not judged:
        return {"generative_judge": f"skipped under {world} processes: resume=RUN_DIR in one process runs it"}
    return {
        "generative_judge": f"{gen.model}: greedy answers of up to {gen.max_new_tokens} tokens to "
        f"{judged['examples']} held-out prompts at {judged['conditions']}, each pair judged in both orders; "
        "win rate raw and length-controlled (logistic length term, AlpacaEval 2.0 without its instruction "
        "term); a table, not a claim"
    }


def protocol(
    cfg: LlmRobustnessConfig,
    *,
    data: Mapping[str, Any],
    counts: Mapping[str, int],
    chosen: Mapping[str, str],
    levels: Mapping[str, list[float]],
    conds: Mapping[str, tuple[str, float]],
    sigma_e: float,
    facts: Mapping[str, Sequence[Mapping[str, Any]]],
    judged: Mapping[str, Any] | None,
    world: int,
    wall_seconds: float,
) -> dict[str, Any]:
    """The ``protocol`` of ``results.json``.

    Args:
        data: the data loader's own protocol record.
        counts: ``n_train_examples``, ``n_val``, ``n_eval`` and ``selection_examples`` (the validation
            examples each candidate is scored on).
        chosen: tuned method -> its chosen candidate.
        levels, conds: the evaluation levels per kind and the named conditions ``name -> (kind, level)``.
        sigma_e: the pretrained embeddings' std.
        facts: method -> its fine-tunes' records, one per evaluation seed.
        judged: the generate-then-judge phase's record (None: it did not run); ``world`` processes ran.
    """
    return {
        **data,
        "model": cfg.model.name,
        **{k: counts[k] for k in ("n_train_examples", "n_val", "n_eval")},
        "train_steps": cfg.train.max_steps,
        "batch_size": cfg.train.batch_size,
        "seq_len": cfg.data.seq_len,
        "seeds": list(cfg.seeds),
        "tune_seed": cfg.tune_seed,
        "seed_pairing": SEED_PAIRING,
        "selection": selection_text(cfg, counts["selection_examples"]),
        "chosen": dict(chosen),
        "draws": cfg.grid.draws,
        "levels": levels,
        "conditions": {name: [kind, x] for name, (kind, x) in conds.items()},
        "level_search": level_search_text(cfg),
        "noise": NOISE,
        "sigma_e": sigma_e,
        "noisy_training": {k: v for k, v in cfg.noisy_training.items() if k in cfg.methods},
        "constraints": constraints_record(cfg, facts),
        **convergence_text(cfg),
        "readout": readout_text(cfg),
        "judge": LIKELIHOOD_JUDGE,
        **generative_text(cfg, judged, world),
        "workers": cfg.workers,
        "torch_threads": cfg.torch_threads,
        "wall_seconds": wall_seconds,
    }


__all__ = ["protocol"]
