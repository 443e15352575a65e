"""docs/RECIPES.md: minGRU, minLSTM and SRU on qrnn.forget_mult, run as the page writes them
and compared in float64 with each paper's own step-by-step formulation (and, for minGRU,
with its log-space parallel scan)."""

import pathlib
import re

import pytest
import torch

from conftest import TOLERANCES, assert_close_to_reference
from qrnn.bench.recipes import min_gru_forget_mult, min_gru_log_space

RECIPES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "RECIPES.md"
T, B, INPUT, HIDDEN = 13, 3, 5, 7


@pytest.fixture(scope="module")
def recipes():
    """The page's Python blocks executed in order, as a reader pasting them would."""
    namespace: dict = {}
    page = RECIPES.read_text().split("\n## On linear_scan", 1)[0]  # this file's section: the ForgetMult recipes
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert len(blocks) == 3, "RECIPES.md should hold the minGRU, minLSTM and SRU blocks"
    for block in blocks:
        exec(compile(block, str(RECIPES), "exec"), namespace)
    return namespace


def _module(recipes, name, *sizes, dtype=torch.float64):
    module = recipes[name](*sizes).to(dtype)
    for p in module.parameters():  # away from the default init, so every weight matters
        torch.nn.init.normal_(p, std=0.7)
    return module


def _paper_g(x):
    return x + 0.5 if x >= 0 else torch.sigmoid(x)


def _loop(step, h, steps):
    """Run `step(t, h) -> h` over the steps and stack the states."""
    out = []
    for t in range(steps):
        h = step(t, h)
        out.append(h)
    return torch.stack(out)


def min_gru_paper(linear, x, h0):
    """The paper's sequential minGRU, one time step and one element of g at a time."""
    k, pre_h = linear(x).chunk(2, dim=-1)
    if pre_h.requires_grad:
        g = torch.where(pre_h >= 0, pre_h + 0.5, torch.sigmoid(pre_h))
    else:  # the paper's definition literally, element by element
        g = pre_h.detach().clone().apply_(_paper_g)
    z = torch.sigmoid(k)
    return _loop(lambda t, h: (1 - z[t]) * h + z[t] * g[t], h0, x.shape[0])


def min_lstm_paper(linear, x, h0):
    pre_f, pre_i, pre_h = linear(x).chunk(3, dim=-1)
    f, i = torch.sigmoid(pre_f), torch.sigmoid(pre_i)
    g = torch.where(pre_h >= 0, pre_h + 0.5, torch.sigmoid(pre_h))
    return _loop(lambda t, h: f[t] / (f[t] + i[t]) * h + i[t] / (f[t] + i[t]) * g[t], h0, x.shape[0])


def sru_paper(linear, x, c0):
    candidate, pre_f, pre_r = linear(x).chunk(3, dim=-1)
    f, r = torch.sigmoid(pre_f), torch.sigmoid(pre_r)
    c = _loop(lambda t, c: f[t] * c + (1 - f[t]) * candidate[t], c0, x.shape[0])
    return r * torch.tanh(c) + (1 - r) * x, c[-1]


@pytest.mark.parametrize("with_h0", [False, True])
def test_min_gru_matches_the_paper(recipes, with_h0):
    model = _module(recipes, "MinGRU", INPUT, HIDDEN)
    x = torch.randn(T, B, INPUT, dtype=torch.float64)
    h0 = torch.rand(B, HIDDEN, dtype=torch.float64) + 0.1 if with_h0 else None
    expected = min_gru_paper(model.linear, x, torch.zeros(B, HIDDEN, dtype=torch.float64) if h0 is None else h0)
    assert_close_to_reference(model(x, h0), expected, torch.float64, "minGRU vs the sequential form")
    # The log-space scan the paper proposes for training computes the same states.
    k, pre_h = model.linear(x).chunk(2, dim=-1)
    assert_close_to_reference(min_gru_log_space(k, pre_h, h0), expected, torch.float64, "log-space scan")
    assert_close_to_reference(min_gru_forget_mult(k, pre_h, h0), expected, torch.float64, "benchmarked form")


def test_min_lstm_matches_the_paper(recipes):
    model = _module(recipes, "MinLSTM", INPUT, HIDDEN)
    x = torch.randn(T, B, INPUT, dtype=torch.float64)
    h0 = torch.randn(B, HIDDEN, dtype=torch.float64)
    assert_close_to_reference(model(x, h0), min_lstm_paper(model.linear, x, h0), torch.float64, "minLSTM")


def test_sru_matches_the_paper(recipes):
    model = _module(recipes, "SRU", HIDDEN)
    x = torch.randn(T, B, HIDDEN, dtype=torch.float64)
    c0 = torch.randn(B, HIDDEN, dtype=torch.float64)
    out, c_last = model(x, c0)
    expected_out, expected_c = sru_paper(model.linear, x, c0)
    assert_close_to_reference(out, expected_out, torch.float64, "SRU output")
    assert_close_to_reference(c_last, expected_c, torch.float64, "SRU cell state")


@pytest.mark.parametrize("name, sizes, reference", [
    ("MinGRU", (INPUT, HIDDEN), min_gru_paper),
    ("MinLSTM", (INPUT, HIDDEN), min_lstm_paper),
    ("SRU", (HIDDEN,), lambda linear, x, h0: sru_paper(linear, x, h0)[0]),
])
def test_recipe_gradients_match_the_paper(recipes, name, sizes, reference):
    """Backward through the kernel equals autograd through the paper's loop, for the
    weights, the input and the initial state, in float64 and float32."""
    for dtype in (torch.float64, torch.float32):
        model = _module(recipes, name, *sizes, dtype=dtype)
        x = torch.randn(T, B, sizes[0], dtype=dtype, requires_grad=True)
        h0 = torch.randn(B, HIDDEN, dtype=dtype, requires_grad=True)
        out = model(x, h0)
        out = out[0] if isinstance(out, tuple) else out
        grad = torch.randn_like(out)
        leaves = [x, h0, *model.parameters()]
        actual = torch.autograd.grad(out, leaves, grad)
        expected = torch.autograd.grad(reference(model.linear, x, h0), leaves, grad)
        atol, rtol = TOLERANCES[dtype]
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, atol=10 * atol, rtol=10 * rtol)
