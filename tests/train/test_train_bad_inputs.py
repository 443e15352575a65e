"""Bad-input sweep of qrnn.train: the qrnn-train command's flags and devices, Trainer's
arguments, NaN losses and empty data. Each call must raise a TypeError or ValueError
naming the argument, or propagate the values correctly; never crash or hang.
"""

import subprocess
import sys

import pytest
import torch

from qrnn.train import Trainer, choose_precision
from qrnn.train import main as train_main


@pytest.mark.parametrize("argv, message", [
    (["--seed", "abc"], "--seed: expected an int"),
    (["--seed", str(2**80)], "--seed: expected an int in"),
    (["--lr", "nan"], "--lr: expected a positive float"),
    (["--lr", "-1"], "--lr: expected a positive float"),
    (["--clip", "inf"], "--clip: expected a positive float"),
    (["--time-budget", "inf"], "--time-budget"),
    (["--layers", "0"], "--layers"),
    (["--hidden", "1.5"], "--hidden"),
    (["--keep-last", "0"], "--keep-last"),
    (["--sample-length", "-1"], "--sample-length"),
    (["--level", "byte"], "--level"),
    (["--optimizer", "lbfgs"], "--optimizer"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_train_command_bad_flags(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1, err


@pytest.mark.parametrize("device, message", [("bogus", "is not a device"), ("meta", "cpu or cuda")]
                         + ([] if torch.cuda.is_available() else [("cuda", "no CUDA device")]))
def test_train_command_bad_device(tmp_path, device, message, capsys):
    data = tmp_path / "text.txt"
    data.write_text("hello world " * 200)
    assert train_main(["--device", device, "--data", str(data), "--no-progress",
                       "--checkpoint-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_trainer_bad_arguments():
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.nn.functional.mse_loss
    with pytest.raises(TypeError, match="model"):
        Trainer(None, opt, loss)
    with pytest.raises(TypeError, match="optimizer"):
        Trainer(model, "sgd", loss)
    with pytest.raises(TypeError, match="loss_fn"):
        Trainer(model, opt, 3)
    with pytest.raises(ValueError, match="precision"):
        Trainer(model, opt, loss, precision="fp8")
    with pytest.raises(ValueError, match="precision"):
        choose_precision("int8", torch.device("cpu"))


def test_trainer_nan_loss_propagates_and_empty_data_is_no_op():
    model = torch.nn.Linear(2, 2)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.mse_loss,
                      precision="fp32", progress=False, log=lambda message: None)
    history = trainer.fit([(torch.full((3, 2), float("nan")), torch.rand(3, 2))], epochs=1)
    assert len(history) == 1 and any(isinstance(v, float) and v != v for v in history[0].values())
    assert trainer.fit([], epochs=2) is not None


def test_library_runs_without_the_train_extra(tmp_path):
    """Without tqdm and matplotlib (the 'train' extra): qrnn, torchqrnn and the Trainer work;
    qrnn-train says in one line what to install."""
    code = (
        "import sys\n"
        "sys.modules['tqdm'] = sys.modules['matplotlib'] = None  # as if not installed\n"
        "import torch, qrnn, torchqrnn\n"
        "from qrnn.train import Trainer, main\n"
        "model = torch.nn.Linear(2, 2)\n"
        "trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.mse_loss,\n"
        "                  precision='fp32', progress=False, log=lambda message: None)\n"
        "assert len(trainer.fit([(torch.rand(3, 2), torch.rand(3, 2))], epochs=1)) == 1\n"
        "sys.exit(main(['--no-progress', '--checkpoint-dir', sys.argv[1]]))\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr == ("qrnn-train: error: qrnn-train needs matplotlib: pip install 'torch-qrnn[train]' "
                             "(from a source checkout: pip install '.[train]')\n")
