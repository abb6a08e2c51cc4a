"""llm-robustness: constrained vs ERM fine-tuning of a causal LM, compared head to head under embedding noise.

The paper fine-tuned Llama 3.1 8B with layer-wise descent constraints and reported a head-to-head
AlpacaEval win rate of the constrained model against the unconstrained one of 50 % at γ = 0 and 69.93 % at
γ = 1.5. Here, offline: SmolLM2-135M-Instruct fine-tuned on Austen's novels as continuation data; any HF
causal-LM id or local folder, and a local Alpaca JSON file (``data.source=alpaca data.path=...``), run the
same protocol.

The study, top to bottom:

* :mod:`.config`: the config and presets.
* :mod:`.run`, with :mod:`.jobs` (every step a job of one :class:`~descentlab.train.jobs.JobRunner`, cached
  in ``jobs/``, so an interrupted run resumes, submitted in dependency and priority order by
  :class:`~.graph.JobGraph`), :mod:`.selection` (the choice between candidates) and :mod:`.protocol` (the
  protocol record, built from the config):

  1. Data. Austen: training windows of ``seq_len`` tokens from the four training novels; a validation set
     (the Austen validation split) for every choice below; held-out examples from Persuasion, a novel never
     trained on: a passage of ``prompt_tokens`` and its reference continuation of ``continuation_tokens``.
  2. ``reference``: the pretrained model's logit-lens profile p_0..p_L on validation. The constraints are
     chosen from it (``constraints``): only layers where p descends, α_l = alpha_fraction · (1 - p_l /
     p_{l-1}) (:func:`~descentlab.constrained.descent.profile_constraints`), so the pretrained model meets
     them and no constraint is infeasible from the start; f_{l-1} detached (``detach_prev``), so no
     layer's loss gets a negative weight.
  3. ERM's tuning run: ERM fine-tuned from ``tune_seed``, which is never an evaluation seed and trains no
     reported model; every choice below is made with it, on validation.
  4. ``grid``: on validation, that ERM's perplexity under each noise kind; the levels where it grows by each
     of ``grid.ratios`` (x1.5, x3, x10) are found by bisection (:mod:`descentlab.robustness.levels`), plus
     fixed levels (NEFTune's α = 1.5, the paper's γ on that scale).
  5. Selection (``selection``): each constrained method's candidates (hard: ``alpha_fraction``; resilient:
     the slack penalty; equal numbers) fine-tune from the tuning seed and are scored on validation against
     ERM's tuning run (``validate``); the chosen one has the largest win rate under the gaussian levels
     among those whose clean win rate is within the parity margin of 50 %.
  6. ``train``: each method fine-tunes once per evaluation seed (``seeds``) from the same pretrained
     weights: ERM, hard constraints, resilient constraints (each with its chosen candidate) and the positive
     control (ERM trained on NEFTune noise, ``noisy_training``). λ of every constrained layer is recorded
     over training, and, with ``val_every``, the validation loss (the convergence check).
  7. ``eval``: every fine-tune on the held-out examples, clean and at every level: per-example reference
     NLL, perplexity, logit-lens profiles (clean and at the profile level).
  8. The judged outcomes against ERM of the same seed (lower reference NLL wins, ties split), ``[seed,
     draw, example]``, saved for the claims; the null control is ERM on one seed against ERM on the next.

* :mod:`.headtohead` and :mod:`.tables`: win-rate and ΔNLL curves and the tables of ``results.json``.
* :mod:`.claims`: what is judged, with the primary endpoint; :mod:`.figures`: the study's figures.

The generate-then-judge comparison needs a judge LM stronger than the judged ones; the only causal LM that
installs offline here is SmolLM2-135M itself, so only the likelihood judge runs inside the study.
"""
