"""What the commands of docs/mixing.md, docs/pool.md and docs/augmentation.md print is what the pages say
(#48: what a user reads is true). Each `datapipe ...` line of their runnable bash blocks is run as written,
in order, in tests/test_docs.py's folder (its block parsing and set-up, imported), and its output is
read, not only its exit status: the figures agree with each other and with the command's arguments, the
files it names exist, and nothing a user reads is a traceback, a wall, a control character or "1 epochs".
`info` runs in `make test`; the commands that load and train are `full`, as test_docs.py's blocks are.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from PIL import Image

from datapipe.cli.main import build_parser, main
from tests.test_docs import library  # noqa: F401  (test_docs.py's session fixture: the folder its blocks run in)
from tests.test_docs import (ROOT, SHELL_LANGS, TIMEOUT_S, Block, command_lines, environment, fenced_blocks,
                             simple_commands, workspace_for)

PAGES = ("mixing.md", "pool.md", "augmentation.md")
MAX_LINE = 300  # characters: a longer line wraps into a wall on a terminal
MAX_LOG_LINES = 12  # a short documented command logs a few lines, not one per record or step
NOUNS = "epochs|shards|samples|records|steps|sources|classes|images|batches|rows|workers|files|weights|datasets"
ONE_MANY = re.compile(rf"(?<![\d.,])1 ({NOUNS})\b")  # "1 epochs": a count whose noun was not counted
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
KNOWN_WALL = re.compile(r"^INFO epoch \d+: ")  # train's epoch line (was its whole record, 417 characters: below)
RAISED = re.compile(r"^Traceback|\b\w+(Error|Exception): ", re.M)


@dataclass(frozen=True)
class Command:
    block: Block
    index: int  # of the line among the block's command lines
    line: str  # as written

    @property
    def words(self) -> list[str]:
        return simple_commands(self.line)[0]

    def __str__(self) -> str:
        return f"{self.block}:{self.words[1]}"


@dataclass(frozen=True)
class Said:
    returncode: int
    stdout: str
    stderr: str
    workspace: Path

    @property
    def lines(self) -> list[str]:
        return (self.stdout + self.stderr).splitlines()


def page_commands() -> list[Command]:
    """The `datapipe` command lines of the pages' runnable shell blocks, each a single command."""
    found = []
    for name in PAGES:
        for block in fenced_blocks(ROOT / "docs" / name):
            if block.lang not in SHELL_LANGS or block.not_run is not None:
                continue
            for i, line in enumerate(command_lines(block)):
                if simple_commands(line)[0][0] == "datapipe":
                    found.append(Command(block, i, line))
    return found


COMMANDS = page_commands()


class Walker:
    """Runs each block's command lines in order in one workspace, each once, as far as a test asks."""

    def __init__(self, library: Path, factory: pytest.TempPathFactory) -> None:
        self.library, self.factory = library, factory
        self.said: dict[tuple[Block, int], Said] = {}
        self.tmpdir = Path(tempfile.mkdtemp(prefix="docs-out-"))  # short: Ray's socket paths must fit

    def __call__(self, command: Command) -> Said:
        lines = command_lines(command.block)
        for i in range(command.index + 1):
            if (command.block, i) not in self.said:
                self.said[command.block, i] = self._run(command.block, lines[i], i)
        return self.said[command.block, command.index]

    def _run(self, block: Block, line: str, index: int) -> Said:
        workspace = self.said[block, index - 1].workspace if index else \
            workspace_for(block, self.library, self.factory.mktemp("docs-out"))
        try:
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=workspace, capture_output=True,
                                  text=True, timeout=TIMEOUT_S, env=environment(self.tmpdir))
        except subprocess.TimeoutExpired:
            pytest.fail(f"{block}: `{line}` still running after {TIMEOUT_S} s")
        return Said(done.returncode, done.stdout, done.stderr, workspace)


@pytest.fixture(scope="module")
def walk(library, tmp_path_factory) -> Iterator[Walker]:
    walker = Walker(library, tmp_path_factory)
    yield walker
    shutil.rmtree(walker.tmpdir, ignore_errors=True)


def fast_or_full(commands: list[Command], fast: set[str]) -> list:
    """The commands as parameters: `fast` subcommands in make test, the others `full`."""
    return [pytest.param(c, marks=[] if c.words[1] in fast else [pytest.mark.full], id=str(c)) for c in commands]


# ---- what each command must print --------------------------------------------------------------------

def check_info(said: Said, words: list[str]) -> None:
    """The mix table: one row per dataset, named as given, shares summing to 1 in the --weights'
    proportions, draws summing to the epoch size, epochs/pass = records / draws, columns aligned."""
    args = build_parser().parse_args(words[1:])
    out = said.stdout.splitlines()
    head = re.fullmatch(r"mix of (\d+) sources?, ([\d,]+) samples? an epoch, (\d+) class(?:es)?", out[0])
    assert head, f"first line: {out[0]!r}"
    rows = [line.split() for line in out[2:2 + len(args.path)]]
    assert int(head[1]) == len(args.path) == len(rows)
    assert [r[0] for r in rows] == [p.split("=")[0] if "=" in p else Path(p).name for p in args.path]
    epoch = int(head[2].replace(",", ""))
    assert epoch == (args.epoch_size or sum(int(r[1]) for r in rows))
    shares = [float(r[2]) for r in rows]
    assert abs(sum(shares) - 1) <= 0.0005 * len(rows), f"the shares sum to {sum(shares)}: {shares}"
    if args.weights:
        weights = [float(w) for w in args.weights.split(",")]
        assert all(abs(s - w / sum(weights)) <= 0.0005 for s, w in zip(shares, weights)), (shares, weights)
    assert sum(int(r[3]) for r in rows) == epoch
    for r in rows:
        assert r[4] == ("never" if r[3] == "0" else f"{int(r[1]) / int(r[3]):.2f}"), r
    for label in ("records", "weight", "draws/epoch", "epochs/pass"):  # each figure under its header
        end = out[1].index(label) + len(label)
        assert all(row[end - 1] != " " and row[end:end + 1] in ("", " ") for row in out[2:2 + len(rows)]), \
            f"column {label!r} out of line:\n" + "\n".join(out[1:2 + len(rows)])
    classes = out[-1].removeprefix("classes: ").split(", ")
    assert out[-1].startswith("classes: ") and len(classes) == int(head[3])


def check_preview(said: Said, words: list[str]) -> None:
    """One line naming the picture written, its epochs, backends and records as asked; no note (a
    backend that failed, bad records); the picture opens."""
    args = build_parser().parse_args(words[1:])
    wrote = re.fullmatch(r"wrote (\S+): (\d+) epochs? x ([\w, ]+), (\d+) records? each, recipe .+",
                         said.stdout.strip())
    assert wrote, said.stdout
    assert (int(wrote[2]), wrote[3].split(", "), int(wrote[4])) == (args.epochs, args.backends.split(","), args.records)
    with Image.open(said.workspace / wrote[1]) as picture:
        assert picture.format == "PNG" and picture.width > 128 * args.records


LAST_LINE = re.compile(r"datapipe train (?:finished|stopped at --max-steps \d+): (\d+) steps?, (\d+) of (\d+) epochs? "
                       r"finished; epoch (\d+)(?: \(unfinished: \d+ images?\))?: loss ([\d.]+), acc ([\d.]+), "
                       r"val_acc ([\d.]+|n/a), (\d+) img/s, "
                       r"data wait ([\d.]+)% \((\w+)\)")


def check_train(said: Said, words: list[str]) -> None:
    """The mix's per-source draws, then the run's last line (steps, loss, img/s, data wait), whose
    figures are metrics.jsonl's last line."""
    args = build_parser().parse_args(words[1:])
    mix = next(line for line in said.lines if " mix: " in f" {line}")
    draws = [(float(s), int(n.replace(",", ""))) for s, n in re.findall(r" (\d\.\d{3}) \(([\d,]+) an epoch\)", mix)]
    assert len(draws) == len(args.data) and sum(n for _, n in draws) == args.epoch_size, mix
    assert abs(sum(s for s, _ in draws) - 1) <= 0.0005 * len(draws), mix
    last = LAST_LINE.search(said.lines[-1])
    assert last, f"the run's last line: {said.lines[-1]!r}"
    steps = int(last[1])
    assert 0 < steps <= min(args.max_steps or steps, args.epochs * (args.epoch_size // args.batch_size))
    metrics = [json.loads(line) for line in (said.workspace / args.out / "metrics.jsonl").read_text().splitlines()]
    assert metrics, "metrics.jsonl is empty"
    end = metrics[-1]
    assert (end["steps"], end["epoch"], end["images"]) == (steps, int(last[4]), steps * args.batch_size)
    assert f"{end['train_loss']:.4f}" == last[5] and f"{end['images_per_s']:.0f}" == last[8]
    assert f"{end['data_wait_pct']:.1f}" == last[9] and end["backend"] == last[10]


CHECKS = {"info": check_info, "preview": check_preview, "train": check_train}


# ---- the tests ---------------------------------------------------------------------------------------

def test_the_pages_commands_are_found_and_each_has_its_checks():
    """A `datapipe` command added to one of the pages fails here until its output is checked below."""
    found = {(c.block.page.name, c.words[1]) for c in COMMANDS}
    assert {("mixing.md", "info"), ("mixing.md", "preview"), ("mixing.md", "train")} <= found, found
    unchecked = [str(c) for c in COMMANDS if c.words[1] not in CHECKS]
    assert not unchecked, f"commands whose output nothing checks: {unchecked}: add a check to CHECKS"
    assert all(len(simple_commands(c.line)) == 1 for c in COMMANDS), "one command a line, so each is read alone"


@pytest.mark.parametrize("command", fast_or_full(COMMANDS, fast={"info"}))
def test_the_command_prints_what_the_page_says(command, walk):
    said = walk(command)
    text = "\n".join(said.lines)
    assert said.returncode == 0, f"`{command.line}`: exit status {said.returncode}\n{text[-4000:]}"
    assert not RAISED.search(text), text[-4000:]
    assert not ONE_MANY.search(text), f"a count of 1 with a plural noun: {ONE_MANY.search(text)[0]!r}"
    assert not CONTROL.search(text), "a control character in the output"
    assert not [ln for ln in said.stderr.splitlines() if ln.startswith("WARNING")], said.stderr
    assert len(said.stderr.splitlines()) <= MAX_LOG_LINES, f"a wall of log lines:\n{said.stderr[-4000:]}"
    CHECKS[command.words[1]](said, command.words)


@pytest.mark.parametrize("command", fast_or_full(COMMANDS, fast={"info"}))
def test_no_line_is_a_wall(command, walk):
    """Every line but train's known epoch record (below) fits MAX_LINE: a banner quoting benchmark
    figures (358 characters before ecdd638) or a table of long paths fails here."""
    lines = [ln for ln in walk(command).lines if not KNOWN_WALL.match(ln)]
    longest = max(lines, key=len, default="")
    assert len(longest) <= MAX_LINE, f"a line of {len(longest)} characters: {longest[:200]}..."


@pytest.mark.full
def test_the_epoch_record_train_logs_is_no_wall(walk):
    said = walk(next(c for c in COMMANDS if c.words[1] == "train"))
    walls = [ln for ln in said.lines if KNOWN_WALL.match(ln)]
    assert walls and max(map(len, walls)) <= MAX_LINE, walls


def test_the_mix_table_counts_its_words_and_aligns_short_names(library, monkeypatch, capsys):
    """mixing.md's info command at an epoch of 1 sample: '1 sample an epoch' (was '1 samples'); names
    shorter than the 'source' header keep the columns under their headers (were 2 characters off)."""
    info = next(c for c in COMMANDS if c.words[1] == "info").words
    argv = [*info[1:info.index("--epoch-size") + 1], "1"]
    monkeypatch.chdir(library)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert re.match(r"mix of 2 sources, 1 sample an epoch, 3 classes\n", out), out
    check_info(Said(0, out, "", library), ["datapipe", *argv])


@pytest.mark.full
def test_the_preview_tiles_name_their_sources(walk, monkeypatch, tmp_path):
    """Each tile of mixing.md's preview is captioned with its source's name and its index there: the
    picture the command wrote is the one rendered from these captions (the same pixels)."""
    from datapipe import preview as module

    command = next(c for c in COMMANDS if c.words[1] == "preview")
    said = walk(command)
    shown = []
    real = module.preview
    monkeypatch.setattr(module, "preview", lambda *a, **k: shown.append(real(*a, **k)) or shown[-1])
    monkeypatch.chdir(said.workspace)
    args = build_parser().parse_args(command.words[1:])
    assert main([*command.words[1:], "--out", str(tmp_path / "again.png")]) == 0
    names = [p.split("=")[0] if "=" in p else Path(p).name for p in args.data]
    captions = [c for row in shown[0].rows for c in row.captions]
    assert len(captions) == args.records * args.epochs
    assert all(re.fullmatch(rf"({'|'.join(map(re.escape, names))}) #\d+", c[0]) for c in captions), captions
    with Image.open(said.workspace / args.out) as written, Image.open(tmp_path / "again.png") as again:
        assert written.tobytes() == again.tobytes()
