"""Data prep: the seeds' recipe vs llmpipe's data stages, same machine, same process tree.

  python benchmarks/data_prep.py [--corpora chunks books] [--shared ../shared/data] [--repeat N] [--scale 10]
      [--paths-only]   (chunks: our tiktoken and HF paths, each right before its encoder alone)
      [--scale 10 [--only-scale]]   (chunks: both paths on 10x the corpus against their encoders alone,
                       the per-token targets; --only-scale: only those and ours at x1)

Seeds' recipe (neuronx-distributed examples/training/llama/get_dataset.py): datasets.load_dataset(json)
+ map(tokenize, batched, num_proc=2) + map(group_texts, num_proc=2) + save_to_disk, GPT-2, 4096.
Ours: the CLI commands the Snakemake rules run, in the order `snakemake --cores 2` runs their DAG:
get-data and tokenizer at once (a local tokenizer does not need sources.json), then tokenize (as the DAG
groups 2 shards: one source -> one job reading it once, 2 worker processes; more -> 2 jobs at once), token-store, pack hf. Each variant runs in its own process tree, the
variants taking turns (reversed every other round); peak RSS is the largest sum over that tree, sampled every 50 ms. Prints wall s,
tokens/s, peak RSS, the ratios, our time per stage, and the HF tokenizer alone on text in memory.
For chunks it also times the floor of any 2-job tokenize step (worker_floor) and what our paths could
reach with a tokenize step at that floor (floor()).
"""

from __future__ import annotations

import argparse
import compileall
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from encoder_alone import BATCH, corpus_texts, count, encoder, two_processes  # benchmarks/encoder_alone.py
from peak import children_cpu, sampled  # benchmarks/peak.py

REPO = Path(__file__).resolve().parents[1]
GPT2 = REPO / "data" / "tokenizers" / "gpt2"
SEQ = 4096
CONFIG_CACHE = "LLMPIPE_CONFIG_CACHE"  # llmpipe.config.CACHE_ENV


def measure(cmd: list[str], anon_too: bool = False) -> dict:
    """Run a worker; return its JSON result plus wall time and peak tree RSS (sampled every 50 ms)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TOKENIZERS_PARALLELISM": "true"}
    out, wall, cpu, rss, anon = sampled(cmd, env, anon_too)
    return {**json.loads(out.strip().splitlines()[-1]), "wall": wall, "cpu": cpu, "rss": rss, "anon": anon}


# ------------------------------------------------------------------ workers (run in a child process)


def worker_recipe(corpus: str, work: Path) -> dict:
    from itertools import chain

    import datasets
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(GPT2))
    raw = datasets.load_dataset("json", data_files=corpus, split="train", cache_dir=str(work / "cache"))
    tokenized = raw.map(lambda ex: tok(ex["text"]), batched=True, num_proc=2, remove_columns=raw.column_names)
    tokens = sum(len(x) for x in tokenized["input_ids"])

    def group_texts(examples):
        cat = {k: list(chain(*examples[k])) for k in examples}
        total = len(cat["input_ids"]) // SEQ * SEQ
        result = {k: [t[i : i + SEQ] for i in range(0, total, SEQ)] for k, t in cat.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    grouped = tokenized.map(group_texts, batched=True, num_proc=2)
    grouped.save_to_disk(str(work / "recipe"))
    return {"tokens": tokens, "rows": len(grouped)}


def worker_ours(corpus: str, work: Path, backend: str, records: int | None, copies: int = 1) -> dict:
    sources = [corpus]
    if copies > 1:  # a corpus `copies` times as large: the same bytes as as many files (sources)
        sources = [str(work / f"copy-{i}.jsonl.gz") for i in range(copies)]
        for name in sources:  # copies: get-data refuses one file listed twice, under any name (symlink, hard link)
            shutil.copyfile(corpus, name)
    cfg = json.dumps(
        {
            "run": "bench",
            "data": {"sources": sources, "num_shards": 2, "max_records_per_source": records},
            "tokenizer": {"source": str(GPT2), "backend": backend},
            "train": {"seq_len": SEQ},
        }
    )
    py = [sys.executable, "-m", "llmpipe"]
    os.environ[CONFIG_CACHE] = str(work / "config-cache")  # empty: each run pays the first run's config checks
    store = work / "tokens"
    stages, cpu, last = {}, {}, [time.perf_counter(), children_cpu()]
    began = list(last)

    def lap(name):  # wall and CPU seconds of the stage's processes
        now, used = time.perf_counter(), children_cpu()
        stages[name], cpu[name] = round(now - last[0], 2), round(used - last[1], 2)
        last[:] = now, used

    def run(*args):
        subprocess.run(py + list(args), check=True, capture_output=True)

    def together(*commands):  # independent jobs, as Snakemake runs them on 2 cores
        jobs = [subprocess.Popen(py + list(c), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for c in commands]
        errors = [j.communicate()[1] for j in jobs]
        for j, err in zip(jobs, errors):
            if j.returncode:
                raise SystemExit(err.decode()[-2000:])

    together(
        ["get-data", "--config", cfg, "--out", str(work / "sources.json")],
        ["tokenizer", "--config", cfg, "--out", str(work / "tok")],
    )
    lap("get-data+tokenizer")
    # the DAG's grouping (rules/common.smk): 1 source -> one job reading it once, 2 worker processes;
    # 2+ sources -> whole sources, 2 jobs of 1 thread at once
    per_job = 2 if len(sources) < 2 else 1  # tokenize.shards_per_job for 2 shards (not imported: timed process)
    jobs, threads = 2 // per_job, (2 if per_job == 2 else 1)
    together(
        *[
            [
                "tokenize",
                "--config",
                cfg,
                "--sources",
                str(work / "sources.json"),
                "--job",
                str(i),
                "--shards-per-job",
                str(per_job),
                "--threads",
                str(threads),
                "--tokenizer",
                str(work / "tok"),
                "--out",
                str(store / f"job-{i:05d}"),
            ]
            for i in range(jobs)
        ]
    )
    lap("tokenize")
    run(
        "token-store",
        "--shards",
        *[str(store / f"job-{i:05d}") for i in range(jobs)],
        "--sources",
        str(work / "sources.json"),
        "--out",
        str(store / "manifest.json"),
    )
    lap("token-store")
    run(
        "pack",
        "--config",
        cfg,
        "--store",
        str(store / "manifest.json"),
        "--tokenizer",
        str(work / "tok"),
        "--out",
        str(work / "hf"),
    )
    lap("pack")
    # at scale only: the x1 worker's whole time is compared with the recipe's
    writes = write_floor(work / "hf", work / "write-floor.bin") if copies > 1 else {}
    manifest = json.loads((store / "manifest.json").read_text())
    encoders = sorted({s["encoder"] for s in manifest["shards"]})
    tokens = sum(manifest["totals"][s]["tokens"] for s in ("train", "val"))
    # the pipeline alone, first stage to last (as the encoder alone is timed): without this worker's start and
    # the removal of its outputs afterwards (~0.1 s at x1, growing with the corpus)
    pipeline = {"pipeline_s": last[0] - began[0], "pipeline_cpu": last[1] - began[1]}
    return {"tokens": tokens, "encoders": encoders, "stages": stages, "stages_cpu": cpu, **pipeline, **writes}


def write_floor(view: Path, out: Path) -> dict:
    """Seconds to write as many bytes as the view's files hold, in 8 MiB writes to a new file beside them,
    then removed, with no compute: plainly (the page cache's own cost; on a VM first touching the guest's
    memory is most of it, so it varies with the machine's memory state) and written once as pack writes
    (llmpipe.io.WriteOnce: two windows of page cache, the disk's speed). Not a strict floor: pack also
    reads the store and builds the rows."""
    from llmpipe.io import WriteOnce

    size = sum(f.stat().st_size for f in view.rglob("*") if f.is_file())
    block = bytes(8 << 20)
    out_s = {"view_bytes": size}
    for name, opener in (("write_floor_s", lambda: open(out, "wb")), ("write_once_s", lambda: WriteOnce(out))):
        began = time.perf_counter()
        with opener() as fh:
            for _ in range(size // len(block)):
                fh.write(block)
            fh.write(block[: size % len(block)])
        out_s[name] = time.perf_counter() - began
        out.unlink()
    return out_s


def worker_alone(corpus: str, which: str, copies: int = 1) -> dict:
    """The encoder alone, text already in memory, in 2 forked processes of 1 thread (as our 2 tokenize jobs
    run): tiktoken's encode_ordinary, or HF's encode_batch_fast (the calls our two paths make); with
    `copies`, each process encodes its half that many times (the text of a corpus `copies` times as large)."""
    secs, tokens, cpu = two_processes(corpus_texts(corpus), functools.partial(count, which), copies)
    return {"tokens": tokens, "alone_s": secs, "alone_cpu": cpu}


def worker_floor(corpus: str, which: str, work: Path) -> dict:
    """The floor of any 2-job tokenize step: 2 fresh processes at once, each reading every other record of
    the corpus, encoding it with the encoder alone's call, and writing the ids (+ EOS) as uint16 to a
    file; no config, no checks, no store, no views. What is left between it and the encoder alone is what
    any pipeline of separate steps pays: process start, imports, loading the encoder, reading, writing."""
    me = [sys.executable, __file__, "--corpus", corpus, "--worker", f"part-{which}"]
    before, start = children_cpu(), time.perf_counter()
    jobs = [subprocess.Popen(me + ["--part", str(i), "--out", str(work / f"{i}.bin")], stdout=subprocess.PIPE) for i in range(2)]
    outs = [j.communicate()[0] for j in jobs]
    if any(j.returncode for j in jobs):
        raise SystemExit(f"floor ({which}): a part failed")
    tokens = sum(map(int, outs))
    return {"tokens": tokens, "floor_s": time.perf_counter() - start, "floor_cpu": children_cpu() - before}


def floor_part(corpus: str, which: str, part: int, out: str) -> int:
    """One process of worker_floor: its half of the records, encoded and written; returns the token count."""
    from struct import pack

    import orjson
    from isal import igzip

    encode = encoder(which)
    eos, tokens = [50256], 0  # GPT-2's <|endoftext|>, as our tokenize appends
    with igzip.open(corpus, "rb") as fh, open(out, "wb") as w:
        lines = (line for i, line in enumerate(fh) if i % 2 == part)
        while batch := [orjson.loads(line)["text"] for _, line in zip(range(BATCH), lines)]:
            for ids in encode(batch):
                tokens += len(ids) + 1
                w.write(pack(f"<{len(ids) + 1}H", *ids, *eos))
    return tokens


def worker_encode(corpus: str, work: Path) -> dict:
    """HF encode_batch and encode_batch_fast in one process with 2 threads, text already in memory."""
    texts = corpus_texts(corpus)
    os.environ["RAYON_NUM_THREADS"] = "2"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(GPT2 / "tokenizer.json"))
    start = time.perf_counter()
    tokens = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    mid = time.perf_counter()
    fast = sum(len(e.ids) for e in tok.encode_batch_fast(texts, add_special_tokens=False))
    assert fast == tokens
    return {"tokens": tokens, "encode_s": mid - start, "encode_fast_s": time.perf_counter() - mid}


def worker(args) -> None:
    work = Path(tempfile.mkdtemp(dir=args.tmp))
    try:
        if args.worker == "recipe":
            out = worker_recipe(args.corpus, work)
        elif args.worker == "encode":
            out = worker_encode(args.corpus, work)
        elif args.worker.startswith("part-"):
            return print(floor_part(args.corpus, args.worker.split("-", 1)[1], args.part, args.out))
        elif args.worker.startswith("floor-"):
            out = worker_floor(args.corpus, args.worker.split("-", 1)[1], work)
        elif args.worker.startswith("alone-"):
            out = worker_alone(args.corpus, args.worker.split("-", 1)[1], args.copies)
        else:
            out = worker_ours(args.corpus, work, args.worker.split("-", 1)[1], args.records, args.copies)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # ~0.9 GB per variant
    print(json.dumps(out))


# ------------------------------------------------------------------ driver


def median_runs(cmds: dict[str, list[str]], repeat: int) -> dict[str, dict]:
    """measure() each command `repeat` times, the variants taking turns, in reverse order every other round
    (A B, B A: a steady drift in the machine's speed hits both of a pair alike over two rounds): per variant
    the run with the median wall time; peak RSS is the largest seen."""
    runs = {name: [] for name in cmds}
    for r in range(repeat):
        for name in list(cmds)[:: -1 if r % 2 else 1]:
            runs[name].append(measure(cmds[name], anon_too=name in ("ours", "scaled")))
    out = {}
    for name, rs in runs.items():
        rs.sort(key=lambda r: r["wall"])
        out[name] = {**rs[len(rs) // 2], "rss": max(r["rss"] for r in rs), "anon": max(r["anon"] for r in rs)}
    return out, runs


def paired(runs: dict[str, list[dict]], ours: str, alone: str, without: str = "", only: str = "") -> str:
    """Throughput of `ours` over the encoder alone, per round (the two measured one after the other, so a
    drift in the machine's speed between rounds cancels out): the median and every round's, by wall time
    and by CPU seconds; `without`: less that stage of ours; `only`: that stage of ours alone."""

    def took(o: dict, key: str) -> float:
        stages = o["stages" if key == "s" else "stages_cpu"]
        if only:
            return stages[only]
        return o[f"pipeline_{key}"] - (stages[without] if without else 0)

    wall = sorted(a["alone_s"] / took(o, "s") * o["tokens"] / a["tokens"] for o, a in zip(runs[ours], runs[alone]))
    cpu = sorted(a["alone_cpu"] / took(o, "cpu") * o["tokens"] / a["tokens"] for o, a in zip(runs[ours], runs[alone]))
    each = ", ".join(f"{x:.0%}" for x in wall)
    return f"{wall[len(wall) // 2]:.0%} (rounds: {each}); by CPU seconds {cpu[len(cpu) // 2]:.0%}"


def floor(runs: dict[str, list[dict]], name: str, ours: str, alone: str) -> str:
    """The floor (worker_floor) over the encoder alone, and the best our path could reach with a tokenize
    step at that floor and its other stages as measured (get-data + tokenizer, token-store, pack), per
    round as in paired."""
    rounds = list(zip(runs[name], runs[ours], runs[alone]))
    alone_tps = [a["alone_s"] / a["tokens"] for _, _, a in rounds]
    bare = sorted(t * f["tokens"] / f["floor_s"] for (f, _, _), t in zip(rounds, alone_tps))
    rest = [o["pipeline_s"] - o["stages"]["tokenize"] for _, o, _ in rounds]
    best = sorted(t * o["tokens"] / (f["floor_s"] + r) for (f, o, _), t, r in zip(rounds, alone_tps, rest))
    mid = len(bare) // 2
    return (
        f"    floor of a 2-job tokenize step (fresh processes: read, encode, write ids; no checks, no store, no views): "
        f"{bare[mid]:.0%} of the encoder alone\n    that floor + our other stages as measured "
        f"({sorted(rest)[mid]:.2f} s): {best[mid]:.0%}, the most a faster tokenize step could give"
    )


def at_scale(r: dict[str, dict], runs: dict[str, list[dict]], n: int) -> str:
    """Ours at xN against x1 (time, tokens, memory) and against the encoder alone at xN (paired per round),
    and what separates the two: the throughput of the N-1 extra copies over the encoder's (the time they
    add to each) and our cost that does not grow with the corpus (x1 minus one copy's share of the
    growth), medians over the rounds."""
    ours, big = r["ours"], r["scaled"]
    rounds = list(zip(runs["ours"], runs["scaled"], runs["tiktoken"], runs["tiktoken-scaled"]))
    margin = sorted(
        (a_n["alone_s"] - a_1["alone_s"])
        / (o_n["pipeline_s"] - o_1["pipeline_s"])
        * (o_n["tokens"] - o_1["tokens"])
        / (a_n["tokens"] - a_1["tokens"])
        for o_1, o_n, a_1, a_n in rounds
    )
    fixed = sorted(o_1["pipeline_s"] - (o_n["pipeline_s"] - o_1["pipeline_s"]) / (n - 1) for o_1, o_n, _, _ in rounds)
    return (
        f"    x{n} vs x1: time {big['pipeline_s'] / ours['pipeline_s']:.2f}x, tokens {big['tokens'] / ours['tokens']:.2f}x, "
        f"peak RSS {big['rss'] / ours['rss']:.2f}x; peak anonymous memory (RssAnon, without mapped file pages) "
        f"{ours['anon'] / 2**30:.2f} -> {big['anon'] / 2**30:.2f} GB, {big['anon'] / ours['anon']:.2f}x"
        f"\n    llmpipe x{n} end to end over tiktoken alone x{n} (encode_ordinary per document): "
        f"{paired(runs, 'scaled', 'tiktoken-scaled')} (target 90 %)"
        f"\n    ... to the token store (all but pack, the hf view): {paired(runs, 'scaled', 'tiktoken-scaled', 'pack')}"
        f"\n    ... the tokenize step alone (2 jobs): {paired(runs, 'scaled', 'tiktoken-scaled', only='tokenize')}"
        f"\n    pack wrote {big['view_bytes'] / 1e9:.2f} GB in {big['stages']['pack']:.2f} s; plain writes of as many bytes "
        f"to a new file took {big['write_floor_s']:.2f} s (the page cache's own cost, in this run), written once as pack "
        f"writes {big['write_once_s']:.2f} s"
        f"\n    ... over tiktoken alone x{n} making our call (documents joined by EOS, encode_to_numpy): "
        f"{paired(runs, 'scaled', 'joined-scaled')}"
        + (
            f"\n    llmpipe HF path x{n} end to end over encode_batch_fast alone x{n}: "
            f"{paired(runs, 'hf-scaled', 'hf-alone-scaled')} (target 95 %)"
            if "hf-scaled" in runs
            else ""
        )
        + f"\n    the {n - 1} extra cop{'y' if n == 2 else 'ies'}: llmpipe at {margin[len(margin) // 2]:.0%} of the encoder alone's throughput; "
        f"cost that does not grow with the corpus: {fixed[len(fixed) // 2]:.1f} s"
    )


def row(name: str, r: dict, base: dict | None) -> str:
    speed = r["tokens"] / r["wall"]
    ratio = f"{base['wall'] / r['wall']:5.2f}x faster, RSS {r['rss'] / base['rss']:.2f}x" if base else ""
    stages = ""
    if "stages" in r:
        stages = f"\n    pipeline {r['pipeline_s']:.2f} s; stages, wall (CPU) s: " + ", ".join(
            f"{k} {v} ({r['stages_cpu'][k]})" for k, v in r["stages"].items()
        )
    return f"{name:<34} {r['wall']:7.1f} s {speed / 1e6:6.2f} M tok/s {r['rss'] / 2**30:6.2f} GB   {ratio}{stages}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpora", nargs="+", default=["chunks", "books"], choices=["chunks", "books"])
    p.add_argument("--shared", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--tmp", default=None, help="scratch folder (default: system temp)")
    p.add_argument("--repeat", type=int, default=1, help="runs per variant; the median is shown")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    p.add_argument("--records", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--copies", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--part", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--scale", type=int, default=0, help="also run ours on a corpus this many times the chunks one")
    p.add_argument("--paths-only", action="store_true", help="chunks: only our two paths and their encoders alone")
    p.add_argument("--only-scale", action="store_true", help="with --scale: only ours at x1 and xN (chunks)")
    p.add_argument(
        "--tiktoken-only", action="store_true", help="with --only-scale: leave out the HF path (5 of 7 variants' time)"
    )
    args = p.parse_args()
    if args.worker:
        return worker(args)
    # bytecode for llmpipe's modules, as an installed package has: without it (PYTHONDONTWRITEBYTECODE set,
    # a read-only checkout) every step compiles the modules it imports again, ~0.05 s a process
    compileall.compile_dir(REPO / "src" / "llmpipe", quiet=1)
    me = [sys.executable, __file__]
    tmp = ["--tmp", args.tmp] if args.tmp else []
    for name in args.corpora:
        corpus = str(Path(args.shared) / "corpus" / f"gutenberg-{name}-100mb.jsonl.gz")
        print(
            f"\n== {corpus} (GPT-2 tokenizer, seq_len {SEQ}, 2 cores; ours: independent stages at once, "
            f"as snakemake --cores 2 runs them; medians of {args.repeat}, variants taking turns, "
            "reversed every other round)",
            flush=True,
        )
        run = me + ["--corpus", corpus] + tmp
        cmds = {"recipe": run + ["--worker", "recipe"], "ours": run + ["--worker", "ours-auto"]}
        if name == "chunks":  # each path right before its encoder alone: a ratio per round (see paired)
            cmds |= {"tiktoken": run + ["--worker", "alone-tiktoken"], "hf": run + ["--worker", "ours-hf"]}
            cmds |= {"hf-alone": run + ["--worker", "alone-hf"], "encode": run + ["--worker", "encode"]}
            cmds |= {"floor": run + ["--worker", "floor-tiktoken"], "hf-floor": run + ["--worker", "floor-hf"]}
            if args.scale > 1:
                copies = ["--copies", str(args.scale)]
                cmds["scaled"] = run + ["--worker", "ours-auto"] + copies
                cmds["tiktoken-scaled"] = run + ["--worker", "alone-tiktoken"] + copies
                cmds["joined-scaled"] = run + ["--worker", "alone-tiktoken-joined"] + copies
                cmds["hf-scaled"] = run + ["--worker", "ours-hf"] + copies
                cmds["hf-alone-scaled"] = run + ["--worker", "alone-hf"] + copies
        else:
            cmds["half"] = run + ["--worker", "ours-auto", "--records", "148"]
        if args.only_scale and args.scale > 1 and name == "chunks":
            scaled = ("ours", "tiktoken", "scaled", "tiktoken-scaled", "joined-scaled", "hf-scaled", "hf-alone-scaled")
            scaled = scaled[:5] if args.tiktoken_only else scaled
            r, runs = median_runs({k: cmds[k] for k in scaled}, args.repeat)
            print(row("llmpipe x1", r["ours"], None), "\n" + row(f"llmpipe x{args.scale}", r["scaled"], None))
            if not args.tiktoken_only:
                print(row(f"llmpipe HF path x{args.scale}", r["hf-scaled"], None))
            print(at_scale(r, runs, args.scale))
            continue
        if args.paths_only:
            cmds = {k: v for k, v in cmds.items() if k not in ("recipe", "encode")}
        r, runs = median_runs(cmds, args.repeat)
        base = r.get("recipe")
        if base:
            print(row("seeds' recipe", base, None) + "baseline")
        print(row(f"llmpipe ({'+'.join(r['ours']['encoders'])})", r["ours"], base))
        if name == "chunks":
            hf, enc, tik, hfa = r["hf"], r.get("encode"), r["tiktoken"], r["hf-alone"]
            print(
                f"{'tiktoken alone, 2 procs':<34} {tik['alone_s']:7.1f} s {tik['tokens'] / tik['alone_s'] / 1e6:6.2f} M tok/s"
                f"\n    llmpipe tiktoken path end to end over it: {paired(runs, 'ours', 'tiktoken')}"
            )
            print(floor(runs, "floor", "ours", "tiktoken"))
            print(row("llmpipe (HF tokenizer only)", hf, base))
            if "scaled" in r:
                print(row(f"llmpipe, corpus x{args.scale}", r["scaled"], base))
                print(row(f"llmpipe HF path, corpus x{args.scale}", r["hf-scaled"], base))
                print(at_scale(r, runs, args.scale))
            print(
                f"{'HF encode_batch_fast alone, 2 procs':<34} {hfa['alone_s']:7.1f} s {hfa['tokens'] / hfa['alone_s'] / 1e6:6.2f} M tok/s"
                f"\n    llmpipe HF path end to end over it: {paired(runs, 'hf', 'hf-alone')}"
            )
            print(floor(runs, "hf-floor", "hf", "hf-alone"))
            for key, what in (("encode_s", "HF encode_batch, 2 threads"), ("encode_fast_s", "HF encode_batch_fast, 2 threads")):
                if enc is None:
                    break
                limit = enc["tokens"] / enc[key]
                print(
                    f"{what + ' alone':<34} {enc[key]:7.1f} s {limit / 1e6:6.2f} M tok/s"
                    f"   llmpipe HF path end to end reaches {hf['tokens'] / hf['pipeline_s'] / limit:.0%} of it"
                )
        else:
            half = r["half"]
            print(
                row("llmpipe, first half of the books", half, base),
                f"  (peak RSS half/full: {half['rss'] / r['ours']['rss']:.2f})",
            )


if __name__ == "__main__":
    main()
