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
import difflib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

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


def _nearest(key: str, valid: Sequence[str], n: int = 3) -> list[str]:
    """Up to ``n`` valid keys a mistyped ``key`` most likely meant, best first.

    Keys ending in the same last part come first (``epochs`` -> ``train.epochs``: a missing section), then
    difflib's close matches on the whole dotted key, then on the last part alone (``train.lr`` ->
    ``optimizer.lr`` is not a typo of the section but of the leaf).
    """
    leaf = key.rsplit(".", 1)[-1]
    same_leaf = [k for k in valid if k.rsplit(".", 1)[-1] == leaf]
    whole = difflib.get_close_matches(key, valid, n=n, cutoff=0.6)
    by_leaf: dict[str, list[str]] = {}
    for k in valid:
        by_leaf.setdefault(k.rsplit(".", 1)[-1], []).append(k)
    leaves = difflib.get_close_matches(leaf, list(by_leaf), n=n, cutoff=0.75)
    ordered = [*same_leaf, *whole, *(k for name in leaves for k in by_leaf[name])]
    return list(dict.fromkeys(ordered))[:n]


def unknown_key_message(key: str, valid: Sequence[str]) -> str:
    """One line for an unknown config key: the nearest valid keys, never the whole list (thousands of
    characters for a study config)."""
    near = _nearest(key, valid)
    if near:
        hint = "did you mean " + " or ".join(repr(k) for k in near) + "?"
    else:
        hint = f"no valid key is close to it (there are {len(valid)})"
    return f"unknown config key {key!r}; {hint} `descentlab config NAME` prints every key with its value"


def _dotted_keys(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted leaf keys of a nested mapping (an empty mapping is a leaf: a dict field set to {})."""
    keys: list[str] = []
    for k, v in tree.items():
        if isinstance(v, Mapping) and v:
            keys.extend(_dotted_keys(v, f"{prefix}{k}."))
        else:
            keys.append(f"{prefix}{k}")
    return keys


def _check_key(key: str, valid: Sequence[str], dict_fields: Sequence[str]) -> None:
    if not _is_valid_key(key, valid, dict_fields):
        # a dataclass section given whole (`section: {...}`) is checked key by key by the caller
        raise ConfigError(unknown_key_message(key, valid))


def read_config_file(path: Path | str, config_cls: type) -> DictConfig:
    """The YAML config at ``path`` as one layer for :func:`resolve_config`, its keys checked.

    The file holds what ``descentlab config`` prints: nested sections, any subset of the keys.

    Raises:
        ConfigError: the file cannot be read, is not YAML, is not a mapping, or names an unknown key (one
            line with the nearest valid keys).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"cannot read config file {str(path)!r}: {reason}; pass a YAML file") from None
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{where}: {problem}") from None
    if tree is None:
        tree = {}
    if not isinstance(tree, dict) or not all(isinstance(k, str) for k in tree):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping of config keys (as `descentlab config NAME` "
            f"prints), not a {type(tree).__name__}"
        )
    valid, dict_fields = config_keys(config_cls), _dict_fields(config_cls)
    for key in _dotted_keys(tree):
        _check_key(key, valid, dict_fields)
    return OmegaConf.create(tree)


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
    config_file: Path | str | None = None,
) -> T:
    """Build a config: dataclass defaults <- preset (dotted keys) <- ``config_file`` <- ``key=value``.

    ``config_file`` is YAML as :func:`config_to_yaml` writes it (``descentlab config`` prints it), so
    ``resolve_config(C, config_file=f)`` of a file holding ``config_to_yaml(cfg)`` gives back ``cfg``.

    Raises:
        ConfigError: unknown preset, unreadable config file, malformed override, unknown key or ill-typed
            value; one line, naming the key and (for an unknown key) the nearest valid ones.
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
    if config_file is not None:
        layers.append(read_config_file(config_file, config_cls))
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(
                f"override {item!r} is not of the form key=value (e.g. train.epochs=2); "
                "`descentlab config NAME` prints every key"
            )
        _check_key(item.split("=", 1)[0], valid, dict_fields)
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
        if isinstance(exc, ConfigKeyError) and key not in valid:  # e.g. a section's key inside a file
            raise ConfigError(unknown_key_message(str(key), valid)) from None
        raise ConfigError(f"bad value for config key {key!r}: {reason}") from None
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
