"""QRNN calls each of its layers as a module: forward hooks on a layer fire and may change
what it reads and returns, and a wrapper put in a layer's place (activation checkpointing,
a user's own module) runs. Checked against the same layers run one by one through
``QRNNLayer.run``, on fresh random float64 inputs."""

import copy

import pytest
import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import checkpoint

import qrnn
import torchqrnn

F64 = torch.float64
STACKS = {"qrnn": qrnn.QRNN, "torchqrnn": torchqrnn.QRNN}


def make_stack(kind="qrnn", bidirectional=False):
    return STACKS[kind](3, 4, num_layers=2, window=2, bidirectional=bidirectional, dtype=F64)


def run_layers(model, x, *, change_input=None, change_output=None, lengths=None):
    """The stack's (output, h_n), layer by layer through QRNNLayer.run (unidirectional),
    with ``change_input``/``change_output`` ({layer index: function}) applied where a hook
    would apply them."""
    states = []
    for index, layer in enumerate(model.layers):
        if change_input and index in change_input:
            x = change_input[index](x)
        out, c_n, _ = layer.run(x, lengths=lengths)
        if change_output and index in change_output:
            out = change_output[index](out)
        states.append(c_n)
        x = out
    return x, torch.stack(states)


class Checkpointed(nn.Module):
    """A user's activation-checkpointing wrapper, put in place of a layer."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, *args):
        return checkpoint(self.layer, *args, use_reentrant=False)


@pytest.mark.parametrize("kind", list(STACKS))
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_forward_hooks_fire_once_per_layer_call(kind, bidirectional):
    model = make_stack(kind, bidirectional)
    calls = []
    for index, layer in enumerate(model.layers):
        layer.register_forward_pre_hook(lambda module, args, index=index: calls.append(("pre", index)))
        layer.register_forward_hook(lambda module, args, out, index=index: calls.append(("post", index)))
    model(torch.randn(5, 2, 3, dtype=F64))
    assert calls == [(when, index) for index in range(len(model.layers)) for when in ("pre", "post")]
    calls.clear()
    seen = []
    handle = nn.modules.module.register_module_forward_hook(lambda module, args, out: seen.append(type(module)))
    try:
        model(torch.randn(5, 2, 3, dtype=F64), model.initial_state())
    finally:
        handle.remove()
    assert len(calls) == 2 * len(model.layers)
    assert sum(issubclass(t, qrnn.QRNNLayer) for t in seen) == len(model.layers)


def test_pre_hook_replaces_a_layers_input():
    model = make_stack()
    plain = copy.deepcopy(model)
    scale = torch.rand(4, dtype=F64) + 0.5
    seen = []

    def scale_input(module, args):
        seen.append(args)
        x, *rest = args
        return (x * scale, *rest)

    model.layers[1].register_forward_pre_hook(scale_input)
    x = torch.randn(6, 2, 3, dtype=F64)
    lengths = torch.randint(0, 7, (2,))
    out, h_n = model(x, lengths=lengths)
    want_out, want_h = run_layers(plain, x, change_input={1: lambda y: y * scale}, lengths=lengths)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(h_n, want_h)
    (x1, state, seen_lengths), = seen  # what a hook is handed: the input, the layer's state record, lengths
    assert x1.shape == (6, 2, 4) and state.c0 is None and state.batch_first is False and state.reverse is False
    assert torch.equal(seen_lengths, lengths)


def test_pre_hook_replaces_a_layers_state():
    model = make_stack()
    plain = copy.deepcopy(model)
    c0 = torch.randn(2, 4, dtype=F64)
    model.layers[0].register_forward_pre_hook(lambda module, args: (args[0], args[1]._replace(c0=c0), args[2]))
    x = torch.randn(5, 2, 3, dtype=F64)
    out, h_n = model(x)
    first, c_first, _ = plain.layers[0].run(x, c0)
    second, c_second, _ = plain.layers[1].run(first)
    torch.testing.assert_close(out, second)
    torch.testing.assert_close(h_n, torch.stack([c_first, c_second]))


def test_forward_hook_replaces_a_layers_output():
    model = make_stack()
    plain = copy.deepcopy(model)
    shift = torch.randn(4, dtype=F64)
    model.layers[0].register_forward_hook(lambda module, args, result: (result[0] + shift, *result[1:]))
    x = torch.randn(5, 2, 3, dtype=F64, requires_grad=True)
    out, h_n = model(x)
    want_out, want_h = run_layers(plain, x, change_output={0: lambda y: y + shift})
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(h_n, want_h)
    grad = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, x, grad)[0], torch.autograd.grad(want_out, x, grad)[0])


@pytest.mark.parametrize("wrap", [checkpoint_wrapper, Checkpointed], ids=["checkpoint_wrapper", "user_wrapper"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
def test_wrapped_layers_are_checkpointed(wrap, bidirectional):
    """Wrappers in every layer's place run: the outputs, carried state and gradients are the
    plain stack's, and each layer runs twice (its forward, then the recomputation in backward)."""
    model = make_stack(bidirectional=bidirectional)
    plain = copy.deepcopy(model)
    runs = []
    for index, layer in enumerate(model.layers):
        # A pre-hook: the recomputation stops as soon as it has what backward needs, before post-hooks.
        layer.register_forward_pre_hook(lambda module, args, index=index: runs.append(index))
    model.layers = nn.ModuleList(wrap(layer) for layer in model.layers)
    chunks = torch.randn(6, 2, 3, dtype=F64).split(3)  # two chunks, the state carried between them
    lengths = torch.randint(0, 4, (2,))
    results = []
    for stack in (model, plain):
        state, outputs = stack.initial_state(), []
        for chunk in chunks:
            out, state = stack(chunk, state, lengths=lengths)
            outputs.append(out)
        loss = torch.cat(outputs).square().sum() + state.c.sum()
        results.append((outputs, state, torch.autograd.grad(loss, list(stack.parameters()))))
    (got_out, got_state, got_grads), (want_out, want_state, want_grads) = results
    torch.testing.assert_close(got_out, want_out)
    torch.testing.assert_close(got_state.c, want_state.c)
    torch.testing.assert_close(got_state.x_tails, want_state.x_tails)
    torch.testing.assert_close(got_grads, want_grads)
    assert sorted(runs) == sorted(list(range(len(model.layers))) * 2 * len(chunks))


def test_input_dtype_is_checked_through_a_wrapper():
    model = make_stack()
    model.layers[0] = Checkpointed(model.layers[0])
    with pytest.raises(ValueError, match="input must have the type torch.float64"):
        model(torch.randn(4, 2, 3))


def test_a_layer_compiled_on_its_own_runs_compiled():
    """``layer.compile()`` (per-block compilation) changes only what calling the layer runs:
    QRNN calls it, so the compiled code runs and gives the plain stack's answer."""
    model = make_stack()
    plain = copy.deepcopy(model)
    compiled = []

    def backend(graph_module, example_inputs):
        compiled.append(graph_module)
        return graph_module.forward

    model.layers[1].compile(backend=backend, fullgraph=True)
    x = torch.randn(5, 2, 3, dtype=F64)
    for got, want in zip(model(x, model.initial_state()), plain(x, plain.initial_state())):
        torch.testing.assert_close(got, want)
    assert compiled and any("qrnn" in str(g.graph) for g in compiled)


class PassThrough(nn.Module):
    """A wrapper that only calls the layer (a user's logging or adapter module)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, *args):
        return self.layer(*args)


def test_kept_inputs_through_wrappers():
    """torchqrnn's save_prev_x keeps each layer's last inputs inside its forward: a wrapper
    that only calls the layer changes nothing (and reset() reaches the layer inside), while
    one that reruns it in backward (activation checkpointing) is refused, since the rerun
    would read the inputs kept after the first run."""
    model = torchqrnn.QRNN(3, 4, num_layers=2, window=2, save_prev_x=True, dtype=F64)
    plain = copy.deepcopy(model)
    model.layers = nn.ModuleList(PassThrough(layer) for layer in model.layers)
    chunks = torch.randn(8, 2, 3, dtype=F64).split(4)
    for stack in (model, plain):
        stack.reset()
        stack.outputs = [stack(chunk)[0] for chunk in chunks]
        sum(out.square().sum() for out in stack.outputs).backward()
    torch.testing.assert_close(model.outputs, plain.outputs)
    torch.testing.assert_close([p.grad for p in model.parameters()], [p.grad for p in plain.parameters()])
    model.reset()
    assert all(layer.layer.prevX is None for layer in model.layers)

    model.layers = nn.ModuleList(checkpoint_wrapper(layer.layer) for layer in model.layers)
    out, _ = model(chunks[0])
    with pytest.raises(RuntimeError, match=r"save_prev_x=True\) was run again in backward .* QRNNState"):
        out.sum().backward()
