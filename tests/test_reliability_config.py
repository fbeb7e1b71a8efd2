"""Config fuzzing (hypothesis): every key of the schema gets wrong types, out-of-range (negative)
values, unknown sibling keys; cross-key rules (batch divisibility, heads, seq_len vs parallel.tp) and
unsafe run names. Each bad config is refused by validation (what Snakemake runs at parse time,
before any job) with a message naming the offending key; Snakemake itself refuses two of them
without creating any output folder.
"""

import math
import re
import subprocess
import sys

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from llmpipe import config as cfgmod
from llmpipe.parallelism import MOVED
from tests.conftest import REPO

SCHEMA = cfgmod.load_schema()
BASE = yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def leaves():
    """(section, key, schema) of every plain key (resources, a free-form map, aside)."""
    out = []
    for name, sub in SCHEMA["properties"].items():
        if name == "resources":
            continue
        if sub.get("type") == "object":
            out += [(name, key, s) for key, s in sub["properties"].items()]
        else:
            out.append((None, name, sub))
    return out


LEAVES = leaves()


def types_of(s: dict) -> set:
    t = s.get("type", [])
    return set([t] if isinstance(t, str) else t)


def wrong_values(s: dict):
    """Values no key with schema `s` may take: other JSON types, non-integral or non-finite numbers."""
    types, cands = types_of(s), []
    if "integer" not in types and "number" not in types:
        cands += [st.integers(-5, 5).filter(lambda v: v not in s.get("enum", ()))]  # enum [0, 1, 2, 3] takes some
    if "integer" in types:
        cands += [st.floats(0.1, 1e6).filter(lambda x: not x.is_integer()), st.just(256.0)]
    if "number" in types or "integer" in types:
        cands += [st.sampled_from([math.nan, math.inf, -math.inf])]
    if "string" not in types and "enum" not in s:
        cands += [st.text(max_size=5)]
    if "enum" in s:
        cands += [st.text(min_size=1, max_size=8).filter(lambda v: v not in s["enum"])]
    if "boolean" not in types:  # an enum may list true / false (parallel.activation_checkpointing)
        cands += [st.booleans().filter(lambda v: not any(v is e for e in s.get("enum", ())))]
    if "array" not in types:
        cands += [st.lists(st.integers(), max_size=2)]
    if "object" not in types:  # free-form objects (levanter.extra) take any keys
        cands += [st.dictionaries(st.sampled_from(["a", "b"]), st.integers(), min_size=1, max_size=1)]
    if "null" not in types and None not in s.get("enum", ()):  # plan.zero: enum [0, 1, 2, 3, null]
        cands += [st.none()]
    return st.one_of(cands)


def with_value(section, key, value) -> dict:
    cfg = yaml.safe_load(yaml.safe_dump(BASE))
    (cfg.setdefault(section, {}) if section else cfg)[key] = value
    return cfg


def refused(cfg) -> str:
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.validate(cfg)
    return str(err.value)


def dotted(section, key):
    return f"{section}.{key}" if section else key


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(LEAVES).flatmap(lambda leaf: st.tuples(st.just(leaf), wrong_values(leaf[2]))))
def test_wrong_types_are_refused_naming_the_key(case):
    (section, key, s), value = case
    if section == "tokenizer" and key == "source" and isinstance(value, str):
        return  # any string is a valid source name
    msg = refused(with_value(section, key, value))
    assert re.search(rf"'{re.escape(dotted(section, key))}[.']", msg), msg  # the key (or an entry of it)


BOUNDED = [(sec, key, s) for sec, key, s in LEAVES if "integer" in types_of(s) and "minimum" in s]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(BOUNDED).flatmap(lambda leaf: st.tuples(st.just(leaf), st.integers(1, 10**9))))
def test_negative_and_below_minimum_sizes_are_refused(case):
    (section, key, s), below = case
    msg = refused(with_value(section, key, s["minimum"] - below))
    assert f"'{dotted(section, key)}'" in msg and "less than the minimum" in msg


SECTIONS = [n for n, s in SCHEMA["properties"].items() if s.get("type") == "object" and n != "resources"]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(SECTIONS), st.from_regex(r"[a-z][a-z0-9_]{0,15}", fullmatch=True), st.integers())
def test_unknown_keys_are_refused_naming_them(section, key, value):
    if key in SCHEMA["properties"][section]["properties"] or f"{section}.{key}" in MOVED:  # moved: named as such
        return
    msg = refused(with_value(section, key, value))
    assert f"unknown key '{section}.{key}'" in msg


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(
        st.sampled_from(["..", ".", "../x", "a/b", "/abs", ".hidden", "a/../b", "x\\y", "", "a b", "~root"]),
        st.text(min_size=1, max_size=12).filter(lambda t: "/" in t or ".." == t or t.startswith(".")),
    )
)
def test_unsafe_run_names_are_refused(name):
    assert "'run'" in refused(with_value(None, "run", name))


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 64), st.integers(1, 16), st.integers(1, 8), st.integers(1, 4))
def test_global_batch_must_divide_into_micro_batches_and_processes(gbs, mbs, nproc, nnodes):
    cfg = with_value("train", "global_batch_size", gbs)
    cfg["train"]["micro_batch_size"] = mbs
    cfg["parallel"] = {"nproc_per_node": nproc, "nnodes": nnodes}
    if gbs % (mbs * nproc * nnodes) == 0:
        cfgmod.validate(cfg)
    else:
        assert "'train.global_batch_size'" in refused(cfg)


@settings(max_examples=100, deadline=None)
@given(st.integers(8, 256), st.integers(1, 16), st.integers(1, 16))
def test_model_shape_rules(hidden, heads, kv):
    cfg = with_value("model", "hidden_size", hidden)
    cfg["model"].update(num_attention_heads=heads, num_key_value_heads=kv)
    ok = hidden % heads == 0 and (hidden // heads) % 2 == 0 and heads % kv == 0
    if ok:
        cfgmod.validate(cfg)
    else:
        msg = refused(cfg)
        assert ("'model.hidden_size'" in msg) == (hidden % heads != 0 or (hidden // heads) % 2 != 0)
        assert ("'model.num_key_value_heads'" in msg) == (heads % kv != 0)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 9000), st.sampled_from([1, 2, 3, 4, 8, 16]))
def test_seq_len_must_divide_by_tensor_parallel_degree(seq_len, tp):
    cfg = with_value("train", "seq_len", seq_len)
    cfg["train"]["backend"], cfg["colossal"] = "colossal", {"plugin": "3d"}  # trains tensor parallel
    cfg["parallel"] = {"tp": tp, "nproc_per_node": tp}  # one data rank of tp processes
    cfg.setdefault("model", {}).update(hidden_size=96, num_attention_heads=48, num_key_value_heads=48)  # tp divides the heads
    if seq_len % tp == 0:
        cfgmod.validate(cfg)
    else:
        assert "'train.seq_len'" in refused(cfg) and "'parallel.tp'" in refused(cfg)


def test_yaml_exponent_floats_are_numbers(tmp_path):
    """PyYAML reads `3e-4` as a string; llmpipe takes it as the number people mean where a number fits."""
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  lr: 3e-4\n  min_lr: 1e-5\n  eps: 1.0e-8\n")
    cfg = cfgmod.load(f)
    assert cfg["train"]["lr"] == 3e-4 and cfg["train"]["min_lr"] == 1e-5 and cfg["train"]["eps"] == 1e-8
    # Snakemake's --configfile parses with PyYAML: the strings become numbers only where a number fits
    parsed = yaml.safe_load(f.read_text() + "run: 1e3\n")
    assert parsed["train"]["lr"] == "3e-4"
    cfg = cfgmod.validate(parsed)
    assert cfg["train"]["lr"] == 3e-4 and cfg["train"]["min_lr"] == 1e-5 and cfg["run"] == "1e3"
    assert "'train.max_steps'" in refused({"train": {"max_steps": "1e3"}})
    # inside lists too: a mixture's weights (data.sources items)
    mix = yaml.safe_load("data:\n  sources:\n    - a.jsonl\n    - {path: b.jsonl, weight: 5e-1, name: b}\n")
    assert mix["data"]["sources"][1]["weight"] == "5e-1"
    assert cfgmod.validate(mix)["data"]["sources"] == ["a.jsonl", {"path": "b.jsonl", "weight": 0.5, "name": "b"}]


@pytest.mark.parametrize("bad,key", [({"run": ".."}, "'run'"), ({"train": {"max_steps": -3}}, "'train.max_steps'")])
def test_snakemake_refuses_before_any_job(tmp_path, bad, key):
    results = tmp_path / "results"
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({**bad, "results_dir": str(results)}))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(cfg)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and key in proc.stdout + proc.stderr
    assert not results.exists()
