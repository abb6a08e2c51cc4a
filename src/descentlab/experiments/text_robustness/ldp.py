"""text-robustness against the local-DP ε, when the run evaluates the ε kinds: the curves joined over seeds,
the privacy accounting of the ε grid and the protocol entry. They are described, not judged (no claim of
the paper is about ε); the figure, with seed-level intervals against the matched control, is drawn by
:mod:`.figures` from ``arrays/ldp.npz``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from descentlab.report.results import Curve, MethodResult
from descentlab.robustness import EmbeddingGeometry, NoiseEvalConfig, RobustnessCurves, privacy_rows
from descentlab.robustness.accounting import PrivacyRow
from descentlab.study.tables import Table


def add_ldp_curves(block: MethodResult, curves: RobustnessCurves | None) -> None:
    """Put the ε curves (x_name ``epsilon``) into a method block, and their grid means into its metrics."""
    if curves is None:
        return
    for kind, c in curves.curves().items():
        block.curves[kind] = Curve.from_dict(c)
        block.metrics[f"{kind}_mean_over_epsilons"] = c["summary"]


def privacy_table(
    rows: Sequence[PrivacyRow], geometry: EmbeddingGeometry, clip: float, delta: float
) -> dict[str, Any]:
    """The accounting table of a run: for each (kind, ε), the equivalent γ, E‖z‖, per-token and
    per-sequence ε (``rows``: :class:`~descentlab.robustness.accounting.PrivacyRow`)."""
    tokens = rows[0].tokens if rows else 0
    table = Table(
        title=f"Privacy of the ε kinds: d = {geometry.d}, σ_E = {geometry.sigma_e:.4g}, token distance "
        f"D <= {geometry.diameter:.4g}, Gaussian clip C = {clip:.4g} and δ = {delta:g} per token; "
        f"sequences of T = {tokens} tokens",
        columns=["kind", "epsilon", "equivalent γ", "E‖noise‖", "per-token ε", "per-sequence ε", "seq. δ"],
    )
    for r in rows:
        table.add(
            r.kind,
            r.epsilon,
            f"{r.gamma:.3g}",
            f"{r.noise_norm:.3g}",
            f"{r.token_epsilon:.4g}",
            f"{r.sequence_epsilon:.4g}",
            f"{r.sequence_delta:.2g}",
        )
    return table.to_dict()


def summarise(
    outputs: Mapping[str, Sequence[Mapping[str, Any]]],
    geometry: EmbeddingGeometry,
    ev: NoiseEvalConfig,
    tokens: int,
) -> tuple[dict[str, RobustnessCurves], list[dict[str, Any]], dict[str, Any]]:
    """From each method's job outputs (one per seed, with ``ldp_curves`` and ``embedding_max_norm``): the ε
    curves joined over seeds, the privacy table of the ε grid (sequences of ``tokens`` tokens) and the
    protocol entry. ``ev.clip`` must be resolved (a number); ``geometry`` is the pretrained model's, its D
    widened to cover every evaluated model (fine-tuning moves the rows a little).
    """
    assert ev.clip is not None
    curves = {m: RobustnessCurves.concat([o["ldp_curves"] for o in outs]) for m, outs in outputs.items()}
    max_norm = max([geometry.max_norm] + [o["embedding_max_norm"] for outs in outputs.values() for o in outs])
    geometry = replace(geometry, max_norm=max_norm)
    rows = [
        r
        for kind in ev.ldp_kinds
        for r in privacy_rows(kind, ev.epsilons, geometry, tokens=tokens, delta=ev.delta, clip=ev.clip)
    ]
    protocol = {
        "kinds": list(ev.ldp_kinds),
        "epsilons": list(ev.epsilons),
        "delta_per_token": ev.delta,
        "clip": ev.clip,
        "sequence_tokens": tokens,
        "mechanisms": "metric_ldp: e + z, p(z) ∝ exp(-ε‖z‖) (E‖z‖ = d/ε); gaussian_mechanism: clip_C(e) + "
        "N(0, σ²I), σ from the analytic Gaussian mechanism at (ε, δ) with Δ = 2C; both on the word-embedding "
        "output, every position, keyed by content; ε is absolute, the same for every model",
    }
    return curves, [privacy_table(rows, geometry, ev.clip, ev.delta)], protocol
