"""S3 for tests: one real ``moto_server`` process per test session on a free 127.0.0.1 port, reached by
boto3 through ``endpoint_url``, and a fresh bucket per test.

``moto_server`` (session): the running server (``.endpoint``), killed by pid at the end of the session.
``s3`` (per test): sets ``AWS_ENDPOINT_URL`` and test credentials in the environment (child processes
inherit them), makes a new bucket, and offers small helpers to put, get and list objects.
"""
from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

import pytest

from bench._moto import MotoServer, moto_executable, stop_moto_server
from bench._moto import start_moto_server as _start_moto_server

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}
_buckets = itertools.count(1)


def start_moto_server() -> MotoServer:
    """bench's moto_server starter, skipping the test where moto_server is not installed."""
    if not moto_executable().exists():
        pytest.skip(f"moto_server is not installed next to {sys.executable} (pip install 'moto[server]')")
    return _start_moto_server()


@pytest.fixture(scope="session")
def moto_server():
    server = start_moto_server()
    try:
        yield server
    finally:
        stop_moto_server(server)


class Bucket:
    """A fresh bucket on the session's moto server, with helpers for tests."""

    def __init__(self, server: MotoServer, name: str) -> None:
        import boto3
        self.server = server
        self.endpoint = server.endpoint
        self.name = name
        self.client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing")
        self.client.create_bucket(Bucket=name)

    def url(self, prefix: str = "") -> str:
        return f"s3://{self.name}/{prefix.strip('/')}" if prefix.strip("/") else f"s3://{self.name}"

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=data)

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.name, Key=key)

    def keys(self, prefix: str = "") -> list[str]:
        out = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", ())]
        return out

    def upload_tree(self, folder: str | Path, prefix: str) -> int:
        """Put every file below ``folder`` under ``prefix`` (same relative names); returns the count."""
        n = 0
        for p in sorted(Path(folder).rglob("*")):
            if p.is_file():
                self.put(f"{prefix.strip('/')}/{p.relative_to(folder).as_posix()}", p.read_bytes())
                n += 1
        return n


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, *_a, **_k):
        yield self.body


def answer_with(client, operation: str, status: int, code: str, times: int, key: str | None = None):
    """Make the next ``times`` ``operation`` requests (on ``key`` if given) fail with ``status``/``code``."""
    from botocore.awsrequest import AWSResponse
    left = [times]

    def hook(request, **_):
        if left[0] <= 0 or (key is not None and not request.url.split("?")[0].endswith(key)):
            return None
        left[0] -= 1
        body = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>injected</Message>"
                f"</Error>").encode()
        return AWSResponse(request.url, status, {"Content-Type": "application/xml"}, _Raw(body))

    client.meta.events.register(f"before-send.s3.{operation}", hook)
    return left


@pytest.fixture
def s3(moto_server, monkeypatch):
    """A new bucket; the environment points boto3 (here and in child processes) at the moto server."""
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server.endpoint)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(key, raising=False)
    return Bucket(moto_server, f"photon-test-{os.getpid()}-{next(_buckets)}")
