"""Property-based tests (hypothesis): random shapes, memory layouts, dtypes and initial
states, every case compared with the float64 reference.

Each example draws a seed for its tensor contents, so a failure hypothesis shrinks and
prints is reproducible as is. Bounded (max_examples, no deadline) to stay fast in CI.
"""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qrnn
from conftest import CPU_DTYPES, assert_close_to_reference, reference_grads, weights_only_reads
from qrnn.reference import forget_mult_reference

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

LAYOUTS_3D = ["contiguous", "transposed", "sliced", "strided", "flipped", "expanded"]
LAYOUTS_2D = ["contiguous", "transposed", "strided", "expanded"]


def random_values(shape, kind, gen):
    if kind == "gate":
        return torch.rand(shape, generator=gen, dtype=torch.float64)
    return torch.randn(shape, generator=gen, dtype=torch.float64)


def make_tensor(shape, dtype, layout, kind, gen, expand_dim=0):
    """A tensor of `shape` with random contents stored in `layout`. Gaps of sliced and
    strided views hold NaN, so a kernel reading outside the view poisons its result."""
    shape = tuple(shape)
    nd = len(shape)
    if layout == "contiguous":
        return random_values(shape, kind, gen).to(dtype)
    if layout == "transposed":  # stored with the dims reversed, viewed back
        return random_values(shape[::-1], kind, gen).to(dtype).permute(*range(nd - 1, -1, -1))
    if layout in ("sliced", "strided"):
        big = torch.full([s * 2 + 3 for s in shape], float("nan"), dtype=dtype)
        if layout == "sliced":
            index = tuple(slice(1, 1 + s) for s in shape)
        else:
            index = tuple(slice(2, 2 + 2 * s, 2) for s in shape)
        big[index] = random_values(shape, kind, gen).to(dtype)
        return big[index]
    if layout == "flipped":  # a reversed (flip) copy of a padded buffer, sliced along the last dim
        padded = torch.full(shape[:-1] + (2 * shape[-1] + 1,), float("nan"), dtype=dtype)
        padded[..., 1:1 + shape[-1]] = random_values(shape, kind, gen).to(dtype)
        return padded.flip(0)[..., 1:1 + shape[-1]]
    if layout == "expanded":  # stride 0 along one dim
        small = list(shape)
        small[expand_dim] = 1
        return random_values(small, kind, gen).to(dtype).expand(shape)
    raise AssertionError(layout)


@st.composite
def forget_mult_cases(draw):
    dtype = draw(st.sampled_from(CPU_DTYPES))
    T = draw(st.integers(0, 12))
    B = draw(st.integers(0, 5))
    H = draw(st.one_of(st.integers(0, 40), st.integers(500, 530)))  # around the 512-unit work block
    batch_first = draw(st.booleans())
    h0_mode = draw(st.sampled_from(["none", "same", "float32"] if dtype in (torch.bfloat16, torch.float16)
                                   else ["none", "same"]))
    return dict(
        dtype=dtype, T=T, B=B, H=H, batch_first=batch_first, h0_mode=h0_mode,
        f_layout=draw(st.sampled_from(LAYOUTS_3D)), x_layout=draw(st.sampled_from(LAYOUTS_3D)),
        grad_layout=draw(st.sampled_from(LAYOUTS_3D)), h0_layout=draw(st.sampled_from(LAYOUTS_2D)),
        expand_dims=draw(st.lists(st.integers(0, 2), min_size=3, max_size=3)),
        requires_grad=draw(st.booleans()), seed=draw(st.integers(0, 2**31 - 1)),
    )


def build(case):
    gen = torch.Generator().manual_seed(case["seed"])
    T, B, H, dtype = case["T"], case["B"], case["H"], case["dtype"]
    shape = (B, T, H) if case["batch_first"] else (T, B, H)
    e = case["expand_dims"]
    f = make_tensor(shape, dtype, case["f_layout"], "gate", gen, e[0])
    x = make_tensor(shape, dtype, case["x_layout"], "value", gen, e[1])
    h0 = None
    if case["h0_mode"] != "none":
        h0_dtype = torch.float32 if case["h0_mode"] == "float32" else dtype
        h0 = make_tensor((B, H), h0_dtype, case["h0_layout"], "value", gen, e[2] % 2)
    grad_h = make_tensor(shape, dtype, case["grad_layout"], "value", gen, e[0])
    return f, x, h0, grad_h


def describe(case):
    return " ".join(f"{k}={v}" for k, v in case.items())


@SETTINGS
@given(forget_mult_cases())
def test_forget_mult_matches_reference(case):
    f, x, h0, grad_h = build(case)
    dtype, batch_first, what = case["dtype"], case["batch_first"], describe(case)
    f64, x64 = f.double(), x.double()
    h064 = h0.double() if h0 is not None else None
    ref_h = forget_mult_reference(f64, x64, h064, batch_first=batch_first)

    if not case["requires_grad"]:
        h = qrnn.forget_mult(f, x, h0, batch_first=batch_first)
        assert h.shape == f.shape and h.dtype == dtype
        assert_close_to_reference(h, ref_h, dtype, f"h {what}")
        return

    # Leaves that keep the drawn layouts (detach() shares storage and strides).
    f, x = f.detach().requires_grad_(), x.detach().requires_grad_()
    if h0 is not None:
        h0 = h0.detach().requires_grad_()
    h = qrnn.forget_mult(f, x, h0, batch_first=batch_first)
    assert_close_to_reference(h, ref_h, dtype, f"h {what}")
    h.backward(grad_h)
    ref_df, ref_dx, ref_dh0 = reference_grads(grad_h, f, x, h, h0, batch_first)
    assert_close_to_reference(f.grad, ref_df, dtype, f"grad_f {what}")
    assert_close_to_reference(x.grad, ref_dx, dtype, f"grad_x {what}")
    if h0 is not None:
        assert h0.grad.dtype == h0.dtype
        assert_close_to_reference(h0.grad, ref_dh0, dtype, f"grad_h0 {what}")


@SETTINGS
@given(forget_mult_cases())
def test_batch_first_is_a_transpose(case):
    """batch_first only changes which dim is time: results agree bit for bit."""
    f, x, h0, _ = build(case)
    bf = case["batch_first"]
    h = qrnn.forget_mult(f, x, h0, batch_first=bf)
    h_other = qrnn.forget_mult(f.transpose(0, 1), x.transpose(0, 1), h0, batch_first=not bf)
    assert torch.equal(h.transpose(0, 1), h_other)


# ---- checkpoint round trip -------------------------------------------------------------------

CHECKPOINT_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64, torch.int8, torch.int16,
    torch.int32, torch.int64, torch.uint8, torch.bool, torch.uint16, torch.float8_e4m3fn,
]
CHECKPOINT_DTYPES = [dt for dt in CHECKPOINT_DTYPES if weights_only_reads(dt)]  # torch 2.4: no uint16


def random_tensor(shape, dtype, gen):
    """Random bit patterns of any dtype (NaN and Inf included for floating types)."""
    nbytes = int(torch.Size(shape).numel()) * dtype.itemsize
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=gen)
    if dtype == torch.bool:
        return (raw & 1).bool().reshape(shape)
    return raw.view(dtype).reshape(shape)


def exact_bits(t):
    flat = torch.empty(t.numel(), dtype=t.dtype).copy_(t.detach().reshape(-1))  # stride 1, whatever the view
    return flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)


@st.composite
def checkpoint_states(draw):
    """A nested state: tensors of many dtypes and layouts (views sharing one storage among
    them), Python scalars, strings and containers."""
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    base = random_tensor((draw(st.integers(1, 6)), draw(st.integers(1, 6))), draw(st.sampled_from(CHECKPOINT_DTYPES)),
                         gen)

    def tensor():
        kind = draw(st.sampled_from(["fresh", "transposed", "strided", "view-of-base", "scalar", "empty"]))
        dtype = draw(st.sampled_from(CHECKPOINT_DTYPES))
        shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
        if kind == "fresh":
            return random_tensor(shape, dtype, gen)
        if kind == "transposed":
            return random_tensor(shape[::-1], dtype, gen).permute(*range(len(shape) - 1, -1, -1))
        if kind == "strided":
            return random_tensor(tuple(2 * s for s in shape), dtype, gen)[tuple(slice(None, None, 2) for _ in shape)]
        if kind == "view-of-base":  # shares storage with other entries: must still share after loading
            return draw(st.sampled_from([base, base.t(), base[0], base[:, -1], base[1:]]))
        if kind == "scalar":
            return random_tensor((), dtype, gen)
        return random_tensor((0,) + shape[1:], dtype, gen)

    # No subnormals: hypothesis refuses to draw them once anything in the process has set
    # flush-to-zero (torch 2.4's inductor loads kernels built with -ffast-math).
    leaves = st.one_of(st.integers(-2**62, 2**62), st.floats(allow_nan=False, allow_subnormal=False),
                       st.text(max_size=8),
                       st.none(), st.booleans())
    state = {}
    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["tensor", "tensor", "leaf", "list", "dict"]))
        if kind == "tensor":
            state[f"t{i}"] = tensor()
        elif kind == "leaf":
            state[f"v{i}"] = draw(leaves)
        elif kind == "list":
            state[f"l{i}"] = [tensor(), draw(leaves), (tensor(), draw(leaves))]
        else:
            state[f"d{i}"] = {"inner": tensor(), 3: draw(leaves)}
    return state


class Expected:
    """A tensor's values, strides and storage offset at save time."""

    def __init__(self, t):
        self.bits, self.dtype, self.shape = exact_bits(t), t.dtype, t.shape
        self.stride, self.offset = t.stride(), t.storage_offset()


def clone_state(state):
    if isinstance(state, torch.Tensor):
        return Expected(state)
    if isinstance(state, dict):
        return {k: clone_state(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(clone_state(v) for v in state)
    return state


def scribble(state):
    """Change every saved tensor in place, as training would right after save()."""
    if isinstance(state, torch.Tensor):
        if state.numel():
            state.copy_(torch.ones(state.shape))  # converted on copy: torch 2.4 fills no float8
    elif isinstance(state, dict):
        for v in state.values():
            scribble(v)
    elif isinstance(state, (list, tuple)):
        for v in state:
            scribble(v)


def assert_same_state(loaded, expected, where="state"):
    if isinstance(expected, Expected):  # torch.save keeps views as views: same strides and offset
        assert isinstance(loaded, torch.Tensor), where
        assert (loaded.dtype, loaded.shape, loaded.stride(), loaded.storage_offset()) == \
            (expected.dtype, expected.shape, expected.stride, expected.offset), where
        assert torch.equal(exact_bits(loaded), expected.bits), f"{where}: bytes differ"
    elif isinstance(expected, dict):
        assert list(loaded) == list(expected), where
        for k in expected:
            assert_same_state(loaded[k], expected[k], f"{where}[{k!r}]")
    elif isinstance(expected, (list, tuple)):
        assert type(loaded) is type(expected) and len(loaded) == len(expected), where
        for i, (a, b) in enumerate(zip(loaded, expected)):
            assert_same_state(a, b, f"{where}[{i}]")
    else:
        assert loaded == expected and type(loaded) is type(expected), f"{where}: {loaded!r} != {expected!r}"


def storages(state, out):
    """Storage address of every tensor with bytes, to compare which ones share storage."""
    if isinstance(state, torch.Tensor):
        if state.untyped_storage().nbytes():
            out.append(state.untyped_storage().data_ptr())
    elif isinstance(state, dict):
        for v in state.values():
            storages(v, out)
    elif isinstance(state, (list, tuple)):
        for v in state:
            storages(v, out)
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(checkpoint_states(), st.booleans())
def test_checkpoint_round_trip(state, use_mmap):
    import tempfile

    from qrnn.checkpoint import AsyncCheckpointer, load, verify

    expected = clone_state(state)
    with tempfile.TemporaryDirectory() as folder:
        with AsyncCheckpointer(folder, keep_last=None, copy_threads=2, _sync=False) as ckpt:
            handle = ckpt.save(state, step=7)  # returns once the snapshot is taken
            scribble(state)                    # so this must not reach the file
            path = handle.result()
        assert verify(path) is None
        for loaded in (torch.load(path, weights_only=True), load(path, mmap=use_mmap)):
            assert_same_state(loaded, expected)
            # Tensors that shared a storage still share one (and only those).
            a, b = storages(loaded, []), storages(state, [])
            assert [a.index(p) for p in a] == [b.index(p) for p in b]


# ---- the fused gate kernel ---------------------------------------------------------------------

@st.composite
def gates_cases(draw):
    dtype = draw(st.sampled_from(CPU_DTYPES))
    half = dtype in (torch.bfloat16, torch.float16)
    return dict(
        dtype=dtype, T=draw(st.integers(0, 7)), B=draw(st.integers(0, 4)),
        H=draw(st.one_of(st.integers(1, 20), st.integers(60, 70))),
        output_gate=draw(st.booleans()), batch_first=draw(st.booleans()), reverse=draw(st.booleans()),
        lengths=draw(st.booleans()), mask=draw(st.booleans()),
        scale=draw(st.sampled_from([1.0, 0.8, 0.0])),
        c0=draw(st.sampled_from(["none", "same", "float32"] if half else ["none", "same"])),
        gates_layout=draw(st.sampled_from(LAYOUTS_3D)), c0_layout=draw(st.sampled_from(LAYOUTS_2D)),
        mask_layout=draw(st.sampled_from(LAYOUTS_3D)), expand_dim=draw(st.integers(0, 2)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@SETTINGS
@given(gates_cases())
def test_qrnn_gates_matches_reference(case):
    """qrnn.qrnn_gates (forward and gradients) against the float64 per-step reference, for
    gates read in place through any strides, every option and dtype."""
    from qrnn.reference import qrnn_gates_reference

    gen = torch.Generator().manual_seed(case["seed"])
    dtype, T, B, H, bf = case["dtype"], case["T"], case["B"], case["H"], case["batch_first"]
    n = 3 if case["output_gate"] else 2
    shape = (B, T, n * H) if bf else (T, B, n * H)
    out_shape = shape[:-1] + (H,)
    # Spread wide enough to reach the activations' flat ends. Gates are never broadcast
    # (each gradient element belongs to one gate), but may be any other view.
    layout = case["gates_layout"] if case["gates_layout"] != "expanded" else "strided"
    gates = (3 * make_tensor(shape, torch.float64, layout, "value", gen)).to(dtype)
    c0 = None
    if case["c0"] != "none":
        c0 = make_tensor((B, H), torch.float32 if case["c0"] == "float32" else dtype, case["c0_layout"], "value", gen,
                         case["expand_dim"] % 2)
    mask = None
    if case["mask"]:
        mask = (make_tensor(out_shape, torch.float64, case["mask_layout"], "gate", gen, case["expand_dim"]) > 0.3)
        mask = mask.to(dtype)
    lengths = None
    if case["lengths"]:
        lengths = torch.randint(0, T + 1, (B,), generator=gen)
    kwargs = dict(output_gate=case["output_gate"], forget_mask=mask, forget_scale=case["scale"], lengths=lengths,
                  batch_first=bf, reverse=case["reverse"])
    grad_out = torch.randn(out_shape, generator=gen, dtype=torch.float64)
    grad_cn = torch.randn(B, H, generator=gen, dtype=torch.float64)

    leaf_gates = gates.detach().requires_grad_()  # keeps the drawn strides
    leaf_c0 = None if c0 is None else c0.detach().requires_grad_()
    output, c_n = qrnn.qrnn_gates(leaf_gates, leaf_c0, **kwargs)
    ref_gates = gates.detach().double().requires_grad_()
    ref_c0 = None if c0 is None else c0.detach().double().requires_grad_()
    ref_kwargs = dict(kwargs, forget_mask=None if mask is None else mask.double())
    ref_out, ref_cn = qrnn_gates_reference(ref_gates, ref_c0, **ref_kwargs)
    what = describe(case)
    assert output.dtype == dtype and output.shape == out_shape
    assert_close_to_reference(output, ref_out, dtype, f"output {what}")
    assert_close_to_reference(c_n, ref_cn, dtype, f"c_n {what}")
    if lengths is not None:  # padding steps are exactly zero
        out_tm = output.transpose(0, 1) if bf else output
        for b in range(B):
            assert (out_tm[int(lengths[b]):, b] == 0).all(), what

    if output.numel() == 0 and c_n.numel() == 0:
        return
    loss = (output.double() * grad_out).sum() + (c_n.double() * grad_cn).sum()
    ref_loss = (ref_out * grad_out).sum() + (ref_cn * grad_cn).sum()
    inputs = [leaf_gates] + ([leaf_c0] if leaf_c0 is not None else [])
    ref_inputs = [ref_gates] + ([ref_c0] if ref_c0 is not None else [])
    def gradients(total, leaves):  # None where nothing reaches a leaf (e.g. seq_len 0 without c0)
        if not total.requires_grad:
            return [None] * len(leaves)
        return torch.autograd.grad(total, leaves, allow_unused=True)

    grads, ref_grads = gradients(loss, inputs), gradients(ref_loss, ref_inputs)
    for got, want, inp, name in zip(grads, ref_grads, inputs, ("grad gates", "grad c0")):
        got = torch.zeros_like(inp) if got is None else got
        want = torch.zeros_like(inp, dtype=torch.float64) if want is None else want
        assert got.dtype == inp.dtype, name
        assert_close_to_reference(got, want, dtype, f"{name} {what}")


# ---- the QRNN module -------------------------------------------------------------------------

@st.composite
def module_cases(draw):
    return dict(
        T=draw(st.integers(1, 6)), B=draw(st.integers(1, 3)), I=draw(st.integers(1, 6)), H=draw(st.integers(1, 6)),
        num_layers=draw(st.integers(1, 2)), bidirectional=draw(st.booleans()), window=draw(st.integers(1, 3)),
        output_gate=draw(st.booleans()), batch_first=draw(st.booleans()), lengths=draw(st.booleans()),
        with_h0=draw(st.booleans()), split=draw(st.integers(1, 5)), seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(module_cases())
def test_qrnn_module_matches_layer_reference(case):
    """qrnn.QRNN in float64 (eval) against the per-step layer reference, stacked as nn.GRU
    stacks layers (each layer reads both directions of the one below)."""
    from qrnn.reference import qrnn_layer_reference

    torch.manual_seed(case["seed"])
    T, B, n_in, H, bf = case["T"], case["B"], case["I"], case["H"], case["batch_first"]
    D = 2 if case["bidirectional"] else 1
    model = qrnn.QRNN(n_in, H, num_layers=case["num_layers"], bidirectional=case["bidirectional"],
                      window=case["window"], output_gate=case["output_gate"], batch_first=bf,
                      dtype=torch.float64).eval()
    x = torch.randn((B, T, n_in) if bf else (T, B, n_in), dtype=torch.float64)
    lengths = torch.randint(0, T + 1, (B,)) if case["lengths"] else None
    h0 = torch.randn(case["num_layers"] * D, B, H, dtype=torch.float64) if case["with_h0"] else None
    with torch.no_grad():
        out, h_n = model(x, h0, lengths=lengths)
        layer_in, states = x, []
        for layer in range(case["num_layers"]):
            outs = []
            for d in range(D):
                lin = model.layers[layer * D + d].linear
                o, c, _ = qrnn_layer_reference(layer_in, lin.weight, lin.bias,
                                               None if h0 is None else h0[layer * D + d], window=case["window"],
                                               output_gate=case["output_gate"], lengths=lengths, batch_first=bf,
                                               reverse=d == 1)
                outs.append(o)
                states.append(c)
            layer_in = torch.cat(outs, -1)
    what = describe(case)
    assert_close_to_reference(out, layer_in, torch.float64, f"output {what}")
    assert_close_to_reference(h_n, torch.stack(states), torch.float64, f"h_n {what}")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(module_cases())
def test_qrnn_chunks_equal_whole_sequence(case):
    """Running a sequence in two chunks with the carried QRNNState gives the same outputs
    and final state as running it whole (unidirectional: what chunked BPTT relies on)."""
    torch.manual_seed(case["seed"])
    T, B, n_in, H, bf = case["T"], case["B"], case["I"], case["H"], case["batch_first"]
    model = qrnn.QRNN(n_in, H, num_layers=case["num_layers"], window=case["window"], output_gate=case["output_gate"],
                      batch_first=bf, dtype=torch.float64).eval()
    x = torch.randn((B, T, n_in) if bf else (T, B, n_in), dtype=torch.float64)
    time_dim = 1 if bf else 0
    split = min(case["split"], T)
    with torch.no_grad():
        whole, whole_state = model(x, model.initial_state())
        first, state = model(x.narrow(time_dim, 0, split), model.initial_state())
        second, state = model(x.narrow(time_dim, split, T - split), state)
    torch.testing.assert_close(torch.cat([first, second], time_dim), whole, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(state.c, whole_state.c, atol=1e-12, rtol=1e-12)
