"""NoiseEvalConfig: defaults, validation messages that name the key."""

from __future__ import annotations

import pytest

from descentlab.errors import ConfigError
from descentlab.robustness import DEFAULT_GAMMAS, NoiseEvalConfig


def test_defaults_match_text_robustness_evaluation() -> None:
    from descentlab.experiments.text_robustness import Evaluation, noisy_condition

    old, new = Evaluation(), NoiseEvalConfig()
    assert (old.kinds, old.gammas, old.draws, old.noise_seed, old.profile_kind, old.profile_gamma) == (
        new.kinds,
        new.gammas,
        new.draws,
        new.noise_seed,
        new.profile_kind,
        new.profile_gamma,
    )
    assert new.gammas == list(DEFAULT_GAMMAS)
    assert noisy_condition(old) == new.profile_condition == "gaussian@1"


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
