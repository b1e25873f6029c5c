"""The S3 kind: ``s3://bucket/prefix`` through boto3 (any endpoint: ``[s3].endpoint_url`` or
``AWS_ENDPOINT_URL``). Objects are written whole: input is listed incrementally and read by ranged GETs
(:class:`photon._source.S3Source`); output is staged locally and uploaded when each file closes
(:class:`photon.S3Publisher`), and read as published objects plus the staging folder
(:class:`photon._output.ObjectOutput`)."""
from __future__ import annotations

import dataclasses

from photon._config import S3Config
from photon._publish import S3Publisher
from photon._source import S3Source, s3_client, s3_endpoint
from photon._storage import StorageKind


class S3Kind(StorageKind):
    scheme = "s3"
    in_place = False

    def source(self, url: str, s3=None, *, input_config=None, client=None):
        return S3Source(url, s3, client)

    def task_access(self, url: str, s3=None):
        """The S3 options with the endpoint resolved on the driver, and the driver's credentials (resolved
        once, so executors need no AWS set-up of their own; temporary credentials expire as they do on the
        driver)."""
        import boto3
        s3 = s3 or S3Config()
        s3 = dataclasses.replace(s3, endpoint_url=s3_endpoint(s3) or "")
        creds = boto3.session.Session().get_credentials()
        frozen = creds.get_frozen_credentials() if creds is not None else None
        return s3, ((frozen.access_key, frozen.secret_key, frozen.token) if frozen is not None else None)

    def task_source(self, url: str, access):
        s3, creds = access
        client = None
        if creds is not None:
            import boto3
            key, secret, token = creds
            session = boto3.session.Session(aws_access_key_id=key, aws_secret_access_key=secret,
                                            aws_session_token=token)
            client = s3_client(s3, session)
        return self.source(url, s3, client=client)

    def publisher(self, url: str, s3=None, *, records: bool = False, client=None):
        return S3Publisher(url, s3, client, records=records)

    def check(self, url: str, s3=None) -> None:
        self.source(url, s3).check()


KIND = S3Kind()
