"""Bad-input sweep of qrnn.train: the qrnn-train command's flags and devices, Trainer's
arguments, NaN losses and empty data. Each call must raise a TypeError or ValueError
naming the argument, or propagate the values correctly; never crash or hang.
"""

import gzip
import subprocess
import sys

import pytest
import torch

from qrnn.train import CheckpointConfig, PrecisionConfig, Trainer, choose_precision
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
        Trainer(model, opt, loss, precision=PrecisionConfig("fp8"))
    with pytest.raises(TypeError, match=r"precision must be a qrnn\.train\.PrecisionConfig .*\('fp32'\)"):
        Trainer(model, opt, loss, precision="fp32")  # the keyword's value before configs grouped it
    with pytest.raises(TypeError, match="checkpointing must be a qrnn.train.CheckpointConfig"):
        Trainer(model, opt, loss, checkpointing={"directory": "runs/x"})
    with pytest.raises(ValueError, match="checkpoint format must be 'file' or 'dcp'"):
        CheckpointConfig("runs/x", format="zip")
    with pytest.raises(ValueError, match="precision"):
        choose_precision("int8", torch.device("cpu"))


def test_trainer_nan_loss_propagates_and_empty_data_is_no_op():
    model = torch.nn.Linear(2, 2)
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.mse_loss,
                      precision=PrecisionConfig("fp32"), progress=False, log=lambda message: None)
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
        "from qrnn.train import PrecisionConfig, Trainer, main\n"
        "model = torch.nn.Linear(2, 2)\n"
        "trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.mse_loss,\n"
        "                  precision=PrecisionConfig('fp32'), progress=False, log=lambda message: None)\n"
        "assert len(trainer.fit([(torch.rand(3, 2), torch.rand(3, 2))], epochs=1)) == 1\n"
        "sys.exit(main(['--no-progress', '--checkpoint-dir', sys.argv[1]]))\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr == ("qrnn-train: error: qrnn-train needs matplotlib: pip install 'torch-qrnn[train]' "
                             "(from a source checkout: pip install '.[train]')\n")


def _not_text_files() -> dict:
    """Files that are not UTF-8 text, by kind: (content, byte offset the error names)."""
    import io
    import random
    import zipfile

    text = ("The quick brown fox jumps over the lazy dog.\n" * 400).encode()
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("train.txt", text)
    elf = b"\x7fELF\x02\x01\x01\x00" + bytes(56) + text
    latin1 = text[:1000] + "café\n".encode("latin-1") + text
    return {"random bytes": (random.Random(0).randbytes(20_000), None),
            "gzip": (gzip.compress(text, mtime=0), 1),
            "zip": (archive.getvalue(), 5),
            "ELF": (elf, 7),
            "NUL in text": (text[:5000] + b"\0" + text, 5000),
            "Latin-1": (latin1, 1003)}


@pytest.mark.parametrize("kind", list(_not_text_files()))
@pytest.mark.parametrize("level", ["char", "word"])
def test_train_command_refuses_data_that_is_not_text(tmp_path, kind, level, capsys):
    """A binary --data file is one line naming the file and the byte, exit status 2: never a
    run trained on its bytes decoded with replacement characters."""
    content, offset = _not_text_files()[kind]
    data = tmp_path / "data.bin"
    data.write_bytes(content)
    assert train_main(["--data", str(data), "--level", level, "--no-progress", "--max-steps", "1",
                       "--checkpoint-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"qrnn-train: error: {data} is not UTF-8 text (") and err.count("\n") == 1, err
    assert "pass --data a UTF-8 text file" in err and "Traceback" not in err, err
    if offset is not None:
        assert f"at byte {offset:,}" in err or f"byte {offset:,} is not UTF-8" in err, err


def test_binary_split_file_in_a_folder_is_named(tmp_path, capsys):
    """In a folder of splits the message names the split file that is not text; the library's
    in-memory loader (load_corpus) refuses it as the command's cache does."""
    from qrnn.train.data import DataError, load_corpus

    text = "the quick brown fox jumps over the lazy dog\n" * 300
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text(text, encoding="utf-8")
    (tmp_path / "valid.txt").write_bytes(text.encode() + b"\xff\xfe" + text.encode())
    assert train_main(["--data", str(tmp_path), "--level", "word", "--no-progress", "--max-steps", "1",
                       "--checkpoint-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'valid.txt'} is not UTF-8 text (byte {len(text):,} is not UTF-8)" in err, err
    with pytest.raises(DataError, match=r"valid\.txt is not UTF-8 text \(byte 13,200 is not UTF-8\)"):
        load_corpus(str(tmp_path), "word")
    single = tmp_path / "one.txt"
    single.write_bytes(text.encode() * 3 + b"\0")
    with pytest.raises(DataError, match=r"one\.txt is not UTF-8 text \(a NUL byte at byte 39,600\)"):
        load_corpus(str(single), "char")


def test_text_cut_inside_its_last_character_is_still_text(tmp_path):
    """A file truncated at a byte count (enwik8-style) may end inside a character: that one
    is replaced, the rest is read (by the command's cache and by load_corpus alike)."""
    from qrnn.train.cache import cached_corpus
    from qrnn.train.data import load_corpus

    data = tmp_path / "cut.txt"
    data.write_bytes(("naïve café déjà vu\n" * 500).encode() + "é".encode()[:1])
    in_memory = load_corpus(str(data), "char")
    cached, _ = cached_corpus(str(data), "char", say=lambda *a, **k: None, progress=False)
    assert in_memory.vocab == cached.vocab
    assert torch.equal(in_memory.test, cached.test.long()) and in_memory.test[-1] == 0  # <unk>: not in training


@pytest.mark.parametrize("hidden, message", [
    ("100000000", "parameters need at least 426 PiB (weights, gradients and adam state, float32) on cpu, which has "),
    (str(10**12), "the model is too large to build: its tensors would exceed what torch can address"),
    (str(10**20), "the model is too large to build"),
])
def test_train_command_refuses_a_model_larger_than_memory(tmp_path, hidden, message, capsys):
    """Absurd sizes are one line before anything is allocated (the parameters are counted on
    the meta device): what is needed, what is available, which flags to lower."""
    assert train_main(["--hidden", hidden, "--no-progress", "--checkpoint-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qrnn-train: error: ") and message in err, err
    assert f"lower --hidden ({hidden}), --emsize (128) or --layers (3)" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err, err


def test_model_memory_estimate_against_the_device(tmp_path, monkeypatch, capsys):
    """The estimate counts weights, gradients and the optimizer's state; CUDA's free memory
    comes from mem_get_info, and a CUDA model's weights must fit in CPU memory first."""
    from qrnn.train import memory
    from qrnn.train.settings import Settings

    monkeypatch.setattr(memory, "available_bytes", lambda device: 1 << 20)
    data = tmp_path / "text.txt"
    data.write_text("hello world\n" * 300)
    assert train_main(["--data", str(data), "--level", "word", "--optimizer", "sgd", "--hidden", "512", "--no-progress",
                       "--checkpoint-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert ("parameters need at least" in err and "(weights, gradients, float32) on cpu, which has 1.0 MiB "
            "available: lower --hidden (512), --emsize (128) or --layers (3), or use --level char" in err), err
    settings = Settings(hidden=64, emsize=16, layers=2, optimizer="adam")
    config = dict(vocab_size=100, emsize=16, hidden=64, layers=2, cutoffs=None)
    params = memory.count_parameters(config)
    monkeypatch.setattr(memory, "available_bytes", lambda device: params * 16 if device.type == "cpu" else 0)
    assert memory.check_model_fits(settings, config, torch.device("cpu")) == params  # 4 copies of 4 bytes fit
    with pytest.raises(memory.TrainError, match=r"on cuda:0, which has 0 B available"):
        memory.check_model_fits(settings, config, torch.device("cuda", 0))
    monkeypatch.undo()
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (3 << 30, 80 << 30))
    assert memory.available_bytes(torch.device("cuda", 0)) == 3 << 30
    assert memory.available_bytes(torch.device("cpu")) > 0
    assert memory.available_bytes(torch.device("meta")) is None
    assert [memory.format_bytes(n) for n in (0, 1023, 1536, 200 << 30, 3 << 60)] == [
        "0 B", "1,023 B", "1.5 KiB", "200 GiB", "3,072 PiB"]


def test_train_command_reports_a_failed_allocation_in_one_line(tmp_path, monkeypatch, capsys):
    """An allocation that fails despite the estimate (memory taken meanwhile, an estimate
    that cannot be made) is one line too; other RuntimeErrors are not disguised as it."""
    import qrnn.train.setup as setup
    from qrnn.train import memory

    monkeypatch.setattr(memory, "available_bytes", lambda device: None)  # nothing refused up front

    def cannot_allocate(**config):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 307200000000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(setup, "QRNNLanguageModel", cannot_allocate)
    argv = ["--no-progress", "--hidden", "64", "--checkpoint-dir", str(tmp_path / "run")]
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("qrnn-train: error: out of memory building the model on cpu (its ") and (
        "parameters need at least" in err and "lower --hidden (64), --emsize (128) or --layers (3)" in err), err
    assert err.count("\n") == 1, err
    assert memory.is_out_of_memory(MemoryError()) and not memory.is_out_of_memory(RuntimeError("shape mismatch"))
    assert memory.is_out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))


@pytest.mark.parametrize("case", ["binary data", "absurd hidden size"])
def test_train_command_bad_input_in_a_real_process(tmp_path, case):
    """As a user's shell sees it: `python -m qrnn.train` itself exits with status 2 and one
    line on stderr, no traceback, for a binary --data file and for a model no machine holds."""
    if case == "binary data":
        data = tmp_path / "data.gz"
        data.write_bytes(gzip.compress(b"some text\n" * 100, mtime=0))
        flags = ["--data", str(data)]
    else:
        flags = ["--hidden", "100000000"]
    result = subprocess.run([sys.executable, "-m", "qrnn.train", *flags, "--no-progress", "--max-steps", "1",
                             "--checkpoint-dir", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("qrnn-train: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert ("is not UTF-8 text" if case == "binary data" else "lower --hidden (100000000)") in result.stderr


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A run folder of a tiny character-level model (two steps on the reference text)."""
    from qrnn.train.data import default_text

    folder = tmp_path_factory.mktemp("tiny-run")
    data = folder / "text.txt"
    data.write_text(default_text()[:12_000], encoding="utf-8")
    run = folder / "run"
    assert train_main(["--data", str(data), "--max-steps", "2", "--layers", "2", "--hidden", "32", "--emsize", "16",
                       "--batch-size", "8", "--bptt", "16", "--precision", "fp32", "--no-progress",
                       "--sample-length", "0", "--checkpoint-dir", str(run)]) == 0
    return str(run)


def _generate_process(*argv):
    """qrnn-generate as its console script runs it, in a fresh interpreter."""
    code = "import sys; from qrnn.train.generate import generate_main; sys.exit(generate_main())"
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("device, message", [("bogus", "is not a device torch knows"), ("meta", "cpu or cuda")]
                         + ([] if torch.cuda.is_available() else [("cuda", "--device cuda: torch sees no CUDA")]))
def test_generate_command_bad_device_in_a_real_process(tiny_run, device, message):
    """As qrnn-train does: exit status 2 and one line naming the device, no traceback."""
    result = _generate_process("--checkpoint", tiny_run, "--device", device, "--length", "5")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("qrnn-generate: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr and "--device cpu" in result.stderr and "Traceback" not in result.stderr


def test_generate_at_an_underflowing_temperature_is_greedy(tiny_run):
    """A temperature so small that logits / temperature overflows samples greedily: the same
    text as a tiny temperature that still computes, which is the most likely token each step."""
    from qrnn.checkpoint import load
    from qrnn.train.data import Vocabulary
    from qrnn.train.lm import QRNNLanguageModel

    texts = []
    for temperature in ("1e-300", "1e-30"):
        result = _generate_process("--checkpoint", tiny_run, "--temperature", temperature, "--length", "40",
                                   "--prompt", "The ")
        assert result.returncode == 0 and result.stderr == "", result.stderr
        texts.append(result.stdout)
    assert texts[0] == texts[1]
    state = load(f"{tiny_run}/best.pt")
    model = QRNNLanguageModel(**state["model_config"]).eval()
    model.load_state_dict(state["model"])
    vocab = Vocabulary.from_state_dict(state["vocab"])
    with torch.no_grad():
        features, carried = model(vocab.encode("The ").view(-1, 1))
        greedy = []
        for _ in range(40):
            token = model.decoder(features.output[-1, 0]).argmax().view(1)
            greedy.append(token)
            features, carried = model(token.view(1, 1), carried)
    assert texts[0] == "The " + vocab.decode(torch.cat(greedy)) + "\n"


def test_split_softmax_at_an_underflowing_temperature_is_greedy():
    """The split softmax's sampling, cluster by cluster, tends to the most likely word too."""
    from qrnn.train.softmax import SplitSoftmax

    torch.manual_seed(5)
    split = SplitSoftmax(4, 30, (6, 15))
    with torch.no_grad():
        split.tail_vectors.normal_()
        split.tail_bias.normal_()
    weight, bias = torch.randn(30, 4) * 3, torch.randn(30)
    with torch.no_grad():  # as generate samples
        for _ in range(20):
            hidden = torch.randn(4)
            best = int(split.log_probs(weight, bias, hidden.view(1, -1))[0].argmax())
            for temperature in (1e-300, 1e-30):
                assert int(split.sample(weight, bias, hidden, temperature, torch.Generator().manual_seed(0))) == best
