"""The plan against hand-computed numbers (Llama-2-7B and Llama-3-70B presets), the parameter formula
against transformers, the hardware table, and the CLI's estimate on a fresh checkout."""

import gzip
import json
import math

import pytest
import yaml

from llmpipe import plan as P
from tests.conftest import CORPUS, REPO

CONFIG = str(REPO / "config" / "config.yaml")
PRESET_7B = str(REPO / "config" / "presets" / "llama-2-7b.yaml")
PRESET_70B = str(REPO / "config" / "presets" / "llama-3-70b.yaml")
GIB = 2**30
# One explicit option so the time/cost arithmetic below does not depend on the shipped table.
GPU8 = {"devices": 8, "peak_tflops": 312, "hbm_gib": 80, "price_per_hour": 40.0, "mfu": 0.5}


def plan_for(*configs, hardware=None, rows=1000, parallel=None, **plan_keys):
    cfg = P.load_configs([CONFIG, *configs, json.dumps({"plan": plan_keys, "parallel": parallel or {}})])
    shape, _ = P.shape_from_config(cfg, None)
    data = {"source": "test", "train_rows": rows, "tokens_per_epoch": rows * cfg["train"]["seq_len"]}
    return P.make_plan(cfg, shape, P.parameters(shape), data, hardware or {"gpu8": GPU8})


def test_parameter_counts_of_the_presets_match_the_published_models():
    p7 = plan_for(PRESET_7B)["model"]
    # 2 x 32000 x 4096 (embedding + head) + 32 x (4 x 4096^2 attention + 3 x 4096 x 11008 MLP + 2 x 4096 norms) + 4096
    assert p7["parameters"] == 6_738_415_616  # meta-llama/Llama-2-7b-hf
    assert p7["matmul_parameters"] == 6_738_415_616 - 32000 * 4096
    p70 = plan_for(PRESET_70B)["model"]
    # 2 x 128256 x 8192 + 80 x (2 x 8192^2 q,o + 2 x 8192 x 1024 k,v + 3 x 8192 x 28672 + 2 x 8192) + 8192
    assert p70["parameters"] == 70_553_706_496  # meta-llama/Meta-Llama-3-70B


@pytest.mark.parametrize(
    "sizes",
    [
        dict(
            vocab_size=512,
            hidden_size=64,
            intermediate_size=160,
            num_hidden_layers=3,
            num_attention_heads=8,
            num_key_value_heads=2,
            tie_word_embeddings=False,
        ),
        dict(
            vocab_size=320,
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            tie_word_embeddings=True,
        ),
        dict(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            tie_word_embeddings=False,
        ),
    ],
)
def test_parameter_formula_equals_transformers_and_the_checkpoint(sizes, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(**sizes))
    model.save_pretrained(tmp_path)
    shape = P.Shape.from_hf(json.loads((tmp_path / "config.json").read_text()))
    assert P.parameters(shape) == model.num_parameters()
    assert P.checkpoint_parameters(tmp_path) == model.num_parameters()


def test_7b_steps_flops_time_cost_and_memory():
    plan = plan_for(PRESET_7B)  # plan: tokens 2e12, zero 1, 4 instances; train: 1024 x 4096, micro 1
    s = plan["schedule"]
    assert s["tokens_per_step"] == 4_194_304  # 1024 x 4096
    assert s["steps"] == 476_838  # ceil(2e12 / 4,194,304) = ceil(476,837.16)
    assert s["steps_from"] == "plan.tokens" and s["tokens"] == 476_838 * 4_194_304 == 2_000_003_530_752
    assert s["warmup_steps"] == 2000 and s["overlay"] is None  # the preset's max_steps agrees
    assert not [w for w in plan["warnings"] if "max_steps" in w]
    # 6 x (6,738,415,616 - 131,072,000) + 12 x 32 layers x 4096 x 4096 seq
    assert plan["flops"]["per_token"] == 39_644_061_696 + 6_442_450_944 == 46_086_512_640
    total = 46_086_512_640 * 2_000_003_530_752
    assert plan["flops"]["total"] == pytest.approx(total, rel=1e-12)  # ~9.22e22

    gpu = plan["hardware"][0]
    assert gpu["devices"] == 32 and gpu["dp"] == 32 and gpu["grad_accum"] == 32  # 1024 / (1 x 32)
    hours = total / (32 * 312e12 * 0.5) / 3600
    assert gpu["hours"] == pytest.approx(hours) and gpu["cost_usd"] == pytest.approx(hours * 40.0 * 4)
    mem = gpu["memory_bytes"]
    assert mem["weights"] == mem["grads"] == 2 * 6_738_415_616  # bf16, not sharded below ZeRO-3
    assert mem["optimizer"] == pytest.approx(12 * 6_738_415_616 / 32)  # ZeRO-1 over dp 32
    # per token and layer 2 B x (4 x 4096 + 2 x 4096 q + 2 x 4096 kv + 3 x 11008) = 131,584 B; x 4096 tokens x 32 layers
    assert mem["activations"] == 4096 * 32 * 131_584 == 17_246_978_048
    assert mem["logits"] == 4 * 4096 * 32000
    assert mem["total"] == pytest.approx(47_251_834_368)  # 44.0 GiB <= 72 GiB usable of 80
    assert gpu["fits"] is True


def test_7b_without_zero_does_not_fit_one_instance_and_says_so():
    plan = plan_for(PRESET_7B, parallel={"zero": 0, "nnodes": 1})
    gpu = plan["hardware"][0]
    # 16 B x 6,738,415,616 + 17,246,978,048 activations + 524,288,000 logits = 125,585,915,904 B = 117.0 GiB
    assert gpu["memory_bytes"]["total"] == pytest.approx(125_585_915_904)
    assert gpu["fits"] is False and gpu["usable_gib"] == pytest.approx(72.0)
    assert any("gpu8: does not fit: 117.0 GiB" in w for w in plan["warnings"]), plan["warnings"]
    checkpointed = plan_for(PRESET_7B, parallel={"zero": 0, "nnodes": 1, "activation_checkpointing": True})["hardware"][0]
    # layer inputs 2 B x 4096 per token per layer x 32 layers + one layer's full set, x 4096 tokens
    assert checkpointed["memory_bytes"]["activations"] == 4096 * (32 * 2 * 4096 + 131_584)


def test_70b_steps_flops_and_memory_under_tp_pp_zero_checkpointing():
    trn = {"devices": 32, "peak_tflops": 95, "hbm_gib": 16, "price_per_hour": 21.5, "mfu": 0.35}
    odd = {**GPU8, "devices": 5}
    plan = plan_for(PRESET_70B, hardware={"gpu8": GPU8, "trn": trn, "odd": odd})  # 16 nodes x 8; tp 8, pp 4, ZeRO-1
    s = plan["schedule"]
    assert s["tokens_per_step"] == 16_777_216  # 2048 x 8192
    assert s["steps"] == 894_070  # ceil(15e12 / 16,777,216) = ceil(894,069.67)
    # 6 x (70,553,706,496 - 128256 x 8192) + 12 x 80 x (64 x 128) x 8192
    assert plan["flops"]["per_token"] == 6 * 69_503_033_344 + 64_424_509_440 == 481_442_709_504

    gpu, t, o = plan["hardware"]
    assert (gpu["devices"], gpu["dp"], gpu["grad_accum"]) == (128, 4, 512)  # 128 / (8 x 4); 2048 / 4
    shard = 70_553_706_496 / 32
    m = gpu["memory_bytes"]
    assert m["weights"] == pytest.approx(2 * shard) and m["grads"] == pytest.approx(2 * shard)
    assert m["optimizer"] == pytest.approx(12 * shard / 4)
    # checkpointing: 20 layers per stage x 4 micro batches in flight (pp) x 2 B x 8192 + one layer's
    # 2 B x (4 x 8192 + 2 x 8192 + 2 x 1024 + 3 x 28672) = 274,432 B; x 8192 tokens / tp 8
    assert m["activations"] == 8192 * (20 * 4 * 2 * 8192 + 274_432) / 8 == 1_623_195_648
    assert m["logits"] == 4 * 8192 * 128256 / 8
    assert gpu["fits"] is True
    # the layout is the training config's (parallel.nproc_per_node 8), whatever the instance holds
    assert (t["devices"], t["dp"]) == (128, 4) and t["memory_bytes"]["optimizer"] == pytest.approx(12 * shard / 4)
    assert any("trn: training uses 8 of the instance's 32 devices" in w for w in plan["warnings"])
    assert o["dp"] is None and o["fits"] is None  # 8 processes per node on a 5-device instance
    assert any(
        "odd: 8 processes per node (parallel.nproc_per_node) but the instance has 5 devices" in w for w in plan["warnings"]
    )
    lay = plan["layout"]
    assert (lay["backend"], lay["from"], lay["tp"], lay["pp"], lay["zero"]) == ("colossal", "parallel", 8, 4, 1)
    assert lay["activation_checkpointing"] is True


def test_epochs_and_warmup_fraction_derive_steps_and_an_overlay():
    plan = plan_for(rows=1862, epochs=2, warmup_fraction=0.1)  # default: global batch 16, max_steps 120
    s = plan["schedule"]
    assert s["steps"] == 233  # ceil(2 x 1862 / 16) = ceil(232.75)
    assert s["warmup_steps"] == 23  # round(0.1 x 233)
    assert s["epochs"] == pytest.approx(233 * 16 / 1862)
    assert s["overlay"] == {"train": {"max_steps": 233, "warmup_steps": 23}}
    assert any("plan.epochs gives 233 steps" in w and "train.max_steps is 120" in w for w in plan["warnings"])
    plain = plan_for(rows=1862)["schedule"]
    assert plain["steps"] == 120 and plain["steps_from"] == "train.max_steps" and plain["overlay"] is None
    with pytest.raises(ValueError, match="'plan.tokens' and 'plan.epochs' are both set"):  # the config check
        plan_for(epochs=1, tokens=10**9)


def test_hardware_table_override_and_errors(tmp_path):
    table = P.load_hardware({"hardware": [], "hardware_file": None})
    assert {"trn1.32xlarge", "p4de.24xlarge", "p5.48xlarge", "tpu-v4-128", "tpu-v5e-256"} <= set(table)
    extra = tmp_path / "hw.yaml"
    extra.write_text(
        yaml.safe_dump(
            {
                "p5.48xlarge": {"price_per_hour": 55.0},
                "mine": {"devices": 4, "peak_tflops": 100, "hbm_gib": 24, "price_per_hour": 1, "mfu": 0.3},
            }
        )
    )
    chosen = P.load_hardware({"hardware": ["p5.48xlarge", "mine"], "hardware_file": str(extra)})
    assert list(chosen) == ["p5.48xlarge", "mine"]
    assert chosen["p5.48xlarge"]["price_per_hour"] == 55.0 and chosen["p5.48xlarge"]["devices"] == 8
    with pytest.raises(ValueError, match="unknown plan.hardware nope"):
        P.load_hardware({"hardware": ["nope"], "hardware_file": None})
    extra.write_text(yaml.safe_dump({"bad": {"devices": 0}}))
    with pytest.raises(ValueError, match="hardware 'bad': devices, peak_tflops"):
        P.load_hardware({"hardware": [], "hardware_file": str(extra)})


def corpus_facts():
    with gzip.open(CORPUS, "rt", encoding="utf-8") as fh:
        texts = [json.loads(line)["text"] for line in fh if line.strip()]
    return len(texts), sum(len(t.encode("utf-8")) for t in texts)


def test_cli_estimates_before_any_data_exists(tmp_path, capsys):
    over = json.dumps({"results_dir": str(tmp_path / "results"), "data": {"sources": [str(CORPUS)]}, "plan": {"epochs": 1}})
    out, md, overlay = tmp_path / "plan.json", tmp_path / "plan.md", tmp_path / "overlay.yaml"
    P.main(["--config", CONFIG, "--config", over, "--out", str(out), "--markdown", str(md), "--overlay", str(overlay)])
    plan = json.loads(out.read_text())
    est = plan["data"]["estimate"]
    assert plan["data"]["source"] == "estimate" and est["read_whole"] and "trained on the sample" in est["tokenizer"]
    docs, text_bytes = corpus_facts()
    assert (est["documents"], est["text_bytes"]) == (docs, text_bytes)  # read whole: exact
    assert 2.0 < est["bytes_per_token"] < 6.0  # English with a 4k BPE
    assert plan["data"]["train_rows"] == est["train_tokens"] // 256  # remainder: drop
    steps = math.ceil(plan["data"]["train_rows"] / 16)  # 1 epoch at global batch 16
    assert yaml.safe_load(overlay.read_text()) == {"train": {"max_steps": steps, "warmup_steps": 10}}
    text = md.read_text()
    assert text == capsys.readouterr().out
    for name in ("trn1.32xlarge", "p4de.24xlarge", "p5.48xlarge", "tpu-v4-128", "tpu-v5e-256", "| fits |"):
        assert name in text, name


def test_estimate_from_a_prefix_extrapolates_by_size(tmp_path, monkeypatch):
    from llmpipe.plan import tokens as plan_tokens

    cfg = P.load_configs([CONFIG, json.dumps({"data": {"sources": [str(CORPUS)]}})])
    whole = plan_tokens.sample_source(0, str(CORPUS), cfg["data"])
    monkeypatch.setattr(plan_tokens, "SAMPLE_BYTES", CORPUS.stat().st_size // 4)
    part = plan_tokens.sample_source(0, str(CORPUS), cfg["data"])
    assert whole["read_whole"] and not part["read_whole"] and len(part["texts"]) < len(whole["texts"])
    assert part["text_bytes"] == pytest.approx(whole["text_bytes"], rel=0.05)
    assert part["documents"] == pytest.approx(whole["documents"], rel=0.1)


def test_hub_tokenizer_source_is_read_from_the_run_that_downloaded_it(tmp_path):
    """tokenizer.source org/name@rev: the plan uses <run>/tokenizer when its hub.json names that repo and
    revision (never the id as a path), and says to run the tokenizer stage when it does not."""
    import shutil

    from llmpipe import config as cfgmod
    from llmpipe.data.tokenizer import tokenizer_sha256
    from tests.conftest import GPT2

    cfg = cfgmod.load({"run": "r", "results_dir": str(tmp_path), "tokenizer": {"source": "org/gpt2@v1"}})
    with pytest.raises(ValueError, match="Hub id not downloaded yet"):
        P.shape_from_config(cfg, None)
    tok = tmp_path / "r" / "tokenizer"
    shutil.copytree(GPT2, tok)
    (tok / "hub.json").write_text(json.dumps({"source": "hub", "repo_id": "org/gpt2", "revision": "v1", "commit": "c"}))
    assert P.tokenizer_folder(cfg) == tok
    assert P._tokenizer_matches(cfg, 0, tokenizer_sha256(GPT2)) and not P._tokenizer_matches(cfg, 0, "0" * 64)
    shape, where = P.shape_from_config(cfg, None)
    assert shape.vocab_size >= 50257 and where.endswith(str(tok))
    other = cfgmod.load({"run": "r", "results_dir": str(tmp_path), "tokenizer": {"source": "org/gpt2@v2"}})
    assert P.tokenizer_folder(other) is None and not P._tokenizer_matches(other, 0, tokenizer_sha256(GPT2))


def test_store_counts_rows_from_the_manifest_or_its_folder(prepared):
    """--store takes the token store's manifest.json or its folder (a folder was a bare IsADirectoryError):
    rows are the store's train tokens in seq_len rows, as the packed view holds them."""
    from llmpipe.plan.inputs import data_from_store

    cfg, manifest = prepared["cfg"], prepared["manifest"]
    train = json.loads(manifest.read_text())["totals"]["train"]["tokens"]
    seq, view = cfg["train"]["seq_len"], json.loads((prepared["view"] / "view.json").read_text())["train"]["rows"]
    for given in (manifest, manifest.parent):
        data = data_from_store(given, cfg)
        assert data["train_rows"] == P.rows_for(train, seq, cfg["data"]["remainder"]) == view


def test_training_longer_than_the_slurm_runtime_is_warned_with_the_attempts_it_needs(tmp_path):
    """--time-limit (the training rule's runtime; the workflow passes it under Slurm): a plan over it names
    the attempts needed, a run past its retries, and a save interval no attempt reaches (every retry would
    start over). Limits are set from the plan's own estimate."""
    base = {"results_dir": str(tmp_path / "results"), "data": {"sources": [str(CORPUS)]}}

    def plan(limit=None, attempts=1, table=False, **over):
        out = tmp_path / "plan.json"
        named = {} if table else {"plan": {"hardware": ["p5.48xlarge"]}}
        args = ["--config", CONFIG, "--config", json.dumps({**base, **named, **over}), "--out", str(out)]
        if limit is not None:
            args += ["--time-limit", str(limit), "--attempts", str(attempts), "--train-rule", "train_torch"]
        P.main(args)
        return json.loads(out.read_text())

    free = plan()
    hours, steps = free["hardware"][0]["hours"], free["schedule"]["steps"]
    assert free["time_limit"] is None and not [w for w in free["warnings"] if "runtime" in w]
    minutes = hours * 60 / 2.5  # the run takes 2.5 runtimes: 3 attempts
    save = max(1, steps // 10)  # a checkpoint every tenth of the run: well inside one attempt
    fits = plan(minutes, 3, train={"save_interval": save})
    (w,) = [w for w in fits["warnings"] if "runtime" in w]
    assert fits["hardware"][0]["attempts_needed"] == 3 and "at least 3 of 3 attempts" in w and "train_torch" in w
    assert f"train.save_interval {save} steps" in w
    assert fits["time_limit"] == {"rule": "train_torch", "minutes": minutes, "attempts": 3}
    short = plan(minutes, 2, train={"save_interval": save})
    (w,) = [w for w in short["warnings"] if "runtime" in w]
    assert "would stop unfinished" in w and "retries 1" in w and "at least 2)" in w
    for save in (steps, steps * 10):  # one checkpoint, at the end: no attempt reaches it (a save_interval past the end too)
        never = plan(minutes, 5, train={"save_interval": save})
        (w,) = [w for w in never["warnings"] if "runtime" in w]
        assert f"{steps} steps between checkpoints (train.save_interval {save})" in w and "every retry starts over" in w
        assert f"below {int(steps * minutes / (hours * 60))}" in w
    roomy = plan(hours * 60 * 1.5, 1)
    assert roomy["hardware"][0]["attempts_needed"] == 1 and not [w for w in roomy["warnings"] if "runtime" in w]
    table = plan(minutes, 1, table=True)  # the whole table is not where this run trains
    assert not [w for w in table["warnings"] if "runtime" in w]
