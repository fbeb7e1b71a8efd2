"""Every input kind is read as a stream (H3): paragraph-mode text (in chunks, paragraphs as found, one over
readers.HUGE_RECORD_BYTES spooled), Parquet (page by page, not pre-buffered), `hf:` local datasets
(save_to_disk folders and Parquet data files, batch by batch) and huge lines on the strided scan (a
HugeLine, as line by line). Each gives exactly what a whole-file read gives on tricky small inputs (chunk
sizes made small), and a reader's peak RSS in a fresh process stays flat from one size to 4x."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmpipe import config as cfgmod
from llmpipe.data import readers
from llmpipe.data.readers import BadRecord, ReadStats, StreamedText, jsonl, limits, opener
from llmpipe.data.readers import text as text_reader
from tests.conftest import corpus_docs

DOCS = corpus_docs(120)


def data_cfg(source, **kw) -> dict:
    return cfgmod.load({"data": {"sources": [str(source)], **kw}})["data"]


def seen(pairs) -> list:
    """(location, text or (reason, message)), a streamed text read whole."""
    out = []
    for where, value in pairs:
        if isinstance(value, BadRecord):
            value = (value.reason, str(value))
        elif isinstance(value, StreamedText):
            value = value.read()
        out.append((where, value))
    return out


def small_chunks(monkeypatch, huge: int, chunk: int, piece: int = 3) -> None:
    monkeypatch.setattr(limits, "HUGE_RECORD_BYTES", huge)
    monkeypatch.setattr(limits, "HUGE_CHUNK", chunk)
    monkeypatch.setattr(limits, "SMALL_PIECE", piece)


# ---------------------------------------------------------------- paragraph-mode text


def empty_line_spans(text: str | bytes) -> list[tuple[int, int]]:
    """The reference, by the definition: line ends are CRLF, CR or LF, found left to right (a CR before an LF
    is one CRLF); two in a row make a paragraph break, paired left to right. The pieces' (start, end)."""
    pattern = r"\r\n|\r|\n" if isinstance(text, str) else rb"\r\n|\r|\n"
    ends = [m.span() for m in re.finditer(pattern, text)]
    spans, start, i = [], 0, 0
    while i + 1 < len(ends):
        if ends[i][1] == ends[i + 1][0]:
            spans.append((start, ends[i][0]))
            start, i = ends[i + 1][1], i + 2
        else:
            i += 1
    return [*spans, (start, len(text))]


def split_at_empty_lines(text: str) -> list[str]:
    return [text[a:b] for a, b in empty_line_spans(text)]


def test_paragraph_pieces_are_the_split_at_empty_lines_of_the_whole_text(monkeypatch):
    """Every text of up to 7 characters from {a, CR, LF}, in chunks of 1-5 bytes: the pieces (and which are
    spooled: over HUGE_RECORD_BYTES) are the whole text split at its empty lines, breaks and CRLFs cut
    anywhere; a CRLF line end alone breaks nothing."""
    assert split_at_empty_lines("one\r\ntwo\r\n\r\nthree\r\n") == ["one\r\ntwo", "three\r\n"]
    monkeypatch.setattr(limits, "HUGE_RECORD_BYTES", 4)
    for n in range(8):
        for chars in itertools.product("a\r\n", repeat=n):
            text = "".join(chars)
            want = split_at_empty_lines(text)
            assert [p.decode() for p in text_reader._BREAK_BYTES.split(text.encode())] == want
            data = text.encode()
            for size in (1, 2, 3, 5):
                got = list(text_reader._paragraph_pieces(data[i : i + size] for i in range(0, len(data), size)))
                assert [p.read() if isinstance(p, StreamedText) else p for p in got] == want, (text, size)
                assert [isinstance(p, StreamedText) for p in got] == [len(p) > 4 for p in want], (text, size)


ENDS = ["\n\n", "\r\n\r\n", "\r\r", "\n\r\n", "\r\n\n", "\n\n\n\n", "\r\n\r\n\r\n", "\n \n", "\r\n\r", "\n\r", "\r\n"]


def paragraph_text(bom: bool = False) -> bytes:
    """Corpus paragraphs ended by every newline style and runs of them, whitespace-only, NUL and emoji / CJK
    paragraphs, a long paragraph (single line ends only) and a long whitespace-only one, no final break."""
    parts = []
    for i, doc in enumerate(DOCS[:60]):
        parts.append(doc + ENDS[i % len(ENDS)])
        if i % 7 == 0:
            parts.append(" \t \n\n")
        if i % 11 == 0:
            parts.append("😀日本語é" * 40 + "\r\n\r\n")
        if i == 30:
            parts.append("a NUL \x00 here\n\n" + "long paragraph 😀 é line\n" * 4000 + "\n\n" + " \t\n" * 30_000 + "\r\r")
    parts.append("the last one, no break")
    return (opener.BOM if bom else b"") + "".join(parts).encode()


def whole_paragraphs(url: str, data: bytes) -> list:
    """The reference: the file's bytes (without a byte order mark) split at empty lines, each paragraph
    decoded; one with invalid UTF-8 is a bad record naming it and the file offset of its first bad byte."""
    skip = len(opener.BOM) if data.startswith(opener.BOM) else 0
    out = []
    for i, (a, b) in enumerate(empty_line_spans(data[skip:])):
        where = f"{url}:paragraph {i}"
        try:
            text = data[skip + a : skip + b].decode("utf-8")
        except UnicodeDecodeError as exc:
            out.append((where, ("invalid_utf8", f"{where}: invalid UTF-8 at byte {skip + a + exc.start}")))
            continue
        if text.strip():
            out.append((where, text))
    return out


def test_paragraphs_in_chunks_of_any_size_find_the_byte_order_mark_and_bad_bytes():
    data = opener.BOM + "one\r\ntwo\r\n\r\nthr\xe9e\n\n".encode() + b"bad \xff here\n\n\xe2\x82\n\nlast \xf0\x9f"
    want = whole_paragraphs("f", data)
    assert [w for w, v in want if isinstance(v, tuple)] == ["f:paragraph 2", "f:paragraph 3", "f:paragraph 4"]
    for n in (1, 2, 5, len(data)):
        assert seen(text_reader._paragraphs("f", [data[i : i + n] for i in range(0, len(data), n)])) == want, n


@pytest.mark.parametrize("chunk", [3, 7, 4099])
@pytest.mark.parametrize("case", ["plain", "bom", "bad_utf8_early", "bad_utf8_in_long", "cut_sequence_at_end"])
def test_streamed_paragraph_file_gives_the_whole_file_paragraphs(tmp_path, monkeypatch, case, chunk):
    data = paragraph_text(bom=case == "bom")
    if case == "bad_utf8_early":
        data = data[:5000] + b"\xff" + data[5000:]
    elif case == "bad_utf8_in_long":
        at = data.index(b"long paragraph") + 50_000
        data = data[:at] + b"\xe2\x82" + data[at:]
    elif case == "cut_sequence_at_end":
        data += "😀".encode()[:3]
    path = tmp_path / "corpus.txt"
    path.write_bytes(data)
    url, cfg = str(path), data_cfg(path, text_mode="paragraph")
    want = whole_paragraphs(url, data)
    assert seen(readers.records(url, cfg)) == want  # the file held whole (it is under the threshold)
    small_chunks(monkeypatch, 16 << 10, chunk)
    streamed = list(readers.records(url, cfg))
    assert seen(streamed) == want
    if not case.startswith(("bad", "cut")):
        kinds = [type(v).__name__ for _, v in streamed]
        assert kinds.count("StreamedText") == 1 and len(want) > 80  # the long paragraph; the long blank one skipped


def test_streamed_paragraphs_give_the_same_documents_and_stats(tmp_path, monkeypatch):
    path = tmp_path / "corpus.txt"
    path.write_bytes(paragraph_text())
    cfg = data_cfg(path, text_mode="paragraph", on_bad_record="skip", max_document_chars=6000)
    runs = []
    for streamed in (False, True):
        if streamed:
            small_chunks(monkeypatch, 16 << 10, 1000)
        stats = ReadStats()
        docs = list(readers.documents(str(path), cfg, stats))
        runs.append((docs, stats.as_dict()))
    assert runs[1] == runs[0]
    assert set(runs[0][1]["skipped"]) == {"nul_bytes", "too_long"}


def test_streamed_paragraph_file_gives_the_same_store(tmp_path, monkeypatch):
    """Through tokenize_shard: the same tokens, offsets, document ids and read stats as the file held whole."""
    from tests.test_huge_records import run, streamed_count

    data = paragraph_text(bom=True)
    normal = run(tmp_path, "normal", data, monkeypatch, False, ".txt", text_mode="paragraph", on_bad_record="skip")
    kinds = streamed_count(monkeypatch)
    streamed = run(tmp_path, "streamed", data, monkeypatch, True, ".txt", text_mode="paragraph", on_bad_record="skip")
    assert sum(kinds) == 1 and len(kinds) > 80  # the long paragraph came as a stream
    assert streamed == normal


# ---------------------------------------------------------------- Parquet


def test_parquet_read_page_by_page_gives_the_whole_table(tmp_path, monkeypatch):
    texts = DOCS[:80] + [None, "", "😀 日本語"]
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), path, row_group_size=7, data_page_size=4096)
    assert pq.ParquetFile(path).metadata.num_row_groups == 12
    monkeypatch.setattr(limits, "PARQUET_BATCH", 5)  # batches across row group ends
    monkeypatch.setattr(limits, "HUGE_CHUNK", 4099)  # the column chunks streamed in odd pieces
    want = [(f"{path}:row {i}", t) for i, t in enumerate(pq.read_table(path).column("text").to_pylist())]
    assert list(readers.records(str(path), data_cfg(path))) == want


# ---------------------------------------------------------------- hf: local datasets


def refuse_datasets_streaming(monkeypatch) -> None:
    """datasets' own streaming (a whole row group at once) must not be what reads these folders."""
    import datasets

    def refuse(*a, **k):
        raise AssertionError("datasets' as_streaming_dataset used")

    monkeypatch.setattr(datasets.builder.DatasetBuilder, "as_streaming_dataset", refuse)


def test_hf_save_to_disk_folders_read_as_load_from_disk_reads_them(tmp_path, monkeypatch):
    import datasets

    refuse_datasets_streaming(monkeypatch)
    ds = datasets.Dataset.from_dict({"n": list(range(60)), "text": DOCS[:60]}).shuffle(seed=3).select(range(50))
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    spec = f"hf:{tmp_path / 'saved'}"
    want = [r["text"] for r in datasets.load_from_disk(str(tmp_path / "saved"))]
    assert list(readers.records(spec, data_cfg(spec))) == [(f"{spec}[{i}]", t) for i, t in enumerate(want)]

    datasets.DatasetDict({"train": ds.select(range(10)), "validation": ds.select(range(10, 25))}).save_to_disk(
        str(tmp_path / "dict")
    )
    spec = f"hf:{tmp_path / 'dict'}"
    got = [v for _, v in readers.records(spec, data_cfg(spec, hf_split="validation"))]
    assert got == [r["text"] for r in datasets.load_from_disk(str(tmp_path / "dict"))["validation"]]
    with pytest.raises(ValueError, match=r"no split 'test' \(data.hf_split; splits: train, validation\)"):
        list(readers.records(spec, data_cfg(spec, hf_split="test")))
    missing = list(readers.records(spec, data_cfg(spec, text_field="body")))
    assert len(missing) == 10 and all(v.reason == "missing_field" for _, v in missing)
    assert str(missing[3][1]) == f"{spec}[3]: no 'body' field"


def test_hf_parquet_data_files_read_as_datasets_streams_them(tmp_path, monkeypatch):
    import datasets

    folder = tmp_path / "pq"
    folder.mkdir()
    pq.write_table(pa.table({"text": DOCS[:30]}), folder / "train-00000-of-00002.parquet", row_group_size=4)
    pq.write_table(pa.table({"text": DOCS[30:70]}), folder / "train-00001-of-00002.parquet")
    pq.write_table(pa.table({"text": DOCS[70:75]}), folder / "test-00000-of-00001.parquet")
    spec = f"hf:{folder}"
    want = [r["text"] for r in datasets.load_dataset(str(folder), split="train", streaming=True)]
    assert want == DOCS[:70]
    refuse_datasets_streaming(monkeypatch)
    assert list(readers.records(spec, data_cfg(spec))) == [(f"{spec}[{i}]", t) for i, t in enumerate(want)]
    assert [v for _, v in readers.records(spec, data_cfg(spec, hf_split="test"))] == DOCS[70:75]
    missing = list(readers.records(spec, data_cfg(spec, text_field="body")))
    assert len(missing) == 70 and {v.reason for _, v in missing} == {"missing_field"}


def test_hf_jsonl_data_files_count_a_bad_line_not_lose_its_block(tmp_path, monkeypatch):
    """A local JSON Lines folder, streamed: read as our JSONL reader reads the file (datasets' own streaming
    dropped every good record of the 10 MB block holding one bad line and named the source unreadable)."""
    import datasets

    folder = tmp_path / "js"
    folder.mkdir()
    lines = [json.dumps({"text": d}) for d in DOCS[:40]]
    lines[25], lines[3] = "{broken", json.dumps({"other": 1})
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    spec = f"hf:{folder}"
    good = [d for i, d in enumerate(DOCS[:40]) if i not in (3, 25)]
    refuse_datasets_streaming(monkeypatch)
    stats = readers.ReadStats()
    assert [t for _, t in readers.documents(spec, data_cfg(spec, on_bad_record="skip"), stats)] == good
    assert dict(stats.skipped) == {"missing_field": 1, "bad_json": 1}
    assert stats.examples["bad_json"] == [
        f"{folder / 'train.jsonl'}:26: not valid JSON (unexpected character, expected a string key)"
    ]
    del lines[25], lines[3]
    (folder / "train.jsonl").write_text("\n".join(lines) + "\n")
    monkeypatch.undo()
    want = [r["text"] for r in datasets.load_dataset(str(folder), split="train", streaming=True)]
    refuse_datasets_streaming(monkeypatch)
    assert want == good and [v for _, v in readers.records(spec, data_cfg(spec))] == want


# ---------------------------------------------------------------- huge lines on the strided scan


def huge_lines() -> bytes:
    """Records on 60 lines: long ones (over 64 KiB) at kept and skipped indices of 4 shards, one first (with a
    BOM), one ended by CRLF and followed by CR-only lines, a long blank line, a long bad record, a long
    last line without a line end; short ones between."""
    big = " ".join(DOCS[:40])

    def long(seed: int) -> str:
        return json.dumps({"id": seed, "text": big[seed * 1000 :][:150_000] + ' 😀 "q" \\ end'})

    lines = [opener.BOM.decode() + long(0) + "\n"]
    for i in range(1, 60):
        if i in (5, 10, 19, 22, 36):
            lines.append(long(i) + ("\r\n" if i == 19 else "\n"))
        elif i in (20, 21):
            lines.append(json.dumps({"text": DOCS[i]}) + "\r")
        elif i == 30:
            lines.append(" " * 200_000 + "\n")  # blank: not a record
        elif i == 40:
            lines.append(long(i)[:-2] + ",}\n")  # bad JSON
        else:
            lines.append(json.dumps({"text": DOCS[i]}) + "\n")
    lines.append(long(7))
    return "".join(lines).encode()


def parsed(line: bytes) -> dict:
    try:
        return json.loads(line)
    except ValueError:
        return {}


def strided_read(path, cfg, shard: int, strided: bool, monkeypatch) -> tuple:
    monkeypatch.setattr(limits, "STRIDED_SCAN", strided)
    stats, out = ReadStats(), []
    for index, text in readers.documents(str(path), cfg, stats, lambda i: i % 4 == shard, (shard, 4), streamed=True):
        out.append((index, isinstance(text, StreamedText), text.read() if isinstance(text, StreamedText) else text))
    return out, stats.as_dict()


def test_huge_lines_on_the_strided_scan_come_as_line_by_line(tmp_path, monkeypatch):
    data = huge_lines()
    path = tmp_path / "corpus.jsonl"
    path.write_bytes(data)
    cfg = data_cfg(path, on_bad_record="skip")
    for name, value in {"HUGE_RECORD_BYTES": 64 << 10, "STRIDE_BLOCK": 8191, "LINE_CHUNK": 8191, "HUGE_CHUNK": 4099}.items():
        monkeypatch.setattr(limits, name, value)
    monkeypatch.setattr(limits, "LONG_STRING", 8 << 10)
    calls = []
    scan = jsonl._strided_lines
    monkeypatch.setattr(jsonl, "_strided_lines", lambda *a: calls.append(1) or scan(*a))
    records = [parsed(line) for line in data[len(opener.BOM) :].splitlines() if line.strip()]
    total = 0
    for shard in range(4):
        strided, stats = strided_read(path, cfg, shard, True, monkeypatch)
        assert calls, "the strided scan was not used"
        assert (strided, stats) == strided_read(path, cfg, shard, False, monkeypatch)
        good = [(i, r["text"]) for i, r in enumerate(records) if i % 4 == shard and "text" in r]
        assert [(i, t) for i, _, t in strided] == good
        total += sum(streamed for _, streamed, _ in strided)
    assert total == 7  # every long record with a text came as a stream (the bad one is skipped in its shard)


# ---------------------------------------------------------------- peak RSS at two sizes, in a fresh process

READER = """
import json, sys
from llmpipe import config as cfgmod
from llmpipe.data import readers
from llmpipe.data.readers import limits
limits.HUGE_RECORD_BYTES = 1 << 20  # long paragraphs / records at these sizes
source, kind = sys.argv[1:3]
cfg = cfgmod.load({"data": {"sources": [source], "text_mode": "paragraph"}})["data"]
keep, stride = ((lambda i: i % 4 == 0), (0, 4)) if kind == "strided" else ((lambda i: True), None)
docs = chars = 0
for _, text in readers.documents(source, cfg, readers.ReadStats(), keep, stride, streamed=True):
    docs += 1
    chars += sum(map(len, text.chunks())) if isinstance(text, readers.StreamedText) else len(text)
peak = int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) << 10  # this process's own, after exec
print(json.dumps({"documents": docs, "chars": chars, "peak": peak}))
"""


def texts(mb: float):
    left = mb * 10**6
    for n in itertools.count():
        for doc in DOCS:
            yield f"[{n}] {doc}"
            left -= len(doc)
            if left <= 0:
                return


def long_text(mb: float) -> str:
    return "\n".join(re.sub(r"[\r\n]+", "\n", t.strip()) for t in texts(mb))


def write_input(kind: str, mb: int, folder) -> str:
    """The input of `kind` with about `mb` MB of text; paragraph and strided: a quarter of it one long text."""
    folder.mkdir()
    if kind == "paragraph":
        path = folder / "corpus.txt"
        docs = list(texts(mb * 3 / 4))
        path.write_text("\n\n".join(docs[:100] + [long_text(mb / 4)] + docs[100:]), encoding="utf-8")
    elif kind == "strided":
        path = folder / "corpus.jsonl"
        lines = [json.dumps({"text": t}) for t in texts(mb / 2)]
        lines[100:100] = [json.dumps({"text": long_text(mb / 4)}), json.dumps({"text": long_text(mb / 4)})]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")  # the first long one kept, the other skipped
    elif kind == "hf-saved":
        import datasets

        datasets.Dataset(pa.table({"text": list(texts(mb))})).save_to_disk(str(folder / "saved"))
        return f"hf:{folder / 'saved'}"
    else:  # one row group: read whole by pyarrow's pre-buffering and by datasets' own streaming
        path = folder / ("train.parquet" if kind == "hf-parquet" else "corpus.parquet")
        pq.write_table(pa.table({"text": list(texts(mb))}), path)
        return f"hf:{folder}" if kind == "hf-parquet" else str(path)
    return str(path)


SIZES = (10, 40)  # MB of text
GROWTH = 8 << 20  # the larger input's peak may exceed the smaller's by this much (before: 29-100 MB more)


@pytest.mark.parametrize("kind", ["paragraph", "parquet", "hf-saved", "hf-parquet", "strided"])
def test_peak_memory_is_flat_from_one_size_to_4x(tmp_path, kind):
    runs = []
    for mb in SIZES:
        source = write_input(kind, mb, tmp_path / f"{kind}-{mb}")
        proc = subprocess.run([sys.executable, "-c", READER, source, kind], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    small, large = runs
    assert large["chars"] > 3 * small["chars"] > 0
    growth = large["peak"] - small["peak"]
    assert growth < GROWTH, (
        f"{kind}: peak RSS {small['peak'] >> 20} MiB at {SIZES[0]} MB, {large['peak'] >> 20} MiB at {SIZES[1]} MB"
    )
