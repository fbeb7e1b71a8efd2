"""The cache of config schema checks (llmpipe.config): a hit gives exactly what a full check gives, a bad
config is never kept, a schema change misses, and a hit skips importing jsonschema (the point of it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from llmpipe import config as cfgmod

CFG = {"run": "cache", "data": {"num_shards": 3, "remainder": "pad"}, "train": {"seq_len": 512, "lr": 1e-3}}


def test_a_hit_equals_a_full_check(tmp_path, monkeypatch):
    monkeypatch.setenv(cfgmod.CACHE_ENV, "off")
    full = cfgmod.load(json.dumps(CFG))
    monkeypatch.setenv(cfgmod.CACHE_ENV, str(tmp_path))
    first = cfgmod.load(json.dumps(CFG))  # a miss: checked, then kept
    kept = list(tmp_path.glob("*.json"))
    assert len(kept) == 1 and oct(kept[0].stat().st_mode & 0o777) == "0o600"
    second = cfgmod.load(json.dumps(CFG))  # a hit
    assert first == second == full
    assert second["data"]["shards_per_job"] is None and second["train"]["seq_len"] == 512  # defaults filled, values kept


def test_a_bad_config_is_refused_and_never_kept(tmp_path, monkeypatch):
    monkeypatch.setenv(cfgmod.CACHE_ENV, str(tmp_path))
    bad = {**CFG, "train": {"seq_len": "long"}}
    for _ in range(2):
        with pytest.raises(cfgmod.ConfigError, match="train.seq_len"):
            cfgmod.load(json.dumps(bad))
    assert not list(tmp_path.glob("*.json"))


def test_an_edited_config_is_a_new_entry(tmp_path, monkeypatch):
    """An entry is keyed by the config's text: editing the config makes a new key, not a stale hit."""
    monkeypatch.setenv(cfgmod.CACHE_ENV, str(tmp_path))
    cfgmod.load(json.dumps(CFG))
    changed = {**CFG, "train": {"seq_len": 1024, "lr": 1e-3}}
    assert cfgmod.load(json.dumps(changed))["train"]["seq_len"] == 1024
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_a_schema_change_misses(tmp_path, monkeypatch):
    monkeypatch.setenv(cfgmod.CACHE_ENV, str(tmp_path))
    cfgmod.load(json.dumps(CFG))
    monkeypatch.setattr(cfgmod, "_schema_stamp", lambda: "another schema")
    cfgmod.load(json.dumps(CFG))
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_not_plain_json_is_checked_every_time(tmp_path, monkeypatch):
    """What a JSON round trip would change (a number as a key, NaN, a date) is never looked up or kept."""
    import datetime

    monkeypatch.setenv(cfgmod.CACHE_ENV, str(tmp_path))
    for odd in ({7: "x"}, {"x": float("nan")}, {"x": datetime.date(2026, 1, 1)}, {"x": (1, 2)}):
        assert cfgmod._cache_file({**CFG, "data": odd}) is None
    assert cfgmod._cache_file(CFG) is not None


def test_a_hit_skips_jsonschema(tmp_path):
    code = (
        "import json, sys; from llmpipe import config; "
        f"c = config.load({json.dumps(json.dumps(CFG))}); "
        "print(json.dumps({'jsonschema': 'jsonschema' in sys.modules, 'seq_len': c['train']['seq_len']}))"
    )
    env = {**os.environ, cfgmod.CACHE_ENV: str(tmp_path)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)]
    runs.append(
        json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)
    )
    assert runs == [{"jsonschema": True, "seq_len": 512}, {"jsonschema": False, "seq_len": 512}]


def test_a_code_change_misses(tmp_path):
    """The key covers llmpipe's own code: after an upgrade that changes a check, no result of the old checks is used."""
    import shutil

    src = cfgmod.SCHEMA_PATH.parent

    def stamp(root) -> str:
        code = "from llmpipe import config; print(config._schema_stamp())"
        env = {**os.environ, "PYTHONPATH": str(root)}
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout

    for name in ("same", "edited"):
        shutil.copytree(src, tmp_path / name / "llmpipe", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "edited" / "llmpipe" / "parallelism.py", "a") as fh:
        fh.write("\n# a check changed\n")
    assert stamp(tmp_path / "same") == stamp(src.parent) != stamp(tmp_path / "edited")
