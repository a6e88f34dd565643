"""URIs (pipelines.spec.uris): credentials are found and redacted, a secret holding a '/' too."""

from __future__ import annotations

from pipelines.spec.uris import redact_uri, uri_credentials
from spec.documents import SECRET


def test_uris_are_redacted_and_their_credentials_found():
    assert redact_uri(f"s3://KEY:{SECRET}@bucket/x?a=1") == "s3://bucket/x"
    assert redact_uri("s3://KEY:abc/def@bucket/x") == "s3://bucket/x"  # a '/' inside the secret
    assert uri_credentials("s3://KEY:abc/def@bucket/x") == "a user:password"
    assert redact_uri("hdfs://namenode:8020/data") == "hdfs://namenode:8020/data"
