import subprocess
import sys

import pytest
import yaml

from llmpipe import config as cfgmod
from tests.conftest import REPO


def test_defaults_fill_every_section():
    cfg = cfgmod.load({})
    assert cfg["train"]["backend"] == "torch"
    assert cfg["data"]["remainder"] == "drop"
    assert cfg["tokenizer"]["source"] == "train"


def test_embedded_default_config_is_valid():
    cfg = cfgmod.load(REPO / "config" / "config.yaml")
    assert cfg["train"]["max_steps"] > 0


def test_unknown_key_is_named_with_suggestion():
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.load({"train": {"learning_rate": 1e-3, "warmup_step": 3}})
    assert "unknown key 'train.learning_rate' (did you mean 'lr'?)" in str(err.value)
    assert "unknown key 'train.warmup_step' (did you mean 'warmup_steps'?)" in str(err.value)


def test_a_dotted_key_in_a_file_is_told_to_nest():
    """`train.lr: 1e-3` in a YAML file is a key named train.lr: the fix is the nesting, not 'train'."""
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.load({"train.lr": 1e-3})
    assert "unknown key 'train.lr' (write it nested: train: {lr: ...})" in str(err.value)
    assert "did you mean 'train'" not in str(err.value)


def test_unknown_top_level_section():
    with pytest.raises(cfgmod.ConfigError, match="unknown key 'trian'"):
        cfgmod.load({"trian": {}})


def test_wrong_type_names_key():
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.load({"train": {"global_batch_size": "sixteen"}})
    assert "'train.global_batch_size'" in str(err.value)


def test_bad_enum_and_range():
    with pytest.raises(cfgmod.ConfigError, match="data.remainder"):
        cfgmod.load({"data": {"remainder": "keep"}})
    with pytest.raises(cfgmod.ConfigError, match="data.val_fraction"):
        cfgmod.load({"data": {"val_fraction": 1.5}})
    for section, key in (("data", "shuffle_seed"), ("data", "split_seed"), ("train", "seed")):  # numpy's generators refuse < 0
        with pytest.raises(cfgmod.ConfigError, match=rf"{section}\.{key}"):
            cfgmod.load({section: {key: -1}})


def test_local_launcher_on_several_nodes_rejected():
    with pytest.raises(cfgmod.ConfigError, match=r"'train.launcher' local .* 'parallel.nnodes' is 2"):
        cfgmod.load({"train": {"launcher": "local"}, "parallel": {"nnodes": 2}})
    assert cfgmod.load({"train": {"launcher": "srun"}, "parallel": {"nnodes": 2}})["parallel"]["nnodes"] == 2


def test_min_lr_above_lr_rejected():
    with pytest.raises(cfgmod.ConfigError, match="min_lr"):
        cfgmod.load({"train": {"lr": 1e-4, "min_lr": 1e-3}})


def test_inline_json_and_file(tmp_path):
    assert cfgmod.load('{"train": {"seq_len": 4096}}')["train"]["seq_len"] == 4096
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({"train": {"seq_len": 8192}}))
    assert cfgmod.load(f)["train"]["seq_len"] == 8192


def test_snakemake_refuses_bad_config_before_any_job(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"train": {"max_step": 10}}))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(bad)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "train.max_step" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "over, line",
    [
        (
            "data={sources: [data/gutenberg-sample-2mb.jsonl]}",  # the .gz left out
            "data source not found: data/gutenberg-sample-2mb.jsonl (fix: data.sources; `llmpipe doctor` checks the sources)",
        ),
        (
            "tokenizer={source: data/tokenizers/gpt3}",
            "  - 'tokenizer.source' 'data/tokenizers/gpt3': no such local folder, and not a Hub id (org/name[@revision])",
        ),
        (
            "model={init_from: /nonexistent/model/folder}",
            "  - 'model.init_from' '/nonexistent/model/folder': no such local folder, and not a Hub id (org/name[@revision])",
        ),
    ],
    ids=["source", "tokenizer", "init_from"],
)
def test_a_path_that_is_not_there_is_one_line_when_planning(over, line):
    """Not an InputFunctionException's traceback (a source) or a missing derived file (tokenizer.json,
    config.json) that names no setting."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--profile", "local", "--config", "run=missing", over],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and line in out.splitlines(), out[-3000:]
    assert "InputFunctionException" not in out and "MissingInputException" not in out


def test_snakemake_refuses_unknown_backend(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"train": {"backend": "tpu-magic"}}))
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--cores", "1", "--configfile", str(bad)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "'train.backend': 'tpu-magic' is not one of" in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "over, key, kind",
    [
        ({"data": {"sources": ["https://user:PWCANARY@host.example/x.jsonl"]}}, "data.sources[0]", "user name or password"),
        (
            {"data": {"sources": ["a.jsonl", {"path": "https://h.example/x.jsonl?X-Amz-Signature=SIGCANARY", "weight": 1}]}},
            "data.sources[1].path",
            "signature or token",
        ),
        ({"hub": {"endpoint": "https://hubuser:PWCANARY@hub.example/"}}, "hub.endpoint", "user name or password"),
        ({"data": {"sources": ["https://h.example/x.jsonl?sig=SIGCANARY&se=2030"]}}, "data.sources[0]", "signature or token"),
    ],
)
def test_a_url_holding_a_credential_is_refused_without_repeating_it(over, key, kind):
    """Config values reach rule params (printed with each shell command, kept in .snakemake/metadata),
    logs, stats.json and a released model card: a URL with a password or a presigned signature is refused,
    naming the key and not the secret."""
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.load(over)
    msg = str(err.value)
    assert f"'{key}' is a URL holding" in msg and kind in msg
    assert "CANARY" not in msg
    cfgmod.load({"data": {"sources": ["https://h.example/x.jsonl?download=1", "s3://bucket/x.jsonl"]}})  # no credential


@pytest.mark.parametrize(
    "over, needle",
    [
        (
            {"train": {"backend": "colossal", "global_batch_size": 16, "micro_batch_size": 2}, "parallel": {"nproc_per_node": 6}},
            "'train.global_batch_size' (16) is not a multiple of 'train.micro_batch_size' x 'parallel.nproc_per_node' x "
            "'parallel.nnodes' (2 x 6 x 1)",
        ),
        (
            {
                "train": {"backend": "colossal"},
                "colossal": {"plugin": "3d"},
                "parallel": {"tp": 4, "nproc_per_node": 6},
                "model": {"num_key_value_heads": 4},  # tp divides the heads
            },
            "'parallel.tp' x 'parallel.pp' (4 x 1) does not divide the 6 processes",
        ),
        (
            {
                "train": {"backend": "colossal", "global_batch_size": 12, "micro_batch_size": 2, "seq_len": 64},
                "colossal": {"plugin": "3d"},
                "parallel": {"tp": 2, "nproc_per_node": 8},
            },
            "'train.global_batch_size' (12) is not a multiple of 'train.micro_batch_size' x 'parallel.nproc_per_node' x "
            "'parallel.nnodes' / ('parallel.tp' x 'parallel.pp') (2 x 8 x 1 / (2 x 1))",
        ),
        ({"train": {"backend": "levanter", "global_batch_size": 7, "micro_batch_size": 2}}, "(7) is not a multiple of"),
    ],
)
def test_batch_that_does_not_split_over_the_data_ranks_is_refused_for_every_backend(over, needle):
    """Refused when the config is read, as for torch and neuron; colossal and levanter found it only inside
    the (GPU / TPU) job."""
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.load(over, whole=True)
    assert needle in str(err.value)
    ok = {**over, "train": {**over["train"], "global_batch_size": 48, "micro_batch_size": 2}}
    if over.get("parallel", {}).get("tp") == 4:
        ok["parallel"] = {"tp": 4, "nproc_per_node": 8}
    cfgmod.load(ok, whole=True)  # the same layout with a batch that splits


def test_plan_settings_that_cannot_hold_are_refused_before_any_job():
    """The plan job said so only after the whole data pipeline had run."""
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.load({"plan": {"epochs": 2, "tokens": 1000, "hardware": ["h100-typo", "p5.48xlarge"]}})
    msg = str(err.value)
    assert "'plan.tokens' and 'plan.epochs' are both set" in msg
    assert "unknown plan.hardware h100-typo; the table has: " in msg and "p5.48xlarge" in msg.split("the table has:")[1]
    cfgmod.load({"plan": {"tokens": 1000, "hardware": ["p5.48xlarge"]}})


def test_a_missing_local_path_under_an_existing_folder_is_not_taken_for_a_hub_repo(tmp_path, monkeypatch):
    """`org/name` with no such local path reads as a Hub repo: a mistyped `models/my-llama` (models/ exists)
    planned a download of repo models/my-llama instead of naming the missing folder."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for key, over in (
        ("model.init_from", {"model": {"init_from": "models/my-llama"}}),
        ("tokenizer.source", {"tokenizer": {"source": "models/my-tok"}}),
    ):
        with pytest.raises(cfgmod.ConfigError, match=rf"'{key}' 'models/my-\w+': no such local path, though models/ exists"):
            cfgmod.load(over)
    cfgmod.load({"model": {"init_from": "hf://models/my-llama"}})  # the Hub repo, said so
    cfgmod.load({"model": {"init_from": "meta-llama/Llama-3.2-1B"}})  # no meta-llama/ here: the Hub


def test_seq_len_past_the_base_models_positions_is_refused(tmp_path):
    """Training a base past its max_position_embeddings ran with only a warning in init's log, and the export
    still claimed the base's positions."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 128}))
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.load({"model": {"init_from": str(tmp_path)}, "train": {"seq_len": 256}})
    assert "'train.seq_len' (256) exceeds the max_position_embeddings (128) of 'model.init_from'" in str(err.value)
    cfgmod.load({"model": {"init_from": str(tmp_path)}, "train": {"seq_len": 128}})
