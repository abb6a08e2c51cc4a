"""ACDCConfig: the settings of an AC/DC run (METHODS.md §2.3), and its ``build``.

Phase lengths are given in ``unit`` (steps or epochs); any length left None is the reference schedule
(warm-up 10 %, alternating phases of 5 %, a decompressed phase of 10 % and a final compressed 15 %)
scaled to the run length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from descentlab.errors import ConfigError
from descentlab.sparsity.acdc import ACDC, ACDCSchedule

LENGTHS = ("warmup", "phase", "last_decompressed", "final")


@dataclass
class ACDCConfig:
    """Settings of :class:`~descentlab.sparsity.acdc.ACDC`.

    Attributes:
        sparsity: fraction of zeros over the selected weights in compressed phases, in [0, 1).
        scope: "global" (one magnitude threshold, as AC/DC), "layer" or "nm".
        reset_moments: at decompression, zero the optimizer moments of the pruned weights.
        nm: (N, M) of the "nm" scope.
        unit: "steps" or "epochs": the unit of the phase lengths below.
        warmup: dense warm-up length (None: 10 % of the run).
        phase: length of each alternating phase (None: 5 % of the run).
        last_decompressed: the decompressed phase before the final one (None: 10 %).
        final: the final compressed fine-tuning phase (None: 15 %).
    """

    sparsity: float = 0.9
    scope: str = "global"
    reset_moments: bool = False
    nm: list[int] = field(default_factory=lambda: [2, 4])
    unit: str = "steps"
    warmup: float | None = None
    phase: float | None = None
    last_decompressed: float | None = None
    final: float | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.sparsity < 1.0:
            raise ConfigError(
                f"acdc.sparsity must lie in [0, 1), got {self.sparsity}; e.g. 0.9 for 90 % zeros"
            )
        if self.scope not in ("global", "layer", "nm"):
            raise ConfigError(f"acdc.scope must be 'global', 'layer' or 'nm', got {self.scope!r}")
        if len(self.nm) != 2 or not 0 < self.nm[0] <= self.nm[1]:
            raise ConfigError(f"acdc.nm must be [N, M] with 0 < N <= M, got {self.nm}; e.g. [2, 4]")
        if self.unit not in ("steps", "epochs"):
            raise ConfigError(f"acdc.unit must be 'steps' or 'epochs', got {self.unit!r}")
        for name in LENGTHS:
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"acdc.{name} must be >= 0 or null (reference schedule), got {value}")

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

    def build(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        total_steps: int,
        *,
        steps_per_epoch: int | None = None,
    ) -> ACDC:
        """The controller of a run of ``total_steps`` optimizer steps; call its ``step()`` once per step."""
        return ACDC(
            model,
            optimizer,
            sparsity=self.sparsity,
            schedule=self.schedule(steps_per_epoch),
            total_steps=total_steps,
            scope=self.scope,
            reset_moments=self.reset_moments,
            nm=(int(self.nm[0]), int(self.nm[1])),
        )


__all__ = ["ACDCConfig"]
