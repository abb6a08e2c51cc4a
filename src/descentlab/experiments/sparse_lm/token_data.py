"""sparse-lm's data at the paper's scale: the corpus tokenized once to memory-mapped token files.

With ``token_cache=true`` (the ``paper`` preset) the run reads its splits through
:func:`~descentlab.data.token_cache.token_files` instead of holding the corpus in RAM: the training split
stays on disk as a :class:`~descentlab.data.token_cache.MemmapBlocks` dataset (a step reads only its own
blocks), and only the ``eval_blocks`` validation and ``test_blocks`` test blocks, evenly spaced over their
splits, are gathered into int64 tensors, the same blocks :func:`~descentlab.experiments.sparse_lm.jobs
.evenly_spaced` picks from an in-RAM split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from descentlab.data.bpe import TextTokenizer, make_tokenizer
from descentlab.data.token_cache import MemmapBlocks, token_files
from descentlab.errors import ConfigError
from descentlab.experiments.sparse_lm.config import SparseLMConfig


@dataclass
class CachedLMData:
    """The tokenizer, the training blocks (on disk), the evaluation blocks (in RAM) and the test text.

    ``test_text`` is the decoded test blocks: the SmolLM2 sanity check re-tokenizes text with its own
    tokenizer.
    """

    tokenizer: TextTokenizer
    train: MemmapBlocks
    val: torch.Tensor
    test: torch.Tensor
    test_text: str


def cached_lm_data(cfg: SparseLMConfig) -> CachedLMData:
    """The splits of ``cfg.corpus`` as token files next to it (built on the first run, reused after).

    Raises:
        ConfigError: ``tokenizer=bpe``, which learns its merges from the whole training text in RAM; use
            ``gpt2`` or a tokenizer folder with the token cache.
    """
    if cfg.tokenizer == "bpe":
        raise ConfigError(
            "token_cache=true needs a fixed tokenizer (tokenizer=gpt2 or a tokenizer folder): tokenizer=bpe "
            "trains on the whole training text in RAM"
        )
    tok = make_tokenizer(cfg.tokenizer)
    files = token_files(cfg.corpus, tok, max_chars=cfg.corpus_max_chars)
    ctx = cfg.model.n_positions
    train = MemmapBlocks(files["train"], ctx, max_blocks=cfg.max_train_blocks)
    val = MemmapBlocks(files["validation"], ctx).evenly_spaced(cfg.eval_blocks)
    test = MemmapBlocks(files["test"], ctx).evenly_spaced(cfg.test_blocks)
    text = "".join(tok.decode(row.tolist()) for row in test[: 2 * cfg.smollm2_blocks])
    return CachedLMData(tokenizer=tok, train=train, val=val, test=test, test_text=text)


__all__ = ["CachedLMData", "cached_lm_data"]
