"""Typed experiment configs: dataclass defaults, a named preset, then ``key=value`` overrides.

OmegaConf does the work: a dataclass becomes a structured config, so an unknown key or a value of the wrong
type is rejected before anything runs. We chose OmegaConf over tyro because our command line takes
``key=value`` overrides (OmegaConf's dot-list syntax, with nested keys such as ``train.epochs=3``), and
because the resolved config round-trips through YAML for the run directory.

Config dataclasses may use ``int``, ``float``, ``bool``, ``str``, ``Optional[...]``, ``list[...]``,
``dict[str, ...]``, enums and nested dataclasses. Range checks go in ``__post_init__`` and raise
:class:`~descentlab.errors.ConfigError`.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from descentlab.errors import ConfigError

T = TypeVar("T")


def config_keys(config_cls: type) -> list[str]:
    """Every settable dotted key of a config dataclass, nested dataclasses expanded."""
    keys: list[str] = []
    for field in dataclasses.fields(config_cls):
        nested = _nested_config(config_cls, field)
        if nested is not None:
            if _field_default(field) is None:  # an optional section: setting it as a whole is valid too
                keys.append(field.name)
            keys.extend(f"{field.name}.{sub}" for sub in config_keys(nested))
        else:
            keys.append(field.name)
    return keys


def _nested_config(config_cls: type, field: dataclasses.Field) -> type | None:
    """The dataclass a field holds: its default's type, or X of an ``X | None`` field that defaults to None."""
    default = _field_default(field)
    if dataclasses.is_dataclass(default):
        return type(default)
    if default is not None:
        return None
    hint = typing.get_type_hints(config_cls).get(field.name)
    options = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(options) == 1 and dataclasses.is_dataclass(options[0]):
        return options[0]
    return None


def _dict_fields(config_cls: type, prefix: str = "") -> list[str]:
    """Dotted names of the dict-typed fields, whose own keys (``field.any_key``) are free-form."""
    names: list[str] = []
    for field in dataclasses.fields(config_cls):
        default = _field_default(field)
        nested = _nested_config(config_cls, field)
        if nested is not None:
            names.extend(_dict_fields(nested, f"{prefix}{field.name}."))
        elif isinstance(default, dict):
            names.append(f"{prefix}{field.name}")
    return names


def _is_valid_key(key: str, valid: Sequence[str], dict_fields: Sequence[str]) -> bool:
    return key in valid or any(key.startswith(f"{name}.") for name in dict_fields)


def _field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _nest(dotted: Mapping[str, Any]) -> dict[str, Any]:
    """{"train.epochs": 3} -> {"train": {"epochs": 3}}."""
    nested: dict[str, Any] = {}
    for key, value in dotted.items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def resolve_config(
    config_cls: type[T],
    *,
    preset: str | None = None,
    presets: Mapping[str, Mapping[str, Any]] | None = None,
    overrides: Sequence[str] = (),
) -> T:
    """Build a config: dataclass defaults <- preset (dotted keys) <- ``key=value`` overrides.

    Raises:
        ConfigError: unknown preset, malformed override, unknown key or ill-typed value; the message names
            the key and lists the valid ones.
    """
    presets = presets or {}
    valid = config_keys(config_cls)
    dict_fields = _dict_fields(config_cls)
    layers: list[DictConfig] = []
    if preset is not None:
        if preset not in presets:
            raise ConfigError(
                f"unknown preset {preset!r}; choose one of: {', '.join(sorted(presets)) or 'none'}"
            )
        layers.append(OmegaConf.create(_nest(presets[preset])))
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(
                f"override {item!r} is not of the form key=value; valid keys: {', '.join(valid)}"
            )
        key = item.split("=", 1)[0]
        if not _is_valid_key(key, valid, dict_fields):
            raise ConfigError(f"unknown config key {key!r}; valid keys: {', '.join(valid)}")
    if overrides:
        try:
            layers.append(OmegaConf.from_dotlist(list(overrides)))
        except Exception as exc:  # OmegaConf's own errors, and YAML scanner errors from values like {a:[1]}
            reason = " ".join(str(exc).split())
            raise ConfigError(
                f"cannot parse overrides {list(overrides)}: {reason}. Values are YAML: write {{key: value}} "
                "with a space after the colon, and quote strings that contain = or :"
            ) from None
    base = OmegaConf.structured(config_cls)
    try:
        merged = OmegaConf.merge(base, *layers)
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        reason = str(exc).splitlines()[0]
        raise ConfigError(
            f"bad value for config key {key!r}: {reason}; valid keys: {', '.join(valid)}"
        ) from None
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"invalid config: {exc}") from None
    return obj  # type: ignore[return-value]


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A plain, JSON-able dict of a resolved config (enums as their values)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True)  # type: ignore[return-value]


def config_to_yaml(cfg: Any) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def load_config_yaml(config_cls: type[T], text: str) -> T:
    """Rebuild a config saved by :func:`config_to_yaml` (used to resume a run with its own config)."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(config_cls), OmegaConf.create(text))
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(
            f"the saved config does not match {config_cls.__name__} ({first}): is it a run of another "
            "experiment? resume= takes a run directory made by the same experiment"
        ) from None
