"""One contract for every optimizer descentlab ships, in the manner of timm's test_optim.py and PyTorch's
OptimizerInfo tests (issue 44, part 4).

:data:`SPECS` declares each optimizer (each HORST implementation reachable on the CPU, HAM in both forms, the
composed geometries, L_p + mirror, the primal-dual wrapper with projected ascent and with a torch dual
optimizer) and how it is built; ``test_registry_covers_every_optimizer_subclass`` finds every
``torch.optim.Optimizer`` subclass in the package (imported from ``descentlab.optim`` and
``descentlab.constrained``, and read from the source of the whole package) and fails when one is missing
here, so a new optimizer cannot ship without joining the suite.

Each spec is held to: an exact ``state_dict`` round trip mid-run (through ``torch.save`` / ``torch.load(...,
weights_only=True)``); torch's ``add_param_group`` checks in torch's words (duplicates, sets, non-leaf
tensors); ``maximize`` equal, bit for bit, to minimising the negated loss; torch's fused / foreach rule;
NaN and negative hyper-parameters refused, as floats and as 0-dim tensors (at construction, in an added
group, and set between steps); step pre / post hooks; ``zero_grad``; closures; the CPU and the meta device
(each spec declares whether a meta step runs or raises, and which error).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import io
import math
import pkgutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.optim import Optimizer

import descentlab
from descentlab.constrained import Constraint, ConstraintSet, PrimalDual
from descentlab.errors import ConfigError
from descentlab.optim import _horst_compiled
from descentlab.optim._horst_kernel import load_kernel
from descentlab.optim.compose import Composed, HyperbolicMirror, LpMirrorAfter, compose
from descentlab.optim.ham import HAM
from descentlab.optim.horst import HORST, HorstFallbackWarning

NAN = float("nan")
KERNEL = load_kernel()
_GEN = torch.Generator().manual_seed(0)
X, Y = torch.randn(8, 4, generator=_GEN), torch.randn(8, 3, generator=_GEN)


def _params(device: str = "cpu") -> list[Tensor]:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4, 3, generator=g)
    b = 0.1 * torch.randn(3, generator=g)
    return [w.to(device).requires_grad_(), b.to(device).requires_grad_()]


def _objective(params: list[Tensor]) -> Tensor:
    w, b = params
    return ((X @ w + b).tanh() - Y).pow(2).mean()


@torch.no_grad()
def _value(params: list[Tensor]) -> float:
    return float(_objective(params))


def _plain_loss(opt: Optimizer, params: list[Tensor]) -> Tensor:
    return _objective(params)


def _lagrangian(opt: Optimizer, params: list[Tensor]) -> Tensor:
    """f + λ (mean(w²) - 0.3): the primal-dual specs descend their constraint set's Lagrangian."""
    w = params[0]
    return opt.constraint.lagrangian(_objective(params), c=(w.square().mean() - 0.3).reshape(1))


# -- the optimizers --------------------------------------------------------------------------------------
def _split(kw: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: kw.pop(k) for k in keys if k in kw}


def _horst(impl: str) -> Callable[..., Optimizer]:
    def build(params, **kw):
        return HORST(params, **{"lr": 1e-2, "alpha": 2.0, "beta": 0.05, "impl": impl, **kw})

    return build


def _horst_compiled_eager(params, **kw):
    """HORST(impl="compiled") with the graph's function (``_step_lists``) run eagerly, so the compiled path's
    plumbing is checked at no compile cost (one CPU graph took 16 s here); the compiled graph itself, with
    maximize, is checked against AdamW in test_horst_compiled.py."""
    return HORST(params, **{"lr": 1e-2, "alpha": 2.0, "beta": 0.05, "impl": "compiled", **kw})


def _ham_params(params, **kw):
    return HAM(params, **{"lr": 1e-2, "alpha": 20.0, "beta": 1e-2, **kw})


def _ham_wrap(params, **kw):
    ham = {"alpha": 20.0, "beta": 1e-2, **_split(kw, ("alpha", "beta", "exp_clamp"))}
    return HAM(torch.optim.AdamW(params, **{"lr": 1e-2, **kw}), **ham)


def _composed(steepest: str, order: str) -> Callable[..., Optimizer]:
    def build(params, **kw):
        mirror = {"alpha": 2.0, "beta": 0.05, **_split(kw, ("alpha", "beta", "gamma", "exp_clamp"))}
        return compose(params, steepest, HyperbolicMirror(**mirror), order, **{"lr": 1e-2, **kw})

    return build


def _lp(params, **kw):
    mirror = {"alpha": 2.0, **_split(kw, ("alpha", "beta", "gamma", "exp_clamp"))}
    return LpMirrorAfter(params, **{"lr": 1e-2, "p": 3.0, "mirror": HyperbolicMirror(**mirror), **kw})


def _primal_dual(dual_optimizer: bool) -> Callable[..., Optimizer]:
    def build(params, **kw):
        dual_lr = kw.pop("dual_lr", 0.5)
        factory = (lambda ps: torch.optim.Adam(ps, lr=0.1, maximize=True)) if dual_optimizer else None
        constraints = ConstraintSet([Constraint("c", 1, dual_lr=dual_lr)], factory)
        return PrimalDual(torch.optim.AdamW(params, **{"lr": 1e-2, **kw}), constraints)

    return build


def _trainer_primal_dual(params, **kw):
    """The class ``primal_dual_optimizer`` hands a Hugging Face ``Trainer`` (its ``optimizer_cls``)."""
    from descentlab.integrations.hf import primal_dual_optimizer  # imports transformers: only when used

    constraints = ConstraintSet([Constraint("c", 1, dual_lr=kw.pop("dual_lr", 0.5))])
    cls, defaults = primal_dual_optimizer(constraints, torch.optim.AdamW, lr=1e-2)
    return cls(params, **{**defaults, **kw})


ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")
MIRROR_KEYS = ("alpha", "beta", "exp_clamp")


@dataclass(frozen=True)
class Spec:
    """One optimizer under the contract.

    Attributes:
        build: ``build(params, **overrides)``; overrides are the optimizer's keywords and hyper-parameters.
        hypers: the hyper-parameters whose NaN / negative values must be refused at construction.
        group_keys: those of ``hypers`` that live in the param groups (checked when a group is added and
            before each step).
        torch_flags: takes torch's ``fused`` / ``foreach`` keywords (others must reject them: TypeError).
        meta: None when a step on meta tensors runs; else the (error type, message pattern) it raises.
        loss: the loss the optimizer descends.
        declared: where the class is defined, ``module.name`` as the source names it (default: ``cls``'s).
    """

    id: str
    cls: type[Optimizer]
    build: Callable[..., Optimizer]
    hypers: tuple[str, ...]
    group_keys: tuple[str, ...] = ()
    torch_flags: bool = False
    meta: tuple[type[Exception], str] | None = None
    loss: Callable[[Optimizer, list[Tensor]], Tensor] = _plain_loss
    skip: str = ""
    declared: str = ""

    @property
    def where(self) -> str:
        return self.declared or f"{self.cls.__module__}.{self.cls.__qualname__}"


HORST_HYPERS = (*ADAM_KEYS, *MIRROR_KEYS)
SPECS = [
    Spec("HORST-foreach", HORST, _horst("foreach"), HORST_HYPERS, HORST_HYPERS, torch_flags=True),
    Spec("HORST-reference", HORST, _horst("reference"), HORST_HYPERS, HORST_HYPERS, torch_flags=True),
    Spec(
        "HORST-fused-kernel",
        HORST,
        _horst("fused"),
        HORST_HYPERS,
        HORST_HYPERS,
        torch_flags=True,
        skip="" if KERNEL is not None else "the fused C kernel did not build here",
    ),
    Spec(
        "HORST-compiled-eager",
        HORST,
        _horst_compiled_eager,
        HORST_HYPERS,
        HORST_HYPERS,
        torch_flags=True,
        meta=(ConfigError, "impl='compiled' cannot compile for meta"),
        skip="" if _horst_compiled.can_compile(torch.device("cpu")) else "no C++ compiler for Inductor",
    ),
    Spec("HAM-params", HAM, _ham_params, HORST_HYPERS, HORST_HYPERS, torch_flags=True),
    Spec("HAM-wrap", HAM, _ham_wrap, HORST_HYPERS, HORST_HYPERS, torch_flags=True),
    Spec(
        "Composed-adam-mirror_after",
        Composed,
        _composed("adam", "mirror_after"),
        (*ADAM_KEYS, *MIRROR_KEYS, "gamma"),
        (*ADAM_KEYS, *MIRROR_KEYS, "gamma"),
    ),
    Spec(
        "Composed-sign-mirror_before",
        Composed,
        _composed("sign", "mirror_before"),
        ("lr", "weight_decay", "alpha", "beta", "gamma"),
        ("lr", "weight_decay", "alpha", "beta", "gamma"),
    ),
    Spec(
        "Composed-normalized_gd-dual",
        Composed,
        _composed("normalized_gd", "dual"),
        ("lr", "weight_decay", "alpha", "beta", "gamma"),
        ("lr", "weight_decay", "gamma"),
        meta=(ConfigError, "meta device"),
    ),
    Spec(
        "LpMirrorAfter",
        LpMirrorAfter,
        _lp,
        ("lr", "p", "alpha", "beta", "gamma", "exp_clamp"),
        ("lr", "p"),
        meta=(ConfigError, "meta device"),
    ),
    Spec(
        "PrimalDual-projected",
        PrimalDual,
        _primal_dual(False),
        (*ADAM_KEYS, "dual_lr"),
        torch_flags=True,
        meta=(RuntimeError, "meta tensors"),
        loss=_lagrangian,
    ),
    Spec(
        "PrimalDual-adam-dual",
        PrimalDual,
        _primal_dual(True),
        ADAM_KEYS,
        torch_flags=True,
        meta=(RuntimeError, "meta tensors"),
        loss=_lagrangian,
    ),
    Spec(
        "PrimalDual-hf-trainer",
        PrimalDual,
        _trainer_primal_dual,
        (*ADAM_KEYS, "dual_lr"),
        torch_flags=True,
        meta=(RuntimeError, "meta tensors"),
        loss=_lagrangian,
        skip="" if importlib.util.find_spec("transformers") else "transformers is not installed",
        declared="descentlab.integrations.hf.BoundPrimalDual",
    ),
]
BY_ID = {s.id: s for s in SPECS}


@pytest.fixture(params=[s.id for s in SPECS])
def spec(request, monkeypatch) -> Spec:
    s = BY_ID[request.param]
    if s.skip:
        pytest.skip(s.skip)
    if s.build is _horst_compiled_eager:  # the graph's own function, run eagerly
        monkeypatch.setattr(_horst_compiled, "compiled_step", lambda: _horst_compiled._step_lists)
    return s


def _backward(spec: Spec, opt: Optimizer, params: list[Tensor], sign: float = 1.0) -> Tensor:
    opt.zero_grad()
    loss = sign * spec.loss(opt, params)
    loss.backward()
    return loss


def _run(spec: Spec, opt: Optimizer, params: list[Tensor], steps: int, sign: float = 1.0) -> None:
    for _ in range(steps):
        _backward(spec, opt, params, sign)
        opt.step()


def _same(a: list[Tensor], b: list[Tensor]) -> bool:
    return all(torch.equal(p.detach(), q.detach()) for p, q in zip(a, b, strict=True))


# -- the registry ----------------------------------------------------------------------------------------
def _imported_optimizers() -> set[str]:
    found = set()
    for package in ("descentlab.optim", "descentlab.constrained"):
        pkg = importlib.import_module(package)
        names = [package] + [m.name for m in pkgutil.walk_packages(pkg.__path__, package + ".")]
        for name in names:
            for _, obj in inspect.getmembers(importlib.import_module(name), inspect.isclass):
                if issubclass(obj, Optimizer) and obj.__module__.startswith("descentlab"):
                    found.add(f"{obj.__module__}.{obj.__qualname__}")
    return found


def _declared_optimizers() -> set[str]:
    """Classes anywhere in src/descentlab whose bases name ``Optimizer`` or one of the declared classes
    (read from the source, so modules with heavy imports are covered without importing them)."""
    known = {"Optimizer", *(s.where.rsplit(".", 1)[-1] for s in SPECS)}
    root = Path(descentlab.__file__).parent
    found = set()
    for path in root.rglob("*.py"):
        module = ".".join(("descentlab", *path.relative_to(root).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
                if bases & known:
                    found.add(f"{module}.{node.name}")
    return found


def test_registry_covers_every_optimizer_subclass() -> None:
    registered = {s.where for s in SPECS}
    imported = {name for name in registered if name.split(".")[1] in ("optim", "constrained")}
    assert _imported_optimizers() == imported
    assert _declared_optimizers() == registered


# -- state ----------------------------------------------------------------------------------------------
def test_state_dict_round_trip_mid_run_is_exact(spec: Spec) -> None:
    params = _params()
    opt = spec.build(params)
    _run(spec, opt, params, 3)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    resumed_params = [p.detach().clone().requires_grad_() for p in params]
    resumed = spec.build(resumed_params, lr=0.5)  # the saved groups must win
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    assert resumed.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    _run(spec, opt, params, 3)
    _run(spec, resumed, resumed_params, 3)
    assert _same(params, resumed_params)
    for p, q in zip(params, resumed_params, strict=True):
        assert opt.state[p].keys() == resumed.state[q].keys()
        for key, value in opt.state[p].items():
            assert torch.equal(value, resumed.state[q][key]) if isinstance(value, Tensor) else True
    moved = [p.detach() for p in _params()]
    assert not _same(params, moved), "the run must move the parameters for the comparison to mean anything"


# -- param groups ---------------------------------------------------------------------------------------
def test_add_param_group_checks_in_torchs_words(spec: Spec) -> None:
    w, b = _params()
    opt = spec.build([w])
    with pytest.raises(TypeError, match="ordered collections"):
        opt.add_param_group({"params": {b}})
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
        opt.add_param_group({"params": [w]})
    with pytest.raises(ValueError, match="can't optimize a non-leaf Tensor"):
        opt.add_param_group({"params": [w * 2]})
    with pytest.raises(TypeError, match="ordered collections"):
        spec.build([{"params": {w, b}}])
    dup = spec.build([w])
    with pytest.warns(UserWarning, match="duplicate parameters"):
        dup.add_param_group({"params": [b, b]})

    opt.add_param_group({"params": [b], "lr": 0.05})
    group = opt.param_groups[-1]
    assert group["lr"] == 0.05 and all(k in group for k in opt.defaults), "the new group takes the defaults"
    before = b.detach().clone()
    _run(spec, opt, [w, b], 1)
    assert not torch.equal(b.detach(), before), "the added group must be stepped"


@pytest.mark.parametrize("as_tensor", [False, True], ids=["float", "tensor"])
@pytest.mark.parametrize("bad", [NAN, -1.0], ids=["nan", "negative"])
def test_bad_hyper_parameters_are_refused_at_construction(spec: Spec, bad: float, as_tensor: bool) -> None:
    def value(x: float) -> float | Tensor:
        return torch.tensor(x) if as_tensor else x

    for key in spec.hypers:
        bad_value = (value(bad), value(0.999)) if key == "betas" else value(bad)
        with pytest.raises(ValueError) as info:
            spec.build(_params(), **{key: bad_value})
        assert "\n" not in str(info.value), f"{key}: one line"


def test_bad_hyper_parameter_in_an_added_group_or_set_between_steps_is_refused(spec: Spec) -> None:
    if not spec.group_keys:
        pytest.skip(
            f"{spec.id}: its groups are the wrapped torch optimizer's, which checks at construction only"
        )
    for key in spec.group_keys:
        w, b = _params()
        opt = spec.build([w])
        bad = (NAN, 0.999) if key == "betas" else NAN
        with pytest.raises(ValueError, match=key):
            opt.add_param_group({"params": [b], key: bad})
        opt = spec.build([w, b])
        _run(spec, opt, [w, b], 1)
        before = [p.detach().clone() for p in (w, b)]
        opt.param_groups[0][key] = bad
        _backward(spec, opt, [w, b])
        with pytest.raises(ValueError, match=key):
            opt.step()
        assert _same([w, b], before), f"{key}: a refused step touches nothing"


# -- torch's keywords ----------------------------------------------------------------------------------
def test_maximize_equals_minimising_the_negated_loss(spec: Spec) -> None:
    up, down = _params(), _params()
    start = _value(up)
    opt_up, opt_down = spec.build(up, maximize=True), spec.build(down)
    for _ in range(4):
        _backward(spec, opt_up, up)
        opt_up.step()
        _backward(spec, opt_down, down, sign=-1.0)
        opt_down.step()
    assert _same(up, down)
    assert _value(up) > start, "maximize must ascend"


def test_fused_and_foreach_follow_torchs_rule(spec: Spec) -> None:
    if not spec.torch_flags:
        with pytest.raises(TypeError):
            spec.build(_params(), fused=True)
        return
    with pytest.raises((RuntimeError, ValueError), match="`fused` and `foreach` cannot be `True` together"):
        spec.build(_params(), fused=True, foreach=True)
    with pytest.raises((RuntimeError, ValueError), match="`fused` and `foreach` cannot be `True` together"):
        torch.optim.AdamW(_params(), fused=True, foreach=True)  # the wording is torch's


# -- hooks, zero_grad, closures ---------------------------------------------------------------------------
def test_step_hooks_fire_once_around_the_update(spec: Spec) -> None:
    params = _params()
    opt = spec.build(params)
    seen: list[tuple[str, Tensor]] = []
    opt.register_step_pre_hook(lambda o, args, kwargs: seen.append(("pre", params[0].detach().clone())))
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append(("post", params[0].detach().clone())))
    before = params[0].detach().clone()
    _run(spec, opt, params, 1)
    assert [name for name, _ in seen] == ["pre", "post"]
    assert torch.equal(seen[0][1], before) and not torch.equal(seen[1][1], before)


def test_zero_grad_sets_to_none_by_default_and_zeros_on_request(spec: Spec) -> None:
    params = _params()
    opt = spec.build(params)
    _backward(spec, opt, params)
    grads = [p.grad for p in params]
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is g and not p.grad.any() for p, g in zip(params, grads, strict=True))
    _backward(spec, opt, params)
    opt.zero_grad()
    assert all(p.grad is None for p in params)


def test_closure_is_evaluated_with_grad_and_matches_the_plain_step(spec: Spec) -> None:
    a, b = _params(), _params()
    opt_a, opt_b = spec.build(a), spec.build(b)

    def closure() -> Tensor:
        assert torch.is_grad_enabled()
        return _backward(spec, opt_a, a)

    for _ in range(3):
        with warnings.catch_warnings():
            # no false alarm: PrimalDual looks for the Lagrangian after the closure
            warnings.simplefilter("error")
            loss = opt_a.step(closure)
        assert isinstance(loss, Tensor) and math.isfinite(float(loss.detach()))
        _run(spec, opt_b, b, 1)
    assert _same(a, b)


# -- devices ----------------------------------------------------------------------------------------------
def test_cpu_and_meta_devices(spec: Spec) -> None:
    params = _params()
    opt = spec.build(params)
    _run(spec, opt, params, 2)
    assert all(p.device.type == "cpu" and bool(torch.isfinite(p).all()) for p in params)

    meta = _params("meta")
    opt = spec.build(meta)
    for p in meta:
        p.grad = torch.empty_like(p)
    if spec.loss is _lagrangian:  # the Lagrangian is called, as in training, so that no warning is due
        opt.constraint.lagrangian(torch.zeros((), device="meta"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HorstFallbackWarning)  # impl="fused" records meta as a fallback
        if spec.meta is None:
            opt.step()
            assert all(p.is_meta for p in meta)
            moments = [t for p in meta for t in opt.state[p].values() if isinstance(t, Tensor) and t.ndim]
            assert all(t.is_meta for t in moments)
        else:
            error, pattern = spec.meta
            with pytest.raises(error, match=pattern):
                opt.step()


# -- HORST and HAM specifics --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("impl", "twin"),
    [("reference", {"foreach": False}), ("foreach", {"foreach": True}), ("fused", {"fused": True})],
)
def test_horst_at_alpha_beta_zero_is_adamw_when_maximizing(impl: str, twin: dict[str, bool]) -> None:
    if impl == "fused" and KERNEL is None:
        pytest.skip("the fused C kernel did not build here")
    a, b = _params(), _params()
    horst = HORST(a, lr=1e-2, alpha=0.0, beta=0.0, impl=impl, maximize=True)
    adamw = torch.optim.AdamW(b, lr=1e-2, maximize=True, **twin)
    for _ in range(5):
        for opt, params in ((horst, a), (adamw, b)):
            opt.zero_grad()
            _objective(params).backward()
            opt.step()
    for p, q in zip(a, b, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert _value(a) > _value(_params())


def test_horst_and_ham_refuse_differentiable_and_capturable_in_torchs_words() -> None:
    with pytest.raises(RuntimeError, match="`fused` does not support `differentiable`"):
        torch.optim.AdamW(_params(), fused=True, differentiable=True)  # torch's phrase, which ours follow
    for build in (_horst("foreach"), _ham_params):
        with pytest.raises(ConfigError, match="does not support `differentiable`"):
            build(_params(), differentiable=True)
    with pytest.raises(ConfigError, match="HORST does not support `capturable`"):
        HORST(_params(), capturable=True)
    with pytest.raises(ConfigError, match="does not support `differentiable`"):
        HAM(torch.optim.AdamW(_params(), differentiable=True))
    opt = HORST(_params(), capturable=False, differentiable=False, maximize=False)  # AdamW's defaults pass
    with pytest.raises(ConfigError, match="differentiable"):
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)], "differentiable": True})


@pytest.mark.parametrize("base", ["adamw", "adam"])
def test_ham_params_form_equals_wrapping_the_base(base: str) -> None:
    a, b = _params(), _params()
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[base]
    built = HAM(a, lr=1e-2, weight_decay=0.05, alpha=20.0, beta=1e-2, base=base)
    wrapped = HAM(cls(b, lr=1e-2, weight_decay=0.05), alpha=20.0, beta=1e-2)
    assert type(built.base_optimizer) is cls and built.param_groups is built.base_optimizer.param_groups
    for _ in range(5):
        for opt, params in ((built, a), (wrapped, b)):
            opt.zero_grad()
            _objective(params).backward()
            opt.step()
    assert _same(a, b)
    assert not _same(a, _params())


def test_ham_wrapping_form_refuses_the_bases_own_keywords() -> None:
    base = torch.optim.AdamW(_params(), lr=1e-2)
    with pytest.raises(ConfigError, match="lr"):
        HAM(base, 200.0)  # the old positional alpha would now be an lr: refused, not misread
    with pytest.raises(ConfigError, match="maximize"):
        HAM(base, maximize=True)
    with pytest.raises(ConfigError, match="base must be one of"):
        HAM(_params(), base="sgd")


@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
def test_horst_maximize_on_bf16_matches_the_reference_twin(stochastic: bool) -> None:
    """The foreach path negates its float32 copies of bf16 gradients: the same bits as the reference."""
    g = torch.Generator().manual_seed(2)
    fast = (torch.randn(6, 5, generator=g) * 0.5).bfloat16().requires_grad_()
    twin = fast.detach().clone().requires_grad_()
    kw = {"lr": 1e-2, "alpha": 2.0, "beta": 0.05, "maximize": True, "stochastic_rounding": stochastic}
    opt_fast = HORST([fast], impl="foreach", sr_seed=3, **kw)
    opt_ref = HORST([twin], impl="reference", sr_seed=3, **kw)
    for _ in range(3):
        grad = torch.randn(6, 5, generator=g).bfloat16()
        fast.grad, twin.grad = grad.clone(), grad.clone()
        opt_fast.step()
        opt_ref.step()
    assert torch.equal(fast, twin) and fast.dtype == torch.bfloat16
    assert torch.equal(opt_fast.state[fast]["exp_avg"], opt_ref.state[twin]["exp_avg"])
    assert torch.equal(grad, fast.grad), "the user's gradient is not negated in place"
