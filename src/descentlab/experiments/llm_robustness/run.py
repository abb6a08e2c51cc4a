"""llm-robustness's run: data -> reference profile -> fine-tunes -> noise grid -> evaluation -> arrays.

Every step is a job of one :class:`~descentlab.train.jobs.JobRunner` (:mod:`.jobs`), cached in ``jobs/``,
so an interrupted run resumes.
"""

from __future__ import annotations

import time

import torch

from descentlab.data import load_causal_lm
from descentlab.data.causal_lm import prepare_causal_lm_data
from descentlab.experiments.llm_robustness.claims import CLAIM_ARRAYS
from descentlab.experiments.llm_robustness.config import LlmRobustnessConfig
from descentlab.experiments.llm_robustness.headtohead import claim_cells, conditions, summarise
from descentlab.experiments.llm_robustness.jobs import grid_levels, job, model_for, validation_examples
from descentlab.experiments.llm_robustness.judged import (
    JUDGED_ARRAYS,
    judged_arrays,
    judged_table,
    run_generative_judge,
)
from descentlab.io import save_arrays
from descentlab.train.jobs import JobRunner
from descentlab.train.rundir import RunDir


def run(cfg: LlmRobustnessConfig, run: RunDir) -> dict:
    started = time.perf_counter()
    if cfg.torch_threads > 0:
        torch.set_num_threads(cfg.torch_threads)
    # 1. data (with workers, the model loads once inside each worker process)
    if cfg.workers <= 1:
        _, tok = model_for(cfg)
    else:
        model, tok = load_causal_lm(cfg.model.name)
        del model
    train, held, data_protocol = prepare_causal_lm_data(cfg.data, tok)
    val, train = validation_examples(cfg, tok, train)

    labels, base = list(cfg.methods), cfg.baseline
    with JobRunner(
        job, workers=cfg.workers, cache_dir=run.path / "jobs", threads=max(1, cfg.torch_threads)
    ) as jobs:
        ref = jobs.submit("reference", "reference", cfg, val, held).result()
        # 2.-3. ERM first (the grid needs it), then the others; the grid runs as soon as ERM is done
        order = [base, *[m for m in labels if m != base]]
        trains = {
            m: jobs.submit(f"train-{m}", "train", cfg, m, train, ref["val_profile"], run) for m in order[:2]
        }
        trains[base].result()
        grid_f = jobs.submit("grid", "grid", cfg, val, run)
        for m in order[2:]:
            trains[m] = jobs.submit(f"train-{m}", "train", cfg, m, train, ref["val_profile"], run)
        grid = grid_f.result()
        levels = grid_levels(cfg, grid)
        g = cfg.grid
        profile_level = grid["kinds"][g.profile_kind]["levels"][
            g.ratios_of(g.profile_kind).index(g.profile_ratio)
        ]
        profile = [g.profile_kind, profile_level]
        evals = {m: jobs.submit(f"eval-{m}", "eval", cfg, m, held, levels, profile, run) for m in order}
        facts = {m: f.result() for m, f in trains.items()}
        evaluations = {m: evals[m].result() for m in labels}

    # 4. the judged outcomes the claims read, then the curves and tables
    derived = {
        kind: dict(zip(g.ratios_of(kind), grid["kinds"][kind]["levels"], strict=True)) for kind in levels
    }
    conds = conditions(levels, derived)
    if run.writer:
        cells = claim_cells(evaluations, baseline=base, conds=conds, draws=g.draws, tol=cfg.eval.tie_tol)
        save_arrays(run.path / CLAIM_ARRAYS, **cells)
    judged = None
    # generate then judge (AlpacaEval-style); the likelihood judge stays of record. Under several processes
    # (FSDP2) every rank would load the judge: that phase runs afterwards in one process, resume=RUN_DIR
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if cfg.generative.model and world == 1:
        judged = run_generative_judge(cfg, held, conds, run, tok)
        if run.writer:
            save_arrays(run.path / JUDGED_ARRAYS, **judged_arrays(judged["verdicts"]))
    body = summarise(
        evaluations=evaluations,
        facts=facts,
        reference=ref,
        grid=grid,
        levels=levels,
        baseline=base,
        profile=f"{g.profile_kind}@{profile_level:g}",
        draws=g.draws,
        tol=cfg.eval.tie_tol,
    )
    d = cfg.data
    protocol = {
        **data_protocol,
        "model": cfg.model.name,
        "n_train_examples": len(train),
        "n_val": len(val),
        "n_eval": len(held),
        "train_steps": cfg.train.max_steps,
        "batch_size": cfg.train.batch_size,
        "seq_len": d.seq_len,
        "seeds": [cfg.seed],
        "draws": g.draws,
        "levels": levels,
        "conditions": {name: [kind, x] for name, (kind, x) in conds.items()},
        "level_search": "ERM's validation perplexity ratio, bisection on log level "
        f"(descentlab.robustness.levels) for ratios { {k: g.ratios_of(k) for k in g.kinds} } on "
        f"{g.val_examples} validation examples",
        "noise": "added to the input-embedding output, keyed by example content (every model sees the same "
        "draws). gaussian: std gamma * sigma_E; neftune: uniform, alpha / sqrt(n d) (n real tokens, d width)",
        "sigma_e": ref["sigma_e"],
        "noisy_training": {k: v for k, v in cfg.noisy_training.items() if k in labels},
        "reseed": {k: v for k, v in cfg.reseed.items() if k in labels},
        "constraints": {
            "select": cfg.constraints.select,
            "per method": {
                m: {k: facts[m].get(k) for k in ("constrained_layers", "alphas")}
                for m in labels
                if "constrained_layers" in facts[m]
            },
            "detach_prev": cfg.method.constraint.detach_prev,
            "dual_lr": cfg.method.constraint.dual_lr,
            "penalty (resilient)": cfg.method.constraint.penalty,
        },
        "readout": f"logit lens, {cfg.readout.sample_tokens or 'all'} sampled targets at the read layers "
        f"(l and l-1 of each constrained l), every target at layer L",
        "judge": "likelihood: lower NLL of the reference continuation wins, ties split",
        **(
            {
                "generative_judge": f"{cfg.generative.model}: greedy answers of up to "
                f"{cfg.generative.max_new_tokens} tokens to {judged['examples']} held-out prompts at "
                f"{judged['conditions']}, each pair judged in both orders; win rate raw and length-controlled "
                "(logistic length term, AlpacaEval 2.0 without its instruction term); a table, not a claim"
            }
            if judged
            else {
                "generative_judge": f"skipped under {world} processes: resume=RUN_DIR in one process runs it"
            }
            if cfg.generative.model
            else {}
        ),
        "workers": cfg.workers,
        "torch_threads": cfg.torch_threads,
        "wall_seconds": time.perf_counter() - started,
    }
    if judged:
        body["tables"].append(judged_table(judged, base, str(cfg.generative.model)))
    return {"protocol": protocol, **body}
