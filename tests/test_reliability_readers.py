"""Property tests (hypothesis) over hostile JSONL corpora: malformed JSON, missing and non-string
fields, invalid UTF-8, NUL bytes, empty and huge documents, LF / CRLF / CR line endings (mixed
within a file), a byte order mark, blank lines. Through the real tokenize + token store path with
the real GPT-2 tokenizer: the skip counts per reason are exact, and every good document's tokens
(as an independent `AutoTokenizer` encodes them, + EOS) arrive in the store in record order.
Under `on_bad_record: fail` the run stops at the first bad record, naming its file and line.
"""

import json
import shutil
from collections import Counter

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from llmpipe.data.readers import BadRecord, BadSource, ReadStats, documents
from llmpipe.data.sources import doc_id, is_validation
from llmpipe.data.token_store import TokenStore, build_manifest
from llmpipe.data.tokenize import tokenize_shard
from llmpipe.data.tokenizer import copy_tokenizer
from tests.conftest import GPT2, tiny_config

# A document: any text (newlines of every style inside it included) with something visible in it.
visible = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=60)
lines = st.lists(st.sampled_from(["line", "\r\n", "\n", "\r", " ", "é", "日本", "\t"]), min_size=1, max_size=30)
good_text = st.one_of(
    visible.filter(lambda t: t.strip()),
    lines.map("".join).filter(lambda t: t.strip()),
    visible.filter(lambda t: t.strip()),
    lines.map("".join).filter(lambda t: t.strip()),
    st.tuples(st.sampled_from(["huge document ", "x"]), st.integers(20_000, 60_000)).map(lambda p: p[0] * p[1]),
)


def jline(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8")


# (kind, raw line bytes, good text or None); kind is the skip reason, "good", or "blank" (not a record)
record = st.one_of(
    good_text.map(lambda t: ("good", jline({"text": t, "id": 1}), t)),
    st.sampled_from(["", " ", "\n\t ", "\u3000"]).map(lambda t: ("empty", jline({"text": t}), None)),
    visible.map(lambda t: ("nul_bytes", jline({"text": t + "\x00" + t}), None)),
    st.one_of(
        st.integers(),
        st.none(),
        st.lists(st.integers(), max_size=3),
        st.booleans(),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    ).map(lambda v: ("not_string", jline({"text": v}), None)),
    st.one_of(st.just({"txt": "a"}), st.just({}), st.just([1, 2]), st.just("text"), st.just(3)).map(
        lambda v: ("missing_field", jline(v), None)
    ),
    st.sampled_from(
        [
            b'{"text": "unterminated',
            b'{"text": }',
            b"{text: 'a'}",
            b'{"text": "a"} x',
            b"[",
            b'{"text": "a\\q"}',
            b'{"text": "raw\ttab"',
        ]
    ).map(lambda b: ("bad_json", b, None)),
    st.sampled_from([b'{"text": "caf\xe9"}', b'{"text": "\xff\xfe"}', b'{"text": "ok", "x": "\xc3"}', b'\x80{"text": "a"}']).map(
        lambda b: ("invalid_utf8", b, None)
    ),
    st.sampled_from([b"", b"   ", b"\t"]).map(lambda b: ("blank", b, None)),
)
corpus = st.tuples(
    st.lists(st.tuples(record, st.sampled_from([b"\n", b"\r\n", b"\r"])), min_size=1, max_size=25),
    st.booleans(),  # final line without its newline
    st.booleans(),  # UTF-8 byte order mark
)


def build(tmp, items, open_end, bom):
    raw, prev = (b"\xef\xbb\xbf" if bom else b""), b""
    for i, ((_, line, _), nl) in enumerate(items):
        if prev == b"\r" and not line and nl.startswith(b"\n"):
            nl = b"\r"  # CR + an empty LF line would read as one CRLF (in any reader)
        raw += line + (b"" if open_end and i == len(items) - 1 else nl)
        prev = nl
    path = tmp / "corpus.jsonl"
    path.write_bytes(raw)
    records = [(kind, text) for (kind, _, text), _ in items if kind != "blank"]
    return path, records


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("gpt2") / "tok"
    copy_tokenizer(str(GPT2), out)
    return out, AutoTokenizer.from_pretrained(str(GPT2))


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(corpus)
@example(([(("bad_json", b"[", None), b"\n"), (("good", b'{"text": "a"}', "a"), b"\n")], False, False))
def test_skip_counts_exact_and_good_tokens_in_order(tmp_path, gpt2, sample):
    tok_dir, tok = gpt2
    work = tmp_path / "w"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    path, records = build(work, *sample)
    cfg = tiny_config(
        work,
        data={"sources": [str(path)], "num_shards": 1, "on_bad_record": "skip", "val_fraction": 0.3},
        tokenizer={"source": str(GPT2)},
    )
    tokenize_shard(cfg, [str(path)], 0, tok_dir, work / "tokens" / "shard-00000.safetensors")
    manifest = build_manifest([work / "tokens" / "shard-00000.safetensors"], work / "tokens" / "manifest.json")
    if sample[0][0][0][1] == b"[":  # a first line "[": a JSON array, skipped whole as a source, named and counted
        assert manifest["read"]["documents"] == 0 and manifest["read"]["skipped"] == {}
        assert manifest["read"]["sources_skipped"] == {"unreadable_source": 1}
        assert "is a JSON array" in manifest["read"]["sources_skipped_examples"]["unreadable_source"][str(path)]
        return

    expected_skips = Counter(kind for kind, _ in records if kind != "good")
    assert manifest["read"]["skipped"] == dict(expected_skips)
    good = [(i, text) for i, (kind, text) in enumerate(records) if kind == "good"]
    assert manifest["read"]["documents"] == len(good)

    # every good document, in record order, per split, exactly as the HF tokenizer encodes it + EOS
    store = TokenStore(work / "tokens" / "manifest.json")
    with safe_open(str(work / "tokens" / "shard-00000.safetensors"), framework="numpy") as f:
        for split in ("train", "val"):
            want = [
                (doc_id(0, i), tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
                for i, text in good
                if is_validation(0, i, 0.3, 0) == (split == "val")
            ]
            offsets, ids = f.get_tensor(f"{split}.offsets"), f.get_tensor(f"{split}.doc_ids")
            stream = store.tokens(split).tolist()
            got = [(int(d), stream[offsets[k] : offsets[k + 1]]) for k, d in enumerate(ids)]
            assert got == want
            assert stream == [t for _, toks in want for t in toks]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corpus)
@example(([(("bad_json", b"[", None), b"\n")], False, False))  # a first line "[": a pretty-printed JSON array
@example(([(("bad_json", b"[", None), b"\n")], False, True))
def test_fail_policy_stops_at_first_bad_record_with_its_line(tmp_path, sample):
    items, open_end, bom = sample
    path, records = build(tmp_path, items, open_end, bom)
    cfg = tiny_config(tmp_path, data={"sources": [str(path)], "on_bad_record": "fail"})["data"]
    kinds = [kind for (kind, _, _), _ in items]
    bad = next((n for n, k in enumerate(kinds, 1) if k not in ("good", "blank", "empty")), None)
    stats = ReadStats()
    if set(kinds) == {"blank"}:  # no record at all: the source itself is named
        with pytest.raises(BadSource) as err:
            list(documents(str(path), cfg, stats))
        assert err.value.reason == "empty_source" and err.value.where == str(path)
    elif bad is None:
        texts = [t for _, t in documents(str(path), cfg, stats)]
        assert texts == [t for k, t in records if k == "good"]
        assert dict(stats.skipped) == ({"empty": kinds.count("empty")} if "empty" in kinds else {})
    elif bad == 1 and items[0][0][1] == b"[":  # the source is named, as a JSON array is (not line 1 of JSONL)
        with pytest.raises(BadSource, match="is a JSON array, not JSON Lines") as err:
            list(documents(str(path), cfg, stats))
        assert err.value.where == str(path)
    else:
        with pytest.raises(BadRecord) as err:
            list(documents(str(path), cfg, stats))
        assert err.value.where == f"{path}:{bad}"  # line numbers count LF, CRLF and CR alike
        assert err.value.reason == kinds[bad - 1]
