"""sagemaker-train: create the training job or attach to it, wait while tailing its CloudWatch logs,
stop it on timeout or interrupt, download model.tar.gz and write the HF-format final folder.

The job name is <prefix>-<run>-<key>, key = hash of the request and the uploaded files' sha256: a
rerun with the same inputs finds the job and attaches (never a second job); changed inputs give a
new name. A job that ended Failed or Stopped is retried as <name>-r2, -r3 ... with the same
checkpoint S3 prefix, so the retry resumes from the last checkpoint.

  python -m llmpipe sagemaker-train --config C --inputs inputs.json --tokenizer DIR --metrics M --out DIR
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import re
import shutil
import signal
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from botocore.exceptions import ClientError

from llmpipe import config as cfgmod
from llmpipe.backends.sagemaker import aws
from llmpipe.backends.sagemaker.hyperparameters import algorithm_hyperparameters, check_settings, job_name, request_key
from llmpipe.backends.sagemaker.metrics import metrics_from_logs
from llmpipe.backends.sagemaker.upload import ENTRY_SCRIPT
from llmpipe.backends.sagemaker.validate import check_request
from llmpipe.io import atomic_path, write_json
from llmpipe.io import dumps as io_dumps
from llmpipe.train.resume import train_settings

log = logging.getLogger(__name__)

LOG_GROUP = "/aws/sagemaker/TrainingJobs"
TERMINAL = ("Completed", "Failed", "Stopped")
CHECKPOINT_LOCAL = "/opt/ml/checkpoints"
CODE_DIR = "/opt/ml/input/data/code"


class JobError(RuntimeError):
    """The training job failed, was stopped, or its artifact is unusable."""


class JobFailed(JobError):
    """The job ended Failed or Stopped (not stopped by llmpipe): `status`, and SageMaker's `reason`."""

    def __init__(self, message: str, status: str, reason: str):
        super().__init__(message)
        self.status, self.reason = status, reason


class WaitTimeout(JobError):
    """The job ran past sagemaker.wait_timeout_seconds (it has been asked to stop)."""


# --- the request -------------------------------------------------------------------------------


def build_request(cfg: dict, inputs: dict) -> dict:
    """The create_training_job request, name and checkpoint prefix filled from the inputs' key."""
    sm, run = cfg["sagemaker"], cfg["run"]
    base = aws.join(sm["s3_prefix"], run)
    if sm["mode"] == "algorithm":
        spec = {"AlgorithmName": sm["algorithm_name"], "TrainingInputMode": "File"}
        hp = algorithm_hyperparameters(cfg)
    else:
        spec = {
            "TrainingImage": sm["image_uri"],
            "TrainingInputMode": "File",
            "ContainerEntrypoint": ["python3", f"{CODE_DIR}/{ENTRY_SCRIPT}"],
        }
        hp = {
            "llmpipe_config": json.dumps({"train": cfg["train"], "eval": cfg["eval"]}, sort_keys=True),
            "processes_per_instance": str(cfg["parallel"]["nproc_per_node"] or "auto"),
            **{k: str(v) for k, v in sm["hyperparameters"].items()},
        }
    request = {
        "AlgorithmSpecification": spec,
        "RoleArn": sm["role_arn"],
        "HyperParameters": hp,
        "InputDataConfig": [
            {
                "ChannelName": name,
                "InputMode": "File",
                "DataSource": {
                    "S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": ch["s3_uri"], "S3DataDistributionType": "FullyReplicated"}
                },
            }
            for name, ch in inputs["channels"].items()
        ],
        "OutputDataConfig": {"S3OutputPath": aws.join(base, "output")},
        "ResourceConfig": {
            "InstanceType": sm["instance_type"],
            "InstanceCount": cfg["parallel"]["nnodes"],
            "VolumeSizeInGB": sm["volume_size_gb"],
            "KeepAlivePeriodInSeconds": sm["keep_alive_seconds"],
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": sm["max_runtime_seconds"]},
        "EnableNetworkIsolation": sm["network_isolation"],
        "Tags": [{"Key": "llmpipe:run", "Value": run}] + [{"Key": k, "Value": str(v)} for k, v in sorted(sm["tags"].items())],
    }
    key = request_key(_keyed(request, cfg, inputs))
    request["TrainingJobName"] = job_name(sm["job_name_prefix"], run, key, 1)
    request["CheckpointConfig"] = {"S3Uri": aws.join(base, "checkpoints", key) + "/", "LocalPath": CHECKPOINT_LOCAL}
    request["Tags"].append({"Key": "llmpipe:key", "Value": key})
    check_request("sagemaker", "CreateTrainingJob", request)
    return request


def _keyed(request: dict, cfg: dict, inputs: dict) -> dict:
    """What names the job and its checkpoint prefix: what the trained model depends on. Left out, so that
    changing them after a Failed or Stopped job resumes its checkpoints rather than starting over: tags,
    the time limit, instance type, volume and keep-alive (InstanceCount stays), llmpipe's own code (mode
    image: the code channel; its trainer resumes across versions), and mode image's resume-neutral
    settings (train.log_interval, eval.batch_size, ...)."""
    keyed = copy.deepcopy(request)
    keyed.pop("Tags")
    keyed.pop("StoppingCondition")
    keyed["ResourceConfig"] = {"InstanceCount": request["ResourceConfig"]["InstanceCount"]}
    if "llmpipe_config" in keyed["HyperParameters"]:
        settings = {**train_settings(cfg), "resume": cfg["train"]["resume"]}  # resume false: a new job, fresh checkpoints
        keyed["HyperParameters"]["llmpipe_config"] = json.dumps({"train": settings, "eval": {}}, sort_keys=True)
    files = {n: c["files"] for n, c in inputs["channels"].items() if n != "code"}
    keyed["InputDataConfig"] = [c for c in keyed["InputDataConfig"] if c["ChannelName"] != "code"]
    return {"request": keyed, "files": files}


def _others_running(sm_client, request: dict) -> list[str]:
    """Jobs of this run (same prefix and run, another key) still InProgress or Stopping: an earlier request's."""
    ours = request["TrainingJobName"]
    stem = ours.rsplit("-", 1)[0]
    pattern = re.compile(rf"^{re.escape(stem)}-[0-9a-f]{{10}}(-r\d+)?$")
    names = []
    for status in ("InProgress", "Stopping"):
        found = sm_client.list_training_jobs(NameContains=stem, StatusEquals=status, MaxResults=100)["TrainingJobSummaries"]
        names += [j["TrainingJobName"] for j in found]
    return sorted(n for n in names if pattern.match(n) and not n.startswith(ours))


def _attempt_name(request: dict, attempt: int) -> str:
    return request["TrainingJobName"] + (f"-r{attempt}" if attempt > 1 else "")  # job_name left room


def _describe(sm_client, name: str) -> dict | None:
    try:
        return sm_client.describe_training_job(TrainingJobName=name)
    except ClientError as exc:
        err = exc.response.get("Error", {})
        msg = err.get("Message", "")
        if err.get("Code") in ("ValidationException", "ValidationError", "ResourceNotFound") and (
            "not found" in msg.lower() or "could not find" in msg.lower()
        ):
            return None
        raise


def create_or_attach(sm_client, request: dict, max_attempts: int, sleep=time.sleep, poll_s: float = 10) -> tuple[str, bool]:
    """(job name, created). Attach to a job of this name that is running or done; after a Failed or
    Stopped one, create the next attempt (same checkpoint prefix: it resumes). A job still Stopping (an
    interrupted run's) is waited for, then treated by how it ended."""
    for attempt in range(1, max_attempts + 1):
        name = _attempt_name(request, attempt)
        desc = _describe(sm_client, name)
        while desc is not None and desc["TrainingJobStatus"] == "Stopping":
            log.info("training job %s is stopping: waiting for it to end", name)
            sleep(poll_s)
            desc = _describe(sm_client, name)
        if desc is None:
            if attempt == 1 and (running := _others_running(sm_client, request)):
                raise JobError(
                    f"training job {running[0]} of this run is still running (started for other settings): a "
                    f"second job would bill beside it. Wait for it or stop it (aws sagemaker stop-training-job "
                    f"--training-job-name {running[0]}), then run again"
                )
            req = copy.deepcopy(request)
            req["TrainingJobName"] = name
            check_request("sagemaker", "CreateTrainingJob", req)
            arn = sm_client.create_training_job(**req)["TrainingJobArn"]
            log.info("created training job %s (%s)", name, arn)
            return name, True
        status = desc["TrainingJobStatus"]
        if status in ("InProgress", "Completed"):
            log.info("attaching to existing training job %s (%s)", name, status)
            return name, False
        log.info(
            "training job %s ended %s (%s); trying the next attempt", name, status, desc.get("FailureReason", "no reason given")
        )
    raise JobError(
        f"{request['TrainingJobName']}: {max_attempts} attempts ended Failed or Stopped "
        f"(sagemaker.max_attempts); see the logs above"
    )


# --- waiting -----------------------------------------------------------------------------------


class LogTail:
    """Copies new CloudWatch events of the job's streams ("<job>/algo-1-<ts>") to `write`."""

    def __init__(self, logs_client, job: str, write):
        self.logs, self.job, self.write = logs_client, job, write
        self.tokens: dict[str, str] = {}
        self.off = False

    def poll(self) -> int:
        """Events copied; a refusal other than "not there yet" (a role without logs:DescribeLogStreams /
        GetLogEvents) is logged once and ends the copying, never the wait on the job."""
        if self.off:
            return 0
        try:
            return self._copy()
        except ClientError as exc:
            err = exc.response.get("Error", {})
            if err.get("Code") == "ResourceNotFoundException":
                return 0  # no log group / stream yet
            self.off = True
            log.warning(
                "cannot read the job's CloudWatch logs (%s: %s): not copied to the log from here on, the job is still "
                "watched (grant logs:DescribeLogStreams and logs:GetLogEvents, or set sagemaker.tail_logs: false)",
                err.get("Code"),
                err.get("Message", ""),
            )
            return 0

    def _copy(self) -> int:
        n = 0
        pages = self.logs.get_paginator("describe_log_streams").paginate(
            logGroupName=LOG_GROUP, logStreamNamePrefix=self.job + "/"
        )
        streams = sorted(s["logStreamName"] for page in pages for s in page.get("logStreams", []))
        for stream in streams:
            token = self.tokens.get(stream)
            while True:
                kw = {"logGroupName": LOG_GROUP, "logStreamName": stream, "startFromHead": True}
                if token:
                    kw["nextToken"] = token
                resp = self.logs.get_log_events(**kw)
                for event in resp.get("events", []):
                    self.write(stream[len(self.job) + 1 :], event["message"].rstrip("\n"))
                    n += 1
                new = resp.get("nextForwardToken")
                if not resp.get("events") or not new or new == token:
                    token = new or token
                    break
                token = new
            if token:
                self.tokens[stream] = token
        return n


def wait(
    sm_client, name: str, timeout_s: float, poll_s: float, tail: LogTail | None = None, clock=time.monotonic, sleep=time.sleep
) -> dict:
    """Poll until the job ends; log status changes; on timeout or interrupt stop the job and raise."""
    deadline = clock() + timeout_s
    last = None
    try:
        while True:
            desc = sm_client.describe_training_job(TrainingJobName=name)
            state = (desc["TrainingJobStatus"], desc.get("SecondaryStatus"))
            if state != last:
                log.info("%s: %s / %s%s", name, *state, f" ({desc['StatusMessage']})" if desc.get("StatusMessage") else "")
                last = state
            if tail:
                tail.poll()
            if desc["TrainingJobStatus"] in TERMINAL:
                if desc["TrainingJobStatus"] != "Completed":
                    status, reason = desc["TrainingJobStatus"], desc.get("FailureReason", "no reason given")
                    raise JobFailed(f"training job {name} ended {status}: {reason}", status, reason)
                return desc
            if clock() >= deadline:
                raise WaitTimeout(
                    f"training job {name} still {desc['TrainingJobStatus']} after {timeout_s:.0f} s "
                    f"(sagemaker.wait_timeout_seconds); stop requested"
                )
            sleep(poll_s)
    except (WaitTimeout, KeyboardInterrupt):
        stop(sm_client, name)
        raise


def run_attempts(sm_client, request: dict, sm: dict, tail_for, sleep=time.sleep) -> tuple[str, bool, dict]:
    """(job name, created, its final description): create or attach, then wait. A job that ended Failed is
    followed by the next attempt in this same run (create_or_attach: same checkpoint prefix, so it
    resumes; it raises past sagemaker.max_attempts), unless SageMaker calls the failure the request's own
    ("ClientError: ...": bad input or hyperparameters, which another attempt would repeat). Stopped (by
    someone) is not retried."""
    timeout = sm["wait_timeout_seconds"] or sm["max_runtime_seconds"] + 3600
    while True:
        name, created = create_or_attach(sm_client, request, sm["max_attempts"], sleep, sm["poll_seconds"])
        try:
            return name, created, wait(sm_client, name, timeout, sm["poll_seconds"], tail_for(name), sleep=sleep)
        except JobFailed as exc:
            if exc.status != "Failed" or exc.reason.startswith("ClientError"):
                raise
            log.warning("%s; the next attempt resumes from %s", exc, request["CheckpointConfig"]["S3Uri"])


def stop(sm_client, name: str) -> None:
    try:
        sm_client.stop_training_job(TrainingJobName=name)
        log.warning("asked SageMaker to stop training job %s", name)
    except ClientError as exc:  # already ending: nothing to stop
        log.warning("could not stop %s: %s", name, exc)


# --- artifacts ---------------------------------------------------------------------------------


MAX_MEMBERS = 1_000_000


def safe_extract(archive: Path, dest: Path) -> None:
    """Extract a tar archive of regular files and folders only: links of any kind (a symlink chain past
    PATH_MAX escaped tarfile's "data" filter before Python 3.11.13 / 3.12.11 / 3.13.4, CVE-2025-4517), device
    files, absolute paths and '..' are refused before anything is written, as is an archive larger than
    the free disk or of more than MAX_MEMBERS members; then the "data" filter (PEP 706) as well."""
    import posixpath

    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members, size = [], 0
        for m in tar:
            members.append(m)
            if len(members) > MAX_MEMBERS:
                raise JobError(f"{archive.name}: more than {MAX_MEMBERS} members: refused")
            if not (m.isreg() or m.isdir()):
                raise JobError(f"{archive.name}: unsafe member refused: {m.name!r} is not a file or folder (a link or device)")
            if m.name.startswith("/") or ".." in posixpath.normpath(m.name).split("/"):
                raise JobError(f"{archive.name}: unsafe member refused: path {m.name!r} leaves the folder")
            size += m.size
        free = shutil.disk_usage(dest).free
        if size > free:
            raise JobError(f"{archive.name}: unpacks to {size} bytes, {free} free under {dest}: refused")
        try:
            tar.extractall(dest, members=members, filter="data")
        except tarfile.FilterError as exc:
            raise JobError(f"{archive.name}: unsafe member refused: {exc}") from None


def download(s3, uri: str, dest: Path) -> Path:
    bucket, key = aws.split_uri(uri)
    try:
        s3.download_file(bucket, key, str(dest))
    except ClientError as exc:
        raise JobError(f"cannot download {uri}: {exc}") from None
    return dest


def last_saved(found: list[Path]) -> Path | None:
    """Of model files found in an artifact, the run's last: the shallowest; among those, one in a folder named
    `final`, else in the highest-numbered one (lit-gpt's pretrain saves out/step-NNNNNNNN/ every interval and
    out/final/ at its end). Files at that depth that neither name tells apart are refused, named."""
    if not found:
        return None
    depth = min(len(p.parts) for p in found)
    top = sorted(p for p in found if len(p.parts) == depth)
    final = [p for p in top if p.parent.name == "final"]
    if final or len(top) == 1:
        return (final or top)[0]
    numbered = {p: int(m[-1]) for p in top if (m := re.findall(r"\d+", p.parent.name))}
    if len(numbered) == len(top) and len(set(numbered.values())) == len(top):
        return max(top, key=numbered.__getitem__)
    raise JobError(f"model.tar.gz holds {len(top)} models and none is final or numbered apart: {', '.join(map(str, top))}")


def find_hf(root: Path) -> Path | None:
    """The folder holding an HF model (config.json + weights) in an extracted artifact; of several, the run's
    last (last_saved: `final`, else the highest-numbered folder)."""
    found = [
        c for c in root.rglob("config.json") if any(c.parent.glob("*.safetensors")) or (c.parent / "pytorch_model.bin").is_file()
    ]
    last = last_saved(found)
    return last.parent if last else None


def to_hf(model_dir: Path, out: Path, fmt: str, tokenizer: Path | None = None) -> str:
    """Copy (HF) or convert (lit-gpt, with `tokenizer`'s special token ids) the extracted model into `out`;
    returns the format found."""
    hf = find_hf(model_dir) if fmt in ("auto", "hf") else None
    if hf is not None:
        shutil.copytree(hf, out, dirs_exist_ok=True)
        return "hf"
    if fmt in ("auto", "litgpt"):
        from llmpipe.backends.sagemaker import litgpt

        ckpt = last_saved(list(model_dir.rglob("lit_model.pth")))
        if ckpt is not None:
            litgpt.convert(ckpt, out, tokenizer)
            return "litgpt"
    found = sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file())[:20]
    raise JobError(
        f"model.tar.gz holds no {'HF or lit-gpt' if fmt == 'auto' else fmt} checkpoint "
        f"(sagemaker.output_format {fmt}); files: {', '.join(found) or 'none'}"
    )


def metrics_from_output(s3, desc: dict, work: Path) -> list[dict] | None:
    """metrics.jsonl from the job's output.tar.gz (/opt/ml/output/data, mode image), if present."""
    uri = desc["ModelArtifacts"]["S3ModelArtifacts"].rsplit("/", 1)[0] + "/output.tar.gz"
    try:
        download(s3, uri, work / "output.tar.gz")
    except JobError:
        return None
    safe_extract(work / "output.tar.gz", work / "output")
    found = sorted((work / "output").rglob("metrics.jsonl"))
    if not found:
        return None
    return [json.loads(line) for line in found[0].read_text().splitlines() if line.strip()]


# --- the whole step ----------------------------------------------------------------------------


def train(
    cfg: dict,
    inputs_path: str | Path,
    out: str | Path,
    metrics_path: str | Path,
    clients: dict | None = None,
    sleep=time.sleep,
    tokenizer: str | Path | None = None,
) -> dict:
    """`tokenizer`: the run's tokenizer folder (a lit-gpt artifact's config takes its BOS / EOS / PAD ids)."""
    check_settings(cfg)
    sm = cfg["sagemaker"]
    inputs = json.loads(Path(inputs_path).read_text())
    if inputs.get("mode") != sm["mode"]:
        raise JobError(f"{inputs_path} was uploaded for mode {inputs.get('mode')!r}, config says {sm['mode']!r}")
    request = build_request(cfg, inputs)  # validated locally before any call
    clients = clients or aws.clients(sm["region"])
    log.info("request: %s", json.dumps({k: v for k, v in request.items() if k != "HyperParameters"}, sort_keys=True))
    log.info("hyperparameters: %s", json.dumps(request["HyperParameters"], sort_keys=True))
    lines: list[str] = []

    def write(stream: str, message: str) -> None:
        lines.append(message)
        print(f"[{stream}] {message}", flush=True)

    tail_for = (lambda job: LogTail(clients["logs"], job, write)) if sm["tail_logs"] else (lambda job: None)
    name, created, desc = run_attempts(clients["sagemaker"], request, sm, tail_for, sleep)
    artifact = desc["ModelArtifacts"]["S3ModelArtifacts"]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".sagemaker-download-", dir=Path(out).parent) as tmp:  # beside out: model-sized
        work = Path(tmp)
        safe_extract(download(clients["s3"], artifact, work / "model.tar.gz"), work / "model")
        records = metrics_from_output(clients["s3"], desc, work) if sm["mode"] == "image" else None
        if not records:
            records = metrics_from_logs(lines, sm["loss_regex"], cfg, inputs.get("train_rows"))
        with atomic_path(out) as tmp_out:
            fmt = to_hf(work / "model", tmp_out, sm["output_format"], Path(tokenizer) if tokenizer else None)
            job = {
                "job_name": name,
                "job_arn": desc.get("TrainingJobArn"),
                "created": created,
                "status": desc["TrainingJobStatus"],
                "model_artifact": artifact,
                "artifact_format": fmt,
                "billable_seconds": desc.get("BillableTimeInSeconds"),
                "checkpoints": request["CheckpointConfig"]["S3Uri"],
                "mode": sm["mode"],
            }
            write_json(tmp_out / "sagemaker_job.json", job)
    with atomic_path(metrics_path) as tmp_m:
        tmp_m.write_text("".join(io_dumps(r, sort_keys=True) + "\n" for r in records))
    if not records:
        log.warning("no per-step metrics: none in the output and no log line matched sagemaker.loss_regex")
    log.info("%s %s -> %s (%s format, %d metric records)", name, desc["TrainingJobStatus"], out, fmt, len(records))
    return job


def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="llmpipe sagemaker-train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", required=True)
    p.add_argument("--inputs", required=True, help="manifest from sagemaker-upload")
    p.add_argument("--tokenizer", required=True, help="the run's tokenizer folder (a lit-gpt model takes its special ids)")
    p.add_argument("--metrics", required=True, help="metrics.jsonl to write")
    p.add_argument("--out", required=True, help="HF-format final folder")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm)  # Snakemake stops jobs with SIGTERM: stop the job too
    try:
        train(cfgmod.load(args.config), args.inputs, args.out, args.metrics, tokenizer=args.tokenizer)
    except KeyboardInterrupt:
        log.error("interrupted: the training job was asked to stop; a rerun starts the next attempt, which resumes")
        sys.exit(130)
