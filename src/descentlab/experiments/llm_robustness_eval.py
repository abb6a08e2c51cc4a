"""Evaluation half of llm-robustness: fine-tuned causal LMs under embedding noise, head to head.

Per model (:func:`evaluate`): for every (kind, γ, draw) one batched pass over the held-out examples gives the
perplexity and each example's NLL of its reference continuation (:func:`~descentlab.robustness.judge.
score_examples`); plus logit-lens loss profiles, clean and noisy, and greedy generations when the
generate-then-judge comparison is on. Noise is keyed by example content, so every model sees the same
noisy embeddings. Across models (:func:`summarise`): perplexity curves, likelihood-judge win-rate curves of
each method against the baseline on the same examples and noise draws, tables, and the win-rate figure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from descentlab.data.instructions import collate_causal
from descentlab.errors import ConfigError
from descentlab.readout import CausalLMReadout, layer_losses
from descentlab.robustness.curves import RobustnessCurves
from descentlab.robustness.judge import GenerativeJudge, Noise, generate_responses, score_examples
from descentlab.robustness.winrate import WinRate, win_rate

PAPER_WIN_RATE = {0.0: 0.50, 1.5: 0.6993}  # Llama 3.1 8B, AlpacaEval, constrained vs unconstrained


def parse_noise(spec: str) -> tuple[str, float]:
    """``"gaussian@1.5"`` -> ("gaussian", 1.5)."""
    kind, _, gamma = spec.partition("@")
    try:
        return kind, float(gamma)
    except ValueError:
        raise ConfigError(f"noise spec {spec!r} must look like 'gaussian@1.5'") from None


def noise_key(kind: str, gamma: float, draw: int) -> str:
    """Name of one noise condition; every kind shares the one clean pass."""
    return "clean" if gamma == 0 else f"{kind}@{gamma:g}#{draw}"


@dataclass
class EvalConfig:
    kinds: list[str] = field(default_factory=lambda: ["gaussian", "uniform", "discrete"])
    gammas: list[float] = field(default_factory=lambda: [0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0])
    draws: int = 3
    noise_seed: int = 0
    batch_size: int = 8
    perplexity_on: str = "all"  # "all" tokens of each example, or the "reference" tokens only
    judge: str = "likelihood"  # "likelihood", or "generate" (adds generate-then-judge curves)
    judge_model: str = "smollm2"  # any local causal LM for the generate-then-judge comparison
    judge_examples: int = 32
    max_new_tokens: int = 48
    tie_tol: float = 1e-6  # NLLs closer than this (nats) tie
    layer_noise: list[str] = field(default_factory=lambda: ["gaussian@1.5"])
    layer_examples: int = 32
    layer_chunk: int = 1024

    def __post_init__(self) -> None:
        if self.judge not in ("likelihood", "generate"):
            raise ConfigError(f"eval.judge must be 'likelihood' or 'generate', got {self.judge!r}")
        if self.perplexity_on not in ("all", "reference"):
            raise ConfigError(f"eval.perplexity_on must be 'all' or 'reference', got {self.perplexity_on!r}")
        if self.draws < 1 or any(g < 0 for g in self.gammas) or 0.0 not in self.gammas:
            raise ConfigError("eval needs draws >= 1 and a γ grid of values >= 0 that includes 0")
        for spec in self.layer_noise:
            parse_noise(spec)


@torch.no_grad()
def layer_profile(
    model: torch.nn.Module, examples: list[dict], pad: int, noise: Noise, *, all_tokens: bool, chunk: int
) -> list[float]:
    """Token-weighted mean logit-lens loss at layers 0..L over ``examples`` (every layer, every target)."""
    model.eval()
    readout = CausalLMReadout(chunk_size=chunk, sample_tokens=None)
    device = next(model.parameters()).device
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    with noise.apply(model, pad_token_id=pad):
        for s in range(0, len(examples), 4):
            batch = collate_causal(examples[s : s + 4], pad)
            if all_tokens:
                batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
            n = int((batch["labels"][:, 1:] != -100).sum())
            f = layer_losses(model, {k: v.to(device) for k, v in batch.items()}, readout=readout)
            total, count = total + f.double() * n, count + n
    return (total / count).tolist()


def evaluate(model: torch.nn.Module, held: list[dict], e: EvalConfig, pad: int, eos: int | None) -> dict:
    """Perplexity and per-example reference NLL under every (kind, γ, draw); layer profiles; generations."""
    out: dict[str, Any] = {"perplexity": {}, "nll": {}, "layer_loss": {}, "generations": {}}
    for kind in e.kinds:
        for gamma in e.gammas:
            for draw in range(1 if gamma == 0 else e.draws):
                key = noise_key(kind, gamma, draw)
                if key in out["nll"]:
                    continue
                noise = Noise(kind, gamma, seed=e.noise_seed, draw=draw)
                s = score_examples(model, held, pad_token_id=pad, batch_size=e.batch_size, noise=noise)
                out["perplexity"][key] = s.perplexity(e.perplexity_on)
                out["nll"][key] = s.reference_nll.tolist()
                if e.judge == "generate" and draw == 0:
                    prompts = [x["input_ids"][: x["prompt_length"][0]] for x in held[: e.judge_examples]]
                    out["generations"][key] = generate_responses(
                        model,
                        prompts,
                        pad_token_id=pad,
                        eos_token_id=eos,
                        max_new_tokens=e.max_new_tokens,
                        noise=noise,
                    )
    sub, kw = held[: e.layer_examples], {"all_tokens": e.perplexity_on == "all", "chunk": e.layer_chunk}
    if not sub:
        return out
    out["layer_loss"]["clean"] = layer_profile(model, sub, pad, Noise(), **kw)
    for spec in e.layer_noise:
        kind, gamma = parse_noise(spec)
        out["layer_loss"][spec] = layer_profile(model, sub, pad, Noise(kind, gamma, seed=e.noise_seed), **kw)
    return out


def grid(n_seeds: int, kind: str, e: EvalConfig, value: Any) -> np.ndarray:
    """``value(seed index, noise key)`` on the [seeds, draws, gammas] grid; γ = 0 is the one clean pass."""
    out = np.zeros((n_seeds, e.draws, len(e.gammas)))
    for s in range(n_seeds):
        for g, gamma in enumerate(e.gammas):
            for d in range(e.draws):
                out[s, d, g] = value(s, noise_key(kind, gamma, 0 if gamma == 0 else d))
    return out


def head_to_head(ev_a: list[dict], ev_b: list[dict], key: str, tol: float) -> WinRate:
    """Likelihood-judge win rate of A over B at one noise key, pooled over seeds: lower reference NLL wins."""
    nll_a = np.concatenate([np.asarray(ev["nll"][key]) for ev in ev_a])
    nll_b = np.concatenate([np.asarray(ev["nll"][key]) for ev in ev_b])
    return win_rate(nll_a, nll_b, higher_is_better=False, tie_tol=tol)


def judged_curves(
    e: EvalConfig, evals: dict[str, list[dict]], baseline: str, held: list[dict], tok: Any
) -> dict[str, dict[str, dict]]:
    """Generate-then-judge win-rate curves (draw 0, both orders) of every method against the baseline."""
    from descentlab.data import load_causal_lm

    judge_model, judge_tok = load_causal_lm(e.judge_model)
    judge = GenerativeJudge(judge_model, judge_tok, batch_size=e.batch_size)
    prompts = [tok.decode(x["input_ids"][: x["prompt_length"][0]], skip_special_tokens=True) for x in held]

    def text(rows: list[list[int]]) -> list[str]:
        return [tok.decode(r, skip_special_tokens=True).strip() for r in rows]

    out: dict[str, dict[str, dict]] = {}
    for method in (m for m in evals if m != baseline):
        out[method] = {}
        for kind in e.kinds:
            values = np.zeros((len(evals[method]), 1, len(e.gammas)))
            for s, (ev_m, ev_b) in enumerate(zip(evals[method], evals[baseline], strict=True)):
                for g, gamma in enumerate(e.gammas):
                    a, b = (
                        ev_m["generations"][noise_key(kind, gamma, 0)],
                        ev_b["generations"][noise_key(kind, gamma, 0)],
                    )
                    values[s, 0, g] = float(judge.compare_texts(prompts[: len(a)], text(a), text(b)).mean())
            curve = RobustnessCurves("judged_win_rate", tuple(e.gammas), {kind: values}).curves()[kind]
            out[method][f"judged_win_rate@{kind}"] = curve
    return out


def win_rate_figure(path: Path, baseline: str, curves: dict[str, dict[str, dict]]) -> bool:
    """Win rate vs γ for every method and kind, with parity and the paper's two points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not curves:
        return False
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for method, block in curves.items():
        for name, c in block.items():
            ax.errorbar(
                c["x"], c["mean"], yerr=c.get("stderr"), marker="o", ms=3, capsize=2, label=f"{method} {name}"
            )
    ax.axhline(0.5, color="grey", lw=1, ls="--", label="parity")
    ax.plot(list(PAPER_WIN_RATE), list(PAPER_WIN_RATE.values()), "k*", ms=10, label="paper (Llama 3.1 8B)")
    ax.set(xlabel="γ (noise std / σ_E)", ylabel=f"win rate vs {baseline}", ylim=(0, 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def summarise(evals: dict[str, list[dict]], e: EvalConfig, baseline: str) -> tuple[dict, list, list, dict]:
    """results.json method blocks, head-to-head rows, paper-comparison rows and the win-rate curves."""
    methods: dict[str, dict] = {}
    h2h_rows: list[list] = []
    paper_rows: list[list] = []
    wr_curves: dict[str, dict[str, dict]] = {}
    base = evals[baseline]
    for method, ev in evals.items():
        ppl = {k: grid(len(ev), k, e, lambda s, key, ev=ev: ev[s]["perplexity"][key]) for k in e.kinds}
        block: dict[str, Any] = {"curves": RobustnessCurves("perplexity", tuple(e.gammas), ppl).curves()}
        block["metrics"] = {"perplexity": float(np.mean([x["perplexity"]["clean"] for x in ev]))}
        block["metrics"].update({f"perplexity_mean@{k}": c["summary"] for k, c in block["curves"].items()})
        block["layer_loss"] = {
            c: np.mean([x["layer_loss"][c] for x in ev], axis=0).tolist() for c in ev[0]["layer_loss"]
        }
        block["metrics"]["train_seconds"] = float(np.mean([x["train"]["train_seconds"] for x in ev]))
        methods[method] = block
        if method == baseline:
            continue
        wr_curves[method] = {}
        for kind in e.kinds:

            def per_seed(s: int, key: str, ev: list[dict] = ev) -> float:
                return head_to_head([ev[s]], [base[s]], key, e.tie_tol).rate

            curve = RobustnessCurves(
                "win_rate", tuple(e.gammas), {kind: grid(len(ev), kind, e, per_seed)}
            ).curves()[kind]
            pooled = [head_to_head(ev, base, noise_key(kind, g, 0), e.tie_tol) for g in e.gammas]
            curve["stderr"] = [w.stderr for w in pooled]
            block["curves"][f"win_rate@{kind}"] = wr_curves[method][f"win_rate@{kind}"] = curve
            h2h_rows += [
                [method, kind, g, w.rate, w.stderr, w.wins, w.ties, w.losses]
                for g, w in zip(e.gammas, pooled, strict=True)
            ]
        clean = block["curves"][f"win_rate@{e.kinds[0]}"]["mean"][e.gammas.index(0.0)]
        block["metrics"]["win_rate"] = clean
        paper_rows.append([method, "0", "50.00 %", f"{100 * clean:.2f} %"])
        if 1.5 in e.gammas and "gaussian" in e.kinds:
            at = block["curves"]["win_rate@gaussian"]["mean"][e.gammas.index(1.5)]
            block["metrics"]["win_rate@gaussian1.5"] = at
            paper_rows.append([method, "1.5 (gaussian)", "69.93 %", f"{100 * at:.2f} %"])
    return methods, h2h_rows, paper_rows, wr_curves


__all__ = [
    "PAPER_WIN_RATE",
    "EvalConfig",
    "evaluate",
    "grid",
    "head_to_head",
    "judged_curves",
    "layer_profile",
    "noise_key",
    "parse_noise",
    "summarise",
    "win_rate_figure",
]
