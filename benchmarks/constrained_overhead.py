"""Cost of a constrained (primal-dual, all layers read out) training step against an ERM step.

Two set-ups, each measured in one process on the same model and the same AdamW state:

* MiniLM-L6 sequence classifier (pretrained, offline), batch 32, sequence 64. Target: <= 1.05x time and
  <= 1.10x peak memory.
* SmolLM2-135M (30 layers, all constrained), batch 1, sequence 256, logit-lens readout with a token
  subsample for layers 0..29 (layer 30, the objective, uses every token). Target: <= 1.5x time and
  <= 1.3x peak memory. The naive readout (all 31 layers on every token, all logits alive at once) is
  printed for comparison.
* A Llama-architecture causal LM built from its config (random weights, nothing to download): 8 layers,
  hidden 512, vocabulary 32000, batch 4 x 512 tokens, activation checkpointing on. The default readout
  (``CausalLMReadout()``, ``sample_tokens="auto"``: in training, layers 0..7 on ⌈N / 16⌉ = 128 shared random
  targets of N = 2044, layer 8 on all) against the target <= 1.5x time and <= 1.2x peak, and, as "exact",
  ``CausalLMReadout(sample_tokens=None)``: every layer on every token. The first constrained step (which
  traces the model's structure) is profiled on its own, after an ERM step has created the AdamW state, and
  its peak is printed beside the steady-state ones.

Baselines: every variant's time and peak are printed as ratios against two ERM steps on the same model and
AdamW state, in the same process: ``erm``, the model's own loss (Hugging Face: all logits, upcast to fp32),
and, for the causal LMs, ``erm_fused``, the fair one, whose loss goes through the same fused cross-entropy as
the readout (:func:`descentlab.linear_cross_entropy` on the last hidden state; checked equal to the HF loss
before timing). The targets are checked against each.

Time: the variants' steps are interleaved (ERM, constrained, [naive], ERM, ...) after warm-up, and the
median wall time per step is compared, so machine noise hits all variants alike.

Peak memory (CPU): resident state (parameters + optimizer state, identical for all variants; λ is a few
floats) plus the step's transient peak, the high-water mark of live CPU tensor bytes allocated during one
full step (forward, backward, optimizer step, zero_grad), read from the "Total Allocated" counter of
torch.profiler's memory events. Gradients count as transient because zero_grad frees them. The optimizer
step's temporaries can set the peak of both variants; the "fwd+bwd" columns give the same measure over
forward + backward alone, where the readouts differ.

Usage: python benchmarks/constrained_overhead.py [--only minilm|smollm2|llama] [--repeats N] [--sample-tokens K]
[--no-naive] [--llama-batch B] [--llama-seq T]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from descentlab.constrained import LayerwiseDescent, PrimalDual
from descentlab.linear_cross_entropy import linear_cross_entropy
from descentlab.readout import CausalLMReadout, layer_losses

LossFn = Callable[[], torch.Tensor]
Variant = tuple[LossFn, torch.optim.Optimizer]  # (forward returning the loss to minimise, optimizer)


def run_step(variant: Variant) -> None:
    loss_fn, optimizer = variant
    loss_fn().backward()
    optimizer.step()
    optimizer.zero_grad()


def transient_peak_bytes(variant: Variant, update: bool = True) -> int:
    """High-water mark of CPU tensor bytes allocated during one step (torch.profiler memory events).

    With ``update=False`` only forward + backward are profiled (zero_grad runs after profiling).
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss_fn, optimizer = variant
        loss_fn().backward()
        if update:
            optimizer.step()
            optimizer.zero_grad()
    variant[1].zero_grad()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as fh:
            events = json.load(fh)["traceEvents"]
    finally:
        os.unlink(path)
    memory = [e["args"] for e in events if e.get("name") == "[memory]"]
    if not memory:
        return 0
    # The counter tracks blocks allocated while profiling; measure from its value when the step began.
    start = memory[0]["Total Allocated"] - memory[0]["Bytes"]
    return max(m["Total Allocated"] for m in memory) - start


def resident_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(
        v.numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )
    return params + state


def fused_erm_loss(model, batch: dict, labels: torch.Tensor) -> LossFn:
    """ERM's loss through the readout's own fused kernel (:func:`descentlab.linear_cross_entropy`): the
    backbone's last hidden state against the LM head's weight, the mean next-token CE, chunk by chunk, with
    no ``[N, V]`` logits kept (the fair baseline: the HF loss holds fp32 logits). Checked against the HF loss
    on the batch before it is timed."""
    targets = labels[:, 1:].reshape(-1)
    rows = torch.arange(labels.numel()).view(labels.shape)[:, :-1].reshape(-1)

    def loss() -> torch.Tensor:
        hidden = model.get_decoder()(**batch, use_cache=False).last_hidden_state
        return linear_cross_entropy(hidden, model.get_output_embeddings().weight, targets, rows=rows)

    with torch.no_grad():
        ours, theirs = loss(), model(**batch, labels=labels).loss
    if not torch.allclose(ours, theirs.float(), rtol=1e-4, atol=1e-4):
        raise RuntimeError(
            f"the fused ERM loss {float(ours):.6f} differs from the HF loss {float(theirs):.6f}"
        )
    return loss


def compare(
    name: str,
    model,
    optimizer,
    steps: dict[str, Variant],
    repeats: int,
    targets: tuple[float, float],
) -> dict:
    """Interleaved median step times and peaks of ``steps``; every variant's ratios against each ERM baseline
    among them: ``erm`` (the model's own, HF loss) and, for causal LMs, ``erm_fused`` (the same fused
    cross-entropy as the readout's)."""
    for variant in steps.values():  # warm-up; also creates the AdamW state
        run_step(variant)
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(repeats):
        for key, variant in steps.items():
            start = time.perf_counter()
            run_step(variant)
            times[key].append(time.perf_counter() - start)
    resident = resident_bytes(model, optimizer)
    peaks = {key: transient_peak_bytes(variant) for key, variant in steps.items()}
    fwd_bwd = {key: transient_peak_bytes(variant, update=False) for key, variant in steps.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    bases = [b for b in ("erm", "erm_fused") if b in steps]
    label = {"erm": "HF", "erm_fused": "fused"}
    print(f"\n== {name}  (threads={torch.get_num_threads()}, repeats={repeats})")
    print(f"resident (params + AdamW state): {resident / 2**20:.0f} MiB")
    print("baselines: " + "; ".join(f"{label[b]} = {b}" for b in bases))
    head = f"{'variant':<14}{'step s':>9}"
    head += "".join(f"{'time x ' + label[b]:>14}" for b in bases)
    head += f"{'peak MiB':>10}" + "".join(f"{'peak x ' + label[b]:>14}" for b in bases)
    head += f"{'fwd+bwd MiB':>13}" + "".join(f"{'f+b x ' + label[b]:>13}" for b in bases)
    print(head)
    out = {}
    for key in steps:
        peak = resident + peaks[key]
        row = {"step_s": med[key], "peak_mib": peak / 2**20, "fwd_bwd_transient_mib": fwd_bwd[key] / 2**20}
        for b in bases:
            suffix = "" if b == "erm" else "_vs_fused"
            row[f"time_ratio{suffix}"] = med[key] / med[b]
            row[f"peak_ratio{suffix}"] = peak / (resident + peaks[b])
            row[f"fwd_bwd_peak_ratio{suffix}"] = (resident + fwd_bwd[key]) / (resident + fwd_bwd[b])
        out[key] = row
        line = f"{key:<14}{med[key]:>9.3f}"
        line += "".join(f"{row['time_ratio' + ('' if b == 'erm' else '_vs_fused')]:>14.3f}" for b in bases)
        line += f"{peak / 2**20:>10.0f}"
        line += "".join(f"{row['peak_ratio' + ('' if b == 'erm' else '_vs_fused')]:>14.3f}" for b in bases)
        line += f"{fwd_bwd[key] / 2**20:>13.0f}"
        line += "".join(
            f"{row['fwd_bwd_peak_ratio' + ('' if b == 'erm' else '_vs_fused')]:>13.3f}" for b in bases
        )
        print(line)
    c = out["constrained"]
    for b in bases:
        suffix = "" if b == "erm" else "_vs_fused"
        ok = c[f"time_ratio{suffix}"] <= targets[0] and c[f"peak_ratio{suffix}"] <= targets[1]
        print(
            f"target <= {targets[0]}x time, <= {targets[1]}x peak memory against ERM ({label[b]} loss): "
            f"{'met' if ok else 'NOT met'}"
        )
    return out


def minilm(repeats: int) -> dict:
    from descentlab.data import load_encoder_classifier, load_text_classification

    torch.manual_seed(0)
    model, tokenizer = load_encoder_classifier("minilm", num_labels=2)
    model.train()
    rows = load_text_classification("rotten_tomatoes", max_train=32)["train"][:32]
    batch = dict(
        tokenizer(rows["text"], padding="max_length", truncation=True, max_length=64, return_tensors="pt")
    )
    batch["labels"] = torch.tensor(rows["label"])
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-5)
    constraint = LayerwiseDescent(model.config.num_hidden_layers, alpha=0.1, dual_lr=0.05)
    primal_dual = PrimalDual(adamw, constraint)

    def erm() -> torch.Tensor:
        return model(**batch).loss

    def constrained() -> torch.Tensor:
        return constraint.lagrangian(layer_losses(model, batch))

    steps = {"erm": (erm, adamw), "constrained": (constrained, primal_dual)}
    return compare(
        "MiniLM-L6 classifier, batch 32 x 64 tokens",
        model,
        adamw,
        steps,
        repeats,
        (1.05, 1.10),
    )


def smollm2(repeats: int, sample_tokens: int, naive_too: bool = True) -> dict:
    from descentlab.data import load_austen, load_causal_lm

    model, tokenizer = load_causal_lm("smollm2")
    model.train()
    text = load_austen()["train"][:20000]
    ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :256]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    labels = ids.clone()
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-5)
    layers = model.config.num_hidden_layers
    constraint = LayerwiseDescent(layers, alpha=0.05, dual_lr=0.01)
    primal_dual = PrimalDual(adamw, constraint)
    fast = CausalLMReadout(chunk_size=1024, sample_tokens=sample_tokens, checkpoint=False)
    naive = CausalLMReadout(chunk_size=None, sample_tokens=None)  # every layer on every token, all logits
    naive_constraint = copy.deepcopy(constraint)
    naive_pd = PrimalDual(adamw, naive_constraint)

    def erm() -> torch.Tensor:
        return model(**batch, labels=labels).loss

    def constrained() -> torch.Tensor:
        return constraint.lagrangian(layer_losses(model, batch, readout=fast))

    def unchunked() -> torch.Tensor:
        return naive_constraint.lagrangian(layer_losses(model, batch, readout=naive))

    name = f"SmolLM2-135M, {layers} layers constrained, 1 x 256 tokens, {sample_tokens} sampled tokens/layer"
    erm_fused = fused_erm_loss(model, batch, labels)
    steps = {"erm": (erm, adamw), "erm_fused": (erm_fused, adamw), "constrained": (constrained, primal_dual)}
    if naive_too:
        steps["naive"] = (unchunked, naive_pd)
    return compare(name, model, adamw, steps, repeats, (1.5, 1.3))


def llama(repeats: int, exact_too: bool = True, batch_size: int = 4, seq: int = 512) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=max(512, seq),
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    ids = torch.randint(0, config.vocab_size, (batch_size, seq), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-5)
    constraint = LayerwiseDescent(config.num_hidden_layers, alpha=0.05, dual_lr=0.01)
    primal_dual = PrimalDual(adamw, constraint)

    def erm() -> torch.Tensor:
        return model(**batch, labels=ids).loss

    def constrained() -> torch.Tensor:
        return constraint.lagrangian(layer_losses(model, batch))  # the default readout

    exact_readout = CausalLMReadout(sample_tokens=None)  # every layer on every token
    exact_constraint = copy.deepcopy(constraint)
    exact_pd = PrimalDual(adamw, exact_constraint)

    def exact() -> torch.Tensor:
        return exact_constraint.lagrangian(layer_losses(model, batch, readout=exact_readout))

    run_step((erm, adamw))  # creates the AdamW state, so the first constrained step is comparable
    start = time.perf_counter()
    first = transient_peak_bytes((constrained, primal_dual))  # the first step: structure traced here
    first_s = time.perf_counter() - start
    name = (
        f"Llama from config (8 x 512, V 32000), {batch_size} x {seq} tokens, checkpointing, default readout"
    )
    erm_fused = fused_erm_loss(model, batch, ids)
    steps = {"erm": (erm, adamw), "erm_fused": (erm_fused, adamw), "constrained": (constrained, primal_dual)}
    if exact_too:
        steps["exact"] = (exact, exact_pd)
    out = compare(name, model, adamw, steps, repeats, (1.5, 1.2))
    resident = resident_bytes(model, adamw)
    erm_peak, fused_peak = (out[k]["peak_mib"] * 2**20 for k in ("erm", "erm_fused"))
    out["constrained_first_step"] = {
        "step_s_profiled": first_s,
        "peak_mib": (resident + first) / 2**20,
        "peak_ratio": (resident + first) / erm_peak,
        "peak_ratio_vs_fused": (resident + first) / fused_peak,
    }
    print(
        f"first constrained step: peak {(resident + first) / 2**20:.0f} MiB "
        f"({(resident + first) / erm_peak:.3f}x ERM with the HF loss, {(resident + first) / fused_peak:.3f}x "
        f"with the fused loss), {first_s:.1f} s under the profiler"
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["minilm", "smollm2", "llama"], default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sample-tokens", type=int, default=16, help="SmolLM2's token subsample")
    parser.add_argument(
        "--no-naive",
        action="store_true",
        help="skip the every-token readouts (SmolLM2's naive, Llama's exact)",
    )
    parser.add_argument("--llama-batch", type=int, default=4, help="the Llama set-up's sequences per batch")
    parser.add_argument("--llama-seq", type=int, default=512, help="the Llama set-up's tokens per sequence")
    args = parser.parse_args(argv)
    results = {}
    if args.only in (None, "minilm"):
        results["minilm"] = minilm(args.repeats)
    if args.only in (None, "smollm2"):
        results["smollm2"] = smollm2(max(2, args.repeats // 2), args.sample_tokens, not args.no_naive)
    if args.only in (None, "llama"):
        results["llama"] = llama(
            max(2, args.repeats // 2), not args.no_naive, args.llama_batch, args.llama_seq
        )
    print("\n" + json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
