"""Remote sources are keyed by what they are now: an S3 object overwritten on a real moto server (same
key, same size) makes `snakemake -n` rerun get_data, tokenize and the store; a Hub dataset's moved branch
changes its key (Hub stand-in, tests/hub_standin.py); an unreachable source is named in a warning."""

import json
import os
import re
import subprocess
import sys

import pytest

from llmpipe.data.remote_keys import digest, remote_identities
from tests.conftest import GPT2, REPO, corpus_docs
from tests.hub_standin import Repo, StandInHub

STORE = "data/tokens/manifest.json"


def jsonl(docs: list[str]) -> bytes:
    return "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()


@pytest.fixture
def s3(monkeypatch):
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    client = boto3.client("s3")
    client.create_bucket(Bucket="corpus")
    yield client
    server.stop()


def snakemake(tmp_path, *args):
    over = tmp_path / "over.json"
    over.write_text(
        json.dumps(
            {
                "results_dir": str(tmp_path / "r"),
                "data": {"sources": ["s3://corpus/part.{1..2}.jsonl"], "num_shards": 2},
                "tokenizer": {"source": str(GPT2)},
            }
        )
    )
    cmd = [sys.executable, "-m", "snakemake", "--profile", "profiles/local", *args, "--configfile", str(over)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=dict(os.environ))


def planned(proc) -> set[str]:
    return set(re.findall(r"^(\w+)\s+\d+$", proc.stdout, re.M)) - {"total", "job"}


def test_overwritten_s3_object_reruns_data_stages(s3, tmp_path):
    docs = corpus_docs(12)
    for i in (1, 2):
        s3.put_object(Bucket="corpus", Key=f"part.{i}.jsonl", Body=jsonl(docs[(i - 1) * 6 : i * 6]))
    target = str(tmp_path / "r" / "default" / STORE)
    proc = snakemake(tmp_path, target)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = json.loads((tmp_path / "r" / "default" / STORE).read_text())
    proc = snakemake(tmp_path, "-n", target)
    assert proc.returncode == 0 and planned(proc) == set(), proc.stdout[-2000:]

    old = jsonl(docs[6:12])
    new = jsonl(docs[6:11] + [docs[11].replace("e", "E", 1)])  # other bytes, same key and size
    assert len(new) == len(old) and new != old
    s3.put_object(Bucket="corpus", Key="part.2.jsonl", Body=new)
    proc = snakemake(tmp_path, "-n", target)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {"get_data", "tokenize", "token_store"} <= planned(proc), proc.stdout[-2000:]
    proc = snakemake(tmp_path, target)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    second = json.loads((tmp_path / "r" / "default" / STORE).read_text())
    assert second["fingerprint"] != first["fingerprint"]  # the store now holds the new object's tokens
    assert second["totals"]["train"]["documents"] + second["totals"]["val"]["documents"] == 12


def test_moved_hub_branch_changes_the_key_and_a_pinned_commit_needs_no_network(monkeypatch):
    repo = Repo()
    first = repo.commit({"data.jsonl": b"one"}, ref="main")
    with StandInHub() as hub:
        hub.repos[("dataset", "org/corpus")] = repo
        ids, warnings = remote_identities(["hf:org/corpus"], {"hf_revision": None}, [], hub.url)
        assert warnings == [] and ids == [{"hub": "org/corpus", "revision": None, "commit": first}]
        second = repo.commit({"data.jsonl": b"two"}, ref="main")
        moved, _ = remote_identities(["hf:org/corpus"], {"hf_revision": None}, [], hub.url)
        assert moved[0]["commit"] == second and digest(moved) != digest(ids)
        # hub.datasets entries are keyed the same way (rule download_dataset's params)
        ds, _ = remote_identities([], {}, [{"name": "c", "id": "org/corpus", "revision": "main"}], hub.url)
        assert ds[0]["commit"] == second
        n = len(hub.requests)
        pinned, warnings = remote_identities(["hf:org/corpus"], {"hf_revision": first}, [], hub.url)
        assert pinned[0]["commit"] == first and len(hub.requests) == n and not warnings


def test_unreachable_sources_are_named_in_a_warning(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ids, warnings = remote_identities(["hf:org/corpus"], {"hf_revision": "main"}, [], None)
    assert ids == [{"hub": "org/corpus", "revision": "main"}]
    assert len(warnings) == 1 and "org/corpus@main" in warnings[0] and "will not rerun get_data" in warnings[0]
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    ids, warnings = remote_identities(["s3://nowhere/x.jsonl"], {}, [], None)
    assert ids == [{"source": "s3://nowhere/x.jsonl"}] and "s3://nowhere/x.jsonl" in warnings[0]


def test_an_http_source_with_only_last_modified_is_keyed_by_it(tmp_path):
    """A web server that sends Last-Modified and no ETag (python -m http.server): a same-size edit changes the
    DAG's key and sources.json's entry (before: keyed by size alone, the old tokens kept)."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from llmpipe.data.remote_keys import object_identities
    from llmpipe.data.sources import describe

    (tmp_path / "c.jsonl").write_bytes(jsonl(["hello there"]))
    os.utime(tmp_path / "c.jsonl", (1_700_000_000, 1_700_000_000))
    quiet = type("Quiet", (SimpleHTTPRequestHandler,), {"log_message": lambda *a: None})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(quiet, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/c.jsonl"
        before = object_identities(url), describe(url)
        (tmp_path / "c.jsonl").write_bytes(jsonl(["HELLO there"]))  # same size, another day
        os.utime(tmp_path / "c.jsonl", (1_700_086_400, 1_700_086_400))
        after = object_identities(url), describe(url)
    finally:
        server.shutdown()
    assert before[0][0]["size"] == after[0][0]["size"] and "Last-Modified" in before[0][0]
    assert digest(before[0]) != digest(after[0]) and before[1] != after[1]


def test_s3_sources_without_credentials_stop_get_data_in_one_line(s3, tmp_path):
    """No AWS credentials at all (no environment, files or instance role): get-data says so in one line and
    how to give them, for a listed object and a glob (before: a 50-85 line botocore traceback)."""
    s3.put_object(Bucket="corpus", Key="a.jsonl", Body=jsonl(["hi there"]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_ENDPOINT_URL=os.environ["AWS_ENDPOINT_URL"],
        AWS_DEFAULT_REGION="us-east-1",
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        PYTHONPATH=str(REPO / "src"),
    )
    for source in ("s3://corpus/a.jsonl", "s3://corpus/*.jsonl"):
        cfg = json.dumps({"data": {"sources": [source]}})
        cmd = [sys.executable, "-m", "llmpipe", "get-data", "--config", cfg, "--out", str(tmp_path / "s.json")]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        (line,) = [x for x in proc.stderr.splitlines() if x.startswith("llmpipe get-data: error:")]
        assert "no usable AWS credentials to read data.sources (NoCredentialsError" in line and "AWS_PROFILE" in line, line
