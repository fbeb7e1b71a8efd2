"""Data mixtures: weighted sources sampled deterministically into the token store (real data stages,
real GPT-2 tokenizer); per-source token counts in the manifest equal the tokens actually stored."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from llmpipe import config as cfgmod
from llmpipe.data.get_data import get_data, load_sources
from llmpipe.data.mixture import plan, selected
from llmpipe.data.readers import ReadStats, documents
from llmpipe.data.sources import RECORD_BITS, doc_id
from llmpipe.data.token_store import TokenStore, build_manifest
from llmpipe.data.tokenize import tokenize_shard
from llmpipe.data.tokenizer import copy_tokenizer
from tests.conftest import GPT2, corpus_docs, merge, tiny_config, write_jsonl

# Shares are set in bytes (exact to within one document); in tokens they hold as far as the groups'
# bytes per token agree: within this absolute tolerance on two halves of the same English corpus.
TOLERANCE = 0.01


def build(tmp, cfg):
    key = get_data(cfg["data"], tmp / "sources.json")["key"]
    mix = json.loads((tmp / "sources.json").read_text()).get("mixture")
    sources = load_sources(tmp / "sources.json")
    if not (tmp / "tok").exists():
        copy_tokenizer(str(GPT2), tmp / "tok")
    n = cfg["data"]["num_shards"]
    store = tmp / f"tokens{n}"
    outs = [store / f"shard-{i:05d}.safetensors" for i in range(n)]
    for i, o in enumerate(outs):
        tokenize_shard(cfg, sources, i, tmp / "tok", o, sources_key=key, mix=mix)
    return build_manifest(outs, store / "manifest.json", key, mix), mix, sources, store


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mix")
    docs = corpus_docs(400)
    write_jsonl(tmp / "books_a.jsonl", docs[:200])
    write_jsonl(tmp / "books_b.jsonl", docs[200:300])
    write_jsonl(tmp / "books_c.jsonl", docs[300:])
    return tmp


def mixture_config(tmp, num_shards):
    return tiny_config(
        tmp,
        data={
            "num_shards": num_shards,
            "sources": [
                {"path": str(tmp / "books_a.jsonl"), "weight": 0.2, "name": "a"},
                {"path": str(tmp / "books_{b,c}.jsonl"), "weight": 0.8, "name": "bc"},  # one group, two files
            ],
        },
        tokenizer={"source": str(GPT2)},
    )


def test_weights_give_token_shares_and_counts_match_store(corpus):
    cfg = mixture_config(corpus, 2)
    manifest, mix, sources, store = build(corpus, cfg)
    groups = {g["name"]: g for g in mix["groups"]}
    assert mix["group_of_source"] == [0, 1, 1] and groups["bc"]["rate"] == 1.0 and 0 < groups["a"]["rate"] < 1
    by_group = manifest["by_group"]
    for name, want in (("a", 0.2), ("bc", 0.8)):
        assert by_group[name]["target_share"] == pytest.approx(want)
        assert abs(by_group[name]["share"] - want) < TOLERANCE, by_group

    # Per-source counts in the manifest == the tokens stored, counted independently: every stored
    # document re-read from its source and re-encoded with the HF tokenizer (+ EOS).
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(corpus / "tok")
    ts = TokenStore(store / "manifest.json")
    from safetensors import safe_open

    stored = {}
    for entry in ts.manifest["shards"]:
        with safe_open(str(store / entry["file"]), framework="numpy") as f:
            for split in ("train", "val"):
                for d in f.get_tensor(f"{split}.doc_ids"):
                    stored[int(d)] = split
    want, kept_bytes, biggest = Counter(), Counter(), 0
    for s_idx, src in enumerate(sources):
        for r_idx, text in documents(src, cfg["data"], ReadStats()):
            did = doc_id(s_idx, r_idx)
            kept = selected(mix, s_idx, r_idx)
            assert (did in stored) == kept
            if kept:
                want[(str(s_idx), stored[did])] += len(tok(text)["input_ids"]) + 1
                size = len(text.encode())
                kept_bytes[mix["group_of_source"][s_idx]] += size
                biggest = max(biggest, size)
    # In bytes the shares are exact to within one document.
    assert abs(kept_bytes[0] / sum(kept_bytes.values()) - 0.2) <= biggest / sum(kept_bytes.values())
    got = {(s, sp): c["tokens"] for s, splits in manifest["by_source"].items() for sp, c in splits.items() if c["tokens"]}
    assert got == dict(want)
    assert sum(got.values()) == sum(manifest["totals"][s]["tokens"] for s in ("train", "val"))
    assert {int(d) >> RECORD_BITS for d in stored} == {0, 1, 2}

    # verify's re-tokenization follows the same sample (it would miss dropped documents otherwise).
    from llmpipe.data.verify import check_tokenization

    assert check_tokenization(ts, corpus / "tok", cfg["data"], sources, 16, mix)["documents_retokenized"] == 32


def test_sample_independent_of_shard_count(corpus):
    m2 = (
        json.loads((corpus / "tokens2" / "manifest.json").read_text())
        if (corpus / "tokens2").exists()
        else build(corpus, mixture_config(corpus, 2))[0]
    )
    m3 = build(corpus, mixture_config(corpus, 3))[0]
    assert m2["by_source"] == m3["by_source"] and m2["by_group"] == m3["by_group"]


def test_plain_sources_unchanged_and_bad_weight_named(corpus, tmp_path):
    cfg = tiny_config(corpus, data={"sources": [str(corpus / "books_a.jsonl")]})
    out = get_data(cfg["data"], tmp_path / "s.json")
    assert "mixture" not in out and all("group" not in e for e in out["sources"])
    with pytest.raises(cfgmod.ConfigError, match=r"data\.sources\.0"):
        tiny_config(corpus, data={"sources": [{"path": "x.jsonl", "weight": 0}]})
    with pytest.raises(cfgmod.ConfigError, match=r"data\.sources\.1"):
        tiny_config(corpus, data={"sources": ["a.jsonl", {"path": "x.jsonl", "wieght": 1}]})
    mixed = merge(cfg, {})
    mixed["data"]["sources"] = [str(corpus / "books_a.jsonl"), {"path": str(corpus / "books_b.jsonl"), "weight": 3}]
    _, mix = plan(cfgmod.validate(mixed)["data"])
    assert [g["weight"] for g in mix["groups"]] == [1.0, 3.0] and [g["name"] for g in mix["groups"]] == ["source0", "source1"]


def test_counting_processes_give_the_same_plan_and_name_a_bad_record(corpus, tmp_path, monkeypatch):
    """get-data --threads: a mixture's files counted by processes at once (real ones) give the same
    sources.json, key included; a bad record met in a counting process stops get-data with its own error."""
    import concurrent.futures

    submitted = []

    class Counted(concurrent.futures.ProcessPoolExecutor):
        def submit(self, fn, *args, **kwargs):
            submitted.append(args[2])
            return super().submit(fn, *args, **kwargs)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Counted)
    cfg = mixture_config(corpus, 2)
    one = get_data(cfg["data"], tmp_path / "one.json", threads=1)
    assert submitted == []
    three = get_data(cfg["data"], tmp_path / "three.json", threads=3)
    assert sorted(submitted) == sorted(load_sources(tmp_path / "one.json")) and len(submitted) == 3
    assert three == one and (tmp_path / "three.json").read_bytes() == (tmp_path / "one.json").read_bytes()

    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("books_a.jsonl", "books_b.jsonl", "books_c.jsonl"):
        (bad / name).write_bytes((corpus / name).read_bytes())
    with open(bad / "books_c.jsonl", "ab") as fh:
        fh.write(b'{"text": "cut off\n')
    cfg = mixture_config(bad, 2)
    with pytest.raises(ValueError) as serial:
        get_data(cfg["data"], tmp_path / "x.json", threads=1)
    with pytest.raises(type(serial.value)) as parallel:
        get_data(cfg["data"], tmp_path / "y.json", threads=3)
    assert str(parallel.value) == str(serial.value) and "books_c.jsonl" in str(serial.value)
    assert parallel.value.reason == serial.value.reason == "bad_json"


def test_a_group_whose_share_is_under_one_document_is_refused(corpus, tmp_path):
    """One short document at weight 1 against 100 long ones at weight 9: the big group's share of bytes is
    smaller than any of its documents, so it would keep none (share 0.0 for a 0.9 target): named instead."""
    tiny = "A short one."
    write_jsonl(tmp_path / "tiny.jsonl", [tiny])
    cfg = tiny_config(tmp_path, tokenizer={"source": str(GPT2)})
    cfg["data"]["sources"] = [
        {"path": str(tmp_path / "tiny.jsonl"), "weight": 1, "name": "tiny"},
        {"path": str(corpus / "books_b.jsonl"), "weight": 9, "name": "big"},
    ]
    share = 9 * len(tiny.encode())  # the scarce group whole, at 9 times its weight
    with pytest.raises(ValueError, match=rf"mixture group 'big' would keep no document: its share \({share} bytes.*group 'tiny'"):
        plan(cfgmod.validate(cfg)["data"])


def test_verify_recomputes_the_group_shares(corpus, tmp_path):
    """by_group (tokens and share per group, against the target) is what shows a mixture held: verify
    recomputes it from the shards and the plan, so an edited or stale one is named."""
    from llmpipe.data.verify_store import VerifyError, check_store

    _, mix, _, store = build(tmp_path, mixture_config(corpus, 2))
    check_store(TokenStore(store / "manifest.json"), mix=mix)
    manifest = json.loads((store / "manifest.json").read_text())
    for g in manifest["by_group"].values():
        g["share"] = g["target_share"]
    (store / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(VerifyError, match="by_group .* differs from its shards'"):
        check_store(TokenStore(store / "manifest.json"), mix=mix)


def test_stats_and_report_show_the_shares_held(corpus, tmp_path):
    """stats.json carries by_group (checked by verify against the shards) and the report's data page
    shows each group's target and achieved share of the train tokens."""
    from llmpipe.data.verify import verify
    from llmpipe.report import data_page

    cfg = mixture_config(corpus, 2)
    manifest, _, _, store = build(tmp_path, cfg)
    stats = verify(
        store / "manifest.json", [], tmp_path / "tok", tmp_path / "sources.json", cfg["data"], tmp_path / "stats.json", 0
    )
    assert stats["by_group"] == manifest["by_group"]
    page = data_page(json.loads((tmp_path / "stats.json").read_text()))
    mixture_table = page.split("<h4>Mixture</h4>")[1].split("</table>")[0]
    for name, g in manifest["by_group"].items():
        cells = [name, f"{g['target_share']:.1%}", f"{g['share']:.1%}", f"{g['train_tokens']:,}", f"{g['val_tokens']:,}"]
        assert "".join(f"<td>{c}</td>" for c in cells) in mixture_table, (cells, mixture_table)
