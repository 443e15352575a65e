"""Property-based test of qrnn.checkpoint (hypothesis): nested states of tensors of many
dtypes and layouts round-trip bit for bit, views sharing storage included."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import weights_only_reads

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


def tensors_in(state):
    """Every tensor of a nested state, in order."""
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, (dict, list, tuple)):
        for v in (state.values() if isinstance(state, dict) else state):
            yield from tensors_in(v)


def scribble(state):
    """Change every saved tensor in place, as training would right after save()."""
    for t in tensors_in(state):
        if t.numel():
            t.copy_(torch.ones(t.shape))  # converted on copy: torch 2.4 fills no float8


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


def storages(state):
    """Storage address of every tensor with bytes, to compare which ones share storage."""
    return [t.untyped_storage().data_ptr() for t in tensors_in(state) if t.untyped_storage().nbytes()]


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
            a, b = storages(loaded), storages(state)
            assert [a.index(p) for p in a] == [b.index(p) for p in b]
