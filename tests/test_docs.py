"""Every command and Python snippet in README.md and docs/*.md runs, so the pages cannot drift from
the code; every relative link resolves; the README stays a newcomer's page. The rules a page follows
are in docs/design.md ("Docs that run"):

- fenced `bash` (or `sh`, `shell`, `console` with `$ ` prompts) and `python` blocks are run, each in a
  fresh folder holding `imagenet/` (fixtures/imagefolder), `raw_val/` + `val.csv`, and `imagenet.lmdb`,
  `.h5`, `.wds` converted once per session, minus the datasets the block converts itself;
- a block that names `s3://` runs against moto's S3 server on 127.0.0.1, bucket `bucket`;
- `/local/nvme/` in a block is a folder inside the block's own folder;
- a block that cannot run here says why on the line before it: `<!-- not run: REASON -->`.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
IMAGEFOLDER = ROOT / "fixtures" / "imagefolder"
SHELL_LANGS = {"bash", "sh", "shell", "console"}
COMMANDS = {"datapipe", "python"}  # what a block may run; anything else needs a `not run` reason
DATASETS = ("imagenet.lmdb", "imagenet.h5", "imagenet.wds")
NOT_RUN = re.compile(r"^<!--\s*not run:(.*)-->$")
FENCE = re.compile(r"^(`{3,})\s*([\w+-]*)\s*$")
TIMEOUT_S = 300
README_MAX_LINES = 150


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    not_run: str | None  # the reason given, or None: the block must run

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def fenced_blocks(page: Path) -> list[Block]:
    """The page's fenced code blocks, each with the `not run` reason on the line before it, if any."""
    lines, found, i = page.read_text(encoding="utf-8").splitlines(), [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == opening[1]), None)
        assert end is not None, f"{page.name}:{i + 1}: a code block that is never closed"
        before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        reason = NOT_RUN.match(before)
        found.append(Block(page, i + 1, opening[2].lower(), "\n".join(lines[i + 1:end]),
                           reason[1].strip() if reason else None))
        i = end + 1
    return found


ALL_BLOCKS = [b for page in PAGES for b in fenced_blocks(page)]


def command_lines(block: Block) -> list[str]:
    """The block's commands: `\\`-continued lines joined; blank and comment lines dropped; in a
    `console` block only the lines after a `$ ` prompt."""
    text = block.text.replace("\\\n", " ")
    lines = [ln.strip() for ln in text.splitlines()]
    if block.lang == "console":
        lines = [ln[2:] for ln in lines if ln.startswith("$ ")]
    return [ln for ln in lines if ln and not ln.startswith("#")]


def simple_commands(line: str) -> list[list[str]]:
    """A command line cut at `;`, `&&`, `||` and `|` into its simple commands' words."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, words = [], []
    for token in lexer:
        if token and set(token) <= set(";&|"):
            commands.append(words)
            words = []
        else:
            words.append(token)
    return [c for c in commands + [words] if c]


def runnable(block: Block) -> bool:
    return block.lang == "python" or block.lang in SHELL_LANGS


def foreign_commands(block: Block) -> list[str]:
    """The programs a shell block starts that this test does not run (pip, make, torchrun...)."""
    if block.lang not in SHELL_LANGS:
        return []
    return [words[0] for line in command_lines(block) for words in simple_commands(line) if words[0] not in COMMANDS]


def converted_here(block: Block) -> set[str]:
    """The outputs the block's own `datapipe convert` commands write (so the workspace lacks them)."""
    from datapipe.cli.main import build_parser

    outputs = set()
    for line in command_lines(block) if block.lang in SHELL_LANGS else []:
        for words in simple_commands(line):
            if words[:2] == ["datapipe", "convert"]:
                try:
                    outputs.add(build_parser().parse_args(words[1:]).dst.rstrip("/"))
                except SystemExit:
                    pytest.fail(f"{block}: `{line}` is not a command `datapipe convert` takes")
    return outputs


# ---- the workspace every block runs in ---------------------------------------------------------------

@pytest.fixture(scope="session")
def library(tmp_path_factory) -> Path:
    """imagenet/, raw_val/ + val.csv, data/ (Parquet), laion-sample/ (img2dataset's layout: image-text
    shards), and imagenet/ converted by the CLI to each format, once."""
    root = tmp_path_factory.mktemp("docs-library")
    shutil.copytree(IMAGEFOLDER, root / "imagenet", symlinks=False)
    (root / "raw_val").mkdir()
    rows = []
    for image in sorted((root / "imagenet" / "val").glob("*/*")):
        name = f"{image.parent.name}_{image.name}"
        shutil.copy(image, root / "raw_val" / name)
        rows.append(f"{name},{image.parent.name}\n")
    (root / "val.csv").write_text("".join(rows))
    from tests.parquet_data import write_hub

    write_hub(root / "data")  # Parquet files as the Hugging Face Hub stores them
    from tools.make_img2dataset_sample import make

    make(root / "laion-sample", shards=2, per_shard=16, failed=1, seed=0)
    for name in DATASETS:
        run(["datapipe", "convert", "imagenet/", name, "-q"], root, environment(tmp_path_factory.mktemp("tmp")),
            what=f"converting {name}")
    return root


def environment(tmpdir: Path, **extra: str) -> dict[str, str]:
    """The venv's `datapipe` and `python` first on the PATH; TMPDIR (so the shard cache) our own."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "datapipe").exists(), f"no `datapipe` script beside {sys.executable}: pip install -e ."
    tmpdir.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", "TMPDIR": str(tmpdir),
            "PYTHONUNBUFFERED": "1", **extra}


def workspace_for(block: Block, library: Path, folder: Path) -> Path:
    for item in library.iterdir():
        if item.name not in converted_here(block):
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, folder / item.name)
    return folder


def run(argv: list[str], cwd: Path, env: dict[str, str], *, what: str) -> str:
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{what}: still running after {TIMEOUT_S} s\n{(e.stdout or '')[-3000:]}{(e.stderr or '')[-3000:]}")
    if done.returncode != 0:
        pytest.fail(f"{what}: exit status {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n"
                    f"--- stderr\n{done.stderr[-6000:]}")
    return done.stdout


# ---- a local S3 server for the blocks that name s3:// ----------------------------------------------

class S3:
    """moto's server on 127.0.0.1, port 0, with the bucket `bucket`; AWS_* point the CLI at it."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
        self.client = self._client()
        self.client.create_bucket(Bucket="bucket")

    def _client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def upload(self, folder: Path, prefix: str) -> None:
        """Every file under `folder` to s3://bucket/PREFIX/..., a manifest last (as `convert` writes)."""
        files = sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: (p.name == "manifest.json", p))
        for path in files:
            self.client.put_object(Bucket="bucket", Key=f"{prefix}/{path.relative_to(folder).as_posix()}",
                                   Body=path.read_bytes())

    def stop(self) -> None:
        self.server.stop()


# ---- the tests ---------------------------------------------------------------------------------------

def test_every_block_is_run_or_says_why_not():
    """A block of commands the test cannot run, or a reason left empty, fails here: so a command
    added to a page is either run or explicitly excused."""
    problems = []
    for block in ALL_BLOCKS:
        if block.not_run is not None:
            if len(block.not_run) < 10:
                problems.append(f"{block}: `not run` needs a reason that says why (got {block.not_run!r})")
            continue
        for program in foreign_commands(block):
            problems.append(f"{block}: `{program}` is not run by this test ({sorted(COMMANDS)} are): "
                            "mark the block <!-- not run: REASON -->")
        if not runnable(block) and any(re.match(r"(\$ )?(datapipe|python|make|pip|torchrun) ", ln.strip())
                                       for ln in block.text.splitlines()):
            problems.append(f"{block}: commands in a block tagged {block.lang or 'nothing'!r}: tag it bash")
    assert not problems, "\n".join(problems)


@pytest.mark.full  # make test-full and CI: each block starts its own commands (~100 CPU-s in all)
@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if runnable(b) and b.not_run is None], ids=str)
def test_block_runs(block, library, tmp_path):
    if foreign_commands(block):  # never started: a `pip install` or `make` in a page must not run here
        pytest.fail(f"{block}: not run, it starts {foreign_commands(block)}: mark it <!-- not run: REASON -->")
    workspace = workspace_for(block, library, tmp_path)
    text = block.text.replace("/local/nvme/", f"{workspace}/local/nvme/")
    s3 = S3() if "s3://" in text else None
    tmpdir = Path(tempfile.mkdtemp(prefix="docs-"))  # short: Ray's socket paths under it must fit 107 bytes
    try:
        env = environment(tmpdir, **(s3.env if s3 else {}))
        if s3:
            if "s3://bucket/imagenet.wds" not in converted_here(block):
                s3.upload(library / "imagenet.wds", "imagenet.wds")
            s3.upload(library / "imagenet", "raw")
        if block.lang == "python":
            (tmp_path / "snippet.py").write_text(text)
            run([sys.executable, str(tmp_path / "snippet.py")], workspace, env, what=f"the Python block at {block}")
        else:
            script = "\n".join(command_lines(Block(block.page, block.line, block.lang, text, None)))
            run(["bash", "-euo", "pipefail", "-c", script], workspace, env, what=f"the commands at {block}")
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
        if s3:
            s3.stop()


def test_readme_is_a_newcomers_page():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; keep it to {README_MAX_LINES}, the rest in docs/"


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lowercased, punctuation dropped, spaces to dashes, repeats numbered."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", prose(page), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def prose(page: Path) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"^(`{3,}).*?^\1\s*$", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)


def test_every_relative_link_points_to_a_file_and_anchor_that_exist():
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: ({target}): no file {path}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: ({target}): no heading #{anchor} in {file.name}")
    assert not broken, "\n".join(broken)


def test_every_repository_path_the_pages_quote_exists():
    """`tools/x.py`, `tests/...`, `datapipe/...` named in the prose: a renamed file fails here."""
    missing = []
    for page in PAGES:
        for span in re.findall(r"`([^`]+)`", prose(page)):  # a span may wrap onto the next line
            for path in re.findall(r"(?<![\w./-])((?:datapipe|converters|tools|tests|benchmarks|fixtures|fuzz|docs)"
                                   r"/[\w./-]*)", span):
                if not (ROOT / path.rstrip(".")).exists():
                    missing.append(f"{page.relative_to(ROOT)}: `{' '.join(span.split())}` names {path}, "
                                   "which does not exist")
    assert not missing, "\n".join(missing)
