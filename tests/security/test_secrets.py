"""Secrets never leave the process: URL userinfo, presigned-URL parameters and cloud credentials from
the environment are masked in messages, exceptions (obstore's own, after retries too), log lines, the
CLI's output, `info`/`bench`/`train` JSON and a loader's state_dict (datapipe.storage.redaction)."""
from __future__ import annotations

import io
import json
import logging
import pickle
import shutil
import traceback

import pytest
import torch

from datapipe import make_loader, open_dataset

from datapipe import cli
from datapipe.formats.inspect import describe
from datapipe.storage import RemoteStore, RetryPolicy, StoreError, StoreUnavailable, redact
from datapipe.storage.urls import refusal_status

PASSWORD, SIGNATURE, TOKEN = "s3cr3t-pass", "SIGVALUE123", "TOKVALUE456"
ENVIRONMENT = {"AWS_SECRET_ACCESS_KEY": "aws-secret-in-env-1", "AWS_SESSION_TOKEN": "aws-session-in-env-2",
               "AZURE_STORAGE_ACCOUNT_KEY": "azure-key-in-env-3", "GOOGLE_SERVICE_ACCOUNT_KEY": "gcs-key-in-env-4"}
SECRETS = (PASSWORD, SIGNATURE, TOKEN, *ENVIRONMENT.values())
FAST = RetryPolicy(max_retries=2, first_backoff_s=0.01, max_backoff_s=0.02, budget_s=5)


@pytest.fixture(autouse=True)
def credentials(monkeypatch):
    for name, value in ENVIRONMENT.items():
        monkeypatch.setenv(name, value)


def secret_url(host: str, path: str = "x.wds") -> str:
    return f"http://reader:{PASSWORD}@{host}/{path}?X-Amz-Signature={SIGNATURE}&token={TOKEN}"


def assert_clean(text: str) -> None:
    leaked = [s for s in SECRETS if s in text]
    assert not leaked, f"{leaked} in {text[:2000]}"


def test_cli_info_prints_obstore_errors_without_the_password(failing_http, capsys):
    host = failing_http(400, f"refused: your key {ENVIRONMENT['AWS_SECRET_ACCESS_KEY']} is wrong")
    assert cli.main(["info", secret_url(host)]) == 2
    out, err = capsys.readouterr()
    assert_clean(out + err)
    assert err.count("\n") == 1 and "http://127.0.0.1" in err


def test_a_store_error_after_retries_carries_no_secret(failing_http):
    host = failing_http(503, f"busy, token {ENVIRONMENT['AWS_SESSION_TOKEN']}")
    with pytest.raises(StoreError) as caught:
        RemoteStore(secret_url(host), retry=FAST).read("manifest.json")  # obstore retried twice, in a child
    exc = caught.value
    assert "retries" in str(exc)
    assert_clean(str(exc) + repr(exc) + "".join(traceback.format_exception(exc)) + repr(pickle.dumps(exc)))


def test_a_503_with_401_or_403_in_its_text_is_no_refusal(failing_http):
    """A 503 was taken for refused credentials when "401" or "403" stood anywhere in obstore's first
    line: in the port, the elapsed time ("in 40.403ms": 1 run in 40 of the test above) or the body."""
    host = failing_http(503, "busy (request 401-403, not AccessDenied, not Forbidden)")
    with pytest.raises(StoreUnavailable, match=r"the store failed after 2 retries .*503 Service Unavailable"):
        RemoteStore(secret_url(host), retry=FAST).read("manifest.json")


@pytest.mark.parametrize(("text", "refused"), [
    ("Error performing GET http://127.0.0.1:40312/x in 40.403ms, after 2 retries - Server returned non-2xx "
     "status code: 503 Service Unavailable: 401", False),
    ("Error performing GET http://127.0.0.1:33313/x in 3.3ms - Server returned non-2xx status code: 403 Forbidden: "
     "<Code>AccessDenied</Code>", True),
    ("Generic { inner: Status { status: 401, body: None } }", True),
    ("HTTP status client error (401 Unauthorized) for url (http://169.254.169.254/token)", True),
    ("connection refused (os error 111) at 127.0.0.1:40301", False)])
def test_only_the_status_obstore_reports_makes_a_refusal(text, refused):
    assert refusal_status(text) is refused


def test_a_remote_dataset_shows_no_secret_anywhere(http_root, packed_wds, tmp_path, capsys):
    root, base = http_root
    shutil.copytree(packed_wds, root / "fixture.wds")
    url = secret_url(base.split("//")[1], "fixture.wds")
    ds = open_dataset(url, cache_dir=tmp_path / "cache")
    loader = make_loader(url, batch_size=4, image_size=32, device="cpu", num_workers=0, cache_dir=tmp_path / "cache")
    next(iter(loader))
    texts = [repr(ds), repr(ds.location.store), ds.location.describe("a.tar"),
             json.dumps(describe(url)), json.dumps(loader.state_dict())]
    assert cli.main(["info", url]) == 0 and cli.main(["verify", url]) == 0
    report = tmp_path / "bench.json"
    assert cli.main(["bench", url, "--suites", "read", "--seconds", "0.05", "--repeats", "1", "--warmup", "0",
                     "--cache-dir", str(tmp_path / "cache"), "--json", str(report)]) == 0
    out, err = capsys.readouterr()
    assert_clean("\n".join(texts) + out + err + report.read_text())
    assert "127.0.0.1" in report.read_text()


def test_train_writes_no_secret_into_its_checkpoint(http_root, packed_wds, tmp_path):
    root, base = http_root
    shutil.copytree(packed_wds, root / "fixture.wds")
    out = tmp_path / "run"
    assert cli.main(["train", secret_url(base.split("//")[1], "fixture.wds"), "--out", str(out), "--model",
                     "resnet18", "--batch-size", "4", "--image-size", "32", "--workers", "0", "--max-steps", "1",
                     "--backend", "dataloader", "--cache-dir", str(tmp_path / "cache")]) == 0
    state = torch.load(out / "last.pt", weights_only=True)
    assert_clean(json.dumps(state["config"]) + "".join(p.read_text() for p in out.glob("*.json*")))


@pytest.mark.parametrize("text", [
    f"https://user:{PASSWORD}@host/x.wds", f"GET s3://AKIA:{PASSWORD}@bucket/a in 3ms",
    f"https://h/a.tar?X-Amz-Credential=AKIA%2F1&X-Amz-Signature={SIGNATURE}&X-Amz-Security-Token={TOKEN}",
    f"https://acct.blob.core.windows.net/c/a.tar?sv=2022&sig={SIGNATURE}", f"uri: Some(http://u:{PASSWORD}@h:1/a)",
    *[f"the store said: {value} is wrong" for value in ENVIRONMENT.values()]])
def test_redact_masks_each_kind_of_secret(text):
    assert_clean(redact(text))


def test_redact_keeps_what_is_no_secret(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    text = "s3://bucket/data.wds/train-000001.tar?versionId=7 (AKIAEXAMPLE, max_tokens=5)"
    assert redact(text) == text
    assert redact("s3://bucket/path/file@2x.jpg") == "s3://bucket/path/file@2x.jpg"  # an @ in a path


@pytest.mark.parametrize("secret", ["wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "a/b+c/d=", "8080/abc"])
def test_redact_masks_a_url_password_holding_a_slash(secret):
    """AWS secret keys hold "/": the userinfo ended at the first one, and the rest of the key was printed."""
    shown = redact(f"cannot open s3://AKIAEXAMPLE:{secret}@bucket/train.wds: not found")
    assert secret not in shown and secret.split("/")[-1] not in shown
    assert shown == "cannot open s3://bucket/train.wds: not found"


def test_log_lines_are_masked_by_the_cli_filter():
    from datapipe.storage.redaction import RedactingFilter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    log = logging.getLogger("datapipe.test_secrets")
    log.addHandler(handler)
    try:
        log.warning("fetching %s failed: %s", secret_url("h"), ENVIRONMENT["AZURE_STORAGE_ACCOUNT_KEY"])
    finally:
        log.removeHandler(handler)
    assert "fetching http://h/x.wds" in stream.getvalue()
    assert_clean(stream.getvalue())
