"""Hugging Face Hub in and out, offline. The Hub cannot be reached here: `tests/hub_standin.py` is a
STAND-IN (a local HTTP server speaking the Hub endpoints huggingface_hub uses, recording requests);
everything else is real: huggingface_hub's snapshot_download / create_repo / upload_folder, its own
cache (then read with HF_HUB_OFFLINE=1), transformers loading the result, datasets' split slicing,
a real tiny training run for the model card."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import REPO, merge
from tests.hub_standin import Repo, StandInHub

TOKEN = "hf_llmpipeTestSecret0123456789"


def tiny_llama(vocab: int, seed: int, tied: bool = True):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            tie_word_embeddings=tied,
        )
    )


def repo_files(model, tmp: Path, tokenizer: Path | None = None) -> dict:
    """The files of a Hub model repo: sharded safetensors + index, configs, tokenizer, and files that must
    NOT be downloaded by default (a pickle, remote code)."""
    model.save_pretrained(tmp, max_shard_size="20KB")
    files = {p.name: p.read_bytes() for p in tmp.iterdir() if p.is_file()}
    if tokenizer:
        files.update({p.name: p.read_bytes() for p in tokenizer.iterdir() if p.is_file()})
    files["pytorch_model.bin"] = b"not a checkpoint: a pickle must never be fetched"
    files["modeling_evil.py"] = b"raise SystemExit('remote code ran')"
    return files


def cli(args: list[str], env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    full = {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        **(env or {}),
    }
    if "HF_HUB_OFFLINE" not in (env or {}):
        full.pop("HF_HUB_OFFLINE", None)
    return subprocess.run([sys.executable, "-m", "llmpipe", *args], capture_output=True, text=True, env=full, timeout=300, **kw)


def no_token_in(*paths: Path, texts: tuple[str, ...] = ()) -> None:
    for text in texts:
        assert TOKEN not in text
    for root in paths:
        for p in [root] if root.is_file() else root.rglob("*"):
            if p.is_file():
                assert TOKEN.encode() not in p.read_bytes(), f"token leaked into {p}"


@pytest.fixture(scope="module")
def hub_models(prepared, tmp_path_factory):
    """A stand-in Hub with org/tiny: v1 (tag) and main (a later commit), sharded, tied embeddings."""
    tmp = tmp_path_factory.mktemp("hub")
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(prepared["tokenizer"]))
    v1, v2 = tiny_llama(vocab, 1), tiny_llama(vocab, 2)
    repo = Repo()
    sha1 = repo.commit(repo_files(v1, tmp / "v1", prepared["tokenizer"]), ref="v1")
    sha2 = repo.commit(repo_files(v2, tmp / "v2", prepared["tokenizer"]), ref="main")
    gated = Repo(gated=True)
    gated.commit(repo_files(v1, tmp / "g"))
    broken = Repo()  # the index names a shard the repo does not have
    files = repo_files(v1, tmp / "b")
    files.pop(sorted(f for f in files if f.endswith(".safetensors"))[0])
    broken.commit(files)
    with StandInHub(granted_tokens=(TOKEN,)) as hub:
        hub.repos.update({("model", "org/tiny"): repo, ("model", "org/gated"): gated, ("model", "org/broken"): broken})
        yield {"hub": hub, "tmp": tmp, "v1": v1, "sha1": sha1, "sha2": sha2, "cache": tmp / "cache"}


def test_download_pinned_revision_sharded_tied_token_never_written(hub_models, prepared, tmp_path):
    h = hub_models
    out = tmp_path / "base"
    cfg = json.dumps({"model": {"init_from": "org/tiny@v1"}, "hub": {"cache_dir": str(h["cache"]), "endpoint": h["hub"].url}})
    proc = cli(["download-model", "--config", cfg, "--out", str(out)], env={"HF_TOKEN": TOKEN})
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((out / "hub.json").read_text())
    assert (record["repo_id"], record["revision"], record["commit"]) == ("org/tiny", "v1", h["sha1"])
    assert h["sha1"] != h["sha2"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and record["weights"] == shards
    assert not (out / "pytorch_model.bin").exists() and not (out / "modeling_evil.py").exists()
    # The token came from HF_TOKEN (huggingface_hub's own lookup) and reached the Hub, nothing else.
    assert any(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in h["hub"].requests)
    no_token_in(out, h["cache"], texts=(proc.stdout, proc.stderr))

    # init_model continues from it: every weight equal to v1's, embeddings tied.
    from transformers import AutoModelForCausalLM

    from llmpipe.model.init import init_model

    cfg_init = merge(prepared["cfg"], {"model": {"init_from": str(out)}})
    init_model(cfg_init, prepared["tokenizer"], tmp_path / "init")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "init")
    want = h["v1"].state_dict()
    got = model.state_dict()
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_offline_from_cache_and_offline_miss(hub_models, tmp_path):
    h = hub_models
    first = tmp_path / "online"
    cfg = {"hub": {"cache_dir": str(h["cache"]), "endpoint": h["hub"].url}}
    proc = cli(["download-model", "--model", "org/tiny@v1", "--config", json.dumps(cfg), "--out", str(first)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    n = len(h["hub"].requests)
    offline = {"HF_HUB_OFFLINE": "1"}
    proc = cli(
        ["download-model", "--model", "org/tiny@v1", "--config", json.dumps(cfg), "--out", str(tmp_path / "off")], env=offline
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(h["hub"].requests) == n  # not one request: served from the cache
    a, b = (json.loads((p / "hub.json").read_text()) for p in (first, tmp_path / "off"))
    assert b["commit"] == h["sha1"] and a["files"] == b["files"]
    # main was never downloaded into this cache: one line saying so, nothing written.
    proc = cli(
        ["download-model", "--model", "org/tiny", "--config", json.dumps(cfg), "--out", str(tmp_path / "miss")], env=offline
    )
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.startswith("llmpipe download-model:")]
    assert len(lines) == 1 and "HF_HUB_OFFLINE=1" in lines[0] and "org/tiny@main" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "miss").exists()


@pytest.mark.parametrize(
    "ref, token, expect",
    [
        ("org/gated", None, ["org/gated is gated", "request access on https://huggingface.co/org/gated", "HF_TOKEN"]),
        ("org/tiny@no-such-tag", TOKEN, ["has no revision 'no-such-tag'"]),
        ("org/missing", TOKEN, ["org/missing not found", "hf auth login"]),
        ("org/broken", TOKEN, ["1 of", "weight shards missing"]),
    ],
)
def test_errors_are_one_line(hub_models, tmp_path, ref, token, expect):
    h = hub_models
    cfg = {"hub": {"cache_dir": str(tmp_path / "cache"), "endpoint": h["hub"].url}}
    env = {"HF_TOKEN": token} if token else {"HF_TOKEN": "", "HF_HOME": str(tmp_path / "home")}
    proc = cli(["download-model", "--model", ref, "--config", json.dumps(cfg), "--out", str(tmp_path / "o")], env=env)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.startswith("llmpipe download-model:")]
    assert len(lines) == 1, proc.stderr
    for part in expect:
        assert part in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and not (tmp_path / "o").exists()
    no_token_in(tmp_path, texts=(proc.stdout, proc.stderr))


def test_tokenizer_source_as_hub_id(tmp_path):
    """tokenizer.source: org/name@rev -> only the tokenizer files, pinned commit recorded, same ids as the
    local copy; an unknown repo is one line naming tokenizer.source; nothing written."""
    from tests.conftest import GPT2

    files = {p.name: p.read_bytes() for p in GPT2.iterdir() if p.is_file()}
    repo = Repo()
    sha = repo.commit({**files, "model.safetensors": b"weights the tokenizer stage must not fetch"}, ref="v1")
    repo.commit({**files, "tokenizer.json": b"{}"}, ref="main")  # a later, different main
    with StandInHub() as hub:
        hub.repos[("model", "org/gpt2")] = repo
        cfg = {"tokenizer": {"source": "org/gpt2@v1"}, "hub": {"cache_dir": str(tmp_path / "cache"), "endpoint": hub.url}}
        proc = cli(["tokenizer", "--config", json.dumps(cfg), "--out", str(tmp_path / "tok")])
        assert proc.returncode == 0, proc.stderr[-3000:]
        fetched = [r.path for r in hub.requests if "/resolve/" in r.path]
        # the same through Snakemake: rule tokenizer (a localrule here) gets the hub settings
        conf = tmp_path / "c.yaml"
        conf.write_text(yaml.safe_dump({"run": "r", "results_dir": str(tmp_path / "results"), **cfg}))
        smk = subprocess.run(
            [
                sys.executable,
                "-m",
                "snakemake",
                str(tmp_path / "results" / "r" / "tokenizer"),
                "--cores",
                "1",
                "--nolock",
                "--configfile",
                str(conf),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
        cfg["tokenizer"]["source"] = "org/nope"
        bad = cli(["tokenizer", "--config", json.dumps(cfg), "--out", str(tmp_path / "bad")])
    assert smk.returncode == 0, smk.stderr[-3000:]
    assert (tmp_path / "results" / "r" / "tokenizer" / "tokenizer.json").read_bytes() == files["tokenizer.json"]
    out = tmp_path / "tok"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == files[name], name
    assert json.loads((out / "hub.json").read_text()) == {"source": "hub", "repo_id": "org/gpt2", "revision": "v1", "commit": sha}
    assert fetched and not any("model.safetensors" in p for p in fetched)
    from llmpipe.data.tokenizer import load_backend

    text = "Hub tokenizers give the same ids as the local copy."
    assert load_backend(out).encode(text).ids == load_backend(GPT2).encode(text).ids
    assert bad.returncode == 1 and not (tmp_path / "bad").exists() and "Traceback" not in bad.stderr
    line = bad.stderr.strip().splitlines()[-1]
    assert line.startswith("llmpipe tokenizer: tokenizer.source 'org/nope'") and "not found" in line, bad.stderr


def test_gated_model_with_granted_token(hub_models, tmp_path):
    h = hub_models
    cfg = {"hub": {"cache_dir": str(tmp_path / "cache"), "endpoint": h["hub"].url}}
    proc = cli(
        ["download-model", "--model", "org/gated", "--config", json.dumps(cfg), "--out", str(tmp_path / "o")],
        env={"HF_TOKEN": TOKEN},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "o" / "hub.json").read_text())["repo_id"] == "org/gated"


def test_dataset_split_slicing(tmp_path):
    from llmpipe.data.readers import ReadStats, documents
    from llmpipe.hub.datasets import download_dataset
    from tests.conftest import corpus_docs, write_jsonl

    docs = corpus_docs(40)
    (tmp_path / "ds").mkdir()
    write_jsonl(tmp_path / "ds" / "train.jsonl", docs)
    out = tmp_path / "hub" / "part.parquet"
    record = download_dataset(str(tmp_path / "ds"), out, split="train[:25%]", text_field="text")
    assert record["rows"] == len(docs) // 4 and json.loads(out.with_name("part.parquet.json").read_text()) == record
    cfg = {"text_field": "text", "max_records_per_source": None, "max_document_chars": None, "on_bad_record": "fail"}
    assert [t for _, t in documents(str(out), cfg, ReadStats())] == docs[: len(docs) // 4]
    record = download_dataset(str(tmp_path / "ds"), tmp_path / "b.parquet", split="train[10:15]")
    assert [t for _, t in documents(str(tmp_path / "b.parquet"), cfg, ReadStats())] == docs[10:15]
    from llmpipe.hub import HubError

    with pytest.raises(HubError, match="bad split"):
        download_dataset(str(tmp_path / "ds"), tmp_path / "c.parquet", split="train[:abc]")
    assert not (tmp_path / "c.parquet").exists()


def test_hub_dataset_comes_from_hub_endpoint(tmp_path):
    """download-dataset asks the configured hub.endpoint (a private Hub or mirror), as download-model and the
    plan's commit keys do: it went to huggingface.co."""
    from llmpipe.data.readers import ReadStats, documents
    from tests.conftest import corpus_docs

    docs = corpus_docs(20)
    with StandInHub() as hub:
        repo = Repo()
        sha = repo.commit({"train.jsonl": "".join(json.dumps({"text": d}) + "\n" for d in docs).encode(), "README.md": b"# ds\n"})
        hub.repos[("dataset", "org/ds")] = repo
        cfg = {"hub": {"endpoint": hub.url, "datasets": [{"name": "ds", "id": "org/ds"}]}}
        out = tmp_path / "ds.parquet"
        args = ["download-dataset", "--config", json.dumps(cfg), "--name", "ds", "--out", str(out)]
        proc = cli(args, env={"HF_HOME": str(tmp_path / "hf")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.with_name("ds.parquet.json").read_text())["commit"] == sha
    cfg = {"text_field": "text", "max_records_per_source": None, "max_document_chars": None, "on_bad_record": "fail"}
    assert [t for _, t in documents(str(out), cfg, ReadStats())] == docs


@pytest.fixture(scope="module")
def trained_run(prepared, tmp_path_factory):
    """A real tiny run: train 6 steps, export, evaluate (inputs of the model card)."""
    from llmpipe.backends.torch.train import train
    from llmpipe.evaluate import evaluate
    from llmpipe.export import export

    tmp = tmp_path_factory.mktemp("run")
    cfg = merge(
        prepared["cfg"],
        {
            "train": {"max_steps": 6, "eval_interval": 3, "save_interval": 6},
            "hub": {
                "release": {
                    "repo_id": "me/tiny-llama",
                    "license": "apache-2.0",
                    "data_license": "public domain (Project Gutenberg)",
                    "hardware": "CPU, 2 cores",
                }
            },
        },
    )
    from llmpipe import config as cfgmod

    cfg = cfgmod.validate(cfg)
    train(cfg, prepared["init"], prepared["view"], tmp / "ckpt", tmp / "metrics.jsonl", tmp / "final")
    export(tmp / "final", prepared["tokenizer"], tmp / "hf")
    evaluate(tmp / "hf", prepared["view"], tmp / "eval.json", 8, 1)
    return {"cfg": cfg, "tmp": tmp}


def test_model_card_states_every_field_and_release_uploads(trained_run, prepared, tmp_path, monkeypatch, caplog):
    from transformers import AutoModelForCausalLM

    from llmpipe.hub.card import build_release, count_parameters
    from llmpipe.hub.release import release

    r, cfg = trained_run["tmp"], trained_run["cfg"]
    out = tmp_path / "release"
    build_release(
        cfg,
        r / "hf",
        prepared["manifest"],
        prepared["root"] / "sources.json",
        r / "metrics.jsonl",
        r / "eval.json",
        r / "final" / "train_summary.json",
        out,
        data_view=prepared["view"],
    )
    card = (out / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])
    assert front["license"] == "apache-2.0" and front["library_name"] == "transformers"
    model = AutoModelForCausalLM.from_pretrained(r / "hf")
    n_params = sum(p.numel() for p in model.state_dict().values())
    assert count_parameters(r / "hf") == n_params and f"| parameters | {n_params} |" in card
    assert "LlamaForCausalLM" in card and f"| num_hidden_layers | {model.config.num_hidden_layers} |" in card
    manifest = json.loads(prepared["manifest"].read_text())
    sources = json.loads((prepared["root"] / "sources.json").read_text())
    assert manifest["tokenizer"]["sha256"] in card and manifest["fingerprint"] in card
    for i, s in enumerate(sources["sources"]):
        counts = manifest["by_source"][str(i)]
        digest = hashlib.sha256(Path(s["source"]).read_bytes()).hexdigest()  # taken by the tokenize job as it read
        assert f"| {s['source']} | {digest} | {s['size']} | - | {counts['train']['tokens']} | {counts['val']['tokens']} |" in card
    for k, v in cfg["train"].items():
        assert f"| {k} | {v} |" in card, k
    metrics = [json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((r / "final" / "train_summary.json").read_text())
    assert f"| steps | {summary['steps']} |" in card and f"| tokens | {metrics[-1]['tokens']} |" in card
    assert "| backend | torch |" in card and "| hardware | CPU, 2 cores |" in card
    for k, v in json.loads((r / "eval.json").read_text()).items():
        assert f"| {k} | {v} |" in card
    assert "![loss curve](loss.png)" in card and (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert head and f"| git_commit | {head} |" in card
    assert "| data | public domain (Project Gutenberg) |" in card and "| code | Apache-2.0 |" in card
    assert yaml.safe_load((out / "llmpipe_config.yaml").read_text()) == json.loads(json.dumps(cfg))
    assert (out / "data" / "hf" / "view.json").is_file() is False  # include_data is off by default
    files = json.loads((out / "files.json").read_text())
    assert "model.safetensors" in files and "provenance/manifest.json" in files

    # Upload to the stand-in Hub with the token in the environment only.
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with StandInHub() as hub:
        rec = release(out, "me/tiny-llama", tmp_path / "release.json", endpoint=hub.url)
        create = next(q for q in hub.requests if q.path == "/api/repos/create")
        assert json.loads(create.body)["visibility"] == "private"
        commits = [q for q in hub.requests if "/commit/" in q.path]
        assert len(commits) == 1 and commits[0].headers["authorization"] == f"Bearer {TOKEN}"
        import base64

        sent = {}
        for line in commits[0].body.decode().splitlines():
            item = json.loads(line)
            if item["key"] == "file":
                sent[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
        local = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        assert sent == local  # every file, byte for byte (card, weights, loss curve, provenance, config)
        assert sent["README.md"].decode() == card
        assert rec["commit"] == hub.repos[("model", "me/tiny-llama")].refs["main"] and rec["private"] is True
        # a later release mirrors its folder: an earlier release's other files (old weights transformers would
        # load before new shards, data no longer included) are removed in the same commit; .gitattributes stays
        repo = hub.repos[("model", "me/tiny-llama")]
        repo.commit({**repo.commits[repo.refs["main"]], "model-00001-of-00002.safetensors": b"old", "data/hf/x": b"old"})
        again = release(out, "me/tiny-llama", tmp_path / "again.json", endpoint=hub.url)
        assert set(repo.commits[again["commit"]]) == set(local) | {".gitattributes"}
        # an existing public repo stays public under create_repo(private=True): refused, nothing uploaded
        from llmpipe.hub import HubError

        public = hub.repos[("model", "me/public")] = Repo(private=False)
        public.commit({"README.md": b"# someone's public model\n"})
        with pytest.raises(HubError, match="me/public exists and is public, but hub.release.private is true"):
            release(out, "me/public", tmp_path / "public.json", endpoint=hub.url)
        assert len(public.commits) == 1 and not (tmp_path / "public.json").exists()
    assert json.loads((tmp_path / "release.json").read_text())["files"] == files
    no_token_in(tmp_path, texts=(caplog.text,))


@pytest.mark.parametrize("start", ["scratch", "local", "hub id"])
def test_model_card_names_the_base_model(trained_run, prepared, tmp_path, start):
    """A run continued from a local folder names that folder (path, config sha256, weights' sizes), a Hub id
    without a downloaded folder names the id; only a run from scratch says so."""
    from llmpipe.hub.card import build_release

    r, local = trained_run["tmp"], prepared["init"]
    init_from = {"scratch": None, "local": str(local), "hub id": "org/tiny@v1"}[start]
    cfg = {**trained_run["cfg"], "model": {**trained_run["cfg"]["model"], "init_from": init_from}}
    out = tmp_path / "release"
    args = (r / "hf", prepared["manifest"], prepared["root"] / "sources.json", r / "metrics.jsonl", r / "eval.json")
    facts = build_release(cfg, *args, r / "final" / "train_summary.json", out)
    card = (out / "README.md").read_text()
    front = yaml.safe_load(card.split("---")[1])
    base = facts["model"]["base_model"]
    assert ("none (trained from scratch)" in card) == (start == "scratch")
    if start == "local":
        weights = {p.name: p.stat().st_size for p in local.glob("*.safetensors")}
        assert weights and base == {
            "path": str(local),
            "config_sha256": hashlib.sha256((local / "config.json").read_bytes()).hexdigest(),
            "weights_bytes": weights,
        }
        assert json.dumps(base) in card and "base_model" not in front  # the Hub's field takes a repo id only
    elif start == "hub id":
        assert base == {"repo_id": "org/tiny", "revision": "v1"} and front["base_model"] == "org/tiny"
    assert json.loads((out / "card.json").read_text())["model"]["base_model"] == base


def test_dry_run_hub_rules(tmp_path):
    conf = tmp_path / "c.yaml"
    base = {
        "run": "hubdry",
        "model": {"init_from": "meta-llama/Llama-2-7b-hf@main"},
        "hub": {"datasets": [{"name": "slim", "id": "cerebras/SlimPajama-627B", "split": "train[:10%]"}]},
        "data": {
            "sources": [
                {"path": "data/gutenberg-sample-2mb.jsonl.gz", "weight": 0.7, "name": "books"},
                {"path": "results/hubdry/data/hub/slim.parquet", "weight": 0.3},
            ]
        },
    }
    for enabled in (False, True):
        conf.write_text(
            yaml.safe_dump(merge(base, {"hub": {"release": {"enabled": enabled, "repo_id": "me/m", "license": "llama2"}}}))
        )
        proc = subprocess.run(
            [sys.executable, "-m", "snakemake", "-n", "-p", "--cores", "2", "--configfile", str(conf)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
        jobs = {line.split()[1].rstrip(":") for line in proc.stdout.splitlines() if line.startswith(("rule ", "localrule "))}
        assert {"download_model", "download_dataset", "init_model"} <= jobs
        assert ("release" in jobs) == enabled and ("model_card" in jobs) == enabled
        # a mixture's two files are counted by get_data in 2 processes at once
        get_data = proc.stdout.split("rule get_data:", 1)[1].split("\n\n", 1)[0]
        assert "threads: 2" in get_data and "get-data --config" in get_data and " --threads 2 " in get_data


def test_snakemake_download_model_feeds_tokenizer_and_init(hub_models, tmp_path):
    """The rules: Hub id in model.init_from -> download_model -> tokenizer (the base's own) -> init_model."""
    h = hub_models
    run = tmp_path / "results" / "r"
    conf = tmp_path / "c.yaml"
    conf.write_text(
        yaml.safe_dump(
            {
                "run": "r",
                "results_dir": str(tmp_path / "results"),
                "model": {"init_from": "org/tiny@v1"},
                "tokenizer": {"source": str(run / "checkpoints" / "base")},
                "train": {"seq_len": 64},
                "hub": {"endpoint": h["hub"].url, "cache_dir": str(tmp_path / "cache")},
            }
        )
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            str(run / "checkpoints" / "init"),
            "--cores",
            "2",
            "--nolock",
            "--configfile",
            str(conf),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_TOKEN": TOKEN, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads((run / "checkpoints" / "base" / "hub.json").read_text())["commit"] == h["sha1"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "init")
    for k, v in h["v1"].state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    assert (run / "tokenizer" / "tokenizer.json").read_bytes() == (run / "checkpoints" / "base" / "tokenizer.json").read_bytes()
    no_token_in(tmp_path / "results", texts=(proc.stdout, proc.stderr))


def test_a_moved_branch_is_named_and_the_downloaded_base_kept(hub_models, tmp_path):
    """model.init_from on a branch that moves after the download: planning names both commits and keeps the
    downloaded base (nothing to redo, so a run mid-training goes on from the model it began with); offline, the
    Hub is not asked."""
    h = hub_models
    hub, repo = h["hub"], Repo()
    first = repo.commit(dict(hub.repos[("model", "org/tiny")].commits[h["sha1"]]), ref="main")
    hub.repos[("model", "org/moving")] = repo
    base = tmp_path / "results" / "r" / "checkpoints" / "base"
    conf = tmp_path / "c.yaml"
    hub_cfg = {"endpoint": hub.url, "cache_dir": str(tmp_path / "cache")}
    conf.write_text(
        yaml.safe_dump(
            {"run": "r", "results_dir": str(tmp_path / "results"), "model": {"init_from": "org/moving"}, "hub": hub_cfg}
        )
    )

    def plan(*extra, **env):
        cmd = [sys.executable, "-m", "snakemake", str(base), "--cores", "1", "--nolock", "--configfile", str(conf), *extra]
        pythonpath = f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
        proc = subprocess.run(
            cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": pythonpath, **env}
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        return proc.stdout + proc.stderr

    plan()
    assert json.loads((base / "hub.json").read_text())["commit"] == first
    assert "points to commit" not in plan("-n")
    moved = repo.commit({**repo.commits[first], "README.md": b"a later commit"}, ref="main")
    out = plan("-n")
    assert f"org/moving@main points to commit {moved} now; {base} holds {first}" in out
    assert "Nothing to be done" in out and "download_model" not in out  # kept
    asked = len(hub.requests)
    assert "points to commit" not in plan("-n", HF_HUB_OFFLINE="1") and len(hub.requests) == asked


def test_interrupted_download_leaves_nothing_and_resumes(hub_models, tmp_path):
    """A transfer that fails mid-snapshot: no output folder; the rerun fetches only what is missing."""
    h = hub_models
    hub, out = h["hub"], tmp_path / "base"
    shard = sorted(f for f in hub.repos[("model", "org/tiny")].commits[h["sha1"]] if f.endswith(".safetensors"))[-1]
    from llmpipe.hub import HubError
    from llmpipe.hub.download import download_model

    hub.failing.add(shard)
    first_start = len(hub.requests)
    try:
        with pytest.raises(HubError, match="org/tiny@v1"):
            download_model("org/tiny@v1", out, cache_dir=str(tmp_path / "cache"), endpoint=hub.url)
    finally:
        hub.failing.discard(shard)
    assert not out.exists() and not list(tmp_path.glob(".base.tmp-*"))
    start = len(hub.requests)
    record = download_model("org/tiny@v1", out, cache_dir=str(tmp_path / "cache"), endpoint=hub.url)
    fetched = [r.path.rsplit("/", 1)[-1] for r in hub.requests[start:] if r.method == "GET" and "/resolve/" in r.path]
    # Files download in parallel: when the shard fails, others may not have started. Those the first
    # attempt fetched come from the cache; only the rest (the shard among them) are fetched again.
    first = {r.path.rsplit("/", 1)[-1] for r in hub.requests[first_start:start] if r.method == "GET" and "/resolve/" in r.path}
    assert shard in fetched and len(fetched) == len(set(fetched)) and not set(fetched) & (first - {shard}), (first, fetched)
    assert (
        record["commit"] == h["sha1"] and (out / shard).read_bytes() == hub.repos[("model", "org/tiny")].commits[h["sha1"]][shard]
    )


def test_download_links_leave_the_sources_modes_alone(tmp_path, monkeypatch):
    """download-model hard-links the large files it takes (the Hub cache's blobs, a local folder's files)
    where it can: giving the output the umask's modes must not change the other name's (the cache is
    shared). Small files are copied: editing the run's config.json left the cache's changed."""
    import numpy as np
    from safetensors.numpy import save_file

    from llmpipe.hub import download
    from llmpipe.hub.download import download_model

    monkeypatch.setattr(download, "LINK_MIN_BYTES", 64)  # the test's weights file is linked, config.json not

    src = tmp_path / "base"
    src.mkdir()
    (src / "config.json").write_text("{}")
    save_file({"w": np.zeros(4, np.float32)}, str(src / "model.safetensors"))
    modes = {"config.json": 0o640, "model.safetensors": 0o440}
    for name, mode in modes.items():
        os.chmod(src / name, mode)
    out = tmp_path / "out"
    download_model(str(src), out)
    assert {name: (src / name).stat().st_mode & 0o777 for name in modes} == modes
    assert (out / "model.safetensors").stat().st_ino == (src / "model.safetensors").stat().st_ino  # linked, not copied
    (out / "config.json").write_text('{"max_position_embeddings": 8192}')  # as seq_len_past_base tells a user
    assert (src / "config.json").read_text() == "{}"
    assert (out / "hub.json").stat().st_mode & 0o777 == 0o666 & ~current_umask()  # our own file: the usual mode


def current_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


@pytest.mark.parametrize("cdn", [200, 500])
def test_a_presigned_cdn_url_never_reaches_the_log(tmp_path, cdn):
    """The Hub redirects a weights file to a presigned CDN URL (X-Amz-Credential, X-Amz-Signature): the HTTP
    client's per-request INFO lines are off and any line or error naming such a URL has its credentials
    redacted (before: the download log held the signed URL; a CDN 500 put it in the one-line error)."""
    import hashlib as hl

    weights = b"W" * 5000
    secret = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLESECRET%2F20260101&X-Amz-Signature=deadbeefSIGNATURE"
    repo = Repo()
    sha = repo.commit({"config.json": b'{"model_type": "llama"}', "model.safetensors": weights}, ref="main")
    with StandInHub() as hub:
        hub.repos[("model", "org/tiny")] = repo
        base = hub.server.RequestHandlerClass

        class Redirecting(base):
            def do_GET(self):
                if self.path.startswith("/cdn/"):
                    self._record()
                    body = weights if cdn == 200 else b"<Error>denied</Error>"
                    return self._send(
                        cdn, body, {"ETag": f'"{hl.sha256(weights).hexdigest()}"'}, ctype="application/octet-stream"
                    )
                if "/resolve/" in self.path and self.path.endswith("model.safetensors"):
                    self._record()
                    where = hub.url.replace("127.0.0.1", "localhost") + f"/cdn/blob?{secret}"
                    linked = {"X-Linked-Etag": f'"{hl.sha256(weights).hexdigest()}"', "X-Linked-Size": str(len(weights))}
                    return self._send(302, b"", {"Location": where, "X-Repo-Commit": sha, **linked, "ETag": '"x"'})
                return super().do_GET()

        hub.server.RequestHandlerClass = Redirecting
        cfg = {"model": {"init_from": "org/tiny"}, "hub": {"endpoint": hub.url, "cache_dir": str(tmp_path / "cache")}}
        env = {"HF_HUB_DOWNLOAD_TIMEOUT": "5", "HF_HUB_ETAG_TIMEOUT": "5"}
        proc = cli(["download-model", "--config", json.dumps(cfg), "--out", str(tmp_path / "out")], env=env)
        assert any(r.path.startswith("/cdn/") for r in hub.requests)  # the weights came through the signed URL
    said = proc.stdout + proc.stderr
    assert (proc.returncode == 0) == (cdn == 200), said[-2000:]
    assert "deadbeefSIGNATURE" not in said and "AKIAEXAMPLESECRET" not in said, said[-2000:]
    if cdn == 500:
        (line,) = [x for x in proc.stderr.splitlines() if x.startswith("llmpipe download-model:")]
        assert "X-Amz-Signature=<redacted>" in line, line
