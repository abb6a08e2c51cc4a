"""Causal-LM fine-tuning data: Austen continuation windows or an Alpaca-format instruction file.

Austen (offline): training windows of ``seq_len`` tokens from the four training novels, labels on every
token; held-out examples from Persuasion, a passage of ``prompt_tokens`` followed by the reference
continuation of ``continuation_tokens``. Alpaca: a seeded hold-out of the file's records, labels on the
response tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from descentlab.data.instructions import austen_examples, encode_example, load_alpaca, split_examples
from descentlab.errors import ConfigError


@dataclass
class CausalLMDataConfig:
    """Fine-tuning and held-out data of a causal LM: Austen continuation windows or an Alpaca file."""

    source: str = "austen"  # "austen" (continuation) or "alpaca" (instruction file or hub dataset at `path`)
    path: str | None = None
    seq_len: int = 128  # training window (austen) or token budget per example (alpaca)
    n_train: int | None = 4000
    prompt_tokens: int = 64
    continuation_tokens: int = 32
    n_eval: int = 200
    max_chars: int | None = None  # read at most this many characters of each Austen split
    seed: int = 0
    # alpaca: held-out prompts from this Alpaca-format file instead of a hold-out of `path` (e.g. AlpacaEval's
    # 805 instructions, alpaca_eval.json: instruction, output); its first n_eval records, every record of
    # `path` trains
    eval_path: str | None = None

    def __post_init__(self) -> None:
        if self.source not in ("austen", "alpaca"):
            raise ConfigError(f"data.source must be 'austen' or 'alpaca', got {self.source!r}")
        if self.source == "alpaca" and not self.path:
            raise ConfigError("data.source=alpaca needs data.path=<Alpaca-format JSON or JSONL file>")
        if self.eval_path and self.source != "alpaca":
            raise ConfigError("data.eval_path is the held-out Alpaca file of data.source=alpaca")
        if min(self.seq_len, self.prompt_tokens, self.continuation_tokens, self.n_eval) < 1:
            raise ConfigError("data.seq_len, prompt_tokens, continuation_tokens and n_eval must be >= 1")


def prepare_causal_lm_data(
    cfg: CausalLMDataConfig, tokenizer: Any
) -> tuple[list[dict], list[dict], dict[str, Any]]:
    """(training examples, held-out examples, protocol entries) of ``cfg``, encoded with ``tokenizer``."""
    if cfg.source == "alpaca":
        records = load_alpaca(cfg.path)
        if cfg.eval_path:
            train, held = records, load_alpaca(cfg.eval_path)[: cfg.n_eval]
            split = f"held-out prompts: the first {len(held)} of {cfg.eval_path}; labels on responses"
        else:
            train, held = split_examples(records, eval_size=min(cfg.n_eval, len(records) - 1), seed=cfg.seed)
            split = "seeded hold-out, labels on responses"
        enc = [encode_example(tokenizer, x, max_length=cfg.seq_len) for x in train[: cfg.n_train]]
        evl = [encode_example(tokenizer, x, max_length=cfg.seq_len) for x in held]
        return enc, evl, {"dataset": f"alpaca:{cfg.path}", "split": split}
    train, held = austen_examples(
        tokenizer,
        seq_len=cfg.seq_len,
        n_train=cfg.n_train,
        prompt_tokens=cfg.prompt_tokens,
        continuation_tokens=cfg.continuation_tokens,
        n_eval=cfg.n_eval,
        max_chars=cfg.max_chars,
        seed=cfg.seed,
    )
    protocol = {
        "dataset": "Austen (janeaustenr): train = 4 novels, eval = Persuasion",
        "split": "test",
        "eval_example": f"{cfg.prompt_tokens}-token passage -> next {cfg.continuation_tokens} tokens",
    }
    return train, held, protocol


__all__ = ["CausalLMDataConfig", "prepare_causal_lm_data"]
