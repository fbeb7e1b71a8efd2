"""boto3 clients from the standard AWS credential chain (environment, profile, instance role) and
S3 URI helpers. Nothing here reads, logs or writes a credential."""

from __future__ import annotations

import boto3
from botocore.config import Config

_RETRIES = Config(retries={"max_attempts": 8, "mode": "standard"})


def session(region: str | None = None) -> boto3.session.Session:
    """region: the config's sagemaker.region, else the chain's (AWS_REGION, profile)."""
    s = boto3.session.Session(region_name=region)
    if not s.region_name:
        raise ValueError("no AWS region: set sagemaker.region or AWS_REGION / AWS_DEFAULT_REGION")
    return s


def clients(region: str | None = None) -> dict:
    """sagemaker, s3 and logs clients (each honours AWS_ENDPOINT_URL, as the tests use)."""
    s = session(region)
    return {name: s.client(name, config=_RETRIES) for name in ("sagemaker", "s3", "logs")}


def split_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/key/prefix -> (bucket, "key/prefix") with no leading or trailing slash."""
    if not uri.startswith("s3://") or len(uri) <= 5:
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[5:].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {uri!r}")
    return bucket, key.strip("/")


def join(uri: str, *parts: str) -> str:
    return "/".join([uri.rstrip("/"), *(p.strip("/") for p in parts if p)])
