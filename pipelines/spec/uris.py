"""URIs in a job spec: which are remote, which carry credentials, and how to show one safely.

Standard library only (the Airflow environment imports this while parsing DAG files).  Used by
the spec's validators and by :mod:`pipelines.data.sources`, so a URI is judged and redacted the
same way everywhere.  See docs/ARCHITECTURE.md, "Failure rules".
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["is_remote", "redact_uri", "uri_credentials"]

# Query parameters through which pyarrow and the object stores accept credentials.
_SECRET_PARAM = re.compile(r"key|secret|token|password|passwd|signature|credential", re.IGNORECASE)


def is_remote(uri: str) -> bool:
    """True for a URI with a scheme other than ``file://`` (``s3://``, ``gs://``, ``hdfs://``, ...)."""
    return "://" in uri and not uri.startswith("file://")


def _split(uri: str) -> tuple[str, str | None, str, str]:
    """``(scheme, user-info or None, host and path, query)`` of a URI with ``://``.

    A secret may hold a ``/`` (AWS secret keys do), which ends the authority early for a standard
    parser: ``s3://KEY:abc/def@bucket/x`` has a non-numeric "port" ``abc`` and an ``@`` later on.
    That shape is taken as user-info too, so it is refused and redacted rather than recorded.
    """
    scheme, rest = uri.split("://", 1)
    query = ""
    if (end := re.search(r"[?#]", rest)) is not None:
        rest, query = rest[: end.start()], rest[end.start() + 1 :]
    authority = rest.split("/", 1)[0]
    if "@" in authority:  # the last "@" of the authority ends the user-info, as in urllib
        userinfo, _, host = authority.rpartition("@")
        return scheme, userinfo, host + rest[len(authority) :], query
    port = authority.partition(":")[2]
    if port and not port.isdigit() and "@" in rest:
        userinfo, _, remainder = rest.partition("@")
        return scheme, userinfo, remainder, query
    return scheme, None, rest, query


def redact_uri(uri: str) -> str:
    """``uri`` without user-info, query string or fragment (where credentials may hide)."""
    if "://" not in uri:
        return uri
    scheme, _, remainder, _ = _split(uri)
    return f"{scheme}://{remainder}"


def uri_credentials(uri: str) -> str | None:
    """What credentials ``uri`` carries (``"a user:password"``, ``"the query parameter secret_key"``),
    or None.  A user name alone (``hdfs://alice@namenode/``, ``abfs://container@account...``) is
    not a secret and passes."""
    if "://" not in uri:
        return None
    _, userinfo, _, query = _split(uri)
    if userinfo is not None and ":" in userinfo:
        return "a user:password"
    names = [name for name, _ in urllib.parse.parse_qsl(query, keep_blank_values=True) if _SECRET_PARAM.search(name)]
    if names:
        return "the query parameter" + ("s " if len(names) > 1 else " ") + ", ".join(sorted(set(names)))
    return None
