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


def llama2_style_tokenizer(out, texts):
    """A Llama-2 / Mistral style tokenizer folder: byte-fallback BPE whose tokenizer.json normalizer prepends
    and replaces spaces with ▁, tokenizer_config.json naming LlamaTokenizer, and a chat_template.jinja."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=600, special_tokens=specials, show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    conf = {"add_bos_token": True, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "legacy": False}
    (out / "tokenizer_config.json").write_text(json.dumps({**conf, "tokenizer_class": "LlamaTokenizer"}))
    (out / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    return out


def test_llama_class_tokenizer_ships_the_data_ids(tmp_path):
    """A LlamaTokenizer-class folder (Llama-2, Mistral bases): transformers 5's AutoTokenizer rebuilt it from
    vocab and merges (" hello" -> other ids than the data's) and init/export re-saved that; now the folders
    init and export write hold the tokenizer.json and chat template byte for byte, under a class that
    transformers 5 and 4.48 read as tokenizer.json says, and evaluate accepts the export."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from llmpipe.export import export
    from llmpipe.model.init import init_model
    from tests.conftest import corpus_docs, prepare, tiny_config, write_jsonl
    from tests.test_neuron_hf_config import nxd_python

    docs = corpus_docs(40)
    write_jsonl(tmp_path / "corpus.jsonl", docs)
    src = llama2_style_tokenizer(tmp_path / "l2", docs)
    cfg = tiny_config(tmp_path, tokenizer={"source": str(src)}, data={"num_shards": 1})
    out = prepare(tmp_path, cfg)
    init_model(cfg, out["tokenizer"], tmp_path / "init")
    export(tmp_path / "init", out["tokenizer"], tmp_path / "exported", "float32", out["manifest"])
    texts = [" hello", "  two spaces", "Ünïcode  ok\n\nnew", docs[0][:300]]
    raw = Tokenizer.from_file(str(src / "tokenizer.json"))
    want = [raw.encode(t).ids for t in texts]
    assert [AutoTokenizer.from_pretrained(str(src)).encode(t) for t in texts] != want  # the trap, as 5.x has it
    for folder in (tmp_path / "init", tmp_path / "exported"):
        assert tokenizer_sha256(folder) == tokenizer_sha256(src)
        assert (folder / "chat_template.jinja").read_bytes() == (src / "chat_template.jinja").read_bytes()
        assert [AutoTokenizer.from_pretrained(str(folder)).encode(t) for t in texts] == want, folder
    read = "import sys, json\nfrom transformers import AutoTokenizer\nt = AutoTokenizer.from_pretrained(sys.argv[1])\nprint(json.dumps([t.encode(x) for x in json.loads(sys.argv[2])]))"
    assert json.loads(nxd_python(read, str(tmp_path / "exported"), json.dumps(texts))) == want
    ev = evaluate(json.dumps({"eval": {"batch_size": 4}}), tmp_path / "exported", out["view"], tmp_path / "eval.json")
    assert ev.returncode == 0, ev.stderr[-2000:]
