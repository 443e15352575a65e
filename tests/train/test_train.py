"""qrnn.train: the training loop, its command line, exact resume, fp16 loss scaling, DDP."""

import json
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import qrnn
from conftest import assert_same_training_state
from qrnn.checkpoint import load
from qrnn.train import CheckpointConfig, PrecisionConfig, ScheduleConfig, Trainer, choose_precision, fit, generate_main
from qrnn.train import main as train_main
from qrnn.train.data import BPTTBatches, Vocabulary, default_text, load_corpus, split_text

TINY = ["--layers", "2", "--hidden", "32", "--emsize", "16", "--batch-size", "8", "--bptt", "16",
        "--warmup", "5", "--lr", "3e-3", "--no-progress", "--sample-length", "40"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    """About 12,000 characters of the default corpus: an epoch is ~85 steps of a tiny model."""
    path = tmp_path_factory.mktemp("data") / "tiny.txt"
    path.write_text(default_text()[:12_000], encoding="utf-8")
    return str(path)


def _latest(run_dir):
    with qrnn.checkpoint.AsyncCheckpointer(run_dir) as scanner:
        return scanner.latest()


# ---------------------------------------------------------------- data

def test_char_vocabulary_round_trip_and_unknowns():
    vocab = Vocabulary.build("hello world\n", "char")
    ids = vocab.encode("hold €")
    assert ids.dtype == torch.int64
    assert ids[-1].item() == 0  # unseen character -> <unk>
    assert vocab.decode(vocab.encode("hello")) == "hello"
    assert Vocabulary.from_state_dict(vocab.state_dict()) == vocab


def test_word_vocabulary_adds_eos_and_orders_by_frequency():
    vocab = Vocabulary.build("b a a\na c\n", "word")
    assert vocab.tokens[:3] == ["<unk>", "a", "<eos>"]
    assert vocab.encode("a zz\n").tolist() == [1, 0, 2]


def test_split_is_90_5_5_at_line_boundaries():
    text = "".join(f"line {i}\n" for i in range(1000))
    train, valid, test = split_text(text)
    assert train + valid + test == text
    assert train.endswith("\n") and valid.endswith("\n")
    assert abs(len(train) / len(text) - 0.9) < 0.01 and abs(len(valid) / len(text) - 0.05) < 0.01


def test_rank_shards_together_are_the_global_batch():
    ids = torch.randperm(1000)
    whole = BPTTBatches(ids, 8, 7)
    shards = [BPTTBatches(ids, 8, 7, rank=r, world=2) for r in range(2)]
    assert len(whole) == len(shards[0]) == len(shards[1])
    for i in range(len(whole)):
        x, y = whole[i]
        assert torch.equal(torch.cat([s[i][0] for s in shards], 1), x)
        assert torch.equal(torch.cat([s[i][1] for s in shards], 1), y)
        assert torch.equal(x[1:], y[:-1])


def test_folder_layout(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"wiki.{split}.tokens").write_text(f"some {split} words here\n" * 50)
    corpus = load_corpus(str(tmp_path), "word")
    assert corpus.vocab.level == "word" and corpus.train.numel() == 250


# ---------------------------------------------------------------- precision

def test_auto_precision_says_why():
    precision, reason = choose_precision("auto", torch.device("cpu"))
    assert precision in ("bf16", "fp32") and reason.startswith("auto: CPU")
    assert choose_precision("fp16", torch.device("cpu")) == ("fp16", "requested")


_X86_FLAGS = "fpu vme de pse tsc msr pae mce cx8 apic sep sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c avx2 bmi2"
_CPUINFO = {  # /proc/cpuinfo heads: (text, bf16 in hardware)
    "x86 AVX2 (2-core VM)": (f"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: {_X86_FLAGS}\n", False),
    "x86 AVX-512 without BF16": (f"processor\t: 0\nflags\t\t: {_X86_FLAGS} avx512f avx512bw avx512_vnni\n", False),
    "x86 Cooper Lake (avx512_bf16)": (f"processor\t: 0\nflags\t\t: {_X86_FLAGS} avx512f avx512_bf16\n", True),
    "x86 Sapphire Rapids (amx_bf16)": (f"processor\t: 0\nflags\t\t: {_X86_FLAGS} avx512f amx_bf16 amx_tile\n", True),
    "aarch64 Neoverse N1": ("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 "
                            "crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs\n", False),
    "aarch64 Neoverse V1 (bf16)": ("processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics "
                                   "fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 sve asimdfhm dit uscat "
                                   "ilrcpc flagm ssbs paca pacg dcpodp svei8mm svebf16 i8mm bf16 dgh rng\n", True),
}


@pytest.mark.parametrize("machine", list(_CPUINFO))
def test_auto_precision_picks_bf16_only_on_cpus_with_bf16_arithmetic(machine, tmp_path, monkeypatch):
    """--precision auto on a CPU: bfloat16 only with AVX512-BF16 or AMX-BF16 (x86) or the
    BF16 extension (aarch64); float32 on an AVX2 or plain AVX-512 CPU, where torch emulates
    bfloat16 (an epoch was no faster than float32's on a 2-core AVX2 machine)."""
    from functools import partial

    from qrnn.train import precision

    text, native = _CPUINFO[machine]
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(text)
    monkeypatch.setattr(precision, "cpu_bf16_support", partial(precision.cpu_bf16_support, cpuinfo=str(cpuinfo)))
    chosen, reason = choose_precision("auto", torch.device("cpu"))
    assert chosen == ("bf16" if native else "fp32"), reason
    assert reason.startswith("auto: CPU has ") and str(cpuinfo) in reason, reason
    assert ("no bf16" in reason) == (machine == "aarch64 Neoverse N1"), reason
    assert choose_precision("auto", torch.device("meta"))[0] == "fp32"  # neither cpu nor cuda: whatever the CPU


def test_bf16_detection_without_cpuinfo_asks_torch(tmp_path, monkeypatch):
    """Where there is no /proc/cpuinfo (macOS, Windows) torch's x86 probes decide."""
    from qrnn.train import precision

    missing = str(tmp_path / "no-cpuinfo")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert precision.cpu_bf16_support(missing) == (False, "CPU has neither avx512_bf16 nor amx_bf16 "
                                                          "(torch.cpu probes)")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert precision.cpu_bf16_support(missing) == (True, "CPU has amx_bf16 (torch.cpu probes)")


@pytest.mark.parametrize("fused", [False, True], ids=["adam", "fused-adam"])
def test_fp16_skipped_step_does_not_update_or_advance_the_schedule(fused):
    """An inf gradient on one step: that step is skipped (parameters equal a control run that
    leaves it out), counted, the scale backs off, and the LR schedule does not advance."""
    torch.manual_seed(0)
    batches = [(torch.randn(4, 8), torch.randn(4, 3)) for _ in range(4)]
    initial = nn.Linear(8, 3)

    def make(precision, scaler):
        model = nn.Linear(8, 3)
        model.load_state_dict(initial.state_dict())
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1, fused=fused)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
        return Trainer(model, optimizer, nn.functional.mse_loss, schedule=ScheduleConfig(scheduler=scheduler),
                       precision=PrecisionConfig(precision, clip_norm=1.0, grad_scaler=scaler), progress=False)

    scaler = torch.amp.GradScaler("cpu", init_scale=128.0, growth_factor=2.0, backoff_factor=0.5,
                                  growth_interval=1)
    trainer = make("fp16", scaler)
    poison_step = 2
    trainer.module.weight.register_hook(
        lambda grad: torch.full_like(grad, float("inf")) if trainer.step == poison_step else grad)
    for x, y in batches:
        trainer.train_step(x, y)
    control = make("fp16", torch.amp.GradScaler("cpu", enabled=False))
    for i, (x, y) in enumerate(batches):
        if i != poison_step:
            control.train_step(x, y)

    assert trainer.skipped_steps == 1 and trainer.step == 4
    assert scaler.get_scale() == 128.0 * 2.0 ** 3 * 0.5 ** 1
    assert trainer.schedule.scheduler.last_epoch == 3 == control.schedule.scheduler.last_epoch
    assert trainer.optimizer.param_groups[0]["lr"] == control.optimizer.param_groups[0]["lr"]
    for p, q in zip(trainer.module.parameters(), control.module.parameters()):
        assert torch.isfinite(p).all()
        torch.testing.assert_close(p, q)


def test_fit_any_model_with_checkpoints(tmp_path):
    """The library form on a user's own (stateless) model: history, rotation, best.pt."""
    torch.manual_seed(0)
    data = [(torch.randn(16, 4), torch.randn(16, 1)) for _ in range(5)]
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    history = fit(model, data, optimizer, nn.functional.mse_loss, valid_data=data[:2], epochs=3,
                  precision=PrecisionConfig("fp32"), checkpointing=CheckpointConfig(str(tmp_path), keep_last=2),
                  progress=False)
    assert [r["epoch"] for r in history] == [1, 2, 3] and all(r["complete"] for r in history)
    assert history[-1]["valid_loss"] < history[0]["valid_loss"]
    assert sorted(os.listdir(tmp_path)) == ["best.pt", "ckpt-000000000010.pt", "ckpt-000000000015.pt"]
    saved = load(tmp_path / "ckpt-000000000015.pt")
    assert saved["progress"]["epoch"] == 3 and saved["progress"]["position"] == 0
    assert torch.equal(saved["model"]["0.weight"], model[0].weight)


# ---------------------------------------------------------------- end to end

def test_tiny_run_end_to_end(tiny_data, tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert train_main(["--data", tiny_data, "--epochs", "2", "--checkpoint-dir", run_dir] + TINY) == 0
    out = capsys.readouterr().out
    assert "precision" in out and "epoch   1 |" in out and "epoch   2 |" in out and "sample:" in out
    assert "valid bpc" in out and "ckpt stall" in out
    records = [json.loads(line) for line in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["epoch"] for r in records] == [1, 2]
    assert records[1]["valid_loss"] < records[0]["valid_loss"]
    with open(os.path.join(run_dir, "loss.png"), "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    best = load(os.path.join(run_dir, "best.pt"))
    assert best["progress"]["best_valid_loss"] == records[1]["valid_loss"]
    assert best["vocab"]["level"] == "char"
    # torch.load alone reads it (no qrnn needed by whoever consumes the file).
    plain = torch.load(_latest(run_dir), weights_only=True)
    assert plain["progress"]["epoch"] == 2

    assert generate_main(["--checkpoint", run_dir, "--prompt", "The ", "--length", "30"]) == 0
    sample = capsys.readouterr().out
    assert sample.startswith("The ") and len(sample) > 30


def test_resume_is_bit_identical(tiny_data, tmp_path):
    """--epochs 2 in one go == --epochs 1 then --resume --epochs 2 == a stop mid-epoch then
    --resume: same weights, optimizer, scaler and schedule, bit for bit (fp16: scaler state).
    The resumed runs take their settings (fp16 included) from the checkpoint."""
    fresh = ["--data", tiny_data, "--precision", "fp16"] + TINY + ["--sample-length", "0"]
    resume = ["--resume", "--no-progress", "--sample-length", "0"]
    one_go, split, mid = (str(tmp_path / name) for name in ("one_go", "split", "mid"))
    assert train_main(fresh + ["--epochs", "2", "--checkpoint-dir", one_go]) == 0
    assert train_main(fresh + ["--epochs", "1", "--checkpoint-dir", split]) == 0
    assert train_main(resume + ["--epochs", "2", "--checkpoint-dir", split]) == 0
    assert train_main(fresh + ["--epochs", "2", "--max-steps", "100", "--checkpoint-dir", mid]) == 0
    assert train_main(resume + ["--checkpoint-dir", mid]) == 0
    reference = load(_latest(one_go))
    for other in (split, mid):
        assert_same_training_state(reference, load(_latest(other)))
    # The records too: one per epoch, a resumed epoch's covering all of it.
    records = {run: [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
               for run in (one_go, split, mid)}
    for other in (split, mid):
        assert len(records[other]) == len(records[one_go]) == 2
        for got, want in zip(records[other], records[one_go]):
            for key in ("epoch", "complete", "step", "tokens", "valid_loss", "skipped_steps"):
                assert got[key] == want[key], (other, key)
            assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-12)


# ---------------------------------------------------------------- errors

@pytest.mark.parametrize("argv, message", [
    (["--epochs", "0"], "--epochs: expected a positive int"),
    (["--precision", "fp8"], "--precision: invalid choice"),
    (["--batch-size", "many"], "--batch-size: expected a positive int"),
    (["--dropout", "1.5"], "--dropout: expected a number in [0, 1)"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--dropout", "half"], "--dropout: expected a number in [0, 1), got 'half'"),
    (["--sample-length", "-3"], "--sample-length: expected an int >= 0, got '-3'"),
    (["--seed", str(2**64)], "--seed: expected an int in [-2**63, 2**63 - 2**16)"),
])
def test_bad_flags_give_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bad_data_and_checkpoints_give_one_line(tiny_data, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    (tmp_path / "folder").mkdir()
    other = tmp_path / "other.txt"
    other.write_text(default_text()[5000:20000])
    run_dir = str(tmp_path / "run")
    assert train_main(["--data", tiny_data, "--max-steps", "2", "--checkpoint-dir", run_dir] + TINY) == 0
    capsys.readouterr()
    # The reference text differs between Python versions: count its validation characters.
    with open(tiny_data, encoding="utf-8") as fh:
        valid_tokens = len(split_text(fh.read())[1])
    cases = [
        (["--data", str(tmp_path / "missing.txt")], "no such file or folder"),
        (["--data", str(empty)], "is empty"),
        (["--data", str(tmp_path / "folder")], "folder has no train.txt/valid.txt/test.txt"),
        (["--data", tiny_data, "--batch-size", "4096"],
         f"validation split: {valid_tokens} tokens are too few for --batch-size 4096"),
        (["--data", tiny_data, "--checkpoint-dir", run_dir], "already holds checkpoints"),
        (["--data", tiny_data, "--checkpoint-dir", run_dir, "--resume", "--hidden", "64"],
         "--hidden 64 conflicts with the checkpoint, trained with --hidden 32"),
        (["--data", str(other), "--checkpoint-dir", run_dir, "--resume"],
         "training data differs from the checkpoint's"),
        (["--checkpoint-dir", str(tmp_path / "nothing"), "--resume"], "no checkpoint in"),
        (["--data", tiny_data, "--resume", "auto"], "--resume auto needs --checkpoint-dir"),
        (["--data", tiny_data, "--checkpoint-dir", run_dir, "--resume", "auto", "--hidden", "64"],
         "--hidden 64 conflicts with the checkpoint"),
    ]
    for argv, message in cases:
        assert train_main(argv + ["--no-progress"]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
    assert generate_main(["--checkpoint", tiny_data]) == 2
    assert "cannot read checkpoint" in capsys.readouterr().err
    (tmp_path / "no-checkpoints").mkdir()
    assert generate_main(["--checkpoint", str(tmp_path / "no-checkpoints")]) == 2
    assert "folder holds no checkpoint" in capsys.readouterr().err
    torch.save({"weights": torch.ones(2)}, tmp_path / "foreign.pt")
    assert generate_main(["--checkpoint", str(tmp_path / "foreign.pt")]) == 2
    assert "is not a qrnn-train checkpoint" in capsys.readouterr().err


def test_resume_without_a_folder_takes_the_newest_run(tiny_data, tmp_path, monkeypatch, capsys):
    """--resume with no --checkpoint-dir continues the newest run under ./runs."""
    monkeypatch.chdir(tmp_path)
    assert train_main(["--data", tiny_data, "--resume", "--no-progress"] + TINY) == 2
    assert "no run with a checkpoint under runs/" in capsys.readouterr().err
    assert train_main(["--data", tiny_data, "--max-steps", "2", "--no-progress"] + TINY) == 0
    capsys.readouterr()
    assert train_main(["--data", tiny_data, "--max-steps", "4", "--resume", "--no-progress"] + TINY) == 0
    assert "resum" in capsys.readouterr().out.lower()


def test_command_line_error_has_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "qrnn.train", "--data", str(tmp_path / "nope")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no such file or folder" in result.stderr


# ---------------------------------------------------------------- many processes

def test_two_process_ddp_stays_in_sync_and_resumes(tiny_data, tmp_path):
    run_dir = str(tmp_path / "ddp")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
              "-m", "qrnn.train", "--data", tiny_data, "--checkpoint-dir", run_dir, "--precision", "fp32"] + TINY
    first = subprocess.run(launch + ["--max-steps", "6"], capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2 processes" in first.stdout and "ranks in sync: 2 processes" in first.stdout
    saved = load(_latest(run_dir))
    assert saved["progress"]["step"] == 6 and len(saved["rng"]) == 2 and len(saved["carry"]) == 2
    # Ranks draw different dropout masks: their RNG streams differ.
    assert not torch.equal(saved["rng"][0]["torch"], saved["rng"][1]["torch"])
    second = subprocess.run(launch + ["--max-steps", "10", "--resume"], capture_output=True, text=True,
                            env=env, timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming" in second.stdout and "ranks in sync: 2 processes" in second.stdout
    assert load(_latest(run_dir))["progress"]["step"] == 10


def test_header_counts_one_in_the_singular(tiny_data, tmp_path, monkeypatch, capsys):
    """"1 layer", "1 epoch", "1 thread": the header lines say a count of one in the singular."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    argv = ["--data", tiny_data, "--layers", "1", "--epochs", "1", "--max-steps", "2", "--no-progress",
            "--sample-length", "0", "--checkpoint-dir", str(tmp_path / "run")]
    assert train_main(argv) == 0
    out = capsys.readouterr().out
    assert "QRNN language model, 1 layer, " in out and "; 1 epoch, seed" in out and ", 1 thread; precision" in out
    assert not any(f"1 {noun}s" in out for noun in ("layer", "epoch", "thread")), out


def test_resume_with_the_softmax_auto_chose(tiny_data, tmp_path, capsys):
    """A run whose --softmax auto chose full (a character vocabulary) resumes with an explicit
    --softmax full; --softmax adaptive is refused in one line naming what auto chose."""
    run = str(tmp_path / "run")
    argv = ["--data", tiny_data, "--checkpoint-dir", run, "--epochs", "1"] + TINY + ["--sample-length", "0"]
    assert train_main(argv + ["--max-steps", "2"]) == 0
    assert "softmax full" in capsys.readouterr().out
    assert train_main(argv + ["--max-steps", "4", "--resume", "--softmax", "full"]) == 0
    assert "(resuming " in capsys.readouterr().out
    assert train_main(argv + ["--resume", "--softmax", "adaptive"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qrnn-train: error: --softmax adaptive conflicts with the checkpoint, trained with "
                          "--softmax auto (which chose full): ") and err.count("\n") == 1, err
