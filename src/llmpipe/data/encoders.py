"""The encoders the data stages use: the HF tokenizer itself, or tiktoken over the same BPE ranks where it
gives exactly the same ids (checked on a sample and fixed probes); long documents in pieces (long_docs)."""

from __future__ import annotations

import functools
import json
import logging
import re
from pathlib import Path

import numpy as np

from llmpipe.data import long_docs
from llmpipe.data.long_docs import GPT2_PATTERN
from llmpipe.data.tokenizer import _file_key, load_backend

log = logging.getLogger(__name__)

SAMPLE_CHARS, SAMPLE_HEAD_CHARS = 1 << 16, 1 << 10  # of a job's first texts, for the equality check
# Strings that exercise the pre-tokenizer's corners, added to every equality check.
PROBES = [
    "Hello world",
    "  leading and trailing  ",
    "tabs\tand\nnew\n\nlines\r\n",
    "don't we'll they've I'M",
    "numbers 1234567 3.14159 1,000,000",
    "ünïcödé café naïve 日本語のテキスト 😀👍🏽",
    "a  b   c    d\n\n\n",
    "punctuation!!! ??? ... ---",
    "MiXeD CaSe and_snake_case and camelCase",
    "x" * 300,
    " " * 50 + "end",
]


class _LongDocuments:
    """Long documents (over `long_chars` characters) encoded piecewise with the ids of encoding them whole
    (data/long_docs.py); `stats` counts what happened; failures name the document (`where`)."""

    threads: int

    def _init_long(self, long_pretoken: str) -> None:
        if long_pretoken not in long_docs.POLICIES:
            raise ValueError(f"data.long_pretoken must be one of {', '.join(long_docs.POLICIES)}, not {long_pretoken!r}")
        self.long_pretoken = long_pretoken
        self.long_chars = long_docs.LONG_DOC_CHARS
        self.piece_chars = long_docs.PIECE_CHARS
        self.max_pretoken = long_docs.MAX_PRETOKEN_CHARS
        self._cutter = None  # built on the first long document; False: this tokenizer cannot be cut exactly

    def set_long(self, long_chars=None, piece=None, max_pretoken=None, policy=None) -> None:
        """Change the long-document settings (tests use small pieces)."""
        if policy is not None:
            self._init_long(policy)
        for attr, value in (("long_chars", long_chars), ("piece_chars", piece), ("max_pretoken", max_pretoken)):
            if value is not None:
                setattr(self, attr, value)
        self._cutter = None

    def _make_cutter(self):
        raise NotImplementedError

    def _encode(self, texts: list[str]) -> list[list[int]]:
        raise NotImplementedError

    def encode_batch(self, texts: list[str], where=None, stream: bool = False) -> list:
        """The ids of each text. `where`: each text's origin, named if the tokenizer fails. A document over
        `long_chars` characters is encoded piecewise; `stream`: it comes as long_docs.Pieces (an iterable of
        id lists, encoded as it is read), else as one list; None: dropped under data.long_pretoken: skip."""
        if all(isinstance(t, str) and len(t) <= self.long_chars for t in texts):  # else: a streamed one (readers.StreamedText)
            return long_docs.guarded(self._encode, texts, where)
        return long_docs.encode_mixed(texts, where, stream, self._encode, self._long, self.long_chars)

    def _long(self, text: str, where: str):
        if self._cutter is None:
            self._cutter = self._make_cutter() or False
            if not self._cutter:
                log.warning("%s: the tokenizer cannot be cut exactly: long documents are encoded whole", self.name)
        streamed = not isinstance(text, str)  # readers.StreamedText: a document too long to hold
        if not self._cutter:
            self.stats["long_documents_whole"] += 1
            if streamed:
                log.warning(
                    "%s: document of %d characters read whole into memory: %s cannot be cut exactly", where, len(text), self.name
                )
                text = text.read()
            return long_docs.guarded(self._encode, [text], [where])[0]
        try:
            if streamed:
                spans = self._cutter.plan_stream(text.chunks(), self.long_pretoken, self.stats)
            else:
                spans = self._cutter.plan(text, self.long_pretoken, self.stats)
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as exc:
            raise long_docs.EncodeError(where, len(text), exc) from exc
        if spans is None:
            self.stats["long_documents_skipped"] += 1
            log.warning(
                "%s: document of %d characters dropped (data.long_pretoken: skip): it holds a pre-token longer than %d "
                "characters",
                where,
                len(text),
                self.max_pretoken,
            )
            return None
        self.stats["long_documents"] += 1
        self.stats["long_pieces"] += len(spans)
        if streamed:
            return long_docs.StreamPieces(text, spans, self._encode_piece, self.threads, where)
        return long_docs.Pieces(text, spans, self._encode_piece, self.threads, where)

    def _encode_piece(self, texts: list[str]) -> list[list[int]]:
        return self._encode(texts)


class HFEncoder(_LongDocuments):
    name = "hf"

    def __init__(self, path: str | Path, threads: int, tok=None, long_pretoken: str = "split"):
        import os

        os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        self.tok = tok or load_backend(path)
        self.threads = threads
        self.stats = long_docs.stats_dict()
        self._init_long(long_pretoken)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        # the _fast variant skips character offsets (unused here): same ids, ~12 % faster
        return [e.ids for e in self.tok.encode_batch_fast(texts, add_special_tokens=False)]

    def _make_cutter(self):
        """Cuts from the HF pre-tokenizer itself, if its pattern is one long_docs knows to be exact."""
        pre = self.tok.pre_tokenizer
        if self.tok.normalizer is not None or pre is None:
            return None
        if _pattern(json.loads(pre.__getstate__())) not in long_docs.safe_patterns():
            return None
        added = list(self.tok.get_added_tokens_decoder().values())
        if any(t.lstrip or t.rstrip or t.single_word for t in added):
            return None  # added tokens that take whitespace along: their boundaries move
        special, special_len = long_docs.special_regex([t.content for t in added])

        def starts(window: str) -> list[int]:
            return [a for _, (a, _) in pre.pre_tokenize_str(window)]

        return long_docs.Cutter(starts, special, special_len, self.piece_chars, self.max_pretoken)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte <-> printable character table used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _pattern(pre: dict | None) -> str | None:
    """The split regex tiktoken needs, if the pre-tokenizer is plain byte-level (GPT-2 / Llama-3 style)."""
    if not pre:
        return None
    if pre["type"] == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space"):
        return GPT2_PATTERN
    if pre["type"] == "Sequence" and len(pre["pretokenizers"]) == 2:
        split, byte = pre["pretokenizers"]
        if (
            split["type"] == "Split"
            and "Regex" in split["pattern"]
            and split.get("behavior") == "Isolated"
            and not split.get("invert")
            and byte["type"] == "ByteLevel"
            and not byte.get("use_regex", True)
            and not byte.get("add_prefix_space")
        ):
            return split["pattern"]["Regex"]
    return None


@functools.lru_cache(maxsize=4)
def _tiktoken_core(key: tuple):
    """(tiktoken.Encoding over the BPE ranks, pre-tokenizer pattern, regex of the added tokens' text or None)
    of a tokenizer.json (see _file_key); ValueError when it is not a plain byte-level BPE."""
    import orjson
    import tiktoken

    spec = orjson.loads(Path(key[0]).read_bytes())
    model = spec["model"]
    if model.get("type") != "BPE" or spec.get("normalizer") or model.get("byte_fallback"):
        raise ValueError("not a plain byte-level BPE (normalizer or byte fallback present)")
    pattern = _pattern(spec.get("pre_tokenizer"))
    if pattern is None:
        raise ValueError("pre-tokenizer is not GPT-2/Llama-3 style byte-level")
    # byte-level characters -> the bytes they stand for (as latin-1); any other character -> U+FFFF,
    # which latin-1 cannot encode
    table = dict.fromkeys(range(512), 0xFFFF) | {ord(c): b for b, c in _bytes_to_unicode().items()}
    special = {t["id"] for t in spec.get("added_tokens", [])}
    ranks = {}
    for token, rank in model["vocab"].items():
        if rank in special:
            continue
        try:
            ranks[token.translate(table).encode("latin-1")] = rank
        except UnicodeEncodeError:
            raise ValueError(f"vocabulary entry {token!r} is not byte-level") from None
    # the added tokens as tiktoken special tokens: encode_ordinary ignores them; encode_docs joins
    # documents with them (tiktoken encodes the text between special tokens as texts of their own)
    added = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    enc = tiktoken.Encoding("llmpipe", pat_str=pattern, mergeable_ranks=ranks, special_tokens=added)
    return enc, pattern, (re.compile("|".join(map(re.escape, added))) if added else None)


class TiktokenEncoder(_LongDocuments):
    """tiktoken over the same BPE ranks; documents holding a special token's text go through HF."""

    name = "tiktoken"

    def __init__(self, path: str | Path, threads: int, hf: HFEncoder | None = None):
        self.enc, pattern, self.special_re = _tiktoken_core(_file_key(path))
        added = list(self.enc._special_tokens)  # one (GPT-2's EOS): `in`, ~1.4x the regex's speed
        self._holds_added = (
            (lambda text, one=added[0]: one in text) if len(added) == 1 else self.special_re and self.special_re.search
        )
        self.threads = threads
        self.hf = hf or HFEncoder(path, threads)
        self.pattern = pattern
        self.stats = self.hf.stats  # one count for both paths (long documents holding a special token go through HF)
        self._init_long(self.hf.long_pretoken)

    def set_long(self, long_chars=None, piece=None, max_pretoken=None, policy=None) -> None:
        super().set_long(long_chars, piece, max_pretoken, policy)
        self.hf.set_long(long_chars, piece, max_pretoken, policy)

    def _encode_piece(self, texts: list[str]) -> list[list[int]]:
        if self.threads > 1:
            return self.enc.encode_ordinary_batch(texts, num_threads=self.threads)
        return [self.enc.encode_ordinary(t) for t in texts]  # the batch call's pool costs more than it gives on 1 thread

    def _make_cutter(self):
        """Cuts from the HF pre-tokenizer (the same split: the sample check holds tiktoken's ids to HF's). Not
        Python's `regex` module on tiktoken's pattern: its Unicode tables may be newer than the tokenizers'
        (a character new in Unicode 17 is \\p{N} there, unassigned in both tokenizers), so it could cut inside
        one of their pre-tokens."""
        if self.pattern not in long_docs.safe_patterns():
            return None
        pre = self.hf.tok.pre_tokenizer  # no normalizer (_tiktoken_core); added tokens' text goes through HF (_long)

        def starts(window: str) -> list[int]:
            return [a for _, (a, _) in pre.pre_tokenize_str(window)]

        return long_docs.Cutter(starts, None, 0, self.piece_chars, self.max_pretoken)

    def _long(self, text: str, where: str):
        if self.special_re and (  # as for short documents: HF matches added tokens (and cuts streamed ones too)
            self.special_re.search(text) if isinstance(text, str) else long_docs.contains(text, self.special_re)
        ):
            return self.hf._long(text, where)
        return super()._long(text, where)

    def encode_docs(self, texts: list[str], prefix: list[int], suffix: list[int]):
        """(token array, length of each document) of `texts`, each as prefix + ids + suffix, from one
        tiktoken call on the texts joined by the prefix and suffix tokens: tiktoken encodes the text
        between special tokens as separate texts, so the ids are those of encoding each document alone,
        without a Python int per token. None where it does not apply: a suffix other than one added token
        (not also in the prefix), a text holding an added token's text, or a long document (the caller
        takes the per-document path)."""
        text_of = {i: t for t, i in self.enc._special_tokens.items()}
        if len(suffix) != 1 or suffix[0] in prefix or not all(i in text_of for i in prefix + suffix):
            return None
        if any(type(t) is not str or len(t) > self.long_chars for t in texts):
            return None
        if self.special_re and any(map(self._holds_added, texts)):
            return None
        head, tail = "".join(text_of[i] for i in prefix), text_of[suffix[0]]
        ids = self.enc.encode_to_numpy(head + (tail + head).join(texts) + tail, allowed_special="all")
        ends = np.flatnonzero(ids == suffix[0]) + 1
        if len(ends) != len(texts) or (len(ends) and ends[-1] != ids.size):
            raise AssertionError(f"tiktoken gave {len(ends)} document ends for {len(texts)} documents")
        return ids, np.diff(ends, prepend=0)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        out = self._encode_piece(texts)
        if self.special_re:
            for i, text in enumerate(texts):
                if self.special_re.search(text):  # HF matches added tokens inside text; tiktoken would not
                    out[i] = self.hf._encode([text])[0]
        return out


def make_encoder(
    path: str | Path,
    backend: str,
    sample: list[str],
    threads: int = 1,
    tok=None,
    long_pretoken: str = "split",
    where: list[str] | None = None,
):
    """The fastest encoder that gives exactly the HF tokenizer's ids on the heads of the `sample` texts
    (SAMPLE_CHARS in all) + PROBES (`tok`: the tokenizers.Tokenizer of `path`, if already
    loaded). `long_pretoken`: data.long_pretoken, for pre-tokens too long to encode (long_docs.py);
    `where`: the sample texts' origins, named if the tokenizer fails on one."""
    hf, fast = encoders(path, backend, threads, tok, long_pretoken)
    return fast if fast is not None and sample_agrees(hf, fast, backend, sample, where) else hf


def encoders(path: str | Path, backend: str, threads: int = 1, tok=None, long_pretoken: str = "split"):
    """(HF encoder, tiktoken encoder or None where tokenizer.backend or the tokenizer rules it out)."""
    hf = HFEncoder(path, threads, tok, long_pretoken)
    if backend == "hf":
        return hf, None
    try:
        return hf, TiktokenEncoder(path, threads, hf)
    except (ValueError, KeyError) as exc:
        if backend == "tiktoken":
            raise ValueError(f"tokenizer.backend is 'tiktoken' but {path} cannot use it: {exc}") from None
        log.warning("tiktoken backend not usable (%s): using the HF tokenizer", exc)
        return hf, None


def sample_agrees(hf, fast, backend: str, sample: list[str], where: list[str] | None = None) -> bool:
    """Whether `fast` gives the HF ids on the heads of `sample` + PROBES (backend 'tiktoken': it must)."""
    head = max(SAMPLE_HEAD_CHARS, SAMPLE_CHARS // max(len(sample), 1))  # the HF side of the check costs ~0.4 s per MiB
    head = min(head, long_docs.LONG_DOC_CHARS)  # never a long document (those are encoded, and counted, piecewise)
    check = [t[:head] for t in sample] + PROBES
    names = [long_docs.name(where, i) for i in range(len(sample))] + [f"tokenizer probe {j}" for j in range(len(PROBES))]
    try:
        want, got = hf.encode_batch(check, names), fast.encode_batch(check, names)
    except long_docs.EncodeError as exc:  # on a head: name the whole document's size, as encoding it would
        cut = [i for i in range(len(sample)) if names[i] == exc.where and len(check[i]) < len(sample[i])]
        if cut and exc.__cause__ is not None:
            raise long_docs.EncodeError(exc.where, len(sample[cut[0]]), exc.__cause__) from exc.__cause__
        raise
    bad = [i for i, (a, b) in enumerate(zip(want, got)) if a != b]
    if bad:
        msg = f"tiktoken ids differ from the HF tokenizer on {len(bad)} of {len(check)} sample texts"
        if backend == "tiktoken":
            raise ValueError(msg)
        log.warning("%s: falling back to the HF tokenizer", msg)
        return False
    log.info("tiktoken backend: ids equal to the HF tokenizer on %d sample texts", len(check))
    return True
