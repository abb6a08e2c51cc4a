"""Config resolution: defaults <- preset <- key=value; unknown or ill-typed keys are named."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from descentlab.config import config_keys, config_to_yaml, load_config_yaml, resolve_config
from descentlab.errors import ConfigError
from descentlab.train.loop import TrainConfig


@dataclass
class _Cfg:
    lr: float = 1e-3
    name: str = "a"
    seeds: list[int] = field(default_factory=lambda: [0])
    grid: dict[str, list[float]] = field(default_factory=lambda: {"horst": [1.0]})
    train: TrainConfig = field(default_factory=TrainConfig)

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")


PRESETS = {"quick": {"train.epochs": 2, "seeds": [0, 1]}}


def test_layers_apply_in_order() -> None:
    cfg = resolve_config(_Cfg, preset="quick", presets=PRESETS, overrides=["train.epochs=5", "lr=0.5"])
    assert cfg.train.epochs == 5 and cfg.seeds == [0, 1] and cfg.lr == 0.5
    assert isinstance(cfg.train, TrainConfig)


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("bogus_key=1", "bogus_key"),
        ("train.bogus=1", "train.bogus"),
        ("lr=fast", "lr"),
        ("train.epochs=1.5", "train.epochs"),
        ("lr", "key=value"),
        ("lr=-1", "lr must be > 0"),
        ("train.batch_size=0", "batch_size must be >= 1"),
    ],
)
def test_bad_overrides_name_the_key(override: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        resolve_config(_Cfg, overrides=[override])
    assert "\n" not in str(info.value)


def test_unknown_preset() -> None:
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        resolve_config(_Cfg, preset="huge", presets=PRESETS)


def test_yaml_round_trip_and_keys() -> None:
    cfg = resolve_config(_Cfg, overrides=["seeds=[3,4]"])
    assert load_config_yaml(_Cfg, config_to_yaml(cfg)) == cfg
    assert "train.epochs" in config_keys(_Cfg) and "lr" in config_keys(_Cfg)


def test_dict_fields_take_dotted_keys_and_yaml_errors_are_config_errors() -> None:
    cfg = resolve_config(_Cfg, overrides=["grid.ham=[2.0, 3.0]"])
    assert cfg.grid == {"horst": [1.0], "ham": [2.0, 3.0]}
    cfg = resolve_config(_Cfg, overrides=["grid={horst: [5.0]}"])
    assert cfg.grid["horst"] == [5.0]
    with pytest.raises(ConfigError, match="space after the colon"):
        resolve_config(_Cfg, overrides=["grid={horst:[1.0]}"])


@dataclass
class _Section:
    size: float = 0.9


@dataclass
class _Holder:
    section: _Section | None = None


def test_optional_nested_sections_take_dotted_keys() -> None:
    from descentlab.config import config_keys, resolve_config

    assert config_keys(_Holder) == ["section", "section.size"]
    assert resolve_config(_Holder).section is None
    assert resolve_config(_Holder, overrides=["section.size=0.5"]).section == _Section(size=0.5)
    with pytest.raises(ConfigError, match=r"unknown config key 'section\.nope'"):
        resolve_config(_Holder, overrides=["section.nope=1"])
