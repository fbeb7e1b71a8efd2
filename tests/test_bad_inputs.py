"""`llmpipe evaluate` / `llmpipe export` on inputs that cannot be used: one line naming the flag and what is
wrong (SystemExit), never a traceback from transformers or datasets."""

import json
import shutil

import pytest

from tests.conftest import GPT2


def fails(main, argv) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return str(exc.value)


def test_evaluate_names_a_model_without_weights_and_a_view_without_view_json(prepared, tmp_path):
    from llmpipe.evaluate import main

    no_weights = tmp_path / "no_weights"  # config.json and tokenizer, the weights left out
    shutil.copytree(prepared["init"], no_weights, ignore=shutil.ignore_patterns("*.safetensors*"))
    no_view_json = tmp_path / "view"
    shutil.copytree(prepared["view"] / "val", no_view_json / "val")
    out = tmp_path / "eval.json"

    msg = fails(main, ["--config", "{}", "--model", str(no_weights), "--data", str(prepared["view"]), "--out", str(out)])
    assert msg.startswith(f"llmpipe evaluate: --model {no_weights}: no model weights (none of model.safetensors"), msg
    msg = fails(main, ["--config", "{}", "--model", str(prepared["init"]), "--data", str(no_view_json), "--out", str(out)])
    assert msg == f"llmpipe evaluate: --data {no_view_json}: no view.json (not an hf data view (llmpipe pack))"
    assert not out.exists()


def test_export_names_a_missing_tokenizer_a_larger_one_and_a_model_without_weights(prepared, tmp_path):
    from llmpipe.export import main

    cfg = json.dumps({"export": {"dtype": "float32"}})
    out = tmp_path / "hf"

    def export(trained, tokenizer, *manifest):
        return fails(
            main, ["--config", cfg, "--trained", str(trained), "--tokenizer", str(tokenizer), *manifest, "--out", str(out)]
        )

    missing = tmp_path / "nonexist"
    manifest = ["--manifest", str(prepared["manifest"])]
    assert export(prepared["init"], missing, *manifest) == f"llmpipe export: --tokenizer {missing}: no such folder"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export(prepared["init"], empty) == f"llmpipe export: --tokenizer {empty}: no tokenizer.json (not a tokenizer folder)"
    # GPT-2's 50257 entries for a model of 512 embedding rows (no manifest to compare the tokenizers by)
    assert export(prepared["init"], GPT2) == (
        f"llmpipe export: --tokenizer {GPT2} has 50257 entries, more than the 512 embedding rows of --trained "
        f"{prepared['init']}: not the tokenizer it was trained with"
    )
    no_weights = tmp_path / "no_weights"
    shutil.copytree(prepared["init"], no_weights, ignore=shutil.ignore_patterns("*.safetensors*"))
    assert export(no_weights, prepared["tokenizer"]).startswith(f"llmpipe export: --trained {no_weights}: no model weights")
    assert not out.exists()
