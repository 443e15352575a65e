"""qrnn-train's and qrnn-generate's size checks build the model on the meta device
(qrnn.train.lm.meta_model): the same parameters and shapes as the real model, and no
initialiser run on it, since torch's meta ``normal_`` imports torch._dynamo (seconds) on its
first call, which qrnn-generate (no optimizer) would otherwise pay before its first token."""

import json

import pytest
import torch

from conftest import run_python
from qrnn.train.lm import QRNNLanguageModel, meta_model

CONFIGS = [
    dict(vocab_size=300, emsize=8, hidden=12, layers=3),
    dict(vocab_size=1000, emsize=8, hidden=12, layers=2, cutoffs=[100, 400], weight_drop=0.3, tie_weights=False),
    dict(vocab_size=50, emsize=6, hidden=6, layers=1, first_window=1),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_meta_model_has_the_real_models_parameters_and_shapes(config):
    meta, real = meta_model(config), QRNNLanguageModel(**config)
    assert {k: v.shape for k, v in meta.state_dict().items()} == {k: v.shape for k, v in real.state_dict().items()}
    assert all(p.is_meta for p in meta.parameters())
    assert sum(p.numel() for p in meta.parameters()) == sum(p.numel() for p in real.parameters())


def test_meta_model_leaves_real_initialisation_alone():
    """The mode is gone afterwards: a model built next draws the same weights as without it."""
    torch.manual_seed(0)
    before = QRNNLanguageModel(**CONFIGS[1]).state_dict()
    meta_model(CONFIGS[1])
    torch.manual_seed(0)
    after = QRNNLanguageModel(**CONFIGS[1]).state_dict()
    for name, tensor in before.items():
        torch.testing.assert_close(after[name], tensor, rtol=0, atol=0)


HEAVY = ("torch._dynamo", "sympy")
# Prints the heavy modules loaded, each with the code that first imported it.
_WATCH_HEAVY = """
import json, sys, traceback
first = {}
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name in HEAVY and name not in first:
            first[name] = "".join(traceback.format_stack(limit=12))
        return None
HEAVY = %r
sys.meta_path.insert(0, Watch())
"""


def _heavy_imports(code):
    proc = run_python(_WATCH_HEAVY % (HEAVY,) + code + "\nprint(json.dumps(first))", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_size_checks_import_nothing_heavy():
    """No torch._dynamo ever, and nothing heavy that torch's own meta-device module building
    does not import in that torch too (a torch release may load sympy on its own)."""
    ours = _heavy_imports("""
import torch
from qrnn.train.lm import meta_model
from qrnn.train.memory import count_parameters
from qrnn.train.setup import check_model_shapes
config = dict(vocab_size=5000, emsize=16, hidden=16, layers=2, cutoffs=[500, 2000])
assert count_parameters(config) > 0
check_model_shapes(config, {k: torch.empty(v.shape) for k, v in meta_model(config).state_dict().items()}, "x")
""")
    torchs = _heavy_imports("""
import torch
with torch.device("meta"):
    torch.nn.Embedding(5000, 16).state_dict()
    torch.nn.Linear(16, 48).state_dict()
""")
    assert "torch._dynamo" not in ours, ours["torch._dynamo"]
    extra = {name: stack for name, stack in ours.items() if name not in torchs}
    assert not extra, "\n".join(f"{name} first imported by:\n{stack}" for name, stack in extra.items())
