"""The sampled readout's estimate: unbiased, with the standard error it states (measured over many draws),
labelled as sampled, and nothing read back to the host to state it.

Run directly (``python tests/readout/test_sampled_variance.py``) it prints the per-layer figures that
docs/readout-families.md quotes.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from descentlab.readout import CausalLMReadout, layer_losses

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import tiny_gpt2

ALPHA = 0.05


def _setup(layers: int = 4, batch: int = 4, length: int = 33):
    model = tiny_gpt2(layers=layers, hidden=32, vocab=64, positions=64, seed=0).eval()
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 64, (batch, length), generator=gen)
    return model, {"input_ids": ids, "labels": ids}


def _g(f: torch.Tensor, alpha: float = ALPHA) -> torch.Tensor:
    return f[1:] - (1 - alpha) * f[:-1]


def _g_by_layer(f_inner: torch.Tensor) -> torch.Tensor:
    """ĝ indexed like the layers read (0..L-1; layer 0 has no ĝ: NaN)."""
    return torch.cat([f_inner.new_full((1,), float("nan")), _g(f_inner)])


def draws(k: int, repeats: int, layers: int = 4):
    """Exact f, and ``repeats`` sampled readouts' f̂, standard errors and wrong-sign probabilities."""
    model, batch = _setup(layers)
    with torch.no_grad():
        exact = layer_losses(model, batch, readout=CausalLMReadout(sample_tokens=None))
        readout = CausalLMReadout(sample_tokens=k, generator=torch.Generator().manual_seed(11))
        fs, ses, wrong = [], [], []
        for _ in range(repeats):
            f = layer_losses(model, batch, readout=readout)
            fs.append(f)
            ses.append(readout.standard_errors(ALPHA)["g"])
            wrong.append(readout.wrong_sign_probability(_g_by_layer(f[:-1]), ALPHA)[1:])
    return exact, torch.stack(fs), torch.stack(ses), torch.stack(wrong), readout


def test_the_sampled_g_is_unbiased_with_the_standard_error_it_states() -> None:
    k, repeats = 16, 400
    exact, fs, ses, _, readout = draws(k, repeats)
    n = readout.last_estimate.n
    assert readout.last_estimate.sampled and readout.last_estimate.k == k and n == 4 * 32
    g_exact = _g(exact[:-1])[:]  # layers 1..L-1 (both read on the same sample)
    g_hat = torch.stack([_g(f[:-1]) for f in fs])
    empirical_sd = g_hat.std(dim=0)
    stated_se = ses[:, 1:].mean(dim=0)  # g of layers 1..L-1 (layer 0 has no predecessor)
    # unbiased: the mean of 400 draws is within 4 standard errors of the mean of the exact value
    assert torch.all((g_hat.mean(dim=0) - g_exact).abs() <= 4 * empirical_sd / math.sqrt(repeats))
    # the stated standard error is the measured one (within 15 %: 400 draws, an estimated variance)
    assert torch.all((stated_se / empirical_sd - 1).abs() < 0.15), (stated_se, empirical_sd)
    # the same for f̂ of each intermediate layer
    f_sd = fs[:, :-1].std(dim=0)
    assert torch.all((fs[:, :-1].mean(0) - exact[:-1]).abs() <= 4 * f_sd / math.sqrt(repeats))


def test_an_exact_read_states_zero_error_and_is_labelled_exact() -> None:
    model, batch = _setup()
    readout = CausalLMReadout(sample_tokens=None)
    with torch.no_grad():
        layer_losses(model, batch, readout=readout)
    assert not readout.last_estimate.sampled and readout.last_estimate.per_token is None
    assert torch.equal(readout.standard_errors(ALPHA)["g"], torch.zeros(4))


def test_auto_samples_under_grad_and_says_so() -> None:
    model, batch = _setup()
    readout = CausalLMReadout()  # the default, "auto"
    f = layer_losses(model, batch, readout=readout)
    assert readout.last_estimate.sampled and readout.last_estimate.k == math.ceil(128 / 8)
    f.sum().backward()  # the per-token record is detached: the graph is the readout's own
    with torch.no_grad():
        layer_losses(model, batch, readout=readout)
    assert not readout.last_estimate.sampled  # evaluation reads every token


def test_stating_the_error_reads_nothing_back() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "horst_memory.py"
    spec = importlib.util.spec_from_file_location("descentlab_bench_horst_memory_r", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model, batch = _setup()
    readout = CausalLMReadout(sample_tokens=16)
    with torch.no_grad():
        f = layer_losses(model, batch, readout=readout)
        with bench.count_reads() as reads:
            readout.standard_errors(ALPHA)
            readout.wrong_sign_probability(_g_by_layer(f[:-1]), ALPHA)
    assert sum(reads.values()) == 0, dict(reads)


if __name__ == "__main__":
    for k in (8, 16, 32, 64):
        exact, fs, ses, wrong, readout = draws(k, 400, layers=4)
        g_hat = torch.stack([_g(f[:-1]) for f in fs])
        g_exact = _g(exact[:-1])
        sd = g_hat.std(0)
        wrong_rate = (torch.sign(g_hat) != torch.sign(g_exact)).float().mean(0)
        ratio = torch.stack([f[1:-1] / f[:-2] for f in fs])
        ratio_exact = exact[1:-1] / exact[:-2]
        print(f"k = {k} of N = {readout.last_estimate.n} (4 layers read, 400 draws)")
        print("  g exact          ", [round(float(x), 4) for x in g_exact])
        print("  se(g) measured   ", [round(float(x), 4) for x in sd])
        print("  se(g) stated     ", [round(float(x), 4) for x in ses[:, 1:].mean(0)])
        print("  P(wrong sign) measured", [round(float(x), 3) for x in wrong_rate])
        print("  P(wrong sign) stated  ", [round(float(x), 3) for x in wrong.mean(0)])
        print(
            "  ratio bias (mean - exact)",
            [f"{float(x):+.5f}" for x in (ratio.mean(0) - ratio_exact)],
            "+/-",
            [f"{float(x):.5f}" for x in ratio.std(0) / 20],
        )
