"""docs/RECIPES.md, section "On linear_scan": RG-LRU, HGRN, LRU and minGRU in decay form on
qrnn.linear_scan, run as the page writes them and compared in float64 with each paper's own
step-by-step equations (forward and backward, both layouts, both directions, with and without
an initial state); and the conditioning argument of the section's introduction, measured."""

import copy
import pathlib
import re

import pytest
import torch
import torch.nn.functional as F

import qrnn
from conftest import TOLERANCES, assert_close_to_reference

RECIPES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "RECIPES.md"
SECTION = "## On linear_scan"
T, B, INPUT, HIDDEN = 13, 3, 5, 7


@pytest.fixture(scope="module")
def recipes():
    """This section's Python blocks executed in order, as a reader pasting them would."""
    text = RECIPES.read_text()
    assert SECTION in text, f"RECIPES.md has no {SECTION!r} section"
    blocks = re.findall(r"```python\n(.*?)```", text[text.index(SECTION):], flags=re.S)
    assert len(blocks) == 4, "the linear_scan section should hold the RG-LRU, HGRN, LRU and minGRU blocks"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(RECIPES), "exec"), namespace)
    return namespace


# name -> (constructor's sizes, input width, state width, output width)
SIZES = {
    "RGLRU": ((HIDDEN,), HIDDEN, HIDDEN, HIDDEN),
    "HGRU": ((INPUT, HIDDEN), INPUT, HIDDEN, INPUT),
    "LRU": ((INPUT, HIDDEN), INPUT, HIDDEN, INPUT),
    "MinGRUDecay": ((INPUT, HIDDEN), INPUT, HIDDEN, HIDDEN),
}


def _module(recipes, name, dtype=torch.float64, **options):
    module = recipes[name](*SIZES[name][0], **options)
    for p in module.parameters():  # away from the default init, so every weight matters
        torch.nn.init.normal_(p, std=0.7)
    if name == "HGRU":  # a lower bound per channel, anywhere in [0, 0.9)
        module.lower_bound = 0.9 * torch.rand(HIDDEN)
    return module.to(dtype)


def _inputs(name, dtype, batch_first):
    """Random input and initial state, never zeros."""
    _, width, state, _ = SIZES[name]
    x = torch.randn((B, T, width) if batch_first else (T, B, width), dtype=dtype)
    return x, torch.randn(B, state, dtype=dtype)


def _loop(step, h, steps, reverse):
    """Run `step(t, h) -> h` over the time steps in the recurrence's order; the states in time order."""
    states = [None] * steps
    for t in range(steps - 1, -1, -1) if reverse else range(steps):
        h = step(t, h)
        states[t] = h
    return torch.stack(states)


def _affine(linear, rows, x_t):
    """Rows `rows` of a fused nn.Linear applied to one time step: one paper matrix W x + b."""
    return x_t @ linear.weight[rows].T + linear.bias[rows]


# ---- Each paper's equations, one time step at a time (time-major x) --------------------------


def rg_lru_paper(m, x, h0, reverse):
    """Griffin: r = σ(W_a x + b_a), i = σ(W_x x + b_x), a_t = σ(Λ)^(c r), h = a_t h + sqrt(1 - a_t²)(i x)."""
    n = m.Lambda.shape[0]
    base = torch.sigmoid(m.Lambda)

    def step(t, h):
        r = torch.sigmoid(_affine(m.gates, slice(0, n), x[t]))
        i = torch.sigmoid(_affine(m.gates, slice(n, 2 * n), x[t]))
        a_t = base ** (8 * r)
        return a_t * h + torch.sqrt(1 - a_t**2) * (i * x[t])

    return _loop(step, h0, x.shape[0], reverse)


def hgru_paper(m, x, h0, reverse):
    """HGRN's HGRU, real form: λ = γ + (1 - γ) σ(W_f x + b_f), h = λ h + (1 - λ) SiLU(W_c x + b_c),
    o = W_o LayerNorm(σ(W_g x + b_g) h) + b_o."""
    n, gamma = m.norm.normalized_shape[0], m.lower_bound

    def step(t, h):
        c = F.silu(_affine(m.linear, slice(0, n), x[t]))
        lam = gamma + (1 - gamma) * torch.sigmoid(_affine(m.linear, slice(n, 2 * n), x[t]))
        return lam * h + (1 - lam) * c

    h = _loop(step, h0, x.shape[0], reverse)
    out = []
    for t in range(x.shape[0]):
        v = torch.sigmoid(_affine(m.linear, slice(2 * n, 3 * n), x[t])) * h[t]
        mean, var = v.mean(-1, keepdim=True), v.var(-1, unbiased=False, keepdim=True)
        normed = (v - mean) / torch.sqrt(var + m.norm.eps) * m.norm.weight + m.norm.bias
        out.append(normed @ m.out.weight.T + m.out.bias)
    return torch.stack(out)


def lru_paper(m, x, h0, reverse):
    """LRU, real diagonal: λ = exp(-exp(ν_log)), γ = sqrt(1 - λ²), h = λ h + γ B x, y = C h + D x."""
    lam = torch.exp(-torch.exp(m.nu_log))
    gamma = torch.sqrt(1 - lam**2)
    h = _loop(lambda t, h: lam * h + gamma * (m.B @ x[t].T).T, h0, x.shape[0], reverse)
    return torch.stack([(m.C @ h[t].T).T + m.D * x[t] for t in range(x.shape[0])])


def min_gru_paper(m, x, h0, reverse):
    """minGRU, sequential: z = σ(W_z x + b_z), h~ = W_h x + b_h, h = (1 - z) h + z h~."""
    n = m.linear.out_features // 2

    def step(t, h):
        z = torch.sigmoid(_affine(m.linear, slice(0, n), x[t]))
        return (1 - z) * h + z * _affine(m.linear, slice(n, 2 * n), x[t])

    return _loop(step, h0, x.shape[0], reverse)


PAPERS = {"RGLRU": rg_lru_paper, "HGRU": hgru_paper, "LRU": lru_paper, "MinGRUDecay": min_gru_paper}


def _paper(name, module, x, h0, batch_first, reverse):
    """The paper's loop on the module's weights, in the module's layout; h0=None is zeros."""
    xt = x.transpose(0, 1) if batch_first else x
    if h0 is None:
        h0 = torch.zeros(B, SIZES[name][2], dtype=x.dtype)
    out = PAPERS[name](module, xt, h0, reverse)
    return out.transpose(0, 1) if batch_first else out


LAYOUTS = [pytest.param(bf, rev, id=f"{'batch_first' if bf else 'time_major'}-{'reverse' if rev else 'forward'}")
           for bf in (False, True) for rev in (False, True)]


@pytest.mark.parametrize("name", list(PAPERS))
@pytest.mark.parametrize("batch_first, reverse", LAYOUTS)
@pytest.mark.parametrize("with_h0", [False, True], ids=["no_h0", "h0"])
def test_recipe_matches_the_paper(recipes, name, batch_first, reverse, with_h0):
    model = _module(recipes, name, batch_first=batch_first, reverse=reverse)
    x, h0 = _inputs(name, torch.float64, batch_first)
    h0 = h0 if with_h0 else None
    out = model(x, h0)
    assert out.shape == x.shape[:2] + (SIZES[name][3],) and out.dtype == torch.float64
    assert_close_to_reference(out, _paper(name, model, x, h0, batch_first, reverse), torch.float64,
                              f"{name} vs the paper's loop")


@pytest.mark.parametrize("name", list(PAPERS))
@pytest.mark.parametrize("batch_first, reverse", [LAYOUTS[0], LAYOUTS[3]])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_recipe_gradients_match_the_paper(recipes, name, batch_first, reverse, dtype):
    """Backward through linear_scan equals autograd through the paper's float64 loop (same
    weights), for every parameter, the input and the initial state."""
    model = _module(recipes, name, dtype, batch_first=batch_first, reverse=reverse)
    reference = copy.deepcopy(model).double()
    x, h0 = (t.requires_grad_() for t in _inputs(name, dtype, batch_first))
    out = model(x, h0)
    grad = torch.randn_like(out)
    actual = torch.autograd.grad(out, [x, h0, *model.parameters()], grad)
    expected_out = _paper(name, reference, x.double(), h0.double(), batch_first, reverse)
    expected = torch.autograd.grad(expected_out, [x, h0, *reference.parameters()], grad.double())
    names = ["x", "h0", *(n for n, _ in model.named_parameters())]
    atol, rtol = TOLERANCES[dtype]
    for what, a, e in zip(names, actual, expected):
        assert a.dtype == dtype and bool(a.abs().max() > 0), f"no gradient reaches {what}"
        # A gradient sums over batch and time: 10x the forward tolerance, as for ForgetMult's recipes.
        torch.testing.assert_close(a.double(), e.double(), atol=10 * atol, rtol=10 * rtol,
                                   msg=lambda m, what=what: f"{name} grad of {what} ({dtype}): {m}")


def test_min_gru_decay_form_is_forget_mults_min_gru(recipes):
    """a = 1 - z, b = z h~ on linear_scan and f = z, x = h~ on ForgetMult: the same states."""
    model = _module(recipes, "MinGRUDecay")
    x, h0 = _inputs("MinGRUDecay", torch.float64, False)
    k, candidate = model.linear(x).chunk(2, dim=-1)
    assert_close_to_reference(model(x, h0), qrnn.forget_mult(torch.sigmoid(k), candidate, h0), torch.float64,
                              "decay form vs forget_mult")


# ---- Why linear_scan: a decay close to 1 -------------------------------------------------------


def _scan64(a, b, h0):
    """The recurrence h = a h + b in float64, one step at a time (autograd for its gradients)."""
    return _loop(lambda t, h: a[t] * h + b[t], h0, a.shape[0], False)


def _error_in_tolerances(actual, expected, dtype):
    """max |actual - expected| / (atol + rtol |expected|): below 1 is within `dtype`'s tolerance."""
    atol, rtol = TOLERANCES[dtype]
    return ((actual.double() - expected).abs() / (atol + rtol * expected.abs())).max().item()


def test_decay_close_to_one_linear_scan_vs_forget_mult_reformulation():
    """a = 1 - 1e-7 (x [0.5, 1.5)) in float32. linear_scan's states and gradients match the float64
    loop on the same float32 inputs within the float32 tolerance. forget_mult(1 - a, b / (1 - a))
    computes the same states (1 - a is exact in float32 this close to 1), but its gradient with
    respect to a is the difference of two terms of size b / (1 - a) ~ 1e7: measured at 5e4 or more
    float32 tolerances off, and 10 % or more of the gradient's own norm."""
    steps = 20  # a → 1 lets the state and its float32 rounding grow with length: kept short
    a = (1 - 1e-7 * (0.5 + torch.rand(steps, B, 64, dtype=torch.float64))).float()
    b, h0 = torch.randn(steps, B, 64), torch.randn(B, 64)
    grad = torch.randn(steps, B, 64)
    leaves64 = [t.double().requires_grad_() for t in (a, b, h0)]
    expected = _scan64(*leaves64)
    expected_grads = torch.autograd.grad(expected, leaves64, grad.double())

    def run(fn):
        leaves = [t.clone().requires_grad_() for t in (a, b, h0)]
        out = fn(*leaves)
        return out, torch.autograd.grad(out, leaves, grad)

    out, grads = run(qrnn.linear_scan)
    assert_close_to_reference(out, expected, torch.float32, "linear_scan, a → 1")
    for what, g, e in zip(("a", "b", "h0"), grads, expected_grads):
        assert_close_to_reference(g, e, torch.float32, f"linear_scan grad_{what}, a → 1")

    out_fm, grads_fm = run(lambda a, b, h0: qrnn.forget_mult(1 - a, b / (1 - a), h0))
    assert_close_to_reference(out_fm, expected, torch.float32, "forget_mult reformulation's states")
    scan_error = _error_in_tolerances(grads[0], expected_grads[0], torch.float32)
    reformulated_error = _error_in_tolerances(grads_fm[0], expected_grads[0], torch.float32)
    assert reformulated_error > 1e3 and reformulated_error > 1e3 * scan_error, (scan_error, reformulated_error)
    assert (grads_fm[0].double() - expected_grads[0]).norm() > 0.05 * expected_grads[0].norm()


def test_decay_rounding_to_one():
    """A decay within 2**-25 of 1 (here exp(-1e-9 u), as RG-LRU's exp(log a) gives for a tiny
    log a) rounds to exactly 1 in float32: linear_scan accumulates b exactly as the float64
    loop does, while the reformulation divides by 1 - a = 0."""
    a = torch.exp(-1e-9 * torch.rand(T, B, HIDDEN))
    assert bool((a == 1).all())
    b, h0 = torch.randn(T, B, HIDDEN), torch.randn(B, HIDDEN)
    assert_close_to_reference(qrnn.linear_scan(a, b, h0), _scan64(a.double(), b.double(), h0.double()),
                              torch.float32, "linear_scan at a = 1")
    assert not bool(torch.isfinite(qrnn.forget_mult(1 - a, b / (1 - a), h0)).any())
