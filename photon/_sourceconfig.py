"""The ``[s3]`` and ``[input]`` sections of ``photon.toml``: where S3 is and how logs are read.

Declared here (each option once, typed, with default and doc) and registered as sections by
:mod:`photon._config`.
"""
from __future__ import annotations

from dataclasses import dataclass

from photon._config import opt


def _positive(v):
    return None if v > 0 else "must be > 0"


def _non_negative(v):
    return None if v >= 0 else "must be >= 0"


def _endpoint(v):
    return None if not v or v.startswith(("http://", "https://")) else "must start with http:// or https://"


@dataclass(frozen=True)
class S3Config:
    """``[s3]``: how Photon reaches S3 for ``s3://bucket/prefix`` log and output roots. Credentials come
    from boto3's standard chain (environment, shared files, instance role)."""
    endpoint_url: str = opt("", "S3 endpoint URL; empty: the AWS_ENDPOINT_URL environment variable, else "
                                "AWS's own endpoint", check=_endpoint)
    region_name: str = opt("", "AWS region; empty: boto3's standard chain (AWS_DEFAULT_REGION, profile), "
                               "else us-east-1")
    list_interval_s: float = opt(0.25, "a stream is listed at most this often (reads of objects already "
                                       "listed go on in between)", check=_non_negative)
    full_list_interval_s: float = opt(10.0, "every this often a stream is listed whole (not only past its "
                                            "last key), which finds late objects that sort before it, "
                                            "replaced older objects and deleted ones", check=_positive)
    retry_attempts: int = opt(8, "attempts per S3 request on a transient error (throttling, 5xx, timeouts, "
                                 "lost connections), with exponential backoff", check=_positive)
    retry_max_s: float = opt(5.0, "longest wait between two attempts", check=_positive)
    connect_timeout_s: float = opt(5.0, "connect timeout per S3 request", check=_positive)
    read_timeout_s: float = opt(30.0, "read timeout per S3 request", check=_positive)
    multipart_mb: float = opt(64.0, "output files larger than this are uploaded in parts of this size",
                              check=_positive)


@dataclass(frozen=True)
class InputConfig:
    """``[input]``: rules for reading log lines, local or on S3."""
    max_line_bytes: int = opt(4 << 20, "a line longer than this is quarantined (its first bytes kept) and "
                                       "skipped, not held in memory", check=_positive)
