"""`redact`: the one function that makes a text fit to leave the process (a message, a log line, an
exception, a JSON report, a progress bar, a manifest).

It removes what grants access: the user:password of any URL in the text, the values of the query
parameters presigned URLs carry (X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token, sig,
token, ...), and every credential value found in the environment (AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AZURE_STORAGE_ACCOUNT_KEY, GOOGLE_SERVICE_ACCOUNT_KEY, ...) or handed to a store
(`remember`). Every place that formats a URL or wraps a store's error goes through it.
"""
from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping

MASK = "***"
MIN_SECRET = 6  # shorter values are masked in URLs and parameters only: "no" must not vanish from every text
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#'\"]*@")  # up to the last @ of the host part
_SECRET_PARAM = re.compile(
    r"(?i)(?<![a-z0-9_-])((?:x-amz-|x-goog-)?(?:signature|credential|security-token)|sig|[a-z0-9_-]*token"
    r"|[a-z0-9_]*secret[a-z0-9_]*|[a-z0-9_]*password|access_?key|account_?key|api_?key|client_secret)"
    r"(=|%3D)[^&\s#'\",;)]+")
_SECRET_VARIABLE = re.compile(r"(?i)^(AWS|AZURE|GOOGLE|GCS|GCP|OBJECT_STORE)_\w*(SECRET|TOKEN|KEY|PASSWORD|SAS)\w*$")
_NOT_SECRET = frozenset({"AWS_ACCESS_KEY_ID", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_CLIENT_ID", "AZURE_TENANT_ID",
                         "GOOGLE_APPLICATION_CREDENTIALS"})  # identifiers and file paths, not secrets
_remembered: set[str] = set()


def secret_values(environ: Mapping[str, str]) -> set[str]:
    """The credential values among these variables (by name: *SECRET*, *TOKEN*, *KEY*, ... of a cloud)."""
    return {value for name, value in environ.items()
            if value and _SECRET_VARIABLE.match(name) and name.upper() not in _NOT_SECRET}


def remember(values: Iterable[str]) -> None:
    """Mask these values too from now on, in this process (a store's credentials from its own
    environment or ~/.aws files); a process that unpickles a store remembers them again."""
    _remembered.update(v for v in values if v and len(v) >= MIN_SECRET)


def redact(text: object) -> str:
    """`text` as a string without userinfo, presigned-URL parameters or known credential values."""
    text = _URL_USERINFO.sub(r"\1", str(text))
    text = _SECRET_PARAM.sub(lambda m: f"{m[1]}{m[2]}{MASK}", text)
    for value in sorted(_remembered | secret_values(os.environ), key=len, reverse=True):
        if len(value) >= MIN_SECRET:
            text = text.replace(value, MASK)
    return text


def redact_json(value: object) -> object:
    """Every string in a JSON-like value (dicts, lists) redacted; other values as they are."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {k: redact_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_json(v) for v in value]
    return value


class RedactingFilter(logging.Filter):
    """A handler filter: the formatted message of every record redacted (the CLI's last net)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True
