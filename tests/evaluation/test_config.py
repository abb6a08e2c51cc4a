"""NoiseEvalConfig: defaults, validation messages that name the key."""

from __future__ import annotations

import pytest

from descentlab.errors import ConfigError
from descentlab.evaluation import DEFAULT_GAMMAS, NoiseEvalConfig


def test_defaults_and_profile_condition() -> None:
    cfg = NoiseEvalConfig()
    assert cfg.kinds == ["gaussian", "uniform", "discrete"] and cfg.gammas == list(DEFAULT_GAMMAS)
    assert (cfg.draws, cfg.noise_seed, cfg.profile_kind, cfg.profile_gamma) == (3, 0, "gaussian", 1.0)
    assert cfg.profile_condition == "gaussian@1"
    assert NoiseEvalConfig(profile_kind="uniform", profile_gamma=1.5).profile_condition == "uniform@1.5"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gammas": [0.5, 1.0]}, "evaluation.gammas must contain 0"),
        ({"gammas": [0.0, -1.0]}, "evaluation.gammas must be >= 0"),
        ({"kinds": ["pink"]}, "evaluation.kinds"),
        ({"kinds": []}, "evaluation.kinds"),
        ({"draws": 0}, "evaluation.draws"),
        ({"profile_kind": "pink"}, "evaluation.profile_kind"),
        ({"profile_gamma": -0.5}, "evaluation.profile_gamma"),
    ],
)
def test_validation_messages(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        NoiseEvalConfig(**kwargs)
