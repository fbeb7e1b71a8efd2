"""Every file a stage reads is a declared input: editing a local tokenizer's tokenizer_config.json (where
the EOS token comes from) reruns the tokenizer and what follows it; editing a local base model's
generation_config.json or weights reruns init and what follows, not the data stages; an unrelated file
in those folders reruns nothing; a colossal hostfile and a plan hardware file are inputs of their jobs."""

import functools
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
import yaml

from tests.conftest import GPT2, REPO, REPO_IGNORE, corpus_docs, write_jsonl


def jobs(out: str) -> set[str]:
    return set(re.findall(r"^(?:local)?rule (\w+):", out, re.M))


def snakemake_in(work, targets, *args):
    """Snakemake on `targets` in the copy `work`, with the local profile and its c.yaml."""
    cmd = [sys.executable, "-m", "snakemake", *targets, *args, "--profile", "local", "--configfile", "c.yaml"]
    return subprocess.run(cmd, cwd=work, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def done_run(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    tmp = tmp_path_factory.mktemp("inputs")
    work = tmp / "repo"
    shutil.copytree(REPO, work, ignore=REPO_IGNORE, symlinks=True)
    write_jsonl(work / "corpus.jsonl", corpus_docs(30))
    shutil.copytree(GPT2, work / "tok")
    torch.manual_seed(0)
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=50304,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).save_pretrained(work / "base")
    (work / "base" / "README.md").write_text("a base model\n")
    cfg = {
        "data": {"sources": ["corpus.jsonl"], "num_shards": 1, "val_fraction": 0.1},
        "tokenizer": {"source": "tok"},
        "model": {"init_from": "base"},
        "train": {"seq_len": 64},
    }
    (work / "c.yaml").write_text(yaml.safe_dump(cfg))
    targets = ["results/default/checkpoints/init", "results/default/data/stats.json"]

    snakemake = functools.partial(snakemake_in, work, targets)

    proc = snakemake()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work, snakemake


def edit_json(path, key):
    data = json.loads(path.read_text())
    data[key] = "edited"
    path.write_text(json.dumps(data))


def test_tokenizer_config_edit_reruns_the_tokenizer_and_what_follows(done_run):
    work, snakemake = done_run
    edit_json(work / "tok" / "tokenizer_config.json", "llmpipe_test")
    planned = jobs(snakemake("-n").stdout)
    assert {"tokenizer", "tokenize", "token_store", "pack_view", "verify_data", "init_model"} <= planned
    assert "get_data" not in planned
    assert snakemake("--touch").returncode == 0


def test_base_model_files_rerun_init_only(done_run):
    work, snakemake = done_run
    edit_json(work / "base" / "generation_config.json", "llmpipe_test")
    assert jobs(snakemake("-n").stdout) == {"init_model"}
    assert snakemake("--touch").returncode == 0
    (work / "base" / "README.md").write_text("edited\n")  # not read by any stage
    assert "Nothing to be done" in (lambda p: p.stdout + p.stderr)(snakemake("-n"))


@pytest.mark.parametrize("section, key, rule", [("colossal", "hostfile", "train_colossal"), ("plan", "hardware_file", "plan")])
def test_hostfile_and_hardware_file_are_inputs(tmp_path, section, key, rule):
    path = tmp_path / f"{key}.txt"
    path.write_text("localhost\n" if key == "hostfile" else "trn1.32xlarge: {price_per_hour: 20.0}\n")
    over = {section: {key: str(path)}}
    if section == "colossal":
        over["colossal"].update(launcher="colossalai")
        over["train"] = {"backend": "colossal"}
    (tmp_path / "o.yaml").write_text(yaml.safe_dump(over))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-n",
            "--profile",
            "local",
            "--configfile",
            str(tmp_path / "o.yaml"),
            "--config",
            f"results_dir={tmp_path}/r",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    block = proc.stdout[proc.stdout.index(f"rule {rule}:") :].split("\n\n")[0]
    assert str(path) in re.search(r"input: (.*)", block).group(1)


def restore_times(path, st):
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_source_edit_with_its_mtime_restored_reruns_from_get_data(done_run):
    """cp -p / rsync -t / a restored backup keep the mtime: the stat digest (size, mtime, ctime, inode) sees it."""
    work, snakemake = done_run
    corpus = work / "corpus.jsonl"
    assert "Nothing to be done" in (lambda p: p.stdout + p.stderr)(snakemake("-n"))
    st = corpus.stat()
    text = corpus.read_text()
    k = text.index("e", text.index('"text": "') + 9)
    corpus.write_text(text[:k] + "E" + text[k + 1 :])  # same size, other bytes (inside a document)
    restore_times(corpus, st)
    assert corpus.stat().st_mtime_ns == st.st_mtime_ns and corpus.stat().st_size == st.st_size
    planned = jobs(snakemake("-n").stdout)
    assert {"get_data", "tokenize", "token_store", "pack_view", "verify_data"} <= planned, planned
    proc = snakemake()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    import hashlib

    manifest = json.loads((work / "results/default/data/tokens/manifest.json").read_text())
    (name,) = manifest["source_sha256"]  # as the config names it
    assert (work / name).resolve() == corpus.resolve()
    assert manifest["source_sha256"][name] == hashlib.sha256(corpus.read_bytes()).hexdigest()  # of the new bytes


def test_source_replaced_by_mv_of_a_copy_reruns_from_get_data(done_run):
    work, snakemake = done_run
    corpus = work / "corpus.jsonl"
    copy = work / "corpus.copy"
    manifest = work / "results/default/data/tokens/manifest.json"
    before = json.loads(manifest.read_text())
    shutil.copy2(corpus, copy)  # same bytes, same mtime, another inode
    os.replace(copy, corpus)
    assert {"get_data", "tokenize"} <= jobs(snakemake("-n").stdout)
    proc = snakemake()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    after = json.loads(manifest.read_text())
    # tokenized again, the same bytes: the same checksum and store fingerprint (a run resumes on it)
    assert after["source_sha256"] == before["source_sha256"] and after["fingerprint"] == before["fingerprint"]
    # run again with nothing changed: nothing to do, and get_data would not read the file again
    assert "Nothing to be done" in (lambda p: p.stdout + p.stderr)(snakemake("-n"))


def test_file_url_and_local_hf_folder_sources_are_inputs(tmp_path):
    """A file:// source and an hf: source that is a local folder are local files too: editing one reruns
    get_data (they were neither inputs nor remote identities: nothing reran, the old tokens were kept)."""
    work = tmp_path / "repo"
    shutil.copytree(REPO, work, ignore=REPO_IGNORE, symlinks=True)
    write_jsonl(work / "corpus.jsonl", corpus_docs(20))
    (work / "hfds").mkdir()
    write_jsonl(work / "hfds" / "data.jsonl", corpus_docs(30)[20:])
    cfg = {"data": {"sources": [f"file://{work / 'corpus.jsonl'}", f"hf:{work / 'hfds'}"], "num_shards": 1}}
    (work / "c.yaml").write_text(yaml.safe_dump({**cfg, "tokenizer": {"source": str(GPT2)}}))

    snakemake = functools.partial(snakemake_in, work, ["results/default/data/sources.json"])

    proc = snakemake()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    dry = snakemake("-n")
    assert "Nothing to be done" in dry.stdout + dry.stderr and "commit not resolved" not in dry.stderr, dry.stderr[-2000:]
    for edited in (work / "hfds" / "data.jsonl", work / "corpus.jsonl"):
        with edited.open("a") as fh:
            fh.write(json.dumps({"text": "one more document"}) + "\n")
        assert "get_data" in jobs(snakemake("-n").stdout), edited
        assert snakemake().returncode == 0


def test_encoder_choice_and_data_keys_leave_a_copied_tokenizer_and_the_init_alone(done_run):
    """tokenizer.backend picks the encoder of the same ids (tokenize reads it); a data key cannot change a
    tokenizer copied from a folder: neither reruns the tokenizer, nor after it init (a base model converted
    again: minutes to hours on a 70B)."""
    work, snakemake = done_run
    assert "Nothing to be done" in (lambda p: p.stdout + p.stderr)(snakemake("-n"))
    for setting in ("tokenizer={backend: hf}", "data={shards_per_job: 1}"):
        planned = jobs(snakemake("-n", "--config", setting).stdout)
        assert "tokenize" in planned and not {"tokenizer", "init_model"} & planned, (setting, planned)


@pytest.mark.parametrize(
    "setting",
    [
        "data={shards_per_job: 1}",
        "data={min_shards_per_job: 2}",
        "data={add_bos: never}",
        "data={long_pretoken: skip}",
        "data={val_fraction: 0.2}",
    ],
)
def test_data_keys_only_tokenize_reads_leave_get_data_alone(done_run, setting):
    """get-data lists and keys the sources (for a mixture it reads them all to count its groups): a key
    only the tokenize jobs read reruns them, not get-data."""
    work, snakemake = done_run
    planned = jobs(snakemake("-n", "--config", setting).stdout)
    assert "tokenize" in planned and "get_data" not in planned, (setting, planned)
