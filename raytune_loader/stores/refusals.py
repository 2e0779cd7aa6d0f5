"""What a store's refusal means, in words a user acts on.

botocore and urllib3 say why a request failed in their own words; :func:`refusal`
turns them into what happened (the bucket does not exist, no credentials were found,
the endpoint cannot be reached) and what to do about it, for the one-line errors of
:class:`~raytune_loader.stores.store.Store`. :func:`first_line` is the client's own
words, short and without any URL (the endpoint is named apart; a query could carry a
signature).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DENIED = ("accessdenied", "access denied", "403", "forbidden", "invalidaccesskeyid",
           "signaturedoesnotmatch", "credential")  # fmt: skip


@dataclass(frozen=True)
class Refusal:
    """Why a store refused, what to do, and whether it is about the whole bucket."""

    why: str
    fix: str
    bucket: bool = False


def refusal(exc: Exception, profile: str | None) -> Refusal:
    """What ``exc`` (a listing's or a GET's failure) means, told by the client's words
    without their URL (a port or a prefix holding "403" is no access denied), connection
    errors first; ``profile`` is the one ``--storage-options`` named."""
    said = first_line(exc).lower()
    if "could not connect" in said or "connect timeout" in said:
        return Refusal(
            "cannot be reached",
            "check the endpoint (AWS_ENDPOINT_URL, or endpoint_url) and that it is up",
        )
    if "nosuchbucket" in said or "bucket does not exist" in said:
        return Refusal(
            "does not exist", "check the bucket's name, the endpoint and the region", bucket=True
        )
    if "unable to locate credentials" in said and profile:
        return Refusal(
            f"cannot be read: profile {profile} holds no credentials",
            "add keys or a role to it, or drop profile from --storage-options",
        )
    if "unable to locate credentials" in said:
        return Refusal(
            "cannot be read: no credentials were found",
            "export AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE; a "
            "public bucket: --storage-options '{\"unsigned\": true}'",
        )
    if "partial credentials" in said:
        return Refusal(
            "cannot be read: the credentials are partial",
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY both, or neither",
        )
    if "profile" in said and "could not be found" in said:
        missing = getattr(exc, "kwargs", {}).get("profile", profile)  # botocore's ProfileNotFound
        return Refusal(
            f"cannot be read: no profile {missing} was found",
            "add it to ~/.aws/credentials or ~/.aws/config, or name another",
        )
    if "signaturedoesnotmatch" in said:
        return Refusal(
            "refused these credentials (the secret key does not match the key ID)",
            "check AWS_SECRET_ACCESS_KEY (or the profile's) for the key ID in use",
        )
    if "invalidaccesskeyid" in said:
        return Refusal(
            "refused these credentials (the store knows no such key ID)",
            "check AWS_ACCESS_KEY_ID (or the profile's), AWS_SESSION_TOKEN with a "
            "temporary (ASIA...) key, and that the keys are this endpoint's",
        )
    if any(word in said for word in _DENIED):
        return Refusal(
            "refused these credentials (access denied)",
            "check the credentials and what the bucket's policy allows them",
        )
    return Refusal("cannot be listed", "check the URL, the endpoint and the credentials")


def first_line(exc: Exception) -> str:
    """What the client said, in short: its first line, without any URL (the endpoint's
    host is named apart) and cut at 200 characters."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    line = re.sub(r":?\s*\"https?://[^\"]*\"", "", line)  # botocore's: 'URL: "http://..."'
    line = re.sub(r"https?://[^\s\"'()<>]+", "<url>", line)
    return line[:200]
