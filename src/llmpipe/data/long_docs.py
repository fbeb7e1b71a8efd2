"""Long documents, encoded in pieces with exactly the ids of encoding them whole, in bounded memory.

A byte-level BPE with a regex pre-tokenizer (GPT-2, Llama-3) encodes each pre-token on its own: BPE
never merges across pre-token boundaries, so text cut where the pre-tokenizer itself starts a
pre-token encodes, piece by piece, to the same ids as the whole text. A cut at x is such a boundary
when the scan of the whole text, from the piece's start (itself a boundary), reaches x as a match
start and no match before x looked at characters past the piece's end. The cuts, in the order tried:

1. a space (U+0020) right after a non-space character. No alternative of the GPT-2 or Llama-3 pattern
   matches a non-space character followed by a space (a space only ever opens a match or sits in a
   whitespace run), and every character is in some match, so every scan starts a match there; the
   matches before it end at a non-space character and looked at most at x (no lookahead past a
   non-space character). The common case: one `str.rfind`-like scan, no pre-tokenizing.
2. the start or the end of an added (special) token's text: the HF tokenizer splits those out before
   pre-tokenizing, so they are hard boundaries (tiktoken sends documents holding one to HF).
3. otherwise (no space in the window: CJK, digits, newlines, one long word): the tokenizer's own
   pre-tokenizer runs on the window text[pos:pos + w] and the cut is its last pre-token start that is
   at most `MARGIN` characters from the window's end, not inside the window's trailing whitespace
   run and not right after two whitespace characters (a run of 2+ whitespace ended by the cut is one
   pre-token at the end of a piece, `\\s+(?!\\S)` at the end of the text, but two in the whole text,
   where it backs off before the next non-space: "\n\n" is 628 alone, 198 198 before a letter). Past a match's end the patterns look at most 3 characters ahead (contractions, greedy runs,
   `\\p{N}{1,3}`), except whitespace alternatives (`\\s+(?!\\S)`, `\\s*[\\r\\n]+`), which look to the end
   of their whitespace run: so every match before such a cut was decided inside the window, and the
   scan of the whole text makes the same matches up to the cut (digit runs stay grouped by 3 from
   their start, `'ll` is not split, spaces before a newline stay with the newline).

No cut in a window of `max_pretoken` characters: one pre-token longer than that (a megabyte of
spaces, one endless word), which the tokenizer cannot encode in bounded memory. `data.long_pretoken`
says what then: `split` cuts it at `max_pretoken` characters (those ids differ from encoding the
whole; counted), `skip` drops the document (counted).

A document too long to hold (readers.StreamedText: a JSONL record or text file over
readers.limits.HUGE_RECORD_BYTES) is cut by Cutter.plan_stream, which fills a buffer from the stream only as far
as each step of plan() looks (the window plus the longest added token), so its cuts are plan()'s; then
StreamPieces reads it again, one group of pieces at a time. Peak memory: a few windows, whatever its size.

Only the pre-tokenizer patterns analysed above (`SAFE_PATTERNS`) are cut, and only without a
normalizer; other tokenizers encode long documents whole, as before, counted in `long_documents_whole`.
"""

from __future__ import annotations

import bisect
import logging
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

log = logging.getLogger(__name__)

LONG_DOC_CHARS = 1 << 20  # longer documents are encoded piecewise; shorter ones go through the batch path unchanged
PIECE_CHARS = 1 << 20  # characters per piece (the pre-tokenizer window)
MAX_PRETOKEN_CHARS = 1 << 20  # a pre-token longer than this goes under data.long_pretoken
MARGIN = 8  # rule 3: characters kept clear of the window's end (the patterns look at most 3 ahead)
POLICIES = ("split", "skip")

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_HF_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_SPACE_AFTER_NONSPACE = re.compile(r"\S ")  # Python's \s is str.isspace: a superset of the engines' \s
_TAIL = 4096  # rule 1 looks at the window's last _TAIL characters first


def safe_patterns() -> set[str]:
    return {GPT2_PATTERN, GPT2_HF_PATTERN, LLAMA3_PATTERN}


def stats_dict() -> dict:
    return {
        "long_documents": 0,  # encoded piecewise
        "long_pieces": 0,
        "long_pretokens_split": 0,  # cuts made inside a pre-token (data.long_pretoken: split)
        "long_documents_skipped": 0,  # dropped (data.long_pretoken: skip)
        "long_documents_whole": 0,  # long, but the tokenizer cannot be cut exactly: encoded whole
    }


class EncodeError(RuntimeError):
    """The tokenizer failed on a document: names where it comes from and its size."""

    def __init__(self, where: str, chars: int, exc: BaseException, piece: tuple[int, int] | None = None):
        at = f" (piece at characters {piece[0]}..{piece[1]})" if piece else ""
        super().__init__(
            f"{where}: the tokenizer failed on this document of {chars:,} characters{at}: {type(exc).__name__}: {exc}"
        )
        self.where, self.chars = where, chars

    def relabel(self, where: str) -> EncodeError:
        """The same failure, its document named by `where` (e.g. the file:line the reader found it at)."""
        out = EncodeError.__new__(EncodeError)
        RuntimeError.__init__(out, str(self).replace(self.where, where, 1))
        out.where, out.chars = where, self.chars
        return out


def guarded(encode: Callable[[list[str]], list], texts: list[str], where: Sequence[str] | None) -> list:
    """encode(texts), any failure re-raised as EncodeError naming the document (found by retrying one by one)."""
    try:
        return encode(texts)
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # pyo3's PanicException is a BaseException
        if isinstance(exc, EncodeError):
            raise
        first = exc
    for i, text in enumerate(texts):
        try:
            encode([text])
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as exc:
            raise EncodeError(name(where, i), len(text), exc) from exc
    raise EncodeError(f"{name(where, 0)} .. {name(where, len(texts) - 1)}", sum(map(len, texts)), first) from first


def name(where: Sequence[str] | None, i: int) -> str:
    return where[i] if where is not None else f"document {i} of the batch"


class Cutter:
    """Finds the cuts of one tokenizer. `pretokenize(window)`: the start offsets (characters) of the
    window's pre-tokens; `special`: a regex matching added tokens' text leftmost-longest, or None."""

    def __init__(
        self,
        pretokenize: Callable[[str], list[int]],
        special: re.Pattern | None,
        special_len: int,
        piece: int = PIECE_CHARS,
        max_pretoken: int = MAX_PRETOKEN_CHARS,
    ):
        self.pretokenize, self.special, self.special_len = pretokenize, special, special_len
        self.piece, self.max_pretoken = piece, max_pretoken

    def plan(self, text: str, policy: str, stats: dict) -> list[tuple[int, int]] | None:
        """The pieces (start, end) of `text`, or None to drop it (policy skip)."""
        spans, pos, n = [], 0, len(text)
        while pos < n:
            w = self.piece
            while True:
                if pos + w >= n:
                    spans.append((pos, n))
                    pos = n
                    break
                cut = self._cut(text, pos, pos + w)
                if cut:
                    spans.append((pos, cut))
                    pos = cut
                    break
                if w >= self.max_pretoken + MARGIN:  # one pre-token longer than max_pretoken
                    if policy == "skip":
                        return None
                    stats["long_pretokens_split"] += 1
                    spans.append((pos, pos + self.max_pretoken))
                    pos += self.max_pretoken
                    break
                w = min(2 * w, self.max_pretoken + MARGIN)
        return spans

    def plan_stream(self, chunks: Iterable[str], policy: str, stats: dict) -> list[tuple[int, int]] | None:
        """plan() of the text that `chunks` make up, holding only a window of it: the same pieces. Each step
        of plan() looks at text[pos : pos + w + special_len + 1] at most (and whether the text ends before
        pos + w), so the buffer is filled that far, then cut exactly as plan() cuts the whole text."""
        spans, off, buf, it, done = [], 0, "", iter(chunks), False
        extra = max(1, self.special_len) + 1

        def fill(k: int) -> None:
            nonlocal buf, done
            parts, have = [buf], len(buf)
            while have < k and not done:
                chunk = next(it, None)
                if chunk is None:
                    done = True
                else:
                    parts.append(chunk)
                    have += len(chunk)
            if len(parts) > 1:
                buf = "".join(parts)

        while True:
            fill(self.piece + extra)
            if done and not buf:
                return spans
            w = self.piece
            while True:
                fill(w + extra)
                if done and len(buf) <= w:
                    step = len(buf)
                else:
                    step = self._cut(buf, 0, w)
                    if not step and w >= self.max_pretoken + MARGIN:
                        if policy == "skip":
                            return None
                        stats["long_pretokens_split"] += 1
                        step = self.max_pretoken
                    elif not step:
                        w = min(2 * w, self.max_pretoken + MARGIN)
                        continue
                spans.append((off, off + step))
                off, buf = off + step, buf[step:]
                break

    def _cut(self, text: str, pos: int, hi: int) -> int:
        """The largest safe cut in (pos, hi], or 0."""
        matches = []
        if self.special is not None:  # complete matches only: a longer token ends before hi + special_len
            matches = [(m.start(), m.end()) for m in self.special.finditer(text, pos, min(len(text), hi + self.special_len))]
            matches = [m for m in matches if m[0] <= hi]
        best = 0
        for start, end in matches:  # rule 2
            best = max(best, *(b for b in (start, end) if pos < b <= hi), 0)
        x = self._space_cut(text, pos, hi)  # rule 1
        if x and not any(start < x < end for start, end in matches):
            best = max(best, x)
        if best or matches:
            return best
        window = text[pos:hi]  # rule 3: no added token in the window
        limit = min(len(window.rstrip()), len(window) - MARGIN)
        starts = self.pretokenize(window)
        i = bisect.bisect_right(starts, limit) - 1
        while i >= 0 and starts[i] > 1 and window[starts[i] - 2 : starts[i]].isspace():  # after 2+ whitespace: not a cut
            i -= 1
        return pos + starts[i] if i >= 0 and starts[i] > 0 else 0

    @staticmethod
    def _space_cut(text: str, pos: int, hi: int) -> int:
        """The last x in (pos, hi] with text[x] == ' ' and text[x - 1] not whitespace, or 0."""
        end = min(hi + 1, len(text))
        size = _TAIL
        start = max(pos, end - size)
        while True:
            last = deque(_SPACE_AFTER_NONSPACE.finditer(text, start, end), maxlen=1)
            if last:
                return last[0].start() + 1
            if start == pos:
                return 0
            end = start + 1  # a match may straddle the block start
            size *= 4
            start = max(pos, end - size)


class Pieces:
    """A long document's ids, piece by piece (an iterable of id lists), encoded as it is iterated."""

    def __init__(self, text: str, spans: list[tuple[int, int]], encode: Callable[[list[str]], list], group: int, where: str):
        self.text, self.spans, self.encode, self.group, self.where = text, spans, encode, max(1, group), where

    def __iter__(self) -> Iterator[list[int]]:
        for i in range(0, len(self.spans), self.group):
            spans = self.spans[i : i + self.group]
            try:
                out = self.encode([self.text[a:b] for a, b in spans])
            except (KeyboardInterrupt, SystemExit, GeneratorExit):
                raise
            except BaseException as exc:
                raise EncodeError(self.where, len(self.text), exc, (spans[0][0], spans[-1][1])) from exc
            yield from out

    def ids(self) -> list[int]:
        out = []
        for ids in self:
            out.extend(ids)
        return out


class StreamPieces(Pieces):
    """Pieces of a streamed document (readers.StreamedText: chunks() reads it again), encoded as iterated,
    holding only the pieces of one group."""

    def __init__(self, doc, spans: list[tuple[int, int]], encode: Callable[[list[str]], list], group: int, where: str):
        super().__init__("", spans, encode, group, where)
        self.doc = doc

    def __iter__(self) -> Iterator[list[int]]:
        it, buf, off = iter(self.doc.chunks()), "", 0
        for i in range(0, len(self.spans), self.group):
            spans = self.spans[i : i + self.group]
            end = spans[-1][1]
            parts, have = [buf], off + len(buf)
            while have < end:
                chunk = next(it)
                parts.append(chunk)
                have += len(chunk)
            buf = "".join(parts)
            texts = [buf[a - off : b - off] for a, b in spans]
            buf, off = buf[end - off :], end
            try:
                out = self.encode(texts)
            except (KeyboardInterrupt, SystemExit, GeneratorExit):
                raise
            except BaseException as exc:
                raise EncodeError(self.where, len(self.doc), exc, (spans[0][0], end)) from exc
            del texts
            yield from out


def contains(doc, regex: re.Pattern, overlap: int = 4096) -> bool:
    """regex.search on a streamed document (chunks), for matches up to `overlap` characters long."""
    tail = ""
    for chunk in doc.chunks():
        text = tail + chunk
        if regex.search(text):
            return True
        tail = text[-overlap:]
    return False


def describe_doc(sources: Sequence[str], did: int) -> str:
    """`source: record N` of a document id (source index << RECORD_BITS | record index), `source: byte N` in a
    file cut into byte ranges (the index is the byte offset of the record's line)."""
    from llmpipe.data.sources import RECORD_BITS

    record, source = did & ((1 << RECORD_BITS) - 1), sources[did >> RECORD_BITS]
    return f"{source}: {'byte' if getattr(source, 'ranges', None) else 'record'} {record}"


def write_pieces(writer, did: int, prefix: list[int], pieces: Pieces, suffix: list[int]) -> None:
    """One long document into a token-store split writer (shard_set.SplitWriter) as its pieces are encoded:
    prefix + ids + suffix, in the writer's dtype, with its offset and doc id, as add_batch would write it."""
    import numpy as np

    n = 0
    for ids in _chain(prefix, pieces, suffix):
        if not ids:
            continue
        data = np.asarray(ids, dtype=writer.dtype).tobytes()
        writer.fh.write(data)
        writer.sha.update(data)
        n += len(ids)
    writer.offsets.append(writer.offsets[-1] + n)
    writer.doc_ids.append(did)


def _chain(prefix: list[int], pieces: Pieces, suffix: list[int]) -> Iterator[list[int]]:
    yield prefix
    yield from pieces
    yield suffix


def encode_mixed(
    texts: list[str],
    where: Sequence[str] | None,
    stream: bool,
    short: Callable[[list[str]], list],
    long: Callable[[str, str], object],
    long_chars: int,
) -> list:
    """Documents up to `long_chars` through `short` in one batch; longer ones through `long` (Pieces, ids or None),
    Pieces joined into one list unless `stream`."""
    out: list = [None] * len(texts)
    idx = [i for i, t in enumerate(texts) if isinstance(t, str) and len(t) <= long_chars]  # streamed ones: long
    if idx:
        for i, ids in zip(idx, guarded(short, [texts[i] for i in idx], [name(where, i) for i in idx])):
            out[i] = ids
    for i, text in enumerate(texts):
        if not isinstance(text, str) or len(text) > long_chars:
            got = long(text, name(where, i))
            out[i] = got.ids() if isinstance(got, Pieces) and not stream else got
    return out


def special_regex(contents: list[str]) -> tuple[re.Pattern | None, int]:
    """Added tokens' text, matched leftmost-longest (as the HF tokenizer matches them), and the longest's length."""
    contents = sorted({c for c in contents if c}, key=len, reverse=True)
    if not contents:
        return None, 0
    return re.compile("|".join(map(re.escape, contents))), len(contents[0])
