"""Logs of a sampled readout say they are sampled and carry ĝ's standard error; an exact readout's do not;
and the labels cost no host read in a step (issue 46, "the logged f/l and g/l are sampled, and nothing says
so")."""

from __future__ import annotations

import torch

import descentlab as dl
from descentlab.errors import ConfigError
from descentlab.host_syncs import HostSyncCounter as SyncCounter
from descentlab.readout import CausalLMReadout, layer_losses
from descentlab.train.loop import TrainConfig, fit
from descentlab.train.objectives import Constrained, DeepSupervision
from descentlab.train.rundir import RunDir
from tiny_models import tiny_gpt2

LAYERS, ALPHA = 4, 0.05


def _setup(batch: int = 4, length: int = 33) -> tuple[torch.nn.Module, dict]:
    model = tiny_gpt2(layers=LAYERS, hidden=32, vocab=64, positions=64, seed=0)
    ids = torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(3))
    return model, {"input_ids": ids, "labels": ids}


def _objective(readout: CausalLMReadout, form: str = "difference") -> Constrained:
    constraint = dl.LayerwiseDescent(num_layers=LAYERS, alpha=ALPHA, dual_lr=0.1, form=form)
    return Constrained(constraint, readout)


def test_a_sampled_step_is_labelled_and_carries_the_standard_error_of_g() -> None:
    model, batch = _setup()
    readout = CausalLMReadout(sample_tokens=16, generator=torch.Generator().manual_seed(5))
    objective = _objective(readout)
    _, logs = objective(model, batch)
    values = dict(logs)
    assert readout.last_estimate.sampled
    # f_0..f_{L-1} and every ĝ (each reads a sampled f_{l-1}) are renamed; f_L, read on every token, is not
    assert {f"f_sampled/{i}" for i in range(LAYERS)} <= set(values) and f"f/{LAYERS}" in values
    assert not any(f"f/{i}" in values for i in range(LAYERS))
    assert {f"g_sampled/{i}" for i in range(1, LAYERS + 1)} <= set(values)
    assert not any(key.startswith("g/") for key in values)
    assert values["readout/sampled_k"] == 16 and values["readout/n"] == 4 * 32
    se = torch.tensor([values[f"g_se/{i}"] for i in range(1, LAYERS + 1)], dtype=torch.float64)
    assert torch.all(torch.isfinite(se) & (se > 0)), se
    # the same figures as the readout's own per-layer computation (a loop over layers, a separate code
    # path): ĝ_l for l < L from layers l and l-1; ĝ_L reads f_L exactly, so only (1-α) f̂_{L-1} varies
    own = readout.standard_errors(ALPHA)
    expected = torch.cat([own["g"][1:], (1 - ALPHA) * own["f"][-1:]]).double()
    torch.testing.assert_close(se, expected, rtol=1e-5, atol=0)


def test_an_exact_readout_is_not_labelled_sampled() -> None:
    model, batch = _setup()
    for readout, grad in ((CausalLMReadout(sample_tokens=None), True), (CausalLMReadout(), False)):
        objective = _objective(readout)
        with torch.set_grad_enabled(grad):  # "auto" reads every token without gradients
            _, logs = objective(model, batch)
        values = dict(logs)
        assert not readout.last_estimate.sampled
        assert {f"f/{i}" for i in range(LAYERS + 1)} <= set(values)
        assert {f"g/{i}" for i in range(1, LAYERS + 1)} <= set(values)
        assert not any("sampled" in key or key.startswith("g_se/") for key in values), sorted(values)


def test_deep_supervision_says_when_its_mean_is_sampled() -> None:
    model, batch = _setup()
    _, sampled = DeepSupervision(CausalLMReadout(sample_tokens=16))(model, batch)
    _, exact = DeepSupervision(CausalLMReadout(sample_tokens=None))(model, batch)
    assert dict(sampled)["readout/sampled_k"] == 16 and "readout/sampled_k" not in dict(exact)


def _spread(form: str, k: int, draws: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    """(measured standard deviation of the logged ĝ over ``draws`` samples, mean logged ``g_se``)."""
    model, batch = _setup()
    readout = CausalLMReadout(sample_tokens=k, generator=torch.Generator().manual_seed(11))
    constraint = dl.LayerwiseDescent(num_layers=LAYERS, alpha=ALPHA, dual_lr=0.1, form=form)
    gs, ses = [], []
    with torch.no_grad():
        for _ in range(draws):
            constraint.lagrangian(layer_losses(model, batch, readout=readout), record=False)
            values = constraint.log_dict(readout.last_estimate)
            gs.append([values[f"g_sampled/{i}"] for i in range(1, LAYERS + 1)])
            ses.append([values[f"g_se/{i}"] for i in range(1, LAYERS + 1)])
    return torch.tensor(gs).std(0), torch.tensor(ses).mean(0)


def test_the_logged_standard_error_is_the_measured_spread_of_the_logged_g() -> None:
    """Difference and ratio form (the ratio's by the delta method), at k = 16 and at k = 64 of N = 128,
    where the finite-population correction alone changes the standard error by a factor 0.71."""
    for form in ("difference", "ratio"):
        for k in (16, 64):
            measured, stated = _spread(form, k)
            assert torch.all((stated / measured - 1).abs() < 0.12), (form, k, stated, measured)


def test_the_labels_add_no_host_read_to_a_step() -> None:
    """A step that builds labelled logs syncs exactly as the same step with unlabelled ones, and the logs
    (standard errors and all) come back in one read at a log step."""
    model, batch = _setup()
    readout = CausalLMReadout(sample_tokens=16, generator=torch.Generator().manual_seed(5))
    objective = _objective(readout)
    objective(model, batch)  # the first call traces the model's structure
    with SyncCounter() as labelled:
        _, logs = objective(model, batch)
    with SyncCounter() as plain:
        f = layer_losses(model, batch, readout=readout)
        objective.constraint.lagrangian(f)
        objective.constraint.log_values()
    assert labelled.counts == plain.counts, (dict(labelled.counts), dict(plain.counts))
    assert f"g_se/{LAYERS}" in logs and not logs.read
    with SyncCounter() as reading:
        dict(logs)
    assert reading.total == 1, dict(reading.counts)


def test_fit_writes_the_labelled_record(tmp_path) -> None:
    model, batch = _setup(batch=8)
    data = [{"input_ids": ids, "labels": ids} for ids in batch["input_ids"]]
    objective = _objective(CausalLMReadout(sample_tokens=8, generator=torch.Generator().manual_seed(2)))
    optimizer = dl.PrimalDual(torch.optim.SGD(model.parameters(), lr=1e-2), objective.constraint)
    cfg = TrainConfig(max_steps=2, batch_size=4, log_every=1, progress=False)
    fit(model, data, objective=objective, optimizer=optimizer, cfg=cfg, run=RunDir(tmp_path))
    records = RunDir(tmp_path).metrics()
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["readout/sampled_k"] == 8 and record["readout/n"] == 4 * 32
        assert record[f"g_se/{LAYERS}"] > 0 and f"g_sampled/{LAYERS}" in record and "g/1" not in record


def test_a_sampled_ratio_is_refused_before_it_reaches_the_dual_step() -> None:
    """The ratio of two sampled means is biased: a step that would record it raises one clear line; the
    same ratio from an exact read, or a sampled ratio only inspected (record=False), passes."""
    model, batch = _setup()
    sampled = CausalLMReadout(sample_tokens=16, generator=torch.Generator().manual_seed(5))
    try:
        _objective(sampled, form="ratio")(model, batch)
    except ConfigError as err:
        message = str(err)
        assert "\n" not in message and "form='difference'" in message and "biased" in message
    else:
        raise AssertionError("a sampled ratio reached the dual step")
    constraint = dl.LayerwiseDescent(num_layers=LAYERS, alpha=ALPHA, dual_lr=0.1, form="ratio")
    f = layer_losses(model, batch, readout=sampled)
    constraint.lagrangian(f, record=False, estimate=sampled.last_estimate)  # inspection only
    assert constraint.pending_violations() is None
    _, logs = _objective(CausalLMReadout(sample_tokens=None), form="ratio")(model, batch)  # exact: fine
    assert f"g/{LAYERS}" in dict(logs)
