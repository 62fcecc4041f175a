"""`redact`: the one function that makes a text fit to leave the process (a message, a log line, an
exception, a JSON report, a progress bar, a manifest).

It removes what grants access: the user:password of any URL or address (user:password@host) in the
text, the values of the query parameters presigned URLs carry (X-Amz-Signature, X-Amz-Credential,
X-Amz-Security-Token, sig, token, ...), a dump of the whole environment (a library's repr of
os.environ), and every credential value found in the environment (a variable named like one:
AWS_SECRET_ACCESS_KEY, HF_TOKEN, WANDB_API_KEY, PGPASSWORD, ...; the password of a URL one holds) or
handed to a store (`remember`). Every place that formats a URL or wraps a store's error goes through
it; `mask_library_output` puts it on what libraries log or warn.
"""
from __future__ import annotations

import functools
import logging
import os
import re
import warnings
from collections.abc import Iterable, Mapping

MASK = "***"
ENVIRONMENT_DUMP = "{<the environment, not shown>}"  # what stands for a repr of os.environ
MIN_SECRET = 6  # shorter values are masked in URLs and parameters only: "no" must not vanish from every text
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#'\"]*@")  # up to the last @ of the host part
# user:password@ whose password holds "/" (AWS secret keys may): the user ends at ":", the password at the
# last "@" before a space. A port then an "@" in the path (http://h:8080/a@b) loses "h:8080/a@" too: never a leak
_SLASHED_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@:'\"]+:[^\s'\"]*@")
_BARE_USERINFO = re.compile(r"(?<![\w.%+/:@-])[\w.%+-]+:[^\s/?#@:'\"]+@(?=[\w\[])")  # user:password@host, no scheme
_SECRET_PARAM = re.compile(
    r"(?i)(?<![a-z0-9_-])((?:x-amz-|x-goog-)?(?:signature|credential|security-token)|sig|[a-z0-9_-]*token"
    r"|[a-z0-9_]*secret[a-z0-9_]*|[a-z0-9_]*password|access_?key|account_?key|api_?key|client_secret)"
    r"(=|%3D)[^&\s#'\",;)]+")
# A variable holds a secret when a word of its name (split at "_") is one of these, or ends with one of
# the long ones (PGPASSWORD, GHTOKEN), unless its last word names an identifier or a place (KEY_ID, *_FILE).
_SECRET_WORD = re.compile(r"(?:SECRETS?|TOKENS?|KEY|APIKEY|PASSWD|PWD|PASS|PASSPHRASE|CREDENTIALS?|SAS|PAT|AUTH"
                          r"|\w*(?:SECRET|TOKEN|PASSWORD|APIKEY|ACCESSKEY|PASSPHRASE))")
_NOT_SECRET_WORD = frozenset({"ID", "NAME", "FILE", "PATH", "DIR", "SOCK", "URL", "USER", "USERNAME", "HOST", "PORT",
                              "REGION", "TYPE", "MODE"})
_NOT_SECRET = frozenset({"PWD", "OLDPWD", "GOOGLE_APPLICATION_CREDENTIALS"})  # folders and file paths, not secrets
_URL_PASSWORD = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s/?#@:]*:([^\s/?#@]+)@")  # DATABASE_URL's password
_remembered: set[str] = set()


@functools.lru_cache(maxsize=4096)
def is_secret_variable(name: str) -> bool:
    """Whether an environment variable of this name holds a credential (HF_TOKEN yes, AWS_ACCESS_KEY_ID no)."""
    words = name.upper().split("_")
    return (name.upper() not in _NOT_SECRET and words[-1] not in _NOT_SECRET_WORD
            and any(_SECRET_WORD.fullmatch(word) for word in words))


def secret_values(environ: Mapping[str, str]) -> set[str]:
    """The credential values among these variables (by name: is_secret_variable), and the password of
    any URL one holds (DATABASE_URL=postgres://app:PASSWORD@db/app: masked wherever it is shown)."""
    found = {value for name, value in environ.items() if value and is_secret_variable(name)}
    for value in environ.values():
        if "://" in value:
            found.update(password for password in _URL_PASSWORD.findall(value))
    return found


def remember(values: Iterable[str]) -> None:
    """Mask these values too from now on, in this process (a store's credentials from its own
    environment or ~/.aws files); a process that unpickles a store remembers them again."""
    _remembered.update(v for v in values if v and len(v) >= MIN_SECRET)


def redact(text: object) -> str:
    """`text` as a string without an environment dump, userinfo, presigned-URL parameters or known
    credential values (as they are, and as a repr writes them: a PEM key's newlines escaped)."""
    text, environ = str(text), dict(os.environ)
    if environ:
        text = text.replace(repr(environ), ENVIRONMENT_DUMP)
    text = _BARE_USERINFO.sub("", _URL_USERINFO.sub(r"\1", _SLASHED_USERINFO.sub(r"\1", text)))
    text = _SECRET_PARAM.sub(lambda m: f"{m[1]}{m[2]}{MASK}", text)
    for value in sorted(_remembered | secret_values(environ), key=len, reverse=True):
        if len(value) >= MIN_SECRET:
            text = text.replace(value, MASK).replace(repr(value)[1:-1], MASK)
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
    """A handler or logger filter: every record's formatted message, traceback and stack redacted (the
    CLI's last net, on its handlers; on the root logger, mask_library_output)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def mask_library_output() -> None:
    """Redact what libraries log through the root logger and what `warnings` prints, in this process
    (once; idempotent). DALI's AutoGraph logs its warnings with logging.warning, on the root logger,
    with the repr of the objects it could not convert: an os.environ method's repr was the environment."""
    root = logging.getLogger()
    if not any(isinstance(f, RedactingFilter) for f in root.filters):
        root.addFilter(RedactingFilter())
    if not getattr(warnings.formatwarning, "redacts", False):
        warnings.formatwarning = _redacting(warnings.formatwarning)


def _redacting(formatwarning):
    def redacted(*args, **kwargs) -> str:
        return redact(formatwarning(*args, **kwargs))

    redacted.redacts = True
    return redacted
