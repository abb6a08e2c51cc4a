"""ACDCConfig: the settings of an AC/DC run (Peste et al., NeurIPS 2021), and its ``build``.

Phase lengths are given in ``unit`` (steps or epochs); any length left None is the reference schedule
(warm-up 10 %, alternating phases of 5 %, a decompressed phase of 10 % and a final compressed 15 %)
scaled to the run length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from descentlab.errors import ConfigError
from descentlab.sparsity.acdc import ACDC, ACDCSchedule, Phase
from descentlab.sparsity.masks import Selection

LENGTHS = ("warmup", "phase", "last_decompressed", "final")
PRUNE_SETS = ("blocks", "all")


def prune_selection(prune: str = "blocks") -> Selection:
    """The weights a ``prune`` set names.

    ``"blocks"``: the Linear / Conv1D weights inside the transformer blocks (embeddings and heads stay dense).
    ``"all"``: every Linear, Conv1D and Conv2d weight of the model: the blocks, the patch projection of a
    ViT and the classification head (token embeddings, biases and norms stay dense).
    """
    if prune not in PRUNE_SETS:
        raise ConfigError(f"prune set must be one of {PRUNE_SETS}, got {prune!r}")
    if prune == "blocks":
        return Selection()
    return Selection(module_types=(*Selection().module_types, nn.Conv2d), blocks_only=False)


@dataclass
class ACDCConfig:
    """Settings of :class:`~descentlab.sparsity.acdc.ACDC`.

    Attributes:
        sparsity: fraction of zeros over the selected weights in compressed phases, in [0, 1).
        scope: "global" (one magnitude threshold, as AC/DC), "layer" or "nm".
        prune: which weights AC/DC masks: "blocks" (the Linears inside the transformer blocks) or "all"
            (also the patch projection and the head; :func:`prune_selection`).
        reset_moments: at decompression, zero the optimizer moments of the pruned weights.
        nm: (N, M) of the "nm" scope.
        unit: "steps" or "epochs": the unit of the phase lengths below.
        warmup: dense warm-up length (None: 10 % of the run).
        phase: length of each alternating phase (None: 5 % of the run).
        last_decompressed: the decompressed phase before the final one (None: 10 %).
        final: the final compressed fine-tuning phase (None: 15 %).
        min_phase_steps: every phase of the resulting schedule (warm-up, each compressed and decompressed
            phase, the final one) must last at least this many optimizer steps, else building it is a
            ConfigError naming the short phases (0: no check). Short phases give Adam's second moment
            (horizon ~1/(1-beta2) = 1,000 steps) and the regrowing weights no time, so use e.g. 300.
    """

    sparsity: float = 0.9
    scope: str = "global"
    prune: str = "blocks"
    reset_moments: bool = False
    nm: list[int] = field(default_factory=lambda: [2, 4])
    unit: str = "steps"
    warmup: float | None = None
    phase: float | None = None
    last_decompressed: float | None = None
    final: float | None = None
    min_phase_steps: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.sparsity < 1.0:
            raise ConfigError(
                f"acdc.sparsity must lie in [0, 1), got {self.sparsity}; e.g. 0.9 for 90 % zeros"
            )
        if self.scope not in ("global", "layer", "nm"):
            raise ConfigError(f"acdc.scope must be 'global', 'layer' or 'nm', got {self.scope!r}")
        if self.prune not in PRUNE_SETS:
            raise ConfigError(f"acdc.prune must be one of {PRUNE_SETS}, got {self.prune!r}")
        if len(self.nm) != 2 or not 0 < self.nm[0] <= self.nm[1]:
            raise ConfigError(f"acdc.nm must be [N, M] with 0 < N <= M, got {self.nm}; e.g. [2, 4]")
        if self.unit not in ("steps", "epochs"):
            raise ConfigError(f"acdc.unit must be 'steps' or 'epochs', got {self.unit!r}")
        for name in LENGTHS:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"acdc.{name} must be >= 0 or null (reference schedule), got {value}")
        if isinstance(self.min_phase_steps, bool) or not isinstance(self.min_phase_steps, int):
            raise ConfigError(f"acdc.min_phase_steps must be an int >= 0, got {self.min_phase_steps!r}")
        if self.min_phase_steps < 0:
            raise ConfigError(f"acdc.min_phase_steps must be >= 0, got {self.min_phase_steps}")

    def selection(self) -> Selection:
        """The weights this run masks (:func:`prune_selection` of ``prune``)."""
        return prune_selection(self.prune)

    def schedule(self, steps_per_epoch: int | None = None) -> ACDCSchedule:
        """The phase lengths in optimizer steps (epochs times ``steps_per_epoch`` when ``unit="epochs"``)."""
        if self.unit == "epochs" and not steps_per_epoch:
            raise ConfigError("acdc.unit='epochs' needs steps_per_epoch (optimizer steps per epoch)")
        scale = steps_per_epoch if self.unit == "epochs" else None

        def steps(value: float | None) -> float | None:
            return None if value is None or scale is None else value * scale

        lengths = {name: getattr(self, name) for name in LENGTHS}
        if scale is not None:
            lengths = {name: steps(value) for name, value in lengths.items()}
        return ACDCSchedule(**lengths)

    def phases(self, total_steps: int, steps_per_epoch: int | None = None) -> list[Phase]:
        """The phase list of a run of ``total_steps`` optimizer steps, checked against ``min_phase_steps``.

        Raises:
            ConfigError: a phase shorter than ``min_phase_steps`` (all of them are named, in steps).
        """
        phases = self.schedule(steps_per_epoch).phases(total_steps)
        short = [p for p in phases if p.end - p.start < self.min_phase_steps]
        if short:
            listed = ", ".join(f"{p.kind} [{p.start}, {p.end})" for p in short)
            raise ConfigError(
                f"AC/DC phases shorter than acdc.min_phase_steps={self.min_phase_steps} steps in a run of "
                f"{total_steps} steps: {listed}; lengthen acdc.phase / warmup / last_decompressed / final "
                "(acdc.unit=steps states them in steps) or train longer"
            )
        return phases

    def build(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        total_steps: int,
        *,
        steps_per_epoch: int | None = None,
    ) -> ACDC:
        """The controller of a run of ``total_steps`` optimizer steps; call its ``step()`` once per step.

        Raises:
            ConfigError: the schedule does not fit the run, or has a phase under ``min_phase_steps``.
        """
        self.phases(total_steps, steps_per_epoch)
        return ACDC(
            model,
            optimizer,
            sparsity=self.sparsity,
            schedule=self.schedule(steps_per_epoch),
            total_steps=total_steps,
            scope=self.scope,
            select=self.selection(),
            reset_moments=self.reset_moments,
            nm=(int(self.nm[0]), int(self.nm[1])),
        )


__all__ = ["PRUNE_SETS", "ACDCConfig", "prune_selection"]
