"""No secret of the environment reaches the output of a command that builds a DALI graph or starts a
Ray: DALI's AutoGraph printed the whole os.environ (HF_TOKEN, WANDB_API_KEY, ...) in a warning about the
`os.environ.setdefault` the op kernels called inside the traced graph (issue #47). The switch is now set
outside any traced code (augment.dali), and what DALI logs or warns is redacted (mask_library_output)."""
from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import warnings

import pytest
import torch

from datapipe.storage.redaction import ENVIRONMENT_DUMP, RedactingFilter, mask_library_output, redact

# credentials by name (redact masks them anywhere), and one under a name that says nothing (only the
# absence of any dump of the environment keeps it in)
FAKE = {"HF_TOKEN": "hf_FAKE_CANARY_123", "WANDB_API_KEY": "wandb-FAKE-CANARY-456",
        "GITHUB_TOKEN": "ghp_FAKE_CANARY_789",
        "DB_PASSWORD": "dbpass_FAKE_CANARY_000", "PGPASSWORD": "pg_FAKE_CANARY_222",
        "MY_SERVICE_CONN": "conn_FAKE_CANARY_111"}
LIMIT_S = 300
SMALL = ("--batch-size", "4", "--image-size", "32", "--workers", "1")
BENCH = ("--suites", "pipeline", "--seconds", "0.2", "--repeats", "1", "--warmup", "0", *SMALL)
TRAIN = ("--max-steps", "1", "--model", "resnet18", *SMALL)


def needs(module: str):
    """DALI and Ray are extras (`pip install 'datapipe[dali-cu12]'`, `[ray]`): a user's install may lack one.
    The dev install that make test and CI build has both, so there these tests run."""
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"needs {module}")


def run_cli(*args, home=None, codes=(0,)) -> str:
    """`datapipe ARGS` in a child with the fake secrets in its environment: its stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | FAKE
    if home is not None:
        env["HOME"] = str(home)  # Ray's auth token goes under ~/.ray (tests/conftest.py ray_home)
    done = subprocess.run([sys.executable, "-m", "datapipe", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=LIMIT_S)
    assert done.returncode in codes, done.stderr[-3000:]
    return done.stdout + done.stderr


def assert_clean(text: str) -> None:
    leaked = sorted(name for name, value in FAKE.items() if value in text)
    assert not leaked, f"{leaked} in the output: {text[:3000]}"
    assert "environ(" not in text and ENVIRONMENT_DUMP not in text, text[:3000]  # no dump at all, not even masked


@needs("nvidia.dali")
def test_preview_of_a_recipe_on_dali_prints_no_secret(packed_wds, tmp_path):
    assert_clean(run_cli("preview", packed_wds, "--recipe", "deit", "--backends", "dali", "--epochs", "1",
                         "--out", tmp_path / "grid.png"))


@needs("nvidia.dali")
def test_train_on_dali_with_a_recipe_prints_no_secret(packed_wds, tmp_path):
    assert_clean(run_cli("train", packed_wds, "--backend", "dali", "--recipe", "deit", *TRAIN,
                         "--out", tmp_path / "run"))


@pytest.mark.full  # make test-full and CI: the same graph as train's, built by bench (~7 s)
@needs("nvidia.dali")
def test_bench_of_dali_with_a_recipe_prints_no_secret(packed_wds):
    # 2: a run this short may be refused as too short to measure, after its pipeline row ran
    text = run_cli("bench", packed_wds, "--backends", "dali", "--recipe", "deit", *BENCH, codes=(0, 2))
    assert "pipeline dali" in text
    assert_clean(text)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is present")
def test_doctor_gpu_builds_every_op_kind_and_prints_no_secret(packed_wds):
    assert_clean(run_cli("doctor", "--gpu", packed_wds))


@pytest.mark.full  # make test-full and CI: each starts a local Ray (10-30 s)
@needs("ray")
@pytest.mark.parametrize("command", [
    ("train", "{data}", "--backend", "ray", "--recipe", "deit", *TRAIN, "--out", "{tmp}/run"),
    ("bench", "{data}", "--backends", "ray", "--recipe", "deit", *BENCH),
    ("convert", "{folder}", "{tmp}/ray.wds", "--engine", "ray")], ids=["train", "bench", "convert"])
def test_commands_on_a_local_ray_print_no_secret(command, packed_wds, imagefolder, ray_home, tmp_path):
    args = [a.format(data=packed_wds, folder=imagefolder, tmp=tmp_path) for a in command]
    assert_clean(run_cli(*args, home=ray_home, codes=(0, 2) if command[0] == "bench" else (0,)))


@pytest.fixture
def library_output():
    """mask_library_output's filter and formatwarning for one test, taken off after it."""
    root, saved = logging.getLogger(), warnings.formatwarning
    before = list(root.filters)
    mask_library_output()
    yield
    warnings.formatwarning = saved
    for added in [f for f in root.filters if f not in before]:
        root.removeFilter(added)


@needs("nvidia.dali")
def test_autographs_warning_about_an_environ_method_is_masked(library_output, monkeypatch, capsys):
    """The second net: were graph code to touch os.environ again, AutoGraph's warning (logged with
    logging.warning, on the root logger, whatever the caller set up) would show no environment."""
    from nvidia.dali._autograph.utils import ag_logging

    for name, value in FAKE.items():
        monkeypatch.setenv(name, value)
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger().addHandler(handler)
    try:
        ag_logging.warning("AutoGraph could not transform %s and will run it as-is.", os.environ.setdefault)
    finally:
        logging.getLogger().removeHandler(handler)
    text = "".join(records) + capsys.readouterr().err
    assert ENVIRONMENT_DUMP in text and not [v for v in FAKE.values() if v in text], text[:3000]
    assert warnings.formatwarning("x " + FAKE["GITHUB_TOKEN"], UserWarning, "f.py", 1) == "f.py:1: UserWarning: x ***\n"


def test_mask_library_output_installs_once(library_output):
    mask_library_output()
    assert sum(isinstance(f, RedactingFilter) for f in logging.getLogger().filters) == 1
    assert getattr(warnings.formatwarning, "redacts", False)


@pytest.mark.parametrize("name", sorted(FAKE.keys() - {"MY_SERVICE_CONN"}) + [
    "OPENAI_API_KEY", "AWS_SECRET_ACCESS_KEY", "AZURE_STORAGE_SAS_TOKEN", "HUGGING_FACE_HUB_TOKEN", "MYSQL_PWD",
    "SLACK_BOT_TOKEN", "CI_JOB_TOKEN", "TWINE_PASSWORD", "GH_PAT", "NPM_AUTH", "API_KEY_SECRET", "SECRET_KEY_BASE"])
def test_a_variable_named_like_a_credential_is_masked(name, monkeypatch):
    monkeypatch.setenv(name, "value-of-a-credential")
    assert redact(f"{name}=value-of-a-credential; 'value-of-a-credential'") == f"{name}=***; '***'"


@pytest.mark.parametrize("name", ["AWS_ACCESS_KEY_ID", "AZURE_CLIENT_ID", "AZURE_STORAGE_ACCOUNT_NAME", "PWD",
                                  "OLDPWD", "SSH_AUTH_SOCK", "TOKENIZERS_PARALLELISM", "GOOGLE_APPLICATION_CREDENTIALS",
                                  "HF_TOKEN_PATH", "KEYBOARD_LAYOUT", "GIT_ASKPASS", "MONKEY_BUSINESS"])
def test_a_variable_that_names_no_credential_stays(name, monkeypatch):
    monkeypatch.setenv(name, "/tmp/plainly-visible")
    assert redact("at /tmp/plainly-visible") == "at /tmp/plainly-visible"


def test_the_password_of_a_url_in_the_environment_is_masked(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://app:db-pass-1234@db.internal:5432/app")
    assert redact("ray://admin:db-pass-1234@head:10001 (the same password)") == "ray://head:10001 (the same password)"
    assert redact("a store said: db-pass-1234 is wrong") == "a store said: *** is wrong"


@pytest.mark.parametrize(("text", "shown"), [
    ("the name admin:pw-1234@127.0.0.1 does not resolve", "the name 127.0.0.1 does not resolve"),
    ("at admin:pw-1234@[::1]:6379", "at [::1]:6379"), ("ray://admin:pw-1234@head:10001", "ray://head:10001"),
    ("bob@example.com, git@github.com:org/repo.git, x:y @z", "bob@example.com, git@github.com:org/repo.git, x:y @z")])
def test_an_address_with_a_password_is_shown_without_it(text, shown):
    assert redact(text) == shown


def test_a_credential_with_newlines_is_masked_as_a_repr_writes_it(monkeypatch):
    key = "-----BEGIN KEY-----\nMIIEvQIBADANBgkq\n-----END KEY-----"
    monkeypatch.setenv("SERVICE_PRIVATE_KEY", key)
    assert redact(f"key={key!r}") == "key='***'"
