"""Strict JSON everywhere (NaN / Infinity become null, listed under "nonfinite"), and export / evaluate
refuse a model with non-finite weights instead of shipping it."""

import json
import math
import subprocess
import sys

import torch
from safetensors.torch import load_file, save_file

from llmpipe.io import dumps, write_json
from tests.conftest import torch_train_args


def test_write_json_is_strict_and_flags_what_it_nulled(tmp_path):
    write_json(tmp_path / "e.json", {"val_loss": math.nan, "perplexity": math.inf, "ok": 1.5, "rows": [1.0, -math.inf]})
    text = (tmp_path / "e.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    got = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))  # strict parse
    assert got["val_loss"] is None and got["perplexity"] is None and got["ok"] == 1.5 and got["rows"] == [1.0, None]
    assert sorted(got["nonfinite"]) == ["perplexity", "rows[1]", "val_loss"]
    assert json.loads(dumps({"loss": 2.0})) == {"loss": 2.0}  # finite records unchanged, no flag


def test_export_and_evaluate_refuse_non_finite_weights(tmp_path, prepared):
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for f in prepared["init"].iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    weights = load_file(damaged / "model.safetensors")
    name = sorted(weights)[3]
    weights[name][0, 0] = float("nan")
    save_file(weights, damaged / "model.safetensors", metadata={"format": "pt"})
    cfg = json.dumps({"export": {"dtype": "float32"}})
    exp = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmpipe",
            "export",
            "--config",
            cfg,
            "--trained",
            str(damaged),
            "--tokenizer",
            str(prepared["tokenizer"]),
            "--out",
            str(tmp_path / "hf"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert exp.returncode != 0 and f"non-finite weights in {name}" in exp.stderr, exp.stderr[-2000:]
    assert not (tmp_path / "hf").exists()
    ev = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmpipe",
            "evaluate",
            "--config",
            "{}",
            "--model",
            str(damaged),
            "--data",
            str(prepared["view"]),
            "--out",
            str(tmp_path / "eval.json"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ev.returncode != 0 and "non-finite" in ev.stderr and not (tmp_path / "eval.json").exists()
    assert torch.isnan(load_file(damaged / "model.safetensors")[name]).any()


def test_a_batch_larger_than_the_data_warns_in_plan_and_training_log(tmp_path, prepared):
    from llmpipe.plan import build
    from tests.conftest import merge

    rows = json.loads((prepared["view"] / "view.json").read_text())["train"]["rows"]
    gbs = 4 * rows  # 4 epochs in every step
    cfg = merge(
        prepared["cfg"],
        {"train": {"global_batch_size": gbs, "micro_batch_size": gbs, "max_steps": 1, "save_interval": 1, "eval_interval": 1}},
    )
    from llmpipe import config as cfgmod

    cfg = cfgmod.validate(cfg)
    plan = build(cfg, view=prepared["view"], model=prepared["init"])
    assert any(
        f"global_batch_size {gbs} exceeds the {rows} train rows" in w and "4.00 epochs per step" in w for w in plan["warnings"]
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmpipe",
            *torch_train_args(cfg, prepared["init"], prepared["view"], tmp_path / "ck", tmp_path / "m.jsonl", tmp_path / "final"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"exceeds the {rows} train rows" in proc.stderr and "4.00 epochs per" in proc.stderr
