"""Inputs shared by the fused gate tests (tests/qrnn_gates and the paths that reach the
fused kernels from elsewhere): the option sets and random gate pre-activations."""

import torch

# (output_gate, lengths, reverse, batch_first, zoneout mask, c0): each value of each
# option appears with every value of every other at least once, kept short for CI.
OPTION_SETS = [
    (True, False, False, False, False, False),
    (True, True, True, True, True, True),
    (False, False, True, True, True, False),
    (False, True, False, False, False, True),
    (True, True, False, True, False, False),
    (False, False, False, True, True, True),
    (True, False, True, False, True, True),
    (False, True, True, False, False, False),
]
OPTION_IDS = ["og{}-len{}-rev{}-bf{}-mask{}-c0{}".format(*map(int, o)) for o in OPTION_SETS]


def make_inputs(T, B, H, dtype, output_gate=True, lengths=False, batch_first=False, mask=False, c0=False,
                requires_grad=False):
    n = 3 if output_gate else 2
    shape = (B, T, n * H) if batch_first else (T, B, n * H)
    # Spread wide enough to reach the activations' flat ends.
    gates = (3 * torch.randn(shape)).to(dtype).requires_grad_(requires_grad)
    out_shape = shape[:-1] + (H,)
    forget_mask = (torch.rand(out_shape) > 0.3).to(dtype) if mask else None
    state_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    c0 = torch.randn(B, H, dtype=state_dtype).requires_grad_(requires_grad) if c0 else None
    lens = torch.randint(0, T + 1, (B,)) if lengths else None
    if lens is not None and B > 0:
        lens[0] = T  # one full-length sequence
    return gates, c0, forget_mask, lens
