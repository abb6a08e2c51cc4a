"""video-denoising against the constrained paper's video experiments: what the presets change, and which
of the paper's claims no row judges (rendered into docs/results/video-denoising.md by
:mod:`descentlab.experiments.fidelity`)."""

from __future__ import annotations

from descentlab.experiments.video_denoising.claims import ID_MARGIN
from descentlab.report.fidelity import Deviation, Fidelity, NotTested, lagrangian, seeds

VIDEO = "video denoising results"


def _data(c) -> str:
    d = c.data
    return (
        f"{d.video} ({d.split} split), {d.size} px, clips of {d.num_frames} frames; "
        f"noise σ_train = {d.sigma_train:g}"
    )


def _models(c) -> str:
    m = c.model
    return f"{', '.join(a.upper() for a in c.architectures)}: depth {m.depth}, width {m.width}"


def _levels(c) -> str:
    above = [g for g in c.gammas if g > 1.0]
    return (
        f"γ ∈ {{{', '.join(f'{g:g}' for g in c.gammas)}}}; the robustness rows average γ ∈ "
        f"{{{', '.join(f'{g:g}' for g in above)}}} (γ > 1); γ = 1, the training noise, is the in-distribution row"
    )


def _constraint(c) -> str:
    arch = c.architectures[0]
    alphas = ", ".join(f"{a.upper()} α = {c.alpha[a]:g}" for a in c.architectures)
    return f"{lagrangian(c.method_config(arch, 'constrained').constraint)}; {alphas}"


DEVIATIONS = [
    Deviation("data", "CUHK Avenue, UCSD, ShanghaiTech", _data, "contribution 4"),
    Deviation("models", "DUST and UT (sizes not stated)", _models, "experiments"),
    Deviation("test noise levels", "RMSE at high test perturbation levels, γ ≥ 1.0", _levels, VIDEO),
    Deviation(
        "Lagrangian",
        "f_L + Σ_{l=1..L} λ_l (f_l − (1 − α_l) f_{l−1}), primal-dual (Algorithm 1)",
        _constraint,
        "Lagrangian of the method section",
    ),
    Deviation(
        "in-distribution tolerance",
        "degradation “often < 0.3 %”",
        lambda c: f"RMSE at γ = 1 at most {100 * ID_MARGIN:g} % above ERM's (non-inferiority)",
        "trade-offs",
    ),
    Deviation(
        "training",
        "not stated",
        lambda c: (
            f"{c.train.max_steps:,} steps at batch {c.train.batch_size}, {c.method.optimizer.name} lr from {c.lr_grid} on validation"
        ),
    ),
    Deviation("seeds", "not stated", lambda c: seeds(c.seeds, c.tune_seed)),
]

NOT_TESTED = [
    NotTested(
        "constrained models consistently achieved lower RMSE under high test perturbation levels (γ ≥ 1.0) across datasets and architectures",
        "the rows judge one data set (a surveillance clip offline; UCSD Ped2 in the `paper` preset) and average γ > 1; γ = 1 is the training noise and is judged as non-inferiority, not as a gain.",
        "the `paper` preset on each of the three data sets, with a row at γ = 1 on lower RMSE.",
        VIDEO,
    ),
    NotTested(
        "constrained models show smooth, monotone per-layer loss decreases",
        "the monotone row is relative (the constrained rise is below ERM's); no row asks whether the constrained profile itself never rises.",
        "a sized row on the constrained model's own rise at γ = 1 from the saved per-layer errors, with a declared margin.",
        "experimental results, monotone descent",
    ),
    NotTested(
        "the descent properties are maintained under distribution shift (Theorem 4)",
        "the per-layer profile is judged at the training noise (γ = 1) only.",
        "the per-layer errors at γ > 1 (a noise shift) and a row on their rise, constrained against ERM.",
        "contribution 2, Theorem 4",
    ),
]

FIDELITY = Fidelity(DEVIATIONS, NOT_TESTED)
