"""ColossalAI backend on CPU: the real colossalai 0.5.0 in .venvs/colossal (scripts/setup-env-colossal.sh),
two gloo processes, a tiny Llama, through the Snakemake rule. Nothing is faked; what needs a GPU
(Gemini, ZeRO, HybridAdam, tp > 1, flash-attn) is not run here (README, "ColossalAI backend")."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import datasets
import pytest
import torch
import yaml

from tests.conftest import REPO, REPO_IGNORE, corpus_docs, merge, write_jsonl

VENV_PY = REPO / ".venvs" / "colossal" / "bin" / "python"
SKIP = REPO_IGNORE


def need_env():
    if VENV_PY.exists():
        return
    if os.environ.get("CI"):
        pytest.fail(f"{VENV_PY} is missing: CI must build it with scripts/setup-env-colossal.sh")
    pytest.skip(f"no ColossalAI environment: run scripts/setup-env-colossal.sh to build {VENV_PY}")


# ---------------------------------------------------------------- collator (main environment)


def test_collator_keeps_every_eos_unmasked(prepared):
    """Packed rows hold EOS between documents; the tokenizer's pad id is EOS here, so a mask derived
    from `input_ids != pad_id` (ColossalAI's LLaMA trainer) would hide them. Ours must not."""
    from transformers import AutoTokenizer

    from llmpipe.backends.colossal.collate import collate

    tok = AutoTokenizer.from_pretrained(prepared["tokenizer"])
    eos = tok.eos_token_id
    ds = datasets.load_from_disk(str(prepared["view"] / "train"))
    batch = collate(ds[list(range(len(ds)))])
    is_eos = batch["input_ids"] == eos
    assert int(is_eos.sum()) > 10  # the rows really are packed documents
    assert bool((batch["attention_mask"][is_eos] == 1).all())
    assert bool((batch["labels"][is_eos] == batch["input_ids"][is_eos]).all())
    assert int((batch["input_ids"] != eos).long().eq(0).sum()) == int(is_eos.sum())  # what pad = eos would mask
    assert batch["input_ids"].dtype == torch.long and batch["attention_mask"].dtype == torch.long

    val = datasets.load_from_disk(str(prepared["view"] / "val"))  # val_remainder pad: padding at the end only
    vb = collate(val[list(range(len(val)))])
    pad = vb["attention_mask"] == 0
    assert bool((vb["labels"][pad] == -100).all()) and bool((vb["labels"][~pad] == vb["input_ids"][~pad]).all())


PRESET_7B = REPO / "config" / "presets" / "llama-2-7b-colossal.yaml"


def preset_7b():
    """The gpu-colossal preset's 7B: its shape and train section."""
    from llmpipe.plan.arithmetic import Shape

    preset = yaml.safe_load(PRESET_7B.read_text())
    shape = Shape.from_hf({**preset["model"], "vocab_size": preset["tokenizer"]["vocab_size"]})
    return shape, preset["train"], preset["parallel"]


def test_gemini_placement_offloads_the_least_optimizer_state_that_fits_one_gpu():
    """The preset's 7B on one 80 GiB GPU: Gemini's default (all on the GPU) is over the plan's estimate
    (it ran out of memory on an H100); the placement moves the least optimizer state to CPU that fits."""
    from llmpipe.backends.colossal.placement import SLACK, STEP, gemini_static

    shape, t, p = preset_7b()
    gpu = 80 * 2**30
    one = gemini_static(shape, t["seq_len"], t["micro_batch_size"], 1, 1, p["activation_checkpointing"], gpu)
    assert one["estimate"]["total"] > one["budget"]  # everything on the GPU does not fit
    assert 0 < one["offload_optim_frac"] < 1 and one["offload_param_frac"] == 0
    assert one["placed"]["total"] <= one["budget"] + SLACK
    assert one["placed"]["optimizer"] == pytest.approx(one["estimate"]["optimizer"] * (1 - one["offload_optim_frac"]))
    less = one["placed"]["total"] + STEP * one["estimate"]["optimizer"]  # one step less offloaded
    assert less > one["budget"]
    # the preset's own layout (8 GPUs, ZeRO-3 over them) fits without offloading anything
    eight = gemini_static(shape, t["seq_len"], t["micro_batch_size"], 1, p["nproc_per_node"], True, gpu)
    assert eight["estimate"]["total"] <= eight["budget"]
    assert (eight["offload_optim_frac"], eight["offload_param_frac"]) == (0.0, 0.0)


@pytest.mark.parametrize("run_dir", ["h100-2026-11-27", "h100-2026-11-27b"])
def test_gemini_placement_counts_gradients_in_the_parameter_chunks_and_stays_above_the_h100_run(run_dir):
    """Without accumulation Gemini writes gradients into the bf16 parameter chunks (no memory of their
    own); with it, they have chunks apart. The estimate at each placement measured on an H100 (the 7B,
    micro 1, one GPU; benchmarks/<run_dir>/c7b.json: 45 % offloaded, then 25 % by the current estimate) is not
    below that run's peak memory."""
    from llmpipe.backends.colossal.placement import gemini_static
    from llmpipe.plan.arithmetic import GIB, memory, parameters

    shape, t, _ = preset_7b()
    plan = memory(shape, parameters(shape), t["seq_len"], 1, 2, 1, 1, 1, 3, True)
    one = gemini_static(shape, t["seq_len"], 1, 1, 1, True, 80 * GIB)["estimate"]
    assert one["grads"] == 0 and one["total"] == pytest.approx(sum(v for k, v in one.items() if k != "total"))
    assert gemini_static(shape, t["seq_len"], 1, 2, 1, True, 80 * GIB)["estimate"]["grads"] == plan["grads"] > 0
    run = json.loads((REPO / "benchmarks" / run_dir / "c7b.json").read_text())[0]
    frac = float(re.search(r"offload_optim_frac ([0-9.]+)", run["placement"])[1])
    assert (run["shape"], run["micro"], run["world"]) == ("7b", 1, 1) and frac > 0
    assert one["total"] - frac * one["optimizer"] >= run["peak_memory_gib"] * GIB


def test_gemini_placement_offloads_parameters_only_beyond_the_whole_optimizer_state():
    from llmpipe.backends.colossal.placement import CAP, SLACK, gemini_static

    shape, t, _ = preset_7b()
    base = gemini_static(shape, t["seq_len"], 1, 1, 1, True, 10**15)["estimate"]
    model = base["weights"] + base["grads"]
    gpu = int((base["activations"] + base["logits"] + 0.4 * model) / CAP)  # room for 40 % of the parameters
    got = gemini_static(shape, t["seq_len"], 1, 1, 1, True, gpu)
    assert got["offload_optim_frac"] == 1.0 and 0.6 <= got["offload_param_frac"] < 0.7
    assert got["placed"]["optimizer"] == 0 and got["placed"]["total"] <= got["budget"] + SLACK
    with pytest.raises(ValueError, match=r"cannot fit .* activations .* lower train.micro_batch_size"):
        gemini_static(shape, t["seq_len"], 1, 1, 1, False, int(base["activations"] / 2))


def test_gemini_placement_keeps_what_the_config_sets_and_the_schema_bounds_it():
    from llmpipe.backends.colossal.train import gemini_placement

    shape, t, _ = preset_7b()
    model = {**yaml.safe_load(PRESET_7B.read_text())["model"], "vocab_size": shape.vocab_size}
    c = {"gradient_checkpointing": True, "offload_optim_frac": 0.3, "offload_param_frac": None}
    t = {**t, "global_batch_size": t["micro_batch_size"]}
    got = gemini_placement(c, t, model, 1, 80 * 2**30)
    assert got["offload_optim_frac"] == 0.3 and got["offload_param_frac"] == 0.0
    assert "set in colossal" in got["note"] and "offload_optim_frac" in got["note"]
    # both given: used as given, even where the estimate says nothing fits (no ValueError)
    both = gemini_placement({**c, "offload_param_frac": 1.0, "offload_optim_frac": 1.0}, t, model, 1, 2**30)
    assert (both["offload_optim_frac"], both["offload_param_frac"]) == (1.0, 1.0)
    from llmpipe import config as cfgmod

    base = {"train": {"backend": "colossal"}}
    assert cfgmod.validate({**base, "colossal": {"offload_optim_frac": 0.5}})["colossal"]["offload_param_frac"] is None
    for bad in (1.5, "half"):
        with pytest.raises(cfgmod.ConfigError, match="offload_optim_frac"):
            cfgmod.validate({**base, "colossal": {"offload_optim_frac": bad}})


def test_the_colossal_keys_the_trainer_reads_reach_its_job(tmp_path):
    """rule train_colossal's config JSON (read by colossal-train) holds colossal.offload_* as set (they were
    left out: the trainer saw null, auto, and a change did not rerun it)."""
    from llmpipe import config as cfgmod
    from llmpipe.backends.colossal.checks import TRAIN_KEYS

    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=REPO_IGNORE)
    given = {"offload_optim_frac": 0.3, "offload_param_frac": 0.1, "flash_attention": False}
    r = snakemake(work, "-n", "-p", "--config", f"colossal={json.dumps(given)}", profile="profiles/gpu-colossal")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    sent = re.search(r"printf '%s' '(\{[^']*\})' > \S*colossal-config.json", r.stdout)
    assert sent, r.stdout[-3000:]
    got = cfgmod.load(sent.group(1))["colossal"]
    assert {k: got[k] for k in given} == given and set(json.loads(sent.group(1))["colossal"]) == set(TRAIN_KEYS)


def test_make_plugin_hands_the_placement_to_colossalais_gemini_plugin():
    """The real GeminiPlugin (ColossalAI 0.5.0, .venvs/colossal) takes the placement as given; built on CPU,
    not run (Gemini needs CUDA)."""
    need_env()
    code = """if True:
        import json
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)  # as torchrun
        from llmpipe.backends.colossal.train import make_plugin
        c = {"plugin": "gemini", "tp": 1, "pp": 1, "zero_stage": 0}
        t = {"grad_clip": 1.0, "global_batch_size": 2, "micro_batch_size": 2}
        p = make_plugin(c, t, "bf16", False, 1, {"offload_optim_frac": 0.45, "offload_param_frac": 0.0, "note": "x"})
        keys = ("placement_policy", "shard_param_frac", "offload_optim_frac", "offload_param_frac")
        print(json.dumps({k: p.gemini_config[k] for k in keys}))
    """
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([str(VENV_PY), "-W", "ignore", "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"placement_policy": "static", "shard_param_frac": 1.0, "offload_optim_frac": 0.45, "offload_param_frac": 0.0}


def test_cpu_refuses_gpu_only_layouts_by_name():
    from llmpipe.backends.colossal.train import check_layout

    base = {"plugin": "ddp", "tp": 1, "pp": 1, "zero_stage": 0}
    check_layout(base, 2, on_gpu=False)
    with pytest.raises(ValueError, match="colossal.plugin gemini needs CUDA"):
        check_layout({**base, "plugin": "gemini"}, 2, on_gpu=False)
    with pytest.raises(ValueError, match="parallel.tp > 1 and parallel.zero > 0 need CUDA"):
        check_layout({**base, "plugin": "3d", "tp": 2}, 2, on_gpu=False)
    with pytest.raises(ValueError, match="parallel.pp > 1 needs CUDA"):
        check_layout({**base, "plugin": "3d", "pp": 2}, 2, on_gpu=False)
    with pytest.raises(ValueError, match="apply to colossal.plugin 3d only"):
        check_layout({**base, "tp": 2}, 2, on_gpu=True)
    with pytest.raises(ValueError, match="not a multiple of parallel.tp x parallel.pp = 4"):
        check_layout({**base, "plugin": "3d", "tp": 2, "pp": 2}, 6, on_gpu=True)


def test_config_refuses_what_colossalai_would_refuse_in_the_job():
    """Read in ColossalAI 0.5.0, not run (GPU only): Gemini writes gradients into the bf16 weight chunks, so a
    skipped non-finite step would leave them as weights; HybridParallelPlugin takes ZeRO 0 / 1 with pp > 1 and
    its 1F1B schedule needs at least pp micro batches. Each is named at config time, not a job's traceback."""
    from llmpipe import config as cfgmod

    def problems(**over):
        base = {"train": {"backend": "colossal", "global_batch_size": 8, "micro_batch_size": 2}}
        try:
            cfgmod.validate(merge(base, over))
        except cfgmod.ConfigError as exc:
            return str(exc)
        return ""

    assert "train.skip_nonfinite_steps 1 cannot be honoured" in problems(train={"skip_nonfinite_steps": 1})
    assert problems(train={"skip_nonfinite_steps": 1}, colossal={"plugin": "zero2"}) == ""
    pp = {"colossal": {"plugin": "3d"}, "parallel": {"pp": 4, "nproc_per_node": 8, "zero": 1}}
    assert problems(**pp, train={"global_batch_size": 16}) == ""  # 16 rows / (micro 2 x dp 2): 4 micro batches
    assert "parallel.pp 4 needs at least 4 micro batches a step, train.global_batch_size 8 gives 2" in problems(**pp)
    zero2 = merge(pp, {"parallel": {"zero": 2}})
    assert "parallel.pp 4 takes parallel.zero 0 or 1 (ColossalAI), not 2" in problems(**zero2, train={"global_batch_size": 16})
    # keys another plugin would drop silently, and ddp's save of tied embeddings (safetensors refuses shared
    # tensors: the run died at its first checkpoint, run on CPU with 2 gloo processes)
    for plugin in ("zero2", "3d", "ddp", "gemini_auto"):
        said = problems(colossal={"plugin": plugin, "offload_optim_frac": 1.0})
        assert f"'colossal.offload_optim_frac' applies to plugin gemini only, not '{plugin}'" in said, plugin
    assert "offload" not in problems(colossal={"plugin": "gemini", "offload_optim_frac": 1.0})
    tied = {"model": {"tie_word_embeddings": True}}
    assert "colossal.plugin ddp cannot checkpoint a model with tied embeddings" in problems(**tied, colossal={"plugin": "ddp"})
    assert problems(**tied, colossal={"plugin": "3d"}) == ""


def test_a_tp_that_does_not_divide_the_heads_is_named_before_any_job(prepared, tmp_path):
    """ColossalAI's Llama policy asserts at booster.boost, on every rank, that parallel.tp divides the query and
    the key/value heads. Config validation names it (model.*, or model.init_from's config.json), and so does
    the trainer from its --init folder (a Hub base is checked there) before building anything."""
    from llmpipe import config as cfgmod
    from llmpipe.backends.colossal.train import main

    def problems(**over):
        base = {"train": {"backend": "colossal"}, "colossal": {"plugin": "3d"}, "parallel": {"tp": 4, "nproc_per_node": 4}}
        try:
            cfgmod.validate(merge(base, over))
        except cfgmod.ConfigError as exc:
            return str(exc)
        return ""

    kv = "parallel.tp 4 does not divide model.num_key_value_heads 2 (ColossalAI splits the attention heads over the tp ranks)"
    assert kv in problems(model={"num_attention_heads": 4, "num_key_value_heads": 2})
    assert "num_attention_heads" not in problems(model={"num_attention_heads": 4, "num_key_value_heads": 2})
    assert "does not divide model.num_attention_heads 6" in problems(model={"hidden_size": 96, "num_attention_heads": 6})
    assert problems(model={"num_attention_heads": 4, "num_key_value_heads": 4}) == ""
    assert problems(model={"num_key_value_heads": 2}, parallel={"tp": 2, "nproc_per_node": 2}) == ""
    # a base model's own heads (prepared init: 4 heads, 2 KV heads), not the model.* sizes
    got = problems(model={"init_from": str(prepared["init"]), "num_key_value_heads": 4}, train={"seq_len": 64})
    assert "parallel.tp 4 does not divide model.init_from's config.json: num_key_value_heads 2" in got

    cfg = merge(prepared["cfg"], {"train": {"backend": "colossal"}, "colossal": {"plugin": "3d"}})
    cfg["parallel"] = {**cfg["parallel"], "tp": 4}  # as a job would get it, unchecked
    paths = {"--init": prepared["init"], "--data": prepared["view"], "--checkpoints": tmp_path / "ck"}
    args = [x for k, v in {**paths, "--metrics": tmp_path / "m.jsonl", "--out": tmp_path / "out"}.items() for x in (k, str(v))]
    threads = torch.get_num_threads()
    try:
        with pytest.raises(SystemExit) as exc:
            main(["--config", json.dumps(cfg), *args])
    finally:
        torch.set_num_threads(threads)
    assert str(exc.value) == f"llmpipe colossal-train: parallel.tp 4 does not divide {prepared['init']}/config.json: " + (
        "num_key_value_heads 2 (ColossalAI splits the attention heads over the tp ranks)"
    )
    assert not (tmp_path / "ck").exists()
    # a config without Llama's head counts (GPT-2's n_head), or tp 1: nothing to check, no KeyError
    from llmpipe.backends.colossal.checks import head_problems

    assert head_problems(4, {"n_head": 12}, "x: ") == [] and head_problems(1, {"num_attention_heads": 6}, "x: ") == []


def test_validation_runs_as_many_forwards_on_every_rank(prepared):
    """Under Gemini every forward gathers the weights from all ranks, so a rank with fewer validation rows
    hung the others: each rank now runs the same number of forwards, the extra ones on a row whose labels
    count for nothing; the summed loss and count equal one pass over the split."""
    from types import SimpleNamespace

    from llmpipe.backends.colossal.train import Trainer
    from llmpipe.train.view import load_view

    _, val = load_view(prepared["view"], prepared["cfg"]["train"])
    dp, size = 4, 2
    assert len(val) % (dp * size), "pick dp x batch that does not divide the split"
    seen = {}

    def rank(r):
        calls = seen.setdefault(r, [])

        def forward(batch):
            calls.append(batch)
            return torch.tensor(1.0, dtype=torch.float64) * int((batch["labels"] != -100).sum()), (batch["labels"] != -100).sum()

        lay = SimpleNamespace(dp_rank=r, dp_size=dp, sum_replicas=lambda x: x)
        fake = SimpleNamespace(model=torch.nn.Linear(1, 1), device=torch.device("cpu"), val_ds=val, lay=lay, forward=forward)
        fake.cfg = {"eval": {"batch_size": size}}
        return Trainer.validate(fake)

    results = [rank(r) for r in range(dp)]
    assert len({len(c) for c in seen.values()}) == 1, {r: len(c) for r, c in seen.items()}
    labelled = sum(int((torch.as_tensor(val[i]["labels"]) != -100).sum()) for i in range(len(val)))
    assert sum(n for _, n in results) == labelled


def test_resume_fingerprint_covers_the_parallel_layout(prepared):
    """A checkpoint resumes only under the same recipe and layout; gemini_auto (the OOM fallback)
    resumes gemini's checkpoints; launch-only keys do not matter."""
    from llmpipe import config as cfgmod
    from llmpipe.backends import get
    from llmpipe.backends.colossal.checks import layout_of, resume_layout
    from llmpipe.train.resume import fingerprint

    def fingerprint_of(cfg):  # what the colossal trainer records and checks (and the workflow before any job)
        sections = get("colossal").resume_sections(cfg)
        assert sections == {"colossal": resume_layout(layout_of(cfg))}
        return fingerprint(cfg, prepared["init"], prepared["view"], **sections)

    def fp(parallel=None, **colossal):
        return fingerprint_of(
            cfgmod.validate(
                {
                    **prepared["cfg"],
                    "train": {**prepared["cfg"]["train"], "backend": "colossal"},
                    "colossal": colossal,
                    "parallel": parallel or {},
                }
            )
        )

    base = fp(plugin="gemini")
    assert fp(plugin="gemini_auto") == base
    assert fp(plugin="gemini", launcher="colossalai", master_port=1234) == base
    assert fp(plugin="3d") != base and fp({"tp": 2, "nproc_per_node": 2}, plugin="3d") != fp({"nproc_per_node": 2}, plugin="3d")
    cfg = cfgmod.validate(
        {
            **prepared["cfg"],
            "train": {**prepared["cfg"]["train"], "backend": "colossal"},
            "colossal": {"plugin": "gemini"},
            "parallel": {},
        }
    )
    cfg["train"]["lr"] *= 2
    assert fingerprint_of(cfg) != base


def test_colossalai_launcher_on_many_nodes_needs_a_hostfile(tmp_path):
    """colossalai run on 2 nodes: a hostfile is needed, one of fewer hosts is named, and the command says how
    many of its hosts to use (--num_nodes; without it colossalai run took every host listed)."""
    from llmpipe import config as cfgmod

    over, two = tmp_path / "o.yaml", {"train": {"backend": "colossal"}, "parallel": {"nnodes": 2}, "results_dir": str(tmp_path)}

    def dry(colossal: dict, *targets: str) -> subprocess.CompletedProcess:
        over.write_text(yaml.safe_dump(merge(two, {"colossal": {"launcher": "colossalai", **colossal}})))
        cmd = [sys.executable, "-m", "snakemake", "-n", "-p", *targets, "--configfile", str(over)]
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)

    proc = dry({})
    assert proc.returncode != 0
    assert "'colossal.launcher' colossalai on 'parallel.nnodes' > 1 needs 'colossal.hostfile'" in proc.stdout + proc.stderr
    hosts = tmp_path / "hosts"
    hosts.write_text("# the nodes\nnode-1\n\n")
    with pytest.raises(cfgmod.ConfigError, match="'colossal.hostfile' lists 1 host\\(s\\), fewer than 'parallel.nnodes' 2"):
        cfgmod.validate(merge(two, {"colossal": {"launcher": "colossalai", "hostfile": str(hosts)}}))
    hosts.write_text("node-1\nnode-2\nnode-3\n")
    proc = dry({"hostfile": str(hosts)}, f"{tmp_path}/default/checkpoints/colossal/final")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "colossalai run --nproc_per_node 1 --num_nodes 2 --hostfile" in proc.stdout


# ---------------------------------------------------------------- through the Snakemake rule


def snakemake(cwd, *args, timeout=600, profile="profiles/local"):
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--profile", profile, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def metrics(run):
    return [json.loads(line) for line in (run / "train" / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    need_env()
    work = tmp_path_factory.mktemp("colossal") / "repo"
    shutil.copytree(REPO, work, ignore=SKIP)
    write_jsonl(work / "corpus.jsonl", corpus_docs(60))
    return work


def run_config(work, colossal: dict, name: str = "t", parallel: dict | None = None) -> tuple:
    """Both tests train run `name` (so the data stages run once): Snakemake reruns training when
    the colossal settings change; each test first removes the other's checkpoints."""
    cfg = {
        "run": name,
        "results_dir": str(work / "results"),
        "data": {"sources": [str(work / "corpus.jsonl")], "num_shards": 1, "val_fraction": 0.1},
        "tokenizer": {"source": "train", "vocab_size": 512},
        "model": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
        "train": {
            "backend": "colossal",
            "seq_len": 64,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "lr": 1e-2,
            "min_lr": 1e-3,
            "warmup_steps": 2,
            "max_steps": 10,
            "save_interval": 5,
            "eval_interval": 5,
            "seed": 7,
            "threads": 1,
        },
        "colossal": {"python": str(VENV_PY), **colossal},
        "parallel": {"nproc_per_node": 2, **(parallel or {})},
    }
    path = work / f"{colossal['plugin']}.yaml"
    shutil.rmtree(work / "results" / name / "checkpoints" / "colossal", ignore_errors=True)
    path.write_text(yaml.safe_dump(cfg))
    return path, work / "results" / name


def check_final(final):
    """HF folder: sharded safetensors + index, config, generation config, tokenizer."""
    names = {p.name for p in final.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
        "train_summary.json",
    } <= names, names
    assert any(n.startswith("model-") and n.endswith(".safetensors") for n in names), names


LOGITS = """
import sys, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=False).eval()
ids = torch.arange(3, 40).reshape(1, -1)
with torch.no_grad():
    torch.save(m(input_ids=ids).logits, sys.argv[2])
"""


@pytest.mark.slow
def test_ddp_via_colossalai_run_exports_a_model_both_environments_load(work, tmp_path):
    cfg, run = run_config(work, {"plugin": "ddp", "launcher": "colossalai", "hostfile": str(write_hostfile(tmp_path))})
    proc = snakemake(work, f"{run}/eval.json", "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (run / "logs" / "train_colossal.log").read_text()
    assert "Training on All Nodes" in log and "plugin ddp" in log and "world 2, dp 2" in log, log[-3000:]

    recs = metrics(run)
    assert [r["step"] for r in recs] == list(range(1, 11))
    assert recs[-1]["loss"] < recs[0]["loss"] - 0.3, [r["loss"] for r in recs]
    final = run / "checkpoints" / "colossal" / "final"
    check_final(final)

    # The exported folder loads in the colossal env (transformers 4.51) and here (5.x): same logits.
    script = tmp_path / "logits.py"
    script.write_text(LOGITS)
    subprocess.run([str(VENV_PY), str(script), str(final), str(tmp_path / "old.pt")], check=True, timeout=300)
    subprocess.run([sys.executable, str(script), str(final), str(tmp_path / "new.pt")], check=True, timeout=300)
    old, new = (torch.load(tmp_path / f, weights_only=True) for f in ("old.pt", "new.pt"))
    assert old.shape == new.shape and torch.allclose(old, new, atol=1e-5)

    # export + evaluate (main environment) agree with the trainer's own validation
    ev = json.loads((run / "eval.json").read_text())
    last = [r for r in recs if "val_loss" in r][-1]
    assert abs(ev["val_loss"] - last["val_loss"]) < 1e-4 and ev["tokens"] == last["val_tokens"]


def write_hostfile(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("localhost\n")
    return path


@pytest.mark.slow
def test_hybrid_parallel_matches_torch_backend_and_resumes(work, tmp_path):
    cfg, run = run_config(work, {"plugin": "3d"}, parallel={"tp": 1, "pp": 1})
    final = run / "checkpoints" / "colossal" / "final"
    proc = snakemake(work, str(final), "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (run / "logs" / "train_colossal.log").read_text()
    assert "torch.distributed.run --standalone --nproc_per_node 2" in log and "plugin 3d (tp 1, pp 1, zero 0)" in log
    check_final(final)
    first = metrics(run)
    assert first[-1]["loss"] < first[0]["loss"] - 0.3

    # The same recipe with the plain torch backend (one process): the hyperparameter mapping agrees.
    from llmpipe import config as cfgmod
    from llmpipe.backends.torch.train import train

    tcfg = cfgmod.load(str(cfg))
    tcfg["train"]["backend"] = "torch"
    tcfg["train"]["document_masking"] = False  # the colossal trainer attends across documents: like with like
    train(
        tcfg, run / "checkpoints" / "init", run / "data" / "views" / "hf", tmp_path / "ck", tmp_path / "m.jsonl", tmp_path / "out"
    )
    ref = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    for a, b in zip(first, ref, strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-4 and abs(a["lr"] - b["lr"]) < 1e-12, (a, b)
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-3 * b["grad_norm"], (a, b)

    # Resume: damage the last checkpoint's weights (sealed with their sha256) and drop the result; the
    # rule names the damaged file and continues from step 5.
    from llmpipe.train.checkpoint import damaged

    ck = run / "checkpoints" / "colossal"
    assert sorted(p.name for p in ck.glob("step_*")) == ["step_00000005", "step_00000010"]
    assert damaged(ck / "step_00000005") == [] == damaged(ck / "step_00000010")
    shard = sorted((ck / "step_00000010" / "model").glob("*.safetensors"))[0]
    raw = bytearray(shard.read_bytes())
    raw[-4096:] = b"\x7f" * 4096
    shard.write_bytes(bytes(raw))
    shutil.rmtree(final)
    proc = snakemake(work, str(final), "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (run / "logs" / "train_colossal.log").read_text()
    assert f"step_00000010 is damaged: model/{shard.name} do not match" in log and "falling back to step 5" in log
    assert "resumed from" in log and "step_00000005 (step 5)" in log
    again = metrics(run)
    assert [r["step"] for r in again] == list(range(1, 11))
    assert json.loads((final / "train_summary.json").read_text())["resumed_from_step"] == 5
    for a, b in zip(first, again, strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-6, (a, b)


# The trainer refuses pp > 1 on CPU (ColossalAI's p2p code calls torch.distributed.is_hccl_available, which
# CPU torch builds lack): this runs the real trainer with that probe added and the refusal lifted.
PP_ON_CPU = """
import sys, torch.distributed as dist
dist.is_hccl_available = getattr(dist, "is_hccl_available", lambda: False)
import llmpipe.backends.colossal.train as T
check = T.check_layout
T.check_layout = lambda c, world, on_gpu: check(c, world, on_gpu or c["pp"] > 1)
T.main(sys.argv[1:])
"""


@pytest.mark.slow
def test_pipeline_validation_with_tied_embeddings_scores_the_trained_model(prepared, tmp_path):
    """plugin 3d, pp 2, tied embeddings: the validation forward (no optimizer) left ColossalAI to all-reduce
    the shared weight's gradient, None after zero_grad: a TypeError on every rank at the first validation.
    Its val_loss now equals evaluate's on the final folder. Also: grad_clip 0 still reports the gradient norm
    (max_norm inf: ColossalAI computes it only for max_norm > 0, so the non-finite guard had none), and the
    final folder keeps the initial model's generation config (it was derived from config.json again)."""
    need_env()
    from llmpipe import config as cfgmod
    from llmpipe.evaluate import evaluate
    from llmpipe.model.init import init_model

    over = {
        "model": {"tie_word_embeddings": True},
        "train": {"backend": "colossal", "max_steps": 4, "save_interval": 4, "eval_interval": 2, "grad_clip": 0},
        "colossal": {"plugin": "3d"},
        "parallel": {"nproc_per_node": 2, "pp": 2},
    }
    cfg = cfgmod.validate(merge(prepared["cfg"], over))
    init_model(cfg, prepared["tokenizer"], tmp_path / "init")
    generation = json.loads((tmp_path / "init" / "generation_config.json").read_text())
    generation.update(do_sample=True, temperature=0.6, top_p=0.9)  # a base's sampling settings
    (tmp_path / "init" / "generation_config.json").write_text(json.dumps(generation))
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    (tmp_path / "pp.py").write_text(PP_ON_CPU)
    args = ["--config", tmp_path / "cfg.json", "--init", tmp_path / "init", "--data", prepared["view"]]
    args += ["--tokenizer", prepared["tokenizer"], "--checkpoints", tmp_path / "ck", "--metrics", tmp_path / "m.jsonl"]
    run = [str(VENV_PY), "-W", "ignore", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [*run, str(tmp_path / "pp.py"), *map(str, args), "--out", str(tmp_path / "final")],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    recs = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2, 3, 4] and [r["step"] for r in recs if "val_loss" in r] == [2, 4]
    assert all(r["grad_norm"] is not None and r["grad_norm"] > 0 for r in recs), recs
    final = tmp_path / "final"
    assert json.loads((final / "config.json").read_text())["tie_word_embeddings"] is True
    kept = json.loads((final / "generation_config.json").read_text())
    assert (kept["do_sample"], kept["temperature"], kept["top_p"]) == (True, 0.6, 0.9), kept
    ev = evaluate(final, prepared["view"], tmp_path / "eval.json", cfg["eval"]["batch_size"], document_masking=False)
    assert abs(ev["val_loss"] - recs[-1]["val_loss"]) < 1e-4 and ev["tokens"] == recs[-1]["val_tokens"]


def test_a_process_offloading_optimizer_state_gets_its_share_of_the_cpus(monkeypatch):
    """HybridAdam's CPU kernel updates the offloaded state with OpenMP: such a process gets its share of
    the CPUs it may run on (never fewer than train.threads); without offload train.threads stands."""
    from llmpipe.backends.colossal.train import offload_threads, use_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    none = {"offload_optim_frac": 0.0, "offload_param_frac": 0.0}
    assert offload_threads(None, 2) == offload_threads(none, 2) == 2
    assert offload_threads({**none, "offload_optim_frac": 0.25}, 2) == 8
    assert offload_threads({**none, "offload_param_frac": 0.5}, 12) == 12
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # torchrun's
    before = torch.get_num_threads()
    try:
        use_threads(3)
        assert torch.get_num_threads() == 3 and os.environ["OMP_NUM_THREADS"] == "3"
    finally:
        torch.set_num_threads(before)
