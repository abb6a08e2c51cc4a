"""DescentConfig: the settings of a layer-wise descent constraint, and its ``build``.

One dataclass for every experiment (text classification, unrolled denoisers, causal LMs): an experiment's
config holds a ``DescentConfig`` and builds the constraint with ``cfg.build(num_layers)``. The step sizes are

    α_l = early_alpha   for l <= early_layers (when early_alpha is set),   α_l = alpha   otherwise,

or, with a reference per-layer loss profile r_0..r_L (``alpha_reference``; e.g. an ERM model's or the
pretrained model's validation profile), a schedule the reference itself meets, so the chain is feasible:

    r̃_l = min(r_0, ..., r_l),     α_l = min(alpha_cap, alpha_fraction · (1 - r̃_l / r̃_{l-1}))

(α_l = 0 where the reference rises: "do not get worse"). Π_l (1 - α_l) >= r̃_L / r̃_0 for fraction <= 1.
A fraction > 1 scales the reference's own per-layer descent up (until ``alpha_cap``): at every layer where
the reference descends and the cap is not reached, the reference meets its constraint with a gap
r̃_l − (1 − α_l) r̃_{l−1} = (fraction − 1)(r̃_{l−1} − r̃_l) > 0, so a model that only matches the reference
keeps its multiplier growing: the way to make a constraint that ERM already meets bind.
``alpha_from`` names where an experiment takes the reference from (it fills ``alpha_reference``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from descentlab.constrained.descent import LayerwiseDescent
from descentlab.constrained.dual import Resilience
from descentlab.errors import ConfigError


@dataclass
class DescentConfig:
    """Settings of :class:`~descentlab.constrained.descent.LayerwiseDescent` (docs/constrained.md).

    Attributes:
        alpha: α of every layer not covered by ``early_alpha``, in [0, 1).
        early_alpha: α of layers 1..``early_layers`` (None: ``alpha`` everywhere).
        early_layers: how many leading layers take ``early_alpha``.
        layer_alphas: α_1..α_L, one per layer (None: from ``alpha`` / ``early_alpha``).
        alpha_reference: a reference profile r_0..r_L (L+1 losses); when set, α_l follows it (module
            docstring) and ``alpha`` / ``early_alpha`` are not used.
        alpha_fraction: the fraction of the reference's per-layer descent asked for (> 0; > 1 asks for
            more descent than the reference achieved, so the reference itself violates the constraint).
        alpha_cap: the largest α_l a reference may give.
        alpha_from: the source of ``alpha_reference`` that an experiment resolves (text-robustness: "erm",
            the first seed's ERM validation profile); None: no reference, or one given directly.
        dual_lr: dual step η_λ > 0.
        form: "difference" (f_l - (1-α) f_{l-1}) or "ratio" (f_l / f_{l-1} - (1-α), scale-free).
        detach_prev: stop gradients through f_{l-1} in ĝ_l.
        constrain_first: constrain layer 1 against layer 0.
        layers: the constrained layers (1-based); None for all.
        resilient: relax the constraints with slacks (:class:`Resilience`); False: hard constraints.
        penalty: slack cost a of h(u) = (a/2)||u||² (resilient only).
        slack_lr: slack step η_u (resilient only; None: 1/a).
        resilience_form: "slack" or "decay" (resilient only).
        max_multiplier: raise InfeasibleConstraintError once a λ_l exceeds it (None: never).
        divergence_patience: raise once a λ_l grew this many dual steps in a row (None: never).
        dual_every: one dual step every k optimizer steps (``dual_cadence="step"``).
        dual_cadence: "step" or "epoch".
    """

    alpha: float = 0.1
    early_alpha: float | None = None
    early_layers: int = 0
    layer_alphas: list[float] | None = None
    alpha_reference: list[float] | None = None
    alpha_fraction: float = 1.0
    alpha_cap: float = 0.5
    alpha_from: str | None = None
    dual_lr: float = 0.05
    form: str = "difference"
    detach_prev: bool = False
    constrain_first: bool = True
    layers: list[int] | None = None
    resilient: bool = False
    penalty: float = 1.0
    slack_lr: float | None = None
    resilience_form: str = "slack"
    max_multiplier: float | None = 1e3
    divergence_patience: int | None = None
    dual_every: int = 1
    dual_cadence: str = "step"

    def __post_init__(self) -> None:
        for key in ("alpha", "early_alpha"):
            value = getattr(self, key)
            if value is not None and not 0.0 <= value < 1.0:
                raise ConfigError(f"constraint.{key} must lie in [0, 1), got {value}; e.g. {key}=0.1")
        if not self.alpha_fraction > 0:
            raise ConfigError(f"constraint.alpha_fraction must be > 0, got {self.alpha_fraction}")
        if not 0.0 <= self.alpha_cap < 1.0:
            raise ConfigError(f"constraint.alpha_cap must lie in [0, 1), got {self.alpha_cap}")
        ref = self.alpha_reference
        if ref is not None and (len(ref) < 2 or min(ref) <= 0):
            raise ConfigError(
                f"constraint.alpha_reference must list L+1 positive losses (layer 0 first), got {ref}"
            )
        if self.layer_alphas is not None and not all(0.0 <= a < 1.0 for a in self.layer_alphas):
            raise ConfigError(f"constraint.layer_alphas must all lie in [0, 1), got {self.layer_alphas}")
        if self.early_layers < 0:
            raise ConfigError(f"constraint.early_layers must be >= 0, got {self.early_layers}")
        if not self.dual_lr > 0:
            raise ConfigError(f"constraint.dual_lr must be > 0, got {self.dual_lr}; typical: 1e-3 to 1e-1")
        if self.form not in ("difference", "ratio"):
            raise ConfigError(f"constraint.form must be 'difference' or 'ratio', got {self.form!r}")
        if self.layers is not None and (not self.layers or min(self.layers) < 1):
            raise ConfigError(f"constraint.layers must list 1-based layers or be null, got {self.layers}")
        if not self.penalty > 0:
            raise ConfigError(f"constraint.penalty must be > 0, got {self.penalty}; e.g. penalty=1.0")
        if self.slack_lr is not None and not self.slack_lr > 0:
            raise ConfigError(f"constraint.slack_lr must be > 0 or null (1/penalty), got {self.slack_lr}")
        if self.resilience_form not in ("slack", "decay"):
            raise ConfigError(
                f"constraint.resilience_form must be 'slack' or 'decay', got {self.resilience_form!r}"
            )
        if self.max_multiplier is not None and not self.max_multiplier > 0:
            raise ConfigError(f"constraint.max_multiplier must be > 0 or null, got {self.max_multiplier}")
        if self.divergence_patience is not None and self.divergence_patience < 1:
            raise ConfigError(
                f"constraint.divergence_patience must be >= 1 or null, got {self.divergence_patience}"
            )
        if self.dual_every < 1:
            raise ConfigError(f"constraint.dual_every must be >= 1, got {self.dual_every}")
        if self.dual_cadence not in ("step", "epoch"):
            raise ConfigError(f"constraint.dual_cadence must be 'step' or 'epoch', got {self.dual_cadence!r}")

    def alphas(self, num_layers: int) -> list[float]:
        """α_1..α_L: from ``alpha_reference`` when set; else ``early_alpha`` on layers 1..early_layers when
        set, ``alpha`` elsewhere. ``layer_alphas``, when given, wins over both."""
        if self.layer_alphas is not None:
            if len(self.layer_alphas) != num_layers:
                raise ConfigError(
                    f"constraint.layer_alphas has {len(self.layer_alphas)} values for {num_layers} layers; "
                    "give one per layer (layer 1 first)"
                )
            return [float(a) for a in self.layer_alphas]
        if self.alpha_reference is not None:
            ref = list(self.alpha_reference)
            if len(ref) != num_layers + 1:
                raise ConfigError(
                    f"constraint.alpha_reference has {len(ref)} losses for a model with {num_layers} layers; "
                    f"give {num_layers + 1} (layers 0..L)"
                )
            run = [min(ref[: i + 1]) for i in range(len(ref))]
            return [
                min(self.alpha_cap, max(0.0, self.alpha_fraction * (1.0 - run[i] / run[i - 1])))
                for i in range(1, len(run))
            ]
        if self.alpha_from is not None:
            raise ConfigError(
                f"constraint.alpha_from={self.alpha_from!r} is resolved by the experiment into "
                "alpha_reference; outside one, give constraint.alpha_reference=[r_0, ..., r_L]"
            )
        early = self.early_alpha is not None
        return [
            self.early_alpha if early and layer <= self.early_layers else self.alpha
            for layer in range(1, num_layers + 1)
        ]

    def resilience(self) -> Resilience | None:
        """The :class:`Resilience` of a resilient config, None for hard constraints."""
        if not self.resilient:
            return None
        return Resilience(penalty=self.penalty, lr=self.slack_lr, form=self.resilience_form)

    def build(self, num_layers: int) -> LayerwiseDescent:
        """The constraint on a model with ``num_layers`` layers (``lagrangian`` takes L+1 losses)."""
        return LayerwiseDescent(
            num_layers,
            self.alphas(num_layers),
            self.dual_lr,
            self.resilience(),
            form=self.form,
            detach_prev=self.detach_prev,
            constrain_first=self.constrain_first,
            layers=self.layers,
            dual_every=self.dual_every,
            dual_cadence=self.dual_cadence,
            max_multiplier=self.max_multiplier,
            divergence_patience=self.divergence_patience,
        )

    def with_overrides(self, spec: str) -> DescentConfig:
        """This config with ``spec``'s space-separated ``key=value`` overrides, typed through OmegaConf.

        Example: ``cfg.with_overrides("alpha=0.05 detach_prev=true layers=[1,2]")``; "" returns a copy.

        Raises:
            ConfigError: an unknown key, a value of the wrong type, or one that fails validation.
        """
        try:
            merged = OmegaConf.merge(OmegaConf.structured(self), OmegaConf.from_dotlist(shlex.split(spec)))
            return OmegaConf.to_object(merged)
        except (OmegaConfBaseException, ValueError) as e:
            raise ConfigError(
                f"bad constraint overrides {spec!r}: {e}; use DescentConfig keys "
                f"({', '.join(self.__dataclass_fields__)})"
            ) from e


__all__ = ["DescentConfig"]
