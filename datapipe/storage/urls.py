"""Object stores behind one small interface: s3:// gs:// az:// http(s):// through obstore.

obstore is not fork-safe (its runtime does not survive a fork), so a `RemoteStore` opens its client
lazily in each process, checking the pid, and never pickles it; and only a process that forks nothing
afterwards calls obstore itself, every other one through a forked helper (datapipe.storage.isolate
states the rule). Credentials and endpoints come from
where the AWS, Google and Azure tools read them (AWS_* variables and ~/.aws files, AWS_ENDPOINT_URL,
GOOGLE_APPLICATION_CREDENTIALS, AZURE_*); none is ever put in a message: every URL and every store
error goes through `redact` (datapipe.storage.redaction), which masks userinfo, presigned-URL
parameters and these credential values. Transient failures
(connection errors, 5xx, timeouts) are retried by obstore with exponential backoff, boundedly.
"""
from __future__ import annotations

import configparser
import errno
import os
import re
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..errors import ExpectedError
from .isolate import call_in_child, direct_call_refused, may_fork_workers
from .redaction import redact, remember, secret_values

SCHEMES = ("s3", "gs", "az", "http", "https")


def is_url(path: object) -> bool:
    return isinstance(path, str) and urlsplit(path).scheme in SCHEMES and "://" in path


class StoreError(ExpectedError):
    """A store failed, not a record: never skipped as a bad sample, it ends the run with its message."""


class StoreUnavailable(StoreError, ConnectionError):
    """The store could not be reached, or kept failing, after the retries."""


class StoreAccessDenied(StoreError, PermissionError):
    """The store refused the credentials, or there were none."""


class StoreNotFound(StoreError, FileNotFoundError):
    """No object at that URL."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long to keep trying a failing request before the run stops with an error."""

    max_retries: int = 6
    first_backoff_s: float = 0.2
    max_backoff_s: float = 8.0
    budget_s: float = 60.0
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 20.0  # a store that stops sending mid-request (a hung server) fails after this
    request_timeout_s: float = 900.0  # a whole request, a 256 MB shard over a slow link included

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.budget_s <= 0:
            raise ValueError(f"max_retries must be >= 0 and budget_s > 0, got {self.max_retries}, {self.budget_s}")


# How obstore (object_store, reqwest) gives the HTTP status it got: "non-2xx status code: 403 Forbidden",
# "status: 403,", "HTTP status client error (403 Forbidden)". The server's status comes before its body.
_STATUS = re.compile(r"\bstatus(?: code)?: (\d{3})\b|\bstatus client error \((\d{3})\b")


def refusal_status(text: str) -> bool:
    """Whether a store error's text reports HTTP 401 or 403 (credentials refused): the status obstore
    names, never digits elsewhere in it. A 503 whose text held "401" or "403" in its port, its
    elapsed time ("in 40.403ms") or its body was taken for a refusal (#38)."""
    found = _STATUS.search(text)
    return found is not None and (found[1] or found[2]) in ("401", "403")


def _aws_files_config(environ: dict[str, str]) -> dict[str, str]:
    """Keys and region from ~/.aws/credentials and ~/.aws/config when the environment has none."""
    if environ.get("AWS_ACCESS_KEY_ID"):
        return {}
    profile = environ.get("AWS_PROFILE", "default")
    home = Path(environ.get("HOME", str(Path.home())))
    found: dict[str, str] = {}
    for file, section in ((environ.get("AWS_SHARED_CREDENTIALS_FILE", home / ".aws" / "credentials"), profile),
                          (environ.get("AWS_CONFIG_FILE", home / ".aws" / "config"),
                           profile if profile == "default" else f"profile {profile}")):
        parser = configparser.ConfigParser()
        try:
            parser.read(file)
        except configparser.Error:
            continue
        if parser.has_section(section):
            for key in ("aws_access_key_id", "aws_secret_access_key", "aws_session_token", "region", "endpoint_url"):
                if parser.has_option(section, key) and key not in found:
                    found[key] = parser.get(section, key)
    if "endpoint_url" in found:
        found["endpoint"] = found.pop("endpoint_url")
    return found


_AWS_ENVIRONMENT = {"AWS_ACCESS_KEY_ID": "aws_access_key_id", "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key",
                    "AWS_SESSION_TOKEN": "aws_session_token", "AWS_DEFAULT_REGION": "aws_region",
                    "AWS_REGION": "aws_region"}


def _store_kwargs(url: str, retry: RetryPolicy, environ: dict[str, str]) -> dict[str, Any]:
    scheme = urlsplit(url).scheme
    config: dict[str, Any] = {}
    if scheme == "s3":
        config = _aws_files_config(environ)
        # The environment this store was made in travels with it: a Ray task on another process or
        # node (whose own environment obstore would read) gets the driver's credentials.
        config.update({key: environ[var] for var, key in _AWS_ENVIRONMENT.items() if environ.get(var)})
        endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL") or config.get("endpoint")
        if endpoint:
            config["endpoint"] = endpoint
        if not (environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or config.get("region")):
            config["region"] = "us-east-1"
    allow_http = scheme == "http" or str(config.get("endpoint", "")).startswith("http://")
    kwargs: dict[str, Any] = {
        "client_options": {"allow_http": allow_http, "connect_timeout": timedelta(seconds=retry.connect_timeout_s),
                           "read_timeout": timedelta(seconds=retry.read_timeout_s),
                           "timeout": timedelta(seconds=retry.request_timeout_s)},
        "retry_config": {"max_retries": retry.max_retries, "retry_timeout": timedelta(seconds=retry.budget_s),
                         "backoff": {"init_backoff": timedelta(seconds=retry.first_backoff_s),
                                     "max_backoff": timedelta(seconds=retry.max_backoff_s), "base": 2.0}},
    }
    if config and scheme == "s3":
        kwargs["config"] = config
        remember(str(config[k]) for k in ("aws_secret_access_key", "aws_session_token") if config.get(k))
    return kwargs


class RemoteStore:
    """One dataset's folder in an object store: get, head, put, delete, list, by relative name."""

    def __init__(self, url: str, *, retry: RetryPolicy = RetryPolicy(), environ: dict[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        self.retry = retry
        self._environ = dict(os.environ if environ is None else environ)
        self._pid: int | None = None
        self._store: Any = None
        remember(secret_values(self._environ))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pid": None, "_store": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        remember(secret_values(self._environ))  # a Ray task's process masks the driver's credentials too

    def __repr__(self) -> str:
        return f"RemoteStore({self.describe()!r})"

    def describe(self, name: str = "") -> str:
        """The URL of the folder, or of `name` in it, fit for a message (`redact`)."""
        if not name:
            return redact(self.url)
        parts = urlsplit(self.url)
        return redact(urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{name}")))

    @property
    def store(self) -> Any:
        if self._pid != os.getpid():
            try:
                from obstore.store import from_url
            except ImportError as exc:
                raise ImportError("reading s3://, gs://, az:// or http(s):// URLs needs obstore: "
                                  "pip install 'datapipe[remote]'") from exc
            self._store = from_url(self.url, **_store_kwargs(self.url, self.retry, self._environ))
            self._pid = os.getpid()
        return self._store

    def _call(self, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if may_fork_workers():  # only a process that forks nothing calls obstore itself (datapipe.storage.isolate)
            return call_in_child(self._direct, name, fn, *args, **kwargs)
        return self._direct(name, fn, *args, **kwargs)

    def _direct(self, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        refused = direct_call_refused()  # forked after a process made requests: fail rather than hang
        if refused:
            raise StoreError(f"{self.describe(name)}: {refused}")
        try:
            return fn(self.store, name, *args, **kwargs)
        except StoreError:
            raise
        except Exception as exc:
            raise self._translate(name, exc) from None

    def _translate(self, name: str, exc: Exception) -> Exception:
        import obstore.exceptions as ox

        where = self.describe(name)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return StoreError(f"{where}: no space left on the local disk while writing it ({exc.filename or exc}); "
                              "free space there")
        if isinstance(exc, (FileNotFoundError, ox.NotFoundError)):
            return StoreNotFound(f"{where} does not exist; check the URL (bucket, prefix, file name)")
        if isinstance(exc, (PermissionError, ox.PermissionDeniedError, ox.UnauthenticatedError)):
            return StoreAccessDenied(
                f"{where}: access denied; check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
                "AWS_PROFILE and ~/.aws, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*) and the bucket's policy")
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if refusal_status(str(exc)):
            return self._translate(name, PermissionError())
        return StoreUnavailable(f"{where}: the store failed after {self.retry.max_retries} retries over at most "
                                f"{self.retry.budget_s:g} s ({redact(first)}); check the network "
                                "and the endpoint (AWS_ENDPOINT_URL)")

    def read(self, name: str, *, limit: int | None = None, what: str = "file") -> bytes:
        """The object's bytes; with `limit`, refused (dataset_files.BadDatasetFile) past that many,
        by its listed size before anything is fetched, and by what arrived."""
        import obstore

        from .dataset_files import too_big

        if limit is not None and (size := self.size(name)) is not None and size > limit:
            raise too_big(self.describe(name), size, limit, what)
        data = bytes(self._call(name, lambda s, n: obstore.get(s, n).bytes()))
        if limit is not None and len(data) > limit:  # replaced by a bigger object since its size was asked
            raise too_big(self.describe(name), len(data), limit, what)
        return data

    def read_ranges(self, name: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        """The object's bytes in each (start, length) range: one ranged GET each, in parallel, in one
        call (never merged: a gap between them is not fetched); fewer bytes only where the object is
        shorter, which the caller checks."""
        import obstore

        def get(store: Any, key: str) -> list[bytes]:
            found = obstore.get_ranges(store, key, starts=[a for a, _ in ranges], lengths=[n for _, n in ranges],
                                       coalesce=0)
            return [bytes(part) for part in found]

        return self._call(name, get) if ranges else []

    def size(self, name: str) -> int | None:
        """The object's size, None when there is none."""
        import obstore

        try:
            return int(self._call(name, obstore.head)["size"])
        except StoreNotFound:
            return None

    def download(self, name: str, target: Path) -> int:
        """Stream an object into a local file (into the space a file already there reserved, cut to
        what came); return its size."""
        import obstore

        def stream(store: Any, key: str) -> int:
            written = 0
            with open(target, "r+b" if Path(target).exists() else "wb") as fh:
                for chunk in obstore.get(store, key):
                    fh.write(chunk)
                    written += len(chunk)
                fh.truncate(written)
            return written

        return self._call(name, stream)

    def upload(self, name: str, source: Path | bytes) -> None:
        """Write an object (multipart for large files, which obstore does in parallel parts)."""
        import obstore

        self._call(name, obstore.put, source if isinstance(source, bytes) else Path(source))

    def delete(self, name: str) -> None:
        import obstore

        self._call(name, obstore.delete)

    def list(self, prefix: str = "") -> dict[str, int]:
        """name -> size of the objects under `prefix`."""
        import obstore

        def collect(store: Any, pre: str) -> dict[str, int]:
            return {m["path"]: int(m["size"]) for batch in obstore.list(store, prefix=pre or None) for m in batch}

        return self._call(prefix, collect)
