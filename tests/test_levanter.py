"""Backend "levanter": real Levanter (marin-levanter, CPU JAX) through the Snakemake rules.

Needs .venvs/levanter (scripts/setup-env-levanter.sh; .ci/run builds it). Under CI (`CI` set) a
missing environment fails these tests; locally they skip. Nothing is faked.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml

from llmpipe import config as cfgmod
from llmpipe.backends.levanter.config import levanter_config, mixed_precision
from tests.conftest import REPO, REPO_IGNORE, merge

LEV_PY = REPO / ".venvs" / "levanter" / "bin" / "python"
SKIP = REPO_IGNORE
STEPS, SAVE, SEQ = 60, 10, 128


def need_env():
    if LEV_PY.exists():
        return
    msg = f"{LEV_PY} missing: run scripts/setup-env-levanter.sh"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)


def run_config() -> dict:
    return {
        "run": "lev",
        "data": {"max_records_per_source": 120},
        "tokenizer": {"vocab_size": 1024},
        "model": {
            "hidden_size": 64,
            "intermediate_size": 192,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
        "train": {
            "backend": "levanter",
            "seq_len": SEQ,
            "global_batch_size": 8,
            "micro_batch_size": 8,
            "max_steps": STEPS,
            "warmup_steps": 4,
            "save_interval": SAVE,
            "eval_interval": 20,
        },
        "levanter": {"python": str(LEV_PY), "jax_platforms": "cpu"},
    }


def snakemake(cwd, *args, timeout=900, popen=False):
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "--profile",
        "profiles/local",
        "--configfile",
        "config/config.yaml",
        "lev.yaml",
        *args,
    ]
    if popen:
        return subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_config_mapping(tmp_path):
    """Every shared hyperparameter lands in Levanter's config under its documented name."""
    cfg = cfgmod.validate(
        {
            "run": "r1",
            "model": {
                "hidden_size": 96,
                "intermediate_size": 200,
                "num_hidden_layers": 3,
                "num_attention_heads": 6,
                "num_key_value_heads": 3,
                "rope_theta": 5e5,
                "rms_norm_eps": 1e-6,
                "tie_word_embeddings": True,
            },
            "train": {
                "seq_len": 512,
                "global_batch_size": 64,
                "micro_batch_size": 4,
                "lr": 2e-3,
                "min_lr": 5e-4,
                "warmup_steps": 7,
                "max_steps": 333,
                "weight_decay": 0.05,
                "beta1": 0.8,
                "beta2": 0.99,
                "eps": 1e-7,
                "grad_clip": 0.5,
                "save_interval": 30,
                "eval_interval": 25,
                "seed": 99,
                "precision": "bf16",
            },
            "eval": {"batch_size": 3},
            "levanter": {"run_id": "fixed-id", "save_minutes": 7, "extra": {"trainer": {"max_eval_batches": 5}}},
        }
    )
    t, m = cfg["train"], cfg["model"]
    out = levanter_config(cfg, tmp_path / "cache", tmp_path / "ref", tmp_path / "out")
    tr, opt, mod = out["trainer"], out["optimizer"], out["model"]
    assert (tr["train_batch_size"], tr["per_device_parallelism"], tr["per_device_eval_parallelism"]) == (
        t["global_batch_size"],
        t["micro_batch_size"],
        cfg["eval"]["batch_size"],
    )
    assert (tr["num_train_steps"], tr["steps_per_eval"], tr["seed"], tr["id"]) == (
        t["max_steps"],
        t["eval_interval"],
        t["seed"],
        "fixed-id",
    )
    assert tr["checkpointer"]["keep"] == [{"every": t["save_interval"]}] and tr["checkpointer"]["save_interval"] == "7m"
    assert tr["max_eval_batches"] == 5 and tr["mp"] == "p=f32,c=bfloat16"
    assert opt["learning_rate"] == t["lr"] and abs(opt["min_lr_ratio"] * t["lr"] - t["min_lr"]) < 1e-12
    assert (
        opt["warmup"],
        opt["lr_schedule"],
        opt["beta1"],
        opt["beta2"],
        opt["epsilon"],
        opt["weight_decay"],
        opt["max_grad_norm"],
    ) == (t["warmup_steps"], "cosine", t["beta1"], t["beta2"], t["eps"], t["weight_decay"], t["grad_clip"])
    assert (
        mod["hidden_dim"],
        mod["intermediate_dim"],
        mod["num_layers"],
        mod["num_heads"],
        mod["num_kv_heads"],
        mod["layer_norm_epsilon"],
        mod["rope"]["theta"],
        mod["tie_word_embeddings"],
        mod["max_seq_len"],
    ) == (
        m["hidden_size"],
        m["intermediate_size"],
        m["num_hidden_layers"],
        m["num_attention_heads"],
        m["num_key_value_heads"],
        m["rms_norm_eps"],
        m["rope_theta"],
        m["tie_word_embeddings"],
        t["seq_len"],
    )
    assert out["train_seq_len"] == t["seq_len"] and out["hf_save_steps"] == t["max_steps"]
    assert out["data_seed"] == cfg["data"]["shuffle_seed"] and "load_checkpoint" not in tr
    assert out["data"]["auto_build_caches"] is False and out["data"]["block_cross_document_attention"] is False
    assert out["data"]["tokenizer"] == mod["tokenizer"] == mod["reference_checkpoint"] == str((tmp_path / "ref").resolve())
    assert "initialize_from_hf" not in out  # a new model: Levanter's own init from train.seed

    (tmp_path / "base").mkdir()  # a local base folder must exist (the config names it)
    cont = cfgmod.validate(
        {
            **cfg,
            "model": {**cfg["model"], "init_from": str(tmp_path / "base")},
            "train": {**t, "grad_clip": 0, "precision": "fp32"},
        }
    )
    out = levanter_config(cont, tmp_path / "cache", tmp_path / "ref", tmp_path / "out")
    assert out["initialize_from_hf"] == str((tmp_path / "ref").resolve()) and out["use_hf_model_config"] is True
    assert out["optimizer"]["max_grad_norm"] is None and out["trainer"]["mp"] == "f32"
    restart = cfgmod.validate({**cfg, "train": {**t, "resume": False}})
    assert levanter_config(restart, tmp_path / "cache", tmp_path / "ref", tmp_path / "out")["trainer"]["load_checkpoint"] is False
    for platforms, want in (("cpu", "f32"), ("tpu", "p=f32,c=bfloat16")):
        auto = cfgmod.validate({"train": {"precision": "auto"}, "levanter": {"jax_platforms": platforms}})
        assert mixed_precision(auto) == want


def test_changed_settings_refuse_to_resume(tmp_path):
    """Checkpoints of a run id are resumed only with the settings and data they were trained with (paths,
    save and eval frequency may change)."""
    from llmpipe.backends.levanter.train import check_resume

    def lev(over=None, cache="cache", ref="ref"):
        return levanter_config(cfgmod.validate(merge(cfg, over or {})), tmp_path / cache, tmp_path / ref, tmp_path / "out")

    cfg = cfgmod.validate({"levanter": {"run_id": "r"}})
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "cache.json").write_text(json.dumps({"fingerprint": "store-a"}))
    check_resume(lev())  # fresh: records the settings
    step = tmp_path / "out" / "checkpoints" / "r" / "step-3"
    step.mkdir()
    (step / "metadata.json").write_text("{}")
    shutil.copytree(tmp_path / "cache", tmp_path / "moved-cache")
    check_resume(lev(cache="moved-cache", ref="ref2"))
    check_resume(
        lev(
            {
                "train": {"save_interval": 7, "eval_interval": 3, "micro_batch_size": 2},
                "eval": {"batch_size": 2},
                "levanter": {"save_minutes": 1},
            }
        )
    )
    with pytest.raises(ValueError, match=r"optimizer.learning_rate: 0.003 -> 0.001.*levanter.run_id"):
        check_resume(lev({"train": {"lr": 1e-3}}))
    with pytest.raises(ValueError, match=r"data_seed: 0 -> 5"):
        check_resume(lev({"data": {"shuffle_seed": 5}}))
    (tmp_path / "cache" / "cache.json").write_text(json.dumps({"fingerprint": "store-b"}))  # another corpus
    with pytest.raises(ValueError, match=r"llmpipe.data: 'store-a' -> 'store-b'"):
        check_resume(lev())


def test_records_start_afresh_unless_resumed(tmp_path):
    """metrics.jsonl: a run that resumes keeps the earlier records up to its checkpoint; one that trains from
    the start (a new run id, deleted checkpoints) keeps none of an earlier run's."""
    from llmpipe.backends.levanter.train import LoggerRecords
    from llmpipe.train.metrics import write_records

    def line(step, loss):
        event = {
            "tracker": "json_logger",
            "event": "log",
            "step": step - 1,
            "metrics": {"train/loss": loss, "optim/learning_rate": 1e-3},
        }
        return "INFO levanter.json_logger " + json.dumps(event)

    path = tmp_path / "metrics.jsonl"
    for resumed, want in ((None, {1: 3.0, 2: 3.0}), (2, {1: 5.0, 2: 5.0, 3: 3.0})):
        write_records(path, [{"step": s, "loss": 5.0, "lr": 1e-3, "val_loss": 4.9} for s in range(1, 11)])
        rec = LoggerRecords(path)
        if resumed:
            rec.resumed(resumed)
        for s in range(resumed + 1 if resumed else 1, 4 if resumed else 3):
            rec.add(line(s, 3.0))
        rec.write()
        assert {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines())} == want


def test_resume_false_restarts_once(tmp_path):
    """train.resume false: the first attempt removes the run id's checkpoints and exports (no other run's);
    a retry under the same settings keeps the restart's own; other settings, or resuming in between, make
    a new restart. Levanter runs the config without load_checkpoint false (it would never resume)."""
    from llmpipe.backends.levanter.train import begin_restart, end_restart, run_settings, runnable

    cfg = cfgmod.validate({"levanter": {"run_id": "r"}, "train": {"resume": False}})
    lev = levanter_config(cfg, tmp_path / "cache", tmp_path / "ref", tmp_path / "out")
    ckpts, hf, kept = (tmp_path / "out" / d for d in ("checkpoints/r", "hf/r", "checkpoints/other"))

    def steps(n):
        for d in (ckpts / f"step-{n}", hf / f"step-{n}", kept):
            d.mkdir(parents=True, exist_ok=True)

    steps(3)  # the earlier run's
    assert begin_restart(lev, run_settings(lev))
    assert sorted(p.name for p in (tmp_path / "out" / "checkpoints").iterdir()) == ["other", "r"]
    assert [p.name for p in ckpts.iterdir()] == ["restart.json"] and not hf.exists()
    steps(5)  # the restart's own, then a retry
    assert not begin_restart(lev, run_settings(lev)) and (ckpts / "step-5").is_dir() and (hf / "step-5").is_dir()
    other = levanter_config(merge(cfg, {"train": {"lr": 1e-3}}), tmp_path / "cache", tmp_path / "ref", tmp_path / "out")
    assert begin_restart(other, run_settings(other)) and not (ckpts / "step-5").exists()
    steps(2)
    end_restart(lev)  # a run with resume true in between
    assert not (ckpts / "restart.json").exists() and (ckpts / "step-2").is_dir()
    assert begin_restart(other, run_settings(other)) and not (ckpts / "step-2").exists()

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(lev))
    ran = yaml.safe_load(runnable(config, lev).read_text())
    assert "load_checkpoint" not in ran["trainer"] and {**ran["trainer"], "load_checkpoint": False} == lev["trainer"]
    resumed = levanter_config(cfgmod.validate({"levanter": {"run_id": "r"}}), tmp_path / "c", tmp_path / "r", tmp_path / "o")
    assert runnable(config, resumed) == config


def test_optimizer_as_levanter_reads_it(tmp_path):
    """Our optimizer section parsed by Levanter's own config classes: warmup steps as written (1 included,
    which Levanter reads as a fraction when written as 1) and weight decay on every matrix, the token
    embeddings included, as our trainers; none on norms."""
    need_env()
    cases = {}
    for steps in (0, 1, 2, 50):
        cfg = cfgmod.validate({"train": {"warmup_steps": steps, "max_steps": 50}})
        cases[steps] = levanter_config(cfg, tmp_path / "cache", tmp_path / "ref", tmp_path / "out")["optimizer"]
    script = """
import json, sys
import draccus, haliax as hax, jax, jax.random as jrandom
from levanter.models.llama import LlamaConfig
from levanter.optim import OptimizerConfig
from levanter.optim.config import _convert_frac_or_steps

cases, out = json.loads(sys.argv[1]), {"warmup": {}}
for steps, d in cases.items():
    opt = draccus.decode(OptimizerConfig, d)
    out["warmup"][steps] = _convert_frac_or_steps(opt.warmup, 50)
model = LlamaConfig(max_seq_len=32, hidden_dim=16, intermediate_dim=32, num_layers=2, num_heads=2, num_kv_heads=1).build(
    hax.Axis("vocab", 64), key=jrandom.PRNGKey(0))
mask = opt.build_weight_decay_mask()(model)
flags = jax.tree_util.tree_leaves_with_path(mask, is_leaf=lambda x: isinstance(x, bool))
arrays = jax.tree_util.tree_leaves(model, is_leaf=lambda x: isinstance(x, hax.NamedArray))
out["decay"] = {jax.tree_util.keystr(p): [m, len([a for a in x.axes if a.name != "layer"])] for (p, m), x in zip(flags, arrays)}
print(json.dumps(out))
"""
    proc = subprocess.run(
        [str(LEV_PY), "-c", script, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["warmup"] == {str(s): s for s in cases}
    decay = got["decay"]
    assert ".embeddings.token_embeddings.weight" in decay and len(decay) >= 10, decay
    assert all(decayed == (rank >= 2) for decayed, rank in decay.values()), decay


def test_dry_run_lists_levanter_rules(tmp_path):
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=SKIP)
    (work / "lev.yaml").write_text(yaml.safe_dump(run_config()))
    proc = snakemake(work, "-n", timeout=120)
    assert proc.returncode == 0, proc.stderr
    for rule in ("levanter_cache", "train_levanter", "export_hf", "evaluate"):
        assert f"rule {rule}:" in proc.stdout, rule
    assert "rule train_torch:" not in proc.stdout


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The whole DAG with train.backend levanter, killed once after its first checkpoint, then rerun."""
    import psutil

    need_env()
    work = tmp_path_factory.mktemp("lev") / "repo"
    shutil.copytree(REPO, work, ignore=SKIP)
    (work / "lev.yaml").write_text(yaml.safe_dump(run_config()))
    run = work / "results" / "lev"
    ckpts = run / "checkpoints" / "levanter" / "checkpoints" / "lev"
    t0 = time.monotonic()
    first = snakemake(work, popen=True)
    try:
        while not list(ckpts.glob("step-*/metadata.json")):
            assert first.poll() is None, "the first run ended before writing a checkpoint"
            assert time.monotonic() - t0 < 600, "no Levanter checkpoint after 10 minutes"
            time.sleep(0.2)
    finally:  # interrupt: kill snakemake and every process under it (the training job included)
        procs = psutil.Process(first.pid).children(recursive=True) + [psutil.Process(first.pid)]
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        first.wait()
    assert not (run / "checkpoints" / "levanter" / "final").exists(), "the first run finished before the kill"
    saved = sorted(int(p.parent.name.split("-")[1]) for p in ckpts.glob("step-*/metadata.json"))
    log_dir = run / "logs"
    first_log = (log_dir / "train_levanter.log").read_text()
    assert snakemake(work, "--unlock", timeout=120).returncode == 0  # the killed snakemake left its lock
    second = snakemake(work)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    return {
        "work": work,
        "run": run,
        "saved": saved,
        "first_log": first_log,
        "log": (log_dir / "train_levanter.log").read_text(),
        "seconds": time.monotonic() - t0,
    }


@pytest.mark.slow
def test_rerun_resumes_from_checkpoint(trained):
    """The rerun loaded the interrupted run's newest checkpoint and trained only the steps after it."""
    last = trained["saved"][-1]
    assert last < STEPS - 1
    assert "No checkpoint found" in trained["first_log"]
    assert f"Loading checkpoint from {trained['run'] / 'checkpoints/levanter/checkpoints/lev'}/step-{last}" in trained["log"]
    steps = [
        json.loads(line.split("levanter.json_logger ", 1)[1])["step"]
        for line in trained["log"].splitlines()
        if '"event": "log"' in line and '"train/loss"' in line
    ]
    assert steps and min(steps) > last and max(steps) == STEPS - 1, (last, steps[:3], steps[-3:])
    summary = json.loads((trained["run"] / "checkpoints/levanter/final/train_summary.json").read_text())
    assert summary["resumed_from"].endswith(f"step-{last}") and summary["steps"] == STEPS
    recs = [json.loads(line) for line in (trained["run"] / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(recs[0]["step"], STEPS + 1))  # both runs, no gap, no repeat


@pytest.mark.slow
def test_loss_falls_and_export_loads(trained):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    recs = [json.loads(line) for line in (trained["run"] / "train" / "metrics.jsonl").read_text().splitlines()]
    first, last = (sum(r["loss"] for r in part) / 5 for part in (recs[:5], recs[-5:]))
    assert last < first - 0.8, (first, last)
    assert recs[-1]["tokens"] == STEPS * 8 * SEQ

    hf = trained["run"] / "hf"
    model = AutoModelForCausalLM.from_pretrained(hf)
    tok = AutoTokenizer.from_pretrained(hf)
    ids = tok("It was a dark and stormy night", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()
    ours, levanter = (
        load_file(hf / "model.safetensors"),
        load_file(trained["run"] / "checkpoints/levanter/final/model.safetensors"),
    )
    assert set(ours) >= set(levanter) and all(torch.equal(ours[k], levanter[k].float()) for k in levanter)


@pytest.mark.slow
def test_eval_matches_levanter(trained):
    """Our evaluate rule on the export == Levanter's last eval: within 1e-4 on the full rows Levanter scores
    (it drops the last partial row), within 5e-3 for eval.json, which also scores that padded row."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM

    from llmpipe.train.loss import dataset_loss

    run = trained["run"]
    summary = json.loads((run / "checkpoints/levanter/final/train_summary.json").read_text())
    assert summary["last_val_step"] == STEPS
    ev = json.loads((run / "eval.json").read_text())
    assert abs(ev["val_loss"] - summary["last_val_loss"]) < 5e-3, (ev, summary)
    cache = json.loads((run / "data/views/levanter/cache.json").read_text())
    rows = cache["splits"]["validation"]["tokens"] // SEQ
    val = datasets.load_from_disk(str(run / "data/views/hf/val")).with_format("torch")
    assert len(val) == rows + 1  # the padded last row
    model = AutoModelForCausalLM.from_pretrained(run / "hf", dtype=torch.float32)
    loss, tokens = dataset_loss(model, val.select(range(rows)), 8, torch.device("cpu"))
    assert tokens == rows * (SEQ - 1)
    assert abs(loss - summary["last_val_loss"]) < 1e-4, (loss, summary["last_val_loss"])


@pytest.mark.slow
def test_cache_holds_exactly_the_store(trained, tmp_path):
    """Levanter's own reader (TreeCache) returns, per document, exactly the token store's tokens."""
    from llmpipe.data.token_store import TokenStore

    run = trained["run"]
    dump = tmp_path / "cache.npz"
    script = (
        "import sys, numpy as np\n"
        "from levanter.store.cache import TreeCache\n"
        "out = {}\n"
        "for split in ('train', 'validation'):\n"
        "    c = TreeCache.load(f'{sys.argv[1]}/{split}', {'input_ids': np.zeros((0,), np.int32)})\n"
        "    docs = [d['input_ids'] for d in c.get_batch_sync(list(range(len(c))))]\n"
        "    out[split] = np.concatenate(docs)\n"
        "    out[split + '_lengths'] = np.array([len(d) for d in docs])\n"
        "np.savez(sys.argv[2], **out)\n"
    )
    proc = subprocess.run(
        [str(LEV_PY), "-c", script, str(run / "data/views/levanter"), str(dump)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(dump)
    store = TokenStore(run / "data/tokens/manifest.json")
    for ours, theirs in (("train", "train"), ("val", "validation")):
        stream = store.split(ours)
        tokens = stream.read(0, stream.size)
        assert np.array_equal(got[theirs], tokens), ours
        lengths = np.diff(np.append(stream.doc_starts(), stream.size))
        assert np.array_equal(got[theirs + "_lengths"], lengths), ours
        assert got[theirs].size == store.manifest["totals"][ours]["tokens"]


@pytest.mark.slow
def test_finished_run_is_a_no_op(trained, tmp_path):
    """Snakemake has nothing to do; the training command itself, run again, trains no step."""
    again = snakemake(trained["work"], "-n", timeout=120)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
    run = trained["run"]
    env = {**os.environ, "PYTHONPATH": str(trained["work"] / "src")}

    def levanter_train(config, out):
        args = ["-m", "llmpipe", "levanter-train", "--levanter-config", str(config), "--out", str(out), "--jax-platforms", "cpu"]
        return subprocess.run([str(LEV_PY), *args], capture_output=True, text=True, timeout=300, env=env)

    proc = levanter_train(run / "train/levanter/config.yaml", tmp_path / "final")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "already finished" in proc.stderr and "levanter.main.train_lm" not in proc.stderr
    assert (tmp_path / "final/model.safetensors").read_bytes() == (
        run / "checkpoints/levanter/final/model.safetensors"
    ).read_bytes()
    # the finished run under another learning rate is refused, not published as if trained with it
    lev = yaml.safe_load((run / "train/levanter/config.yaml").read_text())
    lev["optimizer"]["learning_rate"] /= 2
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(lev))
    proc = levanter_train(tmp_path / "changed.yaml", tmp_path / "changed-final")
    said = proc.stderr
    assert proc.returncode != 0 and "trained with other settings (optimizer.learning_rate" in said, said[-3000:]
    assert "Traceback" not in said
    assert not (tmp_path / "changed-final").exists()


@pytest.mark.slow
def test_neutral_settings_rerun_nothing(trained):
    """After a finished run, settings that do not change the model (logging, saving, evaluation batch,
    accumulation, threads) rerun neither training nor export; the learning rate reruns training."""
    work = trained["work"]
    base = (work / "lev.yaml").read_text()
    neutral = merge(
        run_config(),
        {
            "train": {"log_interval": 3, "save_interval": 7, "eval_interval": 9, "micro_batch_size": 4, "threads": 2},
            "eval": {"batch_size": 2, "max_batches": 3},
            "levanter": {"save_minutes": 5},
        },
    )
    try:
        (work / "lev.yaml").write_text(yaml.safe_dump(neutral))
        proc = snakemake(work, "-n", timeout=120)  # plan (memory per micro batch) and evaluate (its batch) rerun
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert all(f"rule {r}:" not in proc.stdout for r in ("train_levanter", "export_hf")), proc.stdout[-3000:]
        (work / "lev.yaml").write_text(yaml.safe_dump(merge(neutral, {"train": {"lr": 1e-3}})))
        proc = snakemake(work, "-n", timeout=120)
        assert proc.returncode == 0 and "rule train_levanter:" in proc.stdout, proc.stdout[-3000:]
    finally:
        (work / "lev.yaml").write_text(base)


@pytest.mark.slow
def test_restart_is_resumed_by_its_retry(trained, tmp_path):
    """train.resume false (load_checkpoint false): the first attempt removes the earlier run's checkpoints
    and trains from step 0; its retry after an interruption resumes the restart's own checkpoint, instead
    of starting over again, and ends with the same model."""
    run = trained["run"]
    lev = yaml.safe_load((run / "train/levanter/config.yaml").read_text())
    out, steps = tmp_path / "out", 12
    shutil.copytree(run / "checkpoints/levanter/checkpoints/lev", out / "checkpoints/lev")  # the earlier run
    lev["trainer"].update(load_checkpoint=False, num_train_steps=steps, log_dir=str(out / "logs"))
    lev["trainer"]["checkpointer"].update(base_path=str(out / "checkpoints"), keep=[{"every": 5}])
    lev.update(hf_save_path=str(out / "hf"), hf_save_steps=steps)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(lev))
    env = {**os.environ, "PYTHONPATH": str(trained["work"] / "src")}

    def levanter_train(final):
        args = ["-m", "llmpipe", "levanter-train", "--levanter-config", str(config), "--out", str(final)]
        args += ["--metrics", str(tmp_path / "metrics.jsonl"), "--jax-platforms", "cpu"]
        proc = subprocess.run([str(LEV_PY), *args], capture_output=True, text=True, timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stderr

    first = levanter_train(tmp_path / "final1")
    assert "removing" in first and "No checkpoint found" in first, first[-3000:]
    saved = sorted(int(p.parent.name.split("-")[1]) for p in (out / "checkpoints/lev").glob("step-*/metadata.json"))
    assert saved[-1] == steps - 1 and len(saved) >= 2, saved
    for step in saved[1:]:  # interrupted after its first checkpoint: the later ones and the export never made
        shutil.rmtree(out / f"checkpoints/lev/step-{step}")
    shutil.rmtree(out / "hf")
    second = levanter_train(tmp_path / "final2")
    assert "removing" not in second and f"Loading checkpoint from {out / 'checkpoints/lev'}/step-{saved[0]}" in second
    summary = json.loads((tmp_path / "final2/train_summary.json").read_text())
    assert summary["steps"] == steps and summary["resumed_from"].endswith(f"step-{saved[0]}")
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(recs[0]["step"], steps + 1))
    from safetensors.numpy import load_file

    a, b = (load_file(tmp_path / f / "model.safetensors") for f in ("final1", "final2"))
    assert a.keys() == b.keys() and all(np.allclose(a[k], b[k], rtol=0, atol=1e-5) for k in a)


@pytest.mark.slow
def test_continued_pretraining_starts_from_the_base(trained, tmp_path):
    """model.init_from: the trained run's HF export is the base of a new run on the same tokens. Levanter loads
    it (initialize_from_hf from our reference folder), so the new run's first losses are where the base ended,
    not where a new model starts."""
    run = trained["run"]
    recs = [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    scratch, ended = (sum(r["loss"] for r in part) / 3 for part in (recs[:3], recs[-3:]))
    assert ended < scratch - 0.8, (scratch, ended)  # the base learned: the two are told apart
    steps = 6
    cfg = merge(
        run_config(),
        {
            "run": "cont",
            "model": {"init_from": str(run / "hf")},
            "train": {
                "max_steps": steps,
                "save_interval": steps,
                "eval_interval": steps,
                "warmup_steps": 1,
                "lr": 1e-4,
                "min_lr": 1e-5,
            },
        },
    )
    args = ["-m", "llmpipe", "levanter-train", "--config", json.dumps(cfg), "--cache", str(run / "data/views/levanter")]
    args += ["--tokenizer", str(run / "tokenizer"), "--init", str(run / "hf"), "--output", str(tmp_path / "out")]
    args += ["--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "final"), "--metrics", str(tmp_path / "m.jsonl")]
    env = {**os.environ, "PYTHONPATH": str(trained["work"] / "src")}
    proc = subprocess.run([str(LEV_PY), *args, "--jax-platforms", "cpu"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cont = [json.loads(line)["loss"] for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert len(cont) >= 2 and abs(cont[0] - ended) < 0.5 and cont[0] < scratch - 0.6, (scratch, ended, cont)
    lev = yaml.safe_load((tmp_path / "work" / "config.yaml").read_text())
    assert lev["initialize_from_hf"] == str((tmp_path / "work" / "reference").resolve()) and lev["use_hf_model_config"]
