"""Trust under damage in the torch trainer (its checkpoint module is shared with the colossal trainer):
damaged checkpoint bytes are found by their recorded sha256 and the next older intact step is resumed
(the result equals the uninterrupted run, bitwise); a non-finite loss / gradient norm stops training
naming the step, without a traceback, leaving only finite checkpoints; skips are allowed up to
train.skip_nonfinite_steps."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from llmpipe import config as cfgmod
from llmpipe.train import checkpoint as ckpt
from tests.conftest import merge, torch_train_args


def run_train(prepared, tmp, over, name, stop_after=None):
    cfg = cfgmod.validate(merge(prepared["cfg"], over))
    paths = (tmp / f"{name}-ck", tmp / f"{name}.jsonl", tmp / f"{name}-final")
    args = [sys.executable, "-m", "llmpipe", *torch_train_args(cfg, prepared["init"], prepared["view"], *paths)]
    if stop_after:
        args += ["--stop-after", str(stop_after)]
    return subprocess.run(args, capture_output=True, text=True, timeout=600)


SIX = {"train": {"max_steps": 6, "save_interval": 2, "keep_checkpoints": 3, "eval_interval": 6}}


def overwrite(path, offset=4096, size=4096):
    raw = bytearray(path.read_bytes())
    raw[offset : offset + size] = b"\x7f" * min(size, len(raw) - offset)
    path.write_bytes(bytes(raw))


def test_damaged_newest_checkpoint_falls_back_to_the_older_intact_one(tmp_path, prepared):
    assert run_train(prepared, tmp_path, SIX, "whole").returncode == 0
    first = run_train(prepared, tmp_path, SIX, "cut", stop_after=4)
    assert first.returncode == 0, first.stderr[-2000:]
    root = tmp_path / "cut-ck"
    assert ckpt.complete_steps(root) == [2, 4]
    assert json.loads((root / "step_00000004" / "checksums.json").read_text()).keys() >= {"model.safetensors", "optimizer.pt"}
    overwrite(root / "step_00000004" / "model.safetensors")
    resumed = run_train(prepared, tmp_path, SIX, "cut")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (
        "step_00000004 is damaged: model.safetensors do not match their recorded sha256; falling back to step 2" in resumed.stderr
    )
    assert "resumed from" in resumed.stderr and "step_00000002 (step 2)" in resumed.stderr
    whole, cut = (load_file(tmp_path / f"{n}-final" / "model.safetensors") for n in ("whole", "cut"))
    assert all(torch.equal(whole[k], cut[k]) for k in whole)  # bitwise the uninterrupted run


def test_restart_replaces_the_old_runs_checkpoints(tmp_path, prepared):
    """train.resume false restarts the run: the old run's steps are removed before it trains (they were
    kept as "the newest" before, so a rerun resumed the old run's step 6 and published its model)."""
    assert run_train(prepared, tmp_path, SIX, "run").returncode == 0
    assert ckpt.complete_steps(tmp_path / "run-ck") == [2, 4, 6]
    restart = merge(SIX, {"train": {"resume": False}})
    first = run_train(prepared, tmp_path, restart, "run", stop_after=2)
    assert first.returncode == 0, first.stderr[-2000:]
    assert ckpt.complete_steps(tmp_path / "run-ck") == [2]
    again = run_train(prepared, tmp_path, SIX, "run")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "step_00000002 (step 2)" in again.stderr, again.stderr[-2000:]
    assert [r["step"] for r in map(json.loads, (tmp_path / "run.jsonl").read_text().splitlines())] == list(range(1, 7))


def test_a_restarts_retry_resumes_the_restart_and_never_starts_over(tmp_path, prepared):
    """A Slurm retry, --rerun-incomplete or auto-resume runs the same command, train.resume still false:
    it resumes the restart's own checkpoints (before, every retry began again at step 0 and truncated the
    metrics, so a restart longer than one job never finished). The result equals an uninterrupted run.
    Setting resume true and then false again is a new restart."""
    assert run_train(prepared, tmp_path, SIX, "whole").returncode == 0
    assert run_train(prepared, tmp_path, merge(SIX, {"train": {"lr": 2e-3}}), "run").returncode == 0  # an old run
    restart = merge(SIX, {"train": {"resume": False}})
    first = run_train(prepared, tmp_path, restart, "run", stop_after=4)  # killed after step 4, say
    assert first.returncode == 0 and ckpt.complete_steps(tmp_path / "run-ck") == [2, 4], first.stderr[-2000:]
    retry = run_train(prepared, tmp_path, restart, "run")
    assert retry.returncode == 0, retry.stderr[-2000:]
    assert "goes on from its own checkpoints" in retry.stderr and "step_00000004 (step 4)" in retry.stderr
    assert [r["step"] for r in map(json.loads, (tmp_path / "run.jsonl").read_text().splitlines())] == list(range(1, 7))
    whole, run = (load_file(tmp_path / f"{n}-final" / "model.safetensors") for n in ("whole", "run"))
    assert all(torch.equal(whole[k], run[k]) for k in whole)  # bitwise the uninterrupted run
    assert run_train(prepared, tmp_path, SIX, "run").returncode == 0  # resume true: the restart is over
    assert not (tmp_path / "run-ck" / "restart.json").exists()
    anew = run_train(prepared, tmp_path, restart, "run", stop_after=2)
    assert "removing the earlier run's checkpoints" in anew.stderr and ckpt.complete_steps(tmp_path / "run-ck") == [2]


def test_every_checkpoint_damaged_is_refused_naming_the_way_out(tmp_path, prepared):
    assert run_train(prepared, tmp_path, SIX, "cut", stop_after=4).returncode == 0
    for step in ("step_00000002", "step_00000004"):
        overwrite(tmp_path / "cut-ck" / step / "optimizer.pt", offset=100, size=64)
    proc = run_train(prepared, tmp_path, SIX, "cut")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "optimizer.pt do not match" in proc.stderr and "no checkpoint in" in proc.stderr
    assert "set train.resume: false" in proc.stderr and not (tmp_path / "cut-final").exists()


BLOW_UP = {
    "train": {
        "lr": 1.0e3,
        "min_lr": 0.0,
        "warmup_steps": 0,
        "grad_clip": 0.0,
        "max_steps": 6,
        "save_interval": 1,
        "keep_checkpoints": 2,
        "eval_interval": 6,
    }
}  # step 1 is finite, step 2's gradient is NaN


@pytest.mark.parametrize("skips", [0, 2])
def test_non_finite_step_stops_training_and_checkpoints_stay_finite(tmp_path, prepared, skips):
    proc = run_train(prepared, tmp_path, merge(BLOW_UP, {"train": {"skip_nonfinite_steps": skips}}), "nan")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    stop = 2 + skips
    assert f"llmpipe torch-train: step {stop}: grad_norm nan: training stopped before updating the weights" in proc.stderr
    for s in range(2, stop):
        assert f"step {s}: grad_norm nan: skipped, no update" in proc.stderr
    root = tmp_path / "nan-ck"
    assert ckpt.complete_steps(root)[-1] == stop - 1
    for step in ckpt.complete_steps(root):
        weights = load_file(ckpt.step_dir(root, step) / "model.safetensors")
        assert all(torch.isfinite(t).all() for t in weights.values()), step
        assert ckpt.damaged(ckpt.step_dir(root, step)) == []
    lines = (tmp_path / "nan.jsonl").read_text().splitlines()
    records = [json.loads(x, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c))) for x in lines]  # strict
    assert [r["step"] for r in records] == list(range(1, stop))
    assert all(r.get("nonfinite") == ["grad_norm"] for r in records[1:])  # the skipped steps, flagged
    assert not (tmp_path / "nan-final").exists()


def test_skip_allowance_is_the_runs_not_the_jobs(tmp_path, prepared):
    """train.skip_nonfinite_steps counts over the run: a run stopped after skipping step 2 and resumed stops
    at step 3, as the uninterrupted run does (the count was not in the checkpoint: the resumed job skipped
    step 3 too)."""
    one = merge(BLOW_UP, {"train": {"skip_nonfinite_steps": 1}})
    first = run_train(prepared, tmp_path, one, "nan", stop_after=2)
    assert first.returncode == 0 and "step 2: grad_norm nan: skipped, no update" in first.stderr, first.stderr[-2000:]
    resumed = run_train(prepared, tmp_path, one, "nan")
    assert resumed.returncode != 0 and "step_00000002 (step 2)" in resumed.stderr, resumed.stderr[-2000:]
    assert "llmpipe torch-train: step 3: grad_norm nan: training stopped before updating the weights" in resumed.stderr
    assert "skipped, no update" not in resumed.stderr


def test_setup_mistake_is_one_line(tmp_path, prepared):
    """A view of other rows than train.seq_len stops torch-train in one line, not a traceback (per rank)."""
    seq = prepared["cfg"]["train"]["seq_len"]
    proc = run_train(prepared, tmp_path, {"train": {"seq_len": 2 * seq}}, "seq")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"llmpipe torch-train: view {prepared['view']} has rows of {seq} tokens, train.seq_len is {2 * seq}" in proc.stderr


def test_changed_hyperparameter_stops_before_any_job_and_deletes_nothing(tmp_path):
    """A finished run, then train.lr changed: one line naming the key and both ways out, before Snakemake
    deletes the old model; with train.resume=false the run goes ahead."""
    import shutil

    import yaml

    from tests.conftest import REPO, REPO_IGNORE, corpus_docs, write_jsonl

    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=REPO_IGNORE, symlinks=True)
    write_jsonl(work / "corpus.jsonl", corpus_docs(40))
    cfg = {
        "data": {"sources": ["corpus.jsonl"], "num_shards": 1, "val_fraction": 0.1},
        "tokenizer": {"vocab_size": 300},
        "model": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
        "train": {
            "seq_len": 64,
            "global_batch_size": 4,
            "micro_batch_size": 4,
            "max_steps": 2,
            "warmup_steps": 1,
            "save_interval": 2,
            "eval_interval": 2,
            "threads": 1,
        },
    }
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    final = "results/default/checkpoints/torch/final"

    def snakemake(*args):
        return subprocess.run(
            [sys.executable, "-m", "snakemake", final, *args, "--profile", "local", "--configfile", "c.yaml"],
            cwd=work,
            capture_output=True,
            text=True,
            timeout=600,
        )

    assert snakemake().returncode == 0
    before = sorted(p.name for p in (work / final).iterdir())
    cfg["train"]["lr"] = 1.0e-3
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake()
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in text
    assert "run 'default' has checkpoints trained with other settings (step_00000002: train.lr 0.003 -> 0.001)" in text
    assert "--config run=NEW" in text and "train: {resume: false} in your --configfile" in text
    assert sorted(p.name for p in (work / final).iterdir()) == before  # the old model is still there
    # FSDP2 (parallel.zero 3) cannot resume DDP's checkpoints: the backend's layout is checked there too
    cfg["train"]["lr"], cfg["parallel"] = 3.0e-3, {"zero": 3}
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake()
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "(step_00000002: torch.zero None -> 3); nothing was deleted" in text, text[-3000:]
    assert sorted(p.name for p in (work / final).iterdir()) == before
    cfg["train"]["lr"] = 1.0e-3
    del cfg["parallel"]
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    other = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "results/NEW/checkpoints/torch/final",
            "-n",
            "--profile",
            "local",
            "--configfile",
            "c.yaml",
            "--config",
            "run=NEW",
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert other.returncode == 0 and "rule train_torch:" in other.stdout  # way out 1: another run
    cfg["train"]["resume"] = False  # way out 2: restart this run
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    dry = snakemake("-n")
    assert dry.returncode == 0 and "rule train_torch:" in dry.stdout

    # Changed data (another corpus): the data stages rerun, then a job of its own stops before training, so
    # Snakemake never deletes the old model; the same one line and ways out, no traceback.
    cfg["train"].update(lr=3.0e-3, resume=True)
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    write_jsonl(work / "corpus.jsonl", corpus_docs(50)[10:])
    proc = snakemake()
    text = proc.stdout + proc.stderr + (work / "results/default/logs/resume_check.log").read_text()
    assert proc.returncode != 0 and "Traceback" not in text
    assert "run 'default' has checkpoints (step_00000002) trained on another data view than this run now has" in text
    assert "--config run=NEW" in text and "train: {resume: false} in your --configfile" in text
    assert sorted(p.name for p in (work / final).iterdir()) == before  # the old model is still there
    cfg["train"]["resume"] = False
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


# ---------------------------------------------------------------- one training core (llmpipe.train)


def test_trainers_share_one_core_no_copies():
    """torch, colossal and levanter trainers use llmpipe.train's metrics, fingerprint, optimizer, loss and
    checkpoint steps; none defines its own."""
    from llmpipe.backends.colossal import checkpoint as colossal_ckpt  # the colossal trainer's Saver
    from llmpipe.backends.colossal import train as colossal
    from llmpipe.backends.levanter import train as levanter
    from llmpipe.backends.torch import checkpoint as torch_ckpt
    from llmpipe.backends.torch import train as torch_train
    from llmpipe.train import checkpoint, loop, loss, metrics, optim, resume

    shared = {
        "MetricsWriter": metrics.MetricsWriter,
        "fingerprint": resume.fingerprint,
        "resume_state": resume.resume_state,
        "build_optimizer": optim.build_optimizer,
        "lm_loss_sum": loss.lm_loss_sum,
        "label_count": loss.label_count,
        "StepLoop": loop.StepLoop,
        "CheckpointError": checkpoint.CheckpointError,
    }
    for module in (torch_train, colossal):
        for name, obj in shared.items():
            assert getattr(module, name) is obj, (module.__name__, name)
        for old in ("Metrics", "loss_sum", "IGNORE_INDEX", "RESUME_NEUTRAL", "hashlib"):
            assert not hasattr(module, old), (module.__name__, old)
    assert colossal_ckpt.seal is checkpoint.seal and colossal_ckpt.step_dir is checkpoint.step_dir
    assert torch_ckpt.seal is checkpoint.seal and torch_ckpt.prune is checkpoint.prune
    for name in ("newest_intact", "complete_steps", "damaged", "STEP_RE"):
        assert not hasattr(torch_ckpt, name), name
    assert levanter.read_records is metrics.read_records and levanter.write_records is metrics.write_records
    assert not hasattr(levanter, "Metrics")


def test_metrics_writer_of_every_trainer_copes_with_a_line_cut_short(tmp_path):
    """A kill mid-write leaves metrics.jsonl's last line cut short; the resumed run (torch or colossal)
    keeps the whole lines up to its step, drops the rest and appends strict JSON; Levanter's merge reads
    the same file."""
    from llmpipe.backends.colossal import train as colossal
    from llmpipe.backends.levanter.train import LoggerRecords
    from llmpipe.backends.torch import train as torch_train

    whole = "".join(json.dumps({"step": s, "loss": 3.0 - s / 10}) + "\n" for s in (1, 2, 3))
    for module in (colossal, torch_train):
        path = tmp_path / module.__name__ / "metrics.jsonl"
        path.parent.mkdir()
        path.write_text(whole + '{"step": 4, "loss": 2.')  # cut short by the kill
        writer = module.MetricsWriter(path, 2, True)  # resumed from step 2: step 3 is trained again
        writer.write({"step": 3, "loss": float("nan")})
        writer.close()
        records = [
            json.loads(x, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c))) for x in path.read_text().splitlines()
        ]
        assert [r["step"] for r in records] == [1, 2, 3], module.__name__
        assert records[-1] == {"step": 3, "loss": None, "nonfinite": ["loss"]}
        (tmp_path / "lev.jsonl").write_text(whole + '{"step": 4, "lo')
        assert sorted(LoggerRecords(tmp_path / "lev.jsonl").records) == [1, 2, 3]


def test_tensorboard_after_a_resume_shows_each_step_once(tmp_path):
    """A run killed after step 4 and resumed from step 2 writes steps 3-4 again; TensorBoard (its own
    reader) shows steps 1-4 once each, 3 and 4 with the resumed run's values; a fresh start hides them all."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from llmpipe.train.metrics import MetricsWriter

    path = tmp_path / "train" / "metrics.jsonl"
    path.parent.mkdir()

    def run(resume_step: int, steps, loss):
        writer = MetricsWriter(path, resume_step, True, tensorboard=True)
        for s in steps:
            writer.write({"step": s, "loss": loss(s)})
        writer.close()
        events = EventAccumulator(str(path.parent / "tensorboard"))
        events.Reload()
        return [(e.step, round(e.value, 3)) for e in events.Scalars("loss")]

    assert run(0, [1, 2, 3, 4], lambda s: 10.0 + s) == [(1, 11.0), (2, 12.0), (3, 13.0), (4, 14.0)]
    assert run(2, [3, 4], lambda s: 20.0 + s) == [(1, 11.0), (2, 12.0), (3, 23.0), (4, 24.0)]
    assert run(0, [1], lambda s: 30.0 + s) == [(1, 31.0)]


def test_a_step_saved_on_a_gpu_resumes_on_the_cpu(tmp_path, prepared, monkeypatch):
    """optimizer.pt / scheduler.pt / rng.pt are loaded onto the CPU (each optimizer state then moves to its
    parameter's device): a step saved from rank 0's GPU would otherwise load on that GPU in every DDP rank, and
    on a host without one fail with a traceback. No GPU here: the step's files are saved again with their
    storages tagged cuda:0, as a CUDA run writes them (a stand-in for a GPU-written file, not one)."""
    import torch.serialization as ser
    from transformers import AutoModelForCausalLM

    from llmpipe.backends.torch import checkpoint as torch_ckpt

    def built():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(prepared["init"], local_files_only=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))

    model, opt, sched = built()
    model(torch.tensor([[1, 5, 9, 2]]), labels=torch.tensor([[1, 5, 9, 2]])).loss.backward()
    opt.step(), sched.step()
    step = torch_ckpt.save(tmp_path / "ck", 1, model, opt, sched, {"note": "x"}, keep=1)
    with monkeypatch.context() as m:  # what rank 0 on cuda:0 writes
        m.setattr(ser, "location_tag", lambda storage: "cuda:0")
        for name in ("optimizer.pt", "scheduler.pt", "rng.pt"):
            torch.save(torch.load(step / name, weights_only=True), step / name)
    with pytest.raises(RuntimeError, match="CUDA"):  # the file stands in for a GPU's: a plain load fails here
        torch.load(step / "optimizer.pt", weights_only=True)
    fresh, fresh_opt, fresh_sched = built()
    assert torch_ckpt.load(step, fresh, fresh_opt, fresh_sched)["step"] == 1
    saved, loaded = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert saved.keys() == loaded.keys() and all(
        torch.equal(saved[k]["exp_avg"], loaded[k]["exp_avg"]) and loaded[k]["exp_avg"].device.type == "cpu" for k in saved
    )
    assert fresh_sched.state_dict()["last_epoch"] == sched.state_dict()["last_epoch"] == 1
