"""Export and evaluate ship and score with the tokenizer the token store was made with, or refuse
naming both sha256s and the way out."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from llmpipe.data.tokenizer import tokenizer_sha256
from tests.conftest import REPO


def llmpipe(*args):
    return subprocess.run([sys.executable, "-m", "llmpipe", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def evaluate(cfg, model, view, out):
    return llmpipe("evaluate", "--config", cfg, "--model", str(model), "--data", str(view), "--out", str(out), "--threads", "1")


def edited_copy(folder, dest):
    """The tokenizer folder with one merge rule less in tokenizer.json (a real, loadable other tokenizer)."""
    shutil.copytree(folder, dest)
    data = json.loads((dest / "tokenizer.json").read_text())
    data["model"]["merges"] = data["model"]["merges"][:-1]
    (dest / "tokenizer.json").write_text(json.dumps(data))
    return dest


def test_export_and_evaluate_refuse_another_tokenizer(prepared, tmp_path):
    cfg = json.dumps({"export": {"dtype": "float32"}, "eval": {"batch_size": 4}})
    other = edited_copy(prepared["tokenizer"], tmp_path / "other-tokenizer")
    recorded, changed = tokenizer_sha256(prepared["tokenizer"]), tokenizer_sha256(other)
    assert recorded != changed
    refused = llmpipe(
        "export",
        "--config",
        cfg,
        "--trained",
        str(prepared["init"]),
        "--tokenizer",
        str(other),
        "--manifest",
        str(prepared["manifest"]),
        "--out",
        str(tmp_path / "hf-bad"),
    )
    assert refused.returncode != 0 and not (tmp_path / "hf-bad").exists()
    line = refused.stderr.strip().splitlines()[-1]
    assert line.startswith("llmpipe export: ") and recorded in line and changed in line and "--forcerun tokenizer" in line

    ok = llmpipe(
        "export",
        "--config",
        cfg,
        "--trained",
        str(prepared["init"]),
        "--tokenizer",
        str(prepared["tokenizer"]),
        "--manifest",
        str(prepared["manifest"]),
        "--out",
        str(tmp_path / "hf"),
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert tokenizer_sha256(tmp_path / "hf") == recorded  # shipped byte for byte
    scored = evaluate(cfg, tmp_path / "hf", prepared["view"], tmp_path / "eval.json")
    assert scored.returncode == 0, scored.stderr[-2000:]
    assert json.loads((tmp_path / "eval.json").read_text())["tokens"] > 0

    shutil.copy(other / "tokenizer.json", tmp_path / "hf" / "tokenizer.json")  # the exported folder edited later
    refused = evaluate(cfg, tmp_path / "hf", prepared["view"], tmp_path / "eval-bad.json")
    assert refused.returncode != 0 and not (tmp_path / "eval-bad.json").exists()
    assert recorded in refused.stderr and changed in refused.stderr and "llmpipe evaluate: " in refused.stderr
