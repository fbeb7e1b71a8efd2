"""SageMaker backend without AWS: a real moto server (subprocess, HTTP on 127.0.0.1, AWS_ENDPOINT_URL)
for S3, SageMaker and CloudWatch Logs; botocore's Stubber (a fake, named so) for what moto cannot do:
status transitions, Failed jobs, stop_training_job. moto completes every job at once and never writes
model.tar.gz or logs, so tests seed both. A loopback guard (tests/netguard) fails any connection or
name lookup that would leave 127.0.0.1, in this process and in the Snakemake run's processes."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

import boto3
import pytest
import torch
from botocore.stub import Stubber

from llmpipe.backends.sagemaker import jobs, upload
from llmpipe.backends.sagemaker.hyperparameters import ALGORITHM_HYPERPARAMETERS, SettingsError, check_settings
from llmpipe.backends.sagemaker.validate import RequestError
from tests.conftest import REPO, corpus_docs, tiny_config, write_jsonl

GUARD_DIR = REPO / "tests" / "netguard"
BUCKET = "llmpipe-test"
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
ALGORITHM = "arn:aws:sagemaker:us-east-1:123456789012:algorithm/llm-pretraining"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5.1-gpu-py311"


def _load_guard():
    spec = importlib.util.spec_from_file_location("llmpipe_netguard", GUARD_DIR / "sitecustomize.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def moto_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("moto server did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def aws(moto_url, monkeypatch, tmp_path):
    """Fresh moto state, AWS environment pointing at it, the loopback guard on; clients."""
    urllib.request.urlopen(urllib.request.Request(moto_url + "/moto-api/reset", method="POST"), timeout=5)
    guard_log = tmp_path / "netguard.log"
    for k, v in {
        "AWS_ENDPOINT_URL": moto_url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "LLMPIPE_NETGUARD_LOG": str(guard_log),
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    guard = _load_guard()
    guard.install()
    try:
        c = {n: boto3.client(n, region_name="us-east-1") for n in ("sagemaker", "s3", "logs")}
        c["s3"].create_bucket(Bucket=BUCKET)
        yield c
    finally:
        guard.uninstall()
    assert not guard_log.exists(), f"a request tried to leave loopback: {guard_log.read_text()}"


def test_loopback_guard_refuses_the_outside(aws, tmp_path):
    """The guard itself can fail: a real AWS endpoint is refused (and recorded)."""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("sagemaker.us-east-1.amazonaws.com", 443), timeout=2)
    log = Path(os.environ["LLMPIPE_NETGUARD_LOG"])
    assert "sagemaker.us-east-1.amazonaws.com" in log.read_text()
    log.unlink()  # expected here; any other test leaving a record fails


def sm_config(tmp: Path, mode: str = "algorithm", instances: int = 2, processes: int | None = None, **over) -> dict:
    sm = {
        "mode": mode,
        "role_arn": ROLE,
        "s3_prefix": f"s3://{BUCKET}/runs",
        "region": "us-east-1",
        "instance_type": "ml.p5.48xlarge",
        "volume_size_gb": 3,
        "keep_alive_seconds": 900,
        "max_runtime_seconds": 7200,
        "poll_seconds": 0.01,
        "tags": {"team": "nlp"},
        **over,
    }
    sm.setdefault(*(("algorithm_name", ALGORITHM) if mode == "algorithm" else ("image_uri", IMAGE)))
    return tiny_config(
        tmp,
        train={"backend": "sagemaker"},
        data={"views": ["hf", "litgpt"]},
        sagemaker=sm,
        parallel={"nnodes": instances, "nproc_per_node": processes},
    )


def tar_folder(folder: Path, arcname: str = "") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in sorted(folder.rglob("*")):
            tar.add(p, arcname=str(Path(arcname) / p.relative_to(folder)), recursive=False)
    return buf.getvalue()


def seed_job(c: dict, request: dict, model_tar: bytes, log_lines: list[str], attempt_name: str | None = None):
    """What SageMaker would leave: model.tar.gz under the output path, and the job's log stream."""
    name = attempt_name or request["TrainingJobName"]
    bucket, key = request["OutputDataConfig"]["S3OutputPath"][5:].split("/", 1)
    c["s3"].put_object(Bucket=bucket, Key=f"{key}/{name}/output/model.tar.gz", Body=model_tar)
    try:
        c["logs"].create_log_group(logGroupName=jobs.LOG_GROUP)
    except c["logs"].exceptions.ResourceAlreadyExistsException:
        pass
    stream = f"{name}/algo-1-1700000000"
    c["logs"].create_log_stream(logGroupName=jobs.LOG_GROUP, logStreamName=stream)
    now = int(time.time() * 1000)
    c["logs"].put_log_events(
        logGroupName=jobs.LOG_GROUP,
        logStreamName=stream,
        logEvents=[{"timestamp": now + i, "message": m} for i, m in enumerate(log_lines)],
    )


def count_calls(client, operation: str) -> list:
    calls = []
    client.meta.events.register(
        f"provide-client-params.{client.meta.service_model.service_name}.{operation}",
        lambda params, **kw: calls.append(dict(params)),
    )
    return calls


# --- mode algorithm against moto ----------------------------------------------------------------


def test_algorithm_job_request_logs_artifact_and_attach_on_rerun(aws, prepared, tmp_path, capsys):
    cfg = sm_config(tmp_path)
    manifest = tmp_path / "inputs.json"
    upload.upload_inputs(cfg, prepared["litgpt"], None, manifest, s3=aws["s3"])
    inputs = json.loads(manifest.read_text())
    request = jobs.build_request(cfg, inputs)
    lines = [f"iter {4 * s} step {s}: loss {9.0 - s / 2:.4f}, LR: {1e-3 * s:.6f}, iter time: 10ms" for s in (1, 2, 3)]
    seed_job(aws, request, tar_folder(prepared["init"]), ["starting lit-gpt pretraining", *lines])
    creates = count_calls(aws["sagemaker"], "CreateTrainingJob")
    out, metrics = tmp_path / "final", tmp_path / "metrics.jsonl"

    job = jobs.train(cfg, manifest, out, metrics, clients=aws)

    # every field of the request, as SageMaker (moto) recorded it
    d = aws["sagemaker"].describe_training_job(TrainingJobName=job["job_name"])
    t = cfg["train"]
    assert d["AlgorithmSpecification"]["AlgorithmName"] == ALGORITHM
    assert d["AlgorithmSpecification"]["TrainingInputMode"] == "File"
    assert "TrainingImage" not in d["AlgorithmSpecification"]
    hp = d["HyperParameters"]
    assert set(hp) == set(ALGORITHM_HYPERPARAMETERS) and len(hp) == 13
    for name, (section, key) in ALGORITHM_HYPERPARAMETERS.items():
        want = cfg[section][key]
        assert (hp[name] == want) if isinstance(want, str) else (float(hp[name]) == float(want)), name
    assert hp["MODEL_NAME"] == "mindbeam-2k" and hp["MAX_STEP"] == str(t["max_steps"])
    assert d["RoleArn"] == ROLE
    [channel] = d["InputDataConfig"]
    s3src = channel["DataSource"]["S3DataSource"]
    assert channel["ChannelName"] == "train"
    assert s3src["S3DataType"] == "S3Prefix" and s3src["S3DataDistributionType"] == "FullyReplicated"
    assert s3src["S3Uri"] == f"s3://{BUCKET}/runs/{cfg['run']}/inputs/train/"
    assert d["OutputDataConfig"]["S3OutputPath"] == f"s3://{BUCKET}/runs/{cfg['run']}/output"
    assert d["ResourceConfig"] == {
        "InstanceType": "ml.p5.48xlarge",
        "InstanceCount": 2,
        "VolumeSizeInGB": 3,
        "KeepAlivePeriodInSeconds": 900,
    }
    assert d["StoppingCondition"]["MaxRuntimeInSeconds"] == 7200
    assert d["EnableNetworkIsolation"] is True
    assert d["CheckpointConfig"]["S3Uri"].startswith(f"s3://{BUCKET}/runs/{cfg['run']}/checkpoints/")
    assert d["CheckpointConfig"]["LocalPath"] == "/opt/ml/checkpoints"
    assert d["TrainingJobName"] == request["TrainingJobName"] == job["job_name"]
    tags = {x["Key"]: x["Value"] for x in aws["sagemaker"].list_tags(ResourceArn=d["TrainingJobArn"])["Tags"]}
    assert tags["team"] == "nlp" and tags["llmpipe:run"] == cfg["run"]

    # the channel holds exactly the view's lit-gpt files, flat
    keys = {o["Key"] for o in aws["s3"].list_objects_v2(Bucket=BUCKET, Prefix=f"runs/{cfg['run']}/inputs/train/")["Contents"]}
    local = {p.name: p for p in prepared["litgpt"].rglob("*") if p.is_file()}
    assert keys == {f"runs/{cfg['run']}/inputs/train/{n}" for n in local}
    assert any(n.startswith("train_") for n in local) and any(n.startswith("validation_") for n in local)

    # the log stream reached the rule's log; loss lines became metrics
    printed = capsys.readouterr().out
    assert "[algo-1-1700000000] starting lit-gpt pretraining" in printed and lines[-1] in printed
    recs = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [(r["step"], r["loss"], r["lr"]) for r in recs] == [(s, 9.0 - s / 2, 1e-3 * s) for s in (1, 2, 3)]
    rows = json.loads((prepared["litgpt"] / "view.json").read_text())["train"]["rows"]
    gbs, seq = cfg["train"]["global_batch_size"], cfg["train"]["seq_len"]
    assert [(r["tokens"], r["epoch"]) for r in recs] == [(s * gbs * seq, s * gbs / rows) for s in (1, 2, 3)]

    # the artifact: the HF model that was in model.tar.gz, byte for byte
    for p in prepared["init"].glob("*.safetensors"):
        assert (out / p.name).read_bytes() == p.read_bytes()
    assert json.loads((out / "sagemaker_job.json").read_text())["created"] is True
    assert len(creates) == 1

    # rerun: same inputs -> attach, no second job
    shutil.rmtree(out)
    job2 = jobs.train(cfg, manifest, out, metrics, clients=aws)
    assert job2["job_name"] == job["job_name"] and job2["created"] is False
    assert len(creates) == 1
    assert len(aws["sagemaker"].list_training_jobs()["TrainingJobSummaries"]) == 1

    # a changed hyperparameter is a different job (and a different checkpoint prefix)
    cfg3 = sm_config(tmp_path, hyperparameters={"EXTRA": "1"})
    req3 = jobs.build_request(cfg3, inputs)
    assert req3["TrainingJobName"] != request["TrainingJobName"]
    assert req3["CheckpointConfig"]["S3Uri"] != request["CheckpointConfig"]["S3Uri"]


def test_upload_skips_same_checksum_and_removes_stale(aws, prepared, tmp_path):
    view = tmp_path / "view"
    shutil.copytree(prepared["litgpt"], view)
    s3 = aws["s3"]
    puts = count_calls(s3, "PutObject")
    uri = f"s3://{BUCKET}/runs/u/inputs/train"
    files = {p.name: p for p in view.rglob("*") if p.is_file()}

    upload.sync_folder(s3, view, uri, flat=True)
    assert len(puts) == len(files)
    for name, p in files.items():
        head = s3.head_object(Bucket=BUCKET, Key=f"runs/u/inputs/train/{name}")
        assert head["Metadata"]["sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
        body = s3.get_object(Bucket=BUCKET, Key=f"runs/u/inputs/train/{name}")["Body"].read()
        assert body == p.read_bytes()

    upload.sync_folder(s3, view, uri, flat=True)  # nothing changed: no upload
    assert len(puts) == len(files)

    changed = sorted(n for n in files if n.endswith(".bin"))[0]
    raw = bytearray(files[changed].read_bytes())
    raw[-1] ^= 1
    files[changed].write_bytes(bytes(raw))
    boto3.client("s3").put_object(Bucket=BUCKET, Key="runs/u/inputs/train/stale.bin", Body=b"old")
    res = upload.sync_folder(s3, view, uri, flat=True)
    assert [p["Key"] for p in puts[len(files) :]] == [f"runs/u/inputs/train/{changed}"]
    assert res["deleted"] == ["stale.bin"]
    keys = {o["Key"].rsplit("/", 1)[1] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="runs/u/")["Contents"]}
    assert keys == set(files)


def test_bad_names_and_hyperparameters_stop_before_any_call(aws, prepared, tmp_path):
    cfg = sm_config(tmp_path, hyperparameters={"NOTE": "x" * 2501})
    inputs = {"mode": "algorithm", "channels": {"train": {"s3_uri": f"s3://{BUCKET}/x/", "files": {}}}}
    calls = []
    aws["sagemaker"].meta.events.register("before-call.sagemaker.*", lambda **kw: calls.append(kw))
    with pytest.raises(RequestError, match=r"HyperParameters\['NOTE'\]: 2501 characters, at most 2500"):
        jobs.build_request(cfg, inputs)
    cfg = sm_config(tmp_path, role_arn="arn:aws:iam::12345:role/short-account")
    with pytest.raises(RequestError, match="RoleArn"):
        jobs.build_request(cfg, inputs)
    cfg = sm_config(tmp_path, algorithm_name="arn:aws:sagemaker:us-east-1:123456789012:algorithm/bad_name!")
    with pytest.raises(RequestError, match="AlgorithmName"):
        jobs.build_request(cfg, inputs)
    assert calls == []
    with pytest.raises(SettingsError, match=r"MAX_STEP \(set train.max_steps\)"):
        check_settings(sm_config(tmp_path, hyperparameters={"MAX_STEP": "5"}))
    no_litgpt = sm_config(tmp_path)
    no_litgpt["data"]["views"] = ["hf"]
    with pytest.raises(SettingsError, match="add litgpt to data.views"):
        check_settings(no_litgpt)
    with pytest.raises(SettingsError, match="sagemaker.image_uri"):
        check_settings(tiny_config(tmp_path, sagemaker={"mode": "image", "role_arn": ROLE, "s3_prefix": "s3://bucket1/p"}))
    image = {
        "mode": "image",
        "role_arn": ROLE,
        "s3_prefix": "s3://bucket1/p",
        "image_uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
    }
    for name in ("llmpipe_config", "processes_per_instance"):  # they replaced the config llmpipe sends the container
        with pytest.raises(SettingsError, match=rf"may not set what llmpipe passes the container: {name}"):
            check_settings(tiny_config(tmp_path, sagemaker={**image, "hyperparameters": {name: "1"}}))
    check_settings(tiny_config(tmp_path, sagemaker={**image, "hyperparameters": {"my_flag": "1"}}))
    arn = "arn:aws:sagemaker:us-east-1:123456789012:algorithm/x"  # as the sagemaker profile sets one
    with pytest.raises(SettingsError, match="set algorithm_name: null"):
        check_settings(tiny_config(tmp_path, sagemaker={**image, "algorithm_name": arn}))


# --- status transitions, failure, timeout, interrupt: Stubber (a fake SageMaker) -------------------


def stubbed():
    client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    return client, Stubber(client)


def described(name, status, secondary, **extra):
    return {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{name}",
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://b/o/{name}/output/model.tar.gz"},
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ResourceConfig": {"VolumeSizeInGB": 1},
        "StoppingCondition": {},
        "CreationTime": 0,
        **extra,
    }


def test_status_transitions_until_completed(caplog):
    client, stub = stubbed()
    seq = [
        ("InProgress", "Starting"),
        ("InProgress", "Downloading"),
        ("InProgress", "Training"),
        ("InProgress", "Training"),
        ("InProgress", "Uploading"),
        ("Completed", "Completed"),
    ]
    for status, sec in seq:
        stub.add_response("describe_training_job", described("j", status, sec), {"TrainingJobName": "j"})
    sleeps = []
    with stub, caplog.at_level("INFO"):
        desc = jobs.wait(client, "j", timeout_s=3600, poll_s=5, sleep=sleeps.append)
    stub.assert_no_pending_responses()
    assert desc["TrainingJobStatus"] == "Completed"
    assert sleeps == [5] * (len(seq) - 1)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("j: ")]
    assert logged == [f"j: {s} / {sec}" for s, sec in dict.fromkeys(seq)]  # each change once


def test_failed_job_raises_with_reason():
    client, stub = stubbed()
    stub.add_response("describe_training_job", described("j", "InProgress", "Training"), {"TrainingJobName": "j"})
    stub.add_response(
        "describe_training_job",
        described("j", "Failed", "Failed", FailureReason="AlgorithmError: CUDA out of memory"),
        {"TrainingJobName": "j"},
    )
    with stub, pytest.raises(jobs.JobError, match="ended Failed: AlgorithmError: CUDA out of memory"):
        jobs.wait(client, "j", timeout_s=3600, poll_s=1, sleep=lambda s: None)
    stub.assert_no_pending_responses()


def test_timeout_stops_the_job():
    client, stub = stubbed()
    now = [0.0]
    for _ in range(4):  # polls at 0, 10, 20 and 30 s; 30 > 25: stop
        stub.add_response("describe_training_job", described("j", "InProgress", "Training"), {"TrainingJobName": "j"})
    stub.add_response("stop_training_job", {}, {"TrainingJobName": "j"})

    def sleep(s):
        now[0] += s

    with stub, pytest.raises(jobs.WaitTimeout, match="after 25 s"):
        jobs.wait(client, "j", timeout_s=25, poll_s=10, clock=lambda: now[0], sleep=sleep)
    stub.assert_no_pending_responses()  # the stop request was sent


def test_interrupt_stops_the_job():
    client, stub = stubbed()
    stub.add_response("describe_training_job", described("j", "InProgress", "Training"), {"TrainingJobName": "j"})
    stub.add_response("stop_training_job", {}, {"TrainingJobName": "j"})

    def sleep(s):
        raise KeyboardInterrupt

    with stub, pytest.raises(KeyboardInterrupt):
        jobs.wait(client, "j", timeout_s=3600, poll_s=1, sleep=sleep)
    stub.assert_no_pending_responses()


def test_failed_job_is_retried_as_next_attempt_with_the_same_checkpoints(tmp_path):
    cfg = sm_config(tmp_path)
    inputs = {"mode": "algorithm", "channels": {"train": {"s3_uri": f"s3://{BUCKET}/x/", "files": {"a.bin": "00"}}}}
    request = jobs.build_request(cfg, inputs)
    name = request["TrainingJobName"]
    client, stub = stubbed()
    stub.add_response(
        "describe_training_job", described(name, "Failed", "Failed", FailureReason="capacity"), {"TrainingJobName": name}
    )
    stub.add_client_error(
        "describe_training_job",
        "ValidationException",
        "Requested resource not found.",
        expected_params={"TrainingJobName": f"{name}-r2"},
    )
    stub.add_response(
        "create_training_job",
        {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/x"},
        {**request, "TrainingJobName": f"{name}-r2"},
    )
    with stub:
        got, created = jobs.create_or_attach(client, request, max_attempts=3)
    stub.assert_no_pending_responses()
    assert (got, created) == (f"{name}-r2", True)


def test_the_job_key_follows_the_model_not_the_operations(tmp_path):
    """After a Failed or Stopped job the natural fixes (more runtime, another instance type after a capacity
    error, a tag) named a new job with new checkpoints, which started from step 0: now they keep the
    name and its checkpoint prefix; the data and the instance count (the world size) do not."""
    inputs = ONE_CHANNEL
    name = lambda **over: jobs.build_request(sm_config(tmp_path, **over), inputs)["TrainingJobName"]
    base = name()
    ops = dict(
        max_runtime_seconds=9000, instance_type="ml.p4d.24xlarge", keep_alive_seconds=0, tags={"team": "x"}, volume_size_gb=9
    )
    for key, value in ops.items():
        assert name(**{key: value}) == base, key
    other = {**inputs, "channels": {"train": {**inputs["channels"]["train"], "files": {"a.bin": "01"}}}}
    assert jobs.build_request(sm_config(tmp_path), other)["TrainingJobName"] != base
    more = jobs.build_request(sm_config(tmp_path, instances=4), inputs)["TrainingJobName"]
    assert more != base


ONE_CHANNEL = {"mode": "algorithm", "channels": {"train": {"s3_uri": f"s3://{BUCKET}/x/", "files": {"a.bin": "00"}}}}


def no_job(stub, name):
    stub.add_client_error(
        "describe_training_job", "ValidationException", "Requested resource not found.", expected_params={"TrainingJobName": name}
    )


def running(stub, stem, names=()):
    for status in ("InProgress", "Stopping"):
        jobs_ = [
            {
                "TrainingJobName": n,
                "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:1:training-job/{n}",
                "CreationTime": 0,
                "TrainingJobStatus": status,
            }
            for n in (names if status == "InProgress" else ())
        ]
        stub.add_response(
            "list_training_jobs",
            {"TrainingJobSummaries": jobs_},
            {"NameContains": stem, "StatusEquals": status, "MaxResults": 100},
        )


def test_a_second_job_of_the_run_is_refused_while_the_first_runs(tmp_path):
    """The local process died, the settings changed, the run was started again: the earlier job still runs
    (and bills); a second one is refused, naming the first and how to stop it."""
    request = jobs.build_request(sm_config(tmp_path), ONE_CHANNEL)
    name = request["TrainingJobName"]
    stem = name.rsplit("-", 1)[0]
    client, stub = stubbed()
    no_job(stub, name)
    running(stub, stem, [f"{stem}-0123456789", f"{stem}x-0123456789"])  # the second: another run's (run name longer)
    with stub, pytest.raises(jobs.JobError, match=rf"training job {stem}-0123456789 of this run is still running"):
        jobs.create_or_attach(client, request, max_attempts=3)
    stub.assert_no_pending_responses()


@pytest.mark.parametrize("reason", ["InternalServerError: capacity", "ClientError: bad hyperparameter"])
def test_a_failed_job_is_followed_by_its_next_attempt_in_the_same_run(tmp_path, reason):
    """Failed for SageMaker's reasons: the next attempt (same checkpoint prefix) in this same run, where
    before the run ended and only a manual rerun made `-r2`; Failed for the request's own (ClientError):
    no retry, another attempt would fail the same way and bill again."""
    request = jobs.build_request(sm_config(tmp_path), ONE_CHANNEL)
    name = request["TrainingJobName"]
    client, stub = stubbed()
    created = {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/x"}
    no_job(stub, name)
    running(stub, name.rsplit("-", 1)[0])
    stub.add_response("create_training_job", created, request)
    failed = described(name, "Failed", "Failed", FailureReason=reason)
    stub.add_response("describe_training_job", failed, {"TrainingJobName": name})
    if reason.startswith("InternalServerError"):
        stub.add_response("describe_training_job", failed, {"TrainingJobName": name})
        no_job(stub, f"{name}-r2")
        stub.add_response("create_training_job", created, {**request, "TrainingJobName": f"{name}-r2"})
        done = described(f"{name}-r2", "Completed", "Completed")
        stub.add_response("describe_training_job", done, {"TrainingJobName": f"{name}-r2"})
    sm = {"wait_timeout_seconds": 60, "max_runtime_seconds": 60, "poll_seconds": 0, "max_attempts": 3}
    with stub:
        if reason.startswith("ClientError"):
            with pytest.raises(jobs.JobFailed, match="bad hyperparameter"):
                jobs.run_attempts(client, request, sm, lambda job: None, sleep=lambda s: None)
        else:
            got, was_created, desc = jobs.run_attempts(client, request, sm, lambda job: None, sleep=lambda s: None)
            assert (got, was_created, desc["TrainingJobStatus"]) == (f"{name}-r2", True, "Completed")
    stub.assert_no_pending_responses()


# --- artifacts --------------------------------------------------------------------------------------


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink_out", "symlink_in", "hardlink", "fifo"])
def test_unsafe_archives_are_refused(tmp_path, kind):
    """Nothing but files and folders, nothing outside: a symlink even to a place inside the folder is refused
    (a chain of them past PATH_MAX escaped the "data" filter on Python 3.11.7, CVE-2025-4517), before any
    member is written."""
    name = {"dotdot": "../escape.txt", "absolute": "/tmp/llmpipe-escape.txt", "symlink_out": "link"}.get(kind, "m")
    info = tarfile.TarInfo(name)
    data = b"x"
    if kind in ("symlink_out", "symlink_in", "hardlink"):
        info.type = tarfile.LNKTYPE if kind == "hardlink" else tarfile.SYMTYPE
        info.linkname, data = "/etc/passwd" if kind == "symlink_out" else "config.json", None
    elif kind == "fifo":
        info.type, data = tarfile.FIFOTYPE, None
    else:
        info.size = 1
    first = tarfile.TarInfo("config.json")
    first.size = 2
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(_tar([(first, b"{}"), (info, data)]))
    with pytest.raises(jobs.JobError, match="unsafe member refused"):
        jobs.safe_extract(archive, tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists() and not Path("/tmp/llmpipe-escape.txt").exists()
    assert not any((tmp_path / "dest").rglob("*"))  # refused before the first member was written


def test_an_archive_larger_than_the_free_disk_is_refused_before_writing(tmp_path, monkeypatch):
    info = tarfile.TarInfo("model.safetensors")
    info.size = 4096
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(_tar([(info, bytes(4096))]))
    monkeypatch.setattr(jobs.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**6, 10**6 - 100, 100))
    with pytest.raises(jobs.JobError, match="unpacks to 4096 bytes, 100 free"):
        jobs.safe_extract(archive, tmp_path / "dest")
    assert not any((tmp_path / "dest").rglob("*"))


def test_artifact_without_a_model_names_its_files(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "notes.txt").write_text("nothing")
    with pytest.raises(jobs.JobError, match="no HF or lit-gpt checkpoint.*notes.txt"):
        jobs.to_hf(tmp_path / "m", tmp_path / "out", "auto")


def _hf_to_litgpt(sd: dict, cfg, interleaved: bool) -> dict:
    """HF Llama -> lit-gpt names, written from lit-gpt's convert_hf_checkpoint (copy_weights_hf_llama):
    litgpt >= 0.5 stores attn.qkv = cat(q, k, v); older lit-gpt attn.attn interleaves per query group."""
    heads, groups = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = cfg.hidden_size // heads
    out = {
        "transformer.wte.weight": sd["model.embed_tokens.weight"],
        "transformer.ln_f.weight": sd["model.norm.weight"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        q, k, v = (sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
        if interleaved:
            qs, ks, vs = q.view(groups, heads // groups, hd, -1), k.view(groups, 1, hd, -1), v.view(groups, 1, hd, -1)
            out[f"transformer.h.{i}.attn.attn.weight"] = torch.cat([qs, ks, vs], dim=1).reshape(-1, cfg.hidden_size)
        else:
            out[f"transformer.h.{i}.attn.qkv.weight"] = torch.cat([q, k, v])
        for lit, hf in (
            ("norm_1", "input_layernorm"),
            ("norm_2", "post_attention_layernorm"),
            ("attn.proj", "self_attn.o_proj"),
            ("mlp.fc_1", "mlp.gate_proj"),
            ("mlp.fc_2", "mlp.up_proj"),
            ("mlp.proj", "mlp.down_proj"),
        ):
            out[f"transformer.h.{i}.{lit}.weight"] = sd[p + hf + ".weight"]
    return out


@pytest.mark.parametrize("interleaved", [False, True])
def test_litgpt_checkpoint_converts_to_the_same_model(prepared, tmp_path, interleaved):
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(str(prepared["init"]), dtype=torch.float32)
    c = ref.config
    model_dir = tmp_path / "artifact" / "out"
    model_dir.mkdir(parents=True)
    torch.save({"model": _hf_to_litgpt(ref.state_dict(), c, interleaved)}, model_dir / "lit_model.pth")
    (model_dir / "model_config.yaml").write_text(
        json.dumps(
            {
                "n_embd": c.hidden_size,
                "n_layer": c.num_hidden_layers,
                "n_head": c.num_attention_heads,
                "n_query_groups": c.num_key_value_heads,
                "intermediate_size": c.intermediate_size,
                "padded_vocab_size": c.vocab_size,
                "norm_eps": c.rms_norm_eps,
                "rope_base": c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else c.rope_theta,
                "block_size": c.max_position_embeddings,
            }
        )
    )
    out = tmp_path / "hf"
    assert jobs.to_hf(tmp_path / "artifact", out, "auto", prepared["tokenizer"]) == "litgpt"
    got = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ids = torch.randint(0, c.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(got(ids).logits, ref(ids).logits, atol=1e-5)

    # the exported model stops on the run tokenizer's EOS (not transformers' Llama default 2; this one's is 0)
    from llmpipe.data.tokenizer import load_tokenizer, tokenizer_info
    from llmpipe.export import export

    info, tok = tokenizer_info(prepared["tokenizer"]), load_tokenizer(prepared["tokenizer"])
    want = {"bos_token_id": info.bos_id, "eos_token_id": info.eos_id, "pad_token_id": tok.pad_token_id}
    assert want["eos_token_id"] not in (None, 2) and want == {k: getattr(c, k) for k in want}  # as init-model set them
    export(out, prepared["tokenizer"], tmp_path / "exported", "float32", prepared["manifest"])
    for name in ("config.json", "generation_config.json"):
        conf = json.loads((tmp_path / "exported" / name).read_text())
        assert {k: conf.get(k) for k in want} == want, name


# --- mode image ---------------------------------------------------------------------------------------


def test_image_mode_request_and_entry_train_our_model(aws, prepared, tmp_path):
    """The request of mode image, then its entry point run as SageMaker would run it (a local /opt/ml
    tree made from the uploaded channels and the request's hyperparameters): the real torch trainer."""
    cfg = sm_config(tmp_path, mode="image", processes=1, instances=1)
    manifest = tmp_path / "inputs.json"
    upload.upload_inputs(cfg, prepared["view"], prepared["init"], manifest, s3=aws["s3"])
    inputs = json.loads(manifest.read_text())
    assert set(inputs["channels"]) == {"train", "init", "code"}
    request = jobs.build_request(cfg, inputs)
    # a setting that does not change the model keeps the job's name (a rerun attaches, its checkpoints
    # resume); before, any train.* change named a new job that started from scratch. One that does: a new job.
    quiet = {**cfg, "train": {**cfg["train"], "log_interval": 3}, "eval": {**cfg["eval"], "batch_size": 2}}
    assert jobs.build_request(quiet, inputs)["TrainingJobName"] == request["TrainingJobName"]
    for over in ({"lr": cfg["train"]["lr"] / 2}, {"resume": False}):  # resume false: a fresh job, not the old one's
        changed = {**cfg, "train": {**cfg["train"], **over}}
        assert jobs.build_request(changed, inputs)["TrainingJobName"] != request["TrainingJobName"], over
    aws["sagemaker"].create_training_job(**request)
    d = aws["sagemaker"].describe_training_job(TrainingJobName=request["TrainingJobName"])
    spec = d["AlgorithmSpecification"]
    assert spec["TrainingImage"] == IMAGE and "AlgorithmName" not in spec
    entry = spec["ContainerEntrypoint"]
    assert entry[0] == "python3" and entry[1] == f"/opt/ml/input/data/code/{upload.ENTRY_SCRIPT}"
    assert upload.ENTRY_SCRIPT in inputs["channels"]["code"]["files"]
    assert {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in d["InputDataConfig"]} == {
        n: ch["s3_uri"] for n, ch in inputs["channels"].items()
    }
    assert json.loads(d["HyperParameters"]["llmpipe_config"]) == {"train": cfg["train"], "eval": cfg["eval"]}

    # /opt/ml as SageMaker lays it out, every channel downloaded from moto's S3
    root = tmp_path / "opt_ml"
    for name, ch in inputs["channels"].items():
        bucket, prefix = ch["s3_uri"][5:].split("/", 1)
        for rel in ch["files"]:
            dest = root / "input" / "data" / name / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            aws["s3"].download_file(bucket, prefix + rel, str(dest))
    (root / "input" / "config").mkdir(parents=True)
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(d["HyperParameters"]))
    (root / "input" / "config" / "resourceconfig.json").write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    (root / "model").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(root / "input" / "data" / "code" / upload.ENTRY_SCRIPT)],
        env={**env, "LLMPIPE_SM_ROOT": str(root)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"llmpipe from {root / 'input' / 'data' / 'code'}" in proc.stderr  # the channel's copy ran
    summary = json.loads((root / "model" / "train_summary.json").read_text())
    assert summary["steps"] == cfg["train"]["max_steps"]
    recs = [json.loads(x) for x in (root / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == list(range(1, cfg["train"]["max_steps"] + 1))
    assert recs[-1]["loss"] < recs[0]["loss"]
    assert any((root / "checkpoints").glob("step_*"))

    # what the job uploads comes back as the HF final folder + metrics
    out_uri = d["OutputDataConfig"]["S3OutputPath"]
    bucket, key = out_uri[5:].split("/", 1)
    aws["s3"].put_object(Bucket=bucket, Key=f"{key}/{d['TrainingJobName']}/output/model.tar.gz", Body=tar_folder(root / "model"))
    aws["s3"].put_object(
        Bucket=bucket, Key=f"{key}/{d['TrainingJobName']}/output/output.tar.gz", Body=tar_folder(root / "output" / "data", "data")
    )
    out, metrics = tmp_path / "final", tmp_path / "metrics.jsonl"
    job = jobs.train(cfg, manifest, out, metrics, clients=aws)
    assert job["created"] is False and job["artifact_format"] == "hf"
    assert (out / "model.safetensors").read_bytes() == (root / "model" / "model.safetensors").read_bytes()
    assert [json.loads(x) for x in metrics.read_text().splitlines()] == recs


# --- the Snakemake rules of this backend against moto ----------------------------------------------


@pytest.mark.slow
def test_snakemake_profile_runs_against_moto(aws, tmp_path):
    """profiles/sagemaker end to end: data prep, upload, train (moto), download of a seeded lit-gpt
    artifact, conversion, export and evaluation; a rerun of the training rule attaches."""
    import yaml

    from llmpipe import config as cfgmod
    from llmpipe.evaluate import evaluate
    from tests.conftest import merge

    work = tmp_path / "repo"
    shutil.copytree(
        REPO,
        work,
        ignore=shutil.ignore_patterns("results", ".snakemake", ".git", "__pycache__", "*.egg-info", ".pytest_cache", ".venvs"),
    )
    write_jsonl(work / "corpus.jsonl", corpus_docs(60))
    over = {
        "data": {"sources": ["corpus.jsonl"], "val_fraction": 0.1, "litgpt_sequences_per_file": 32},
        "tokenizer": {"vocab_size": 512},
        "model": {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
        "train": {
            "seq_len": 64,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "max_steps": 6,
            "warmup_steps": 1,
            "save_interval": 3,
            "eval_interval": 3,
        },
        "sagemaker": {"s3_prefix": f"s3://{BUCKET}/llmpipe", "poll_seconds": 0.01, "wait_timeout_seconds": 60},
    }
    (work / "sm.yaml").write_text(yaml.safe_dump(over))
    files = ["config/config.yaml", "profiles/sagemaker/llmpipe.yaml", "sm.yaml"]  # the profile loads its own llmpipe.yaml
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(GUARD_DIR), str(work / "src")])}

    def snakemake(*args):
        return subprocess.run(
            [sys.executable, "-m", "snakemake", "--profile", "profiles/sagemaker", *args, "--configfile", files[0], files[2]],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    run = work / "results" / "default"
    proc = snakemake("results/default/sagemaker/inputs.json", "results/default/checkpoints/init")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cfg = cfgmod.validate(merge(merge(*(yaml.safe_load((work / f).read_text()) for f in files[:2])), over))
    request = jobs.build_request(cfg, json.loads((run / "sagemaker" / "inputs.json").read_text()))
    bins = sorted(p.name for p in (run / "data" / "views" / "litgpt").rglob("*.bin"))
    listed = aws["s3"].list_objects_v2(Bucket=BUCKET, Prefix="llmpipe/default/inputs/train/")["Contents"]
    assert sorted(o["Key"].rsplit("/", 1)[1] for o in listed if o["Key"].endswith(".bin")) == bins

    # what the algorithm would leave: a lit-gpt checkpoint of the init model, and loss lines in its log
    from transformers import AutoModelForCausalLM

    init = AutoModelForCausalLM.from_pretrained(str(run / "checkpoints" / "init"), dtype=torch.float32)
    c = init.config
    lit = tmp_path / "lit"
    lit.mkdir()
    torch.save(_hf_to_litgpt(init.state_dict(), c, interleaved=False), lit / "lit_model.pth")
    (lit / "model_config.yaml").write_text(
        yaml.safe_dump(
            {
                "n_embd": c.hidden_size,
                "n_layer": c.num_hidden_layers,
                "n_head": c.num_attention_heads,
                "n_query_groups": c.num_key_value_heads,
                "intermediate_size": c.intermediate_size,
                "padded_vocab_size": c.vocab_size,
                "norm_eps": float(c.rms_norm_eps),
                "block_size": 64,
            }
        )
    )
    seed_job(aws, request, tar_folder(lit, "out"), [f"step {s}: loss {8 - s * 0.25}" for s in range(1, 7)])

    proc = snakemake("results/default/eval.json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (run / "logs" / "train_sagemaker.log").read_text()
    assert f"created training job {request['TrainingJobName']}" in log and "step 6: loss 6.5" in log
    assert (
        json.loads((run / "checkpoints" / "sagemaker" / "final" / "sagemaker_job.json").read_text())["artifact_format"]
        == "litgpt"
    )
    exported = json.loads((run / "hf" / "generation_config.json").read_text())  # the run tokenizer's ids, as init's
    assert {k: exported.get(k) for k in ("bos_token_id", "eos_token_id")} == {
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
    }
    # the evaluated model is the one that came back: same val loss as the init model it was made from
    ev = json.loads((run / "eval.json").read_text())
    view, bs = run / "data" / "views" / "hf", cfg["eval"]["batch_size"]
    want = evaluate(run / "checkpoints" / "init", view, tmp_path / "ref.json", bs, document_masking=False)  # as lit-gpt trains
    assert abs(ev["val_loss"] - want["val_loss"]) < 1e-5
    recs = [json.loads(x) for x in (run / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in recs] == [(s, 8 - s * 0.25) for s in range(1, 7)]

    proc = snakemake("results/default/checkpoints/sagemaker/final", "--forcerun", "train_sagemaker")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "attaching to existing training job" in (run / "logs" / "train_sagemaker.log").read_text()
    assert len(aws["sagemaker"].list_training_jobs()["TrainingJobSummaries"]) == 1


def run_entry(tmp_path, root):
    """The container's entry script from a fresh code channel, on `root` as /opt/ml (llmpipe from the channel)."""
    code = upload.code_folder(tmp_path / "code")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, str(code / upload.ENTRY_SCRIPT)],
        env={**env, "LLMPIPE_SM_ROOT": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_entry_failure_reaches_the_failure_file(tmp_path):
    """SageMaker shows /opt/ml/output/failure as the job's FailureReason."""
    root = tmp_path / "opt_ml"
    proc = run_entry(tmp_path, root)
    assert proc.returncode != 0
    assert (root / "output" / "failure").read_text().startswith("FileNotFoundError")
    assert "hyperparameters.json" in (root / "output" / "failure").read_text()


def test_image_mode_refuses_a_batch_its_processes_cannot_split(tmp_path):
    """Mode image starts a process a GPU of the instance type (processes_per_instance auto): a global batch
    those cannot split is refused when the config is checked, as the torch backend refuses it, where before
    the trainer refused it inside the job on every attempt. Given nproc_per_node, that count is checked."""
    from llmpipe import config as cfgmod
    from tests.conftest import merge

    image = {"mode": "image", "role_arn": ROLE, "s3_prefix": "s3://bucket1/p", "image_uri": IMAGE}
    train = {"backend": "sagemaker", "global_batch_size": 16, "micro_batch_size": 8}

    def checked(nproc_per_node=None):  # tiny_config's is the torch backend's 1: null again, sagemaker's default
        over = {"train": train, "sagemaker": image, "parallel": {"nproc_per_node": nproc_per_node}}
        return cfgmod.validate(merge(tiny_config(tmp_path), over))

    with pytest.raises(cfgmod.ConfigError, match=r"\(8 x 8 x 1\) \(one process a GPU of ml.p4de.24xlarge: 8\)"):
        checked()
    with pytest.raises(cfgmod.ConfigError, match=r"\(8 x 4 x 1\)$"):
        checked(nproc_per_node=4)
    assert checked(nproc_per_node=2)["parallel"]["nproc_per_node"] == 2
    image["instance_type"] = "ml.g5.2xlarge"  # not in the hardware table: its GPUs unknown here, left to the job
    assert checked()["sagemaker"]["instance_type"] == "ml.g5.2xlarge"


def test_a_trainer_failure_reaches_the_failure_file_by_its_error_not_its_command(tmp_path):
    """The trainer exits 1: the failure file (the job's FailureReason) holds its
    exit status and last error lines (here: an empty train channel), not the command line with the whole config cut
    at 1,000 characters."""
    root = tmp_path / "opt_ml"
    (root / "input" / "config").mkdir(parents=True)
    for channel in ("train", "init"):
        (root / "input" / "data" / channel).mkdir(parents=True)
    config = {"train": {"max_steps": 2, "lr": 1e-3}, "eval": {}}
    hp = {"llmpipe_config": json.dumps(config), "processes_per_instance": "1"}
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hp))
    proc = run_entry(tmp_path, root)
    assert proc.returncode != 0
    failure = (root / "output" / "failure").read_text()
    assert failure.startswith("torch-train exited ") and "llmpipe torch-train" in failure, failure
    assert '"max_steps"' not in failure and len(failure) <= 1000  # not the command's config
    assert f"--data {root / 'input' / 'data' / 'train'}: no view.json" in failure  # why: the empty train channel
    assert failure.split(" | ")[-1] in proc.stderr  # its stderr still reached the job's log


def test_job_names_fit_aws_limits_for_every_attempt():
    import regex

    from llmpipe.backends.sagemaker.hyperparameters import job_name
    from llmpipe.backends.sagemaker.validate import _operation

    pattern = _operation("sagemaker", "CreateTrainingJob").input_shape.members["TrainingJobName"].metadata["pattern"]
    for run in ("default", "a" * 80, "exp_2.v1--x", "-lead.dots-"):
        for attempt in (1, 2, 20):
            name = job_name("llmpipe", run, "0123456789", attempt)
            assert len(name) <= 63 and regex.fullmatch(pattern, name), name
            assert name.endswith("-0123456789" + (f"-r{attempt}" if attempt > 1 else ""))


def test_a_job_still_stopping_is_waited_for_then_followed_by_the_next_attempt(tmp_path):
    """A rerun right after Ctrl-C finds the job Stopping: it waits until it has stopped, then creates the next
    attempt (which resumes), as the interrupt's message says; before, it attached and ended on 'Stopped'."""
    request = jobs.build_request(sm_config(tmp_path), ONE_CHANNEL)
    name = request["TrainingJobName"]
    client, stub = stubbed()
    for status in ("Stopping", "Stopping", "Stopped"):
        stub.add_response("describe_training_job", described(name, status, status), {"TrainingJobName": name})
    no_job(stub, f"{name}-r2")
    stub.add_response(
        "create_training_job",
        {"TrainingJobArn": "arn:aws:sagemaker:us-east-1:1:training-job/x"},
        {**request, "TrainingJobName": f"{name}-r2"},
    )
    naps = []
    with stub:
        got = jobs.create_or_attach(client, request, max_attempts=3, sleep=naps.append, poll_s=7)
    stub.assert_no_pending_responses()
    assert got == (f"{name}-r2", True) and naps == [7, 7]


def test_logs_the_role_may_not_read_end_the_copying_not_the_wait(tmp_path, caplog):
    """A role without logs:DescribeLogStreams: one warning naming the permission and the way out, then the job
    is still watched to its end (before: a traceback right after the job was created, the job left billing)."""
    logs = boto3.client("logs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    client, stub = stubbed()
    name = "llmpipe-t-0123456789"
    with Stubber(logs) as logs_stub:
        logs_stub.add_client_error(
            "describe_log_streams", "AccessDeniedException", "not authorized to perform logs:DescribeLogStreams"
        )
        for status in ("InProgress", "Completed"):
            stub.add_response("describe_training_job", described(name, status, status), {"TrainingJobName": name})
        tail = jobs.LogTail(logs, name, lambda stream, line: None)
        with stub:
            desc = jobs.wait(client, name, 100, 0, tail, sleep=lambda s: None)
        stub.assert_no_pending_responses()
    assert desc["TrainingJobStatus"] == "Completed" and tail.off
    warned = [r.getMessage() for r in caplog.records if "CloudWatch" in r.getMessage()]
    assert len(warned) == 1 and "AccessDeniedException" in warned[0] and "sagemaker.tail_logs: false" in warned[0]


def test_the_artifacts_last_model_is_taken_final_else_the_highest_step(tmp_path):
    """lit-gpt's pretrain saves out/step-N/ every interval and out/final/ at its end: the final one is
    converted (before: whichever the file system listed first); without it the highest step; models at one
    depth that nothing tells apart are refused, named."""

    def model(*parts):
        f = tmp_path.joinpath(*parts)
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"x")
        return f

    steps = [model("out", f"step-{n:08d}", "lit_model.pth") for n in (900, 1000, 200)]
    assert jobs.last_saved(steps) == steps[1]
    final = model("out", "final", "lit_model.pth")
    assert jobs.last_saved([*steps, final]) == final
    assert jobs.last_saved([*steps, model("deep", "er", "x", "lit_model.pth")]) == steps[1]  # the shallowest first
    with pytest.raises(jobs.JobError, match="2 models and none is final or numbered apart"):
        jobs.last_saved([model("a", "lit_model.pth"), model("b", "lit_model.pth")])
    assert jobs.last_saved([]) is None
