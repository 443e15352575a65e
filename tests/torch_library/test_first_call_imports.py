"""The first eager call of each qrnn op with autograd imports nothing heavy: torch wraps a
custom op's kernels in ``torch._disable_dynamo``, whose first call imported ``torch._dynamo``
(with sympy, torch._inductor and DTensor: seconds) although no Dynamo frame hook can exist
before that import (qrnn.ops.core.dispatch.defer_dynamo_import). Each check runs in a fresh
interpreter, where nothing has imported them yet."""

import json

from conftest import run_python

HEAVY = ("torch._dynamo", "torch._inductor", "sympy", "torch.distributed.tensor")

FIRST_CALLS = """
    import json, sys
    import torch
    import qrnn

    heavy = {heavy!r}
    already = [m for m in heavy if m in sys.modules]  # by `import torch` / `import qrnn` themselves
    torch.manual_seed(0)
    layer = qrnn.QRNN(4, 6, num_layers=2, window=2)
    out, _ = layer(torch.randn(5, 3, 4))
    out.sum().backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # qrnn-train's mixed precision
        out, _ = layer(torch.randn(5, 3, 4))
    out.float().sum().backward()

    f = torch.rand(5, 3, 6, requires_grad=True)
    x = torch.randn(5, 3, 6, requires_grad=True)
    h0 = torch.randn(3, 6, requires_grad=True)
    qrnn.forget_mult(f, x, h0).sum().backward()
    qrnn.linear_scan(f, x, h0).sum().backward()
    gates = torch.randn(5, 3, 18, requires_grad=True)
    h, c = qrnn.qrnn_gates(gates, h0)
    (h.sum() + c.sum()).backward()
    with torch.no_grad():  # the direct path
        qrnn.forget_mult(f, x, h0), qrnn.linear_scan(f, x, h0), qrnn.qrnn_gates(gates, h0)
    print(json.dumps({{"already": already, "after": [m for m in heavy if m in sys.modules]}}))
"""


def test_first_forward_and_backward_of_every_op_family_imports_nothing_heavy():
    proc = run_python(FIRST_CALLS.format(heavy=HEAVY), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["already"] == [], f"`import torch, qrnn` imported {result['already']}"
    assert result["after"] == [], f"the first calls imported {result['after']}"


def test_the_ops_still_run_under_dynamo_after_an_eager_first_call():
    """The stand-in hands over to torch._dynamo.disable once Dynamo is loaded: an eager call,
    then torch.compile(fullgraph=True) of the same ops, then eager again, agree."""
    proc = run_python("""
        import sys
        import torch
        import qrnn

        def step(f, x, h0):
            gates = torch.cat([x, f, x], dim=-1)
            h, c = qrnn.qrnn_gates(gates, h0)
            return qrnn.forget_mult(f, x, h0) + qrnn.linear_scan(f, x, h0) + h

        f, x, h0 = torch.rand(5, 3, 4), torch.randn(5, 3, 4), torch.randn(3, 4)
        eager = step(f, x, h0)
        assert "torch._dynamo" not in sys.modules
        compiled = torch.compile(step, fullgraph=True, backend="eager")(f, x, h0)
        assert "torch._dynamo" in sys.modules
        torch.testing.assert_close(compiled, eager)
        torch.testing.assert_close(step(f, x, h0), eager)
        print("ok")
    """, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "ok"
