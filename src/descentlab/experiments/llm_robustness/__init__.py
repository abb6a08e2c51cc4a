"""llm-robustness: constrained vs ERM fine-tuning of a causal LM, compared head to head under embedding noise.

The paper fine-tuned Llama 3.1 8B with layer-wise descent constraints and reported a head-to-head AlpacaEval
win rate against the unconstrained model of 50 % at γ = 0 and 69.93 % at γ = 1.5. Here, offline: SmolLM2-135M
fine-tuned on Austen's novels as continuation data, judged by likelihood (:mod:`.run` lists the steps); any
HF causal LM and a local Alpaca JSON file run the same protocol, and ``generative.model`` adds a judge LM.
:mod:`.clusters` labels the held-out passages with their chapter (and a saved run, from the command line).
"""
