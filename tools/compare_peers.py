"""datapipe beside its peers on the same folder and cores: loaders and converters, one table a corpus.

    python tools/compare_peers.py --setup                       # once: the peers' scratch venv
    python tools/make_imagenet_like.py --out build/imagenet-like   # the ImageNet-sized corpus
    python tools/compare_peers.py build/imagenet-like build/webmix --passes 2 \
        --json benchmarks/peers-imagenet-like-cpu.json

--setup installs FFCV's system libraries (apt-get) and builds a scratch venv (--peers-venv, default
build/peers-venv) with the CPU torch pinned, FFCV 1.0.2, LitData, SPDL 0.8 and torchdata 0.11:
users of datapipe never need them. Every measurement is a fresh process; rows are interleaved
(pass 1 runs every row in order, pass 2 in reverse, ...), and each table shows medians, each
row's ratio to the anchor, and for loaders to the ceiling (tools/peer_loaders.py: one core's rate
of decode of the crop region at its DCT scale + resize + flip, times the cores). The loaders and
how each is configured are in tools/peer_loaders.py. CPU-s/1k img: CPU time of the row's whole
process tree over the timed epochs (utime+stime of every process in it from /proc/PID/stat,
sampled every 50 ms; a process that ends counts up to its last sample). Peak RSS: the largest sum
of the tree's resident sets (every 50 ms; shared pages count once per process, an upper bound);
peak PSS: the same from /proc/PID/smaps_rollup (shared pages split between their users), every
0.5 s, as reading it costs ~3 ms a process. After the passes, one cProfile of datapipe's row in
one process says where time goes beyond the ceiling.

Converters: images/s of the call (interpreter and imports excluded for both) over the whole
folder, bad files included: LitData `optimize` stores the raw bytes and the label; `datapipe
convert` validates (the default).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import peer_loaders as peers  # noqa: E402
from node_memory import descendants, memory  # noqa: E402

CEILING = "ceiling: cores x one core's decode+resize+flip"


# ---- converter children --------------------------------------------------------------------------

def timed_call(call, count: int) -> dict:
    started = time.monotonic()
    call()
    ended = time.monotonic()
    return {"images_per_s": count / (ended - started), "images": count, "t0": started, "t1": ended}


def convert_litdata(folder: str, workers: int, epochs: int) -> dict:
    from litdata import optimize

    files = [(str(p), label) for p, label in peers.image_files(Path(folder))]
    with tempfile.TemporaryDirectory() as tmp:
        return timed_call(lambda: optimize(fn=peers.litdata_sample, inputs=files, output_dir=str(Path(tmp) / "out"),
                                           chunk_bytes="64MB", num_workers=workers, mode="overwrite"), len(files))


def convert_datapipe(folder: str, workers: int, epochs: int, engine: str = "local") -> dict:
    """`datapipe convert` to .wds; with engine="ray", on a local Ray started before the clock (as a
    cluster that exists)."""
    from converters import ConvertOptions, convert

    if engine == "ray":
        import ray

        ray.init(num_cpus=workers, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")
    options = ConvertOptions(engine="ray", progress=False) if engine == "ray" else ConvertOptions(
        workers=workers, progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        return timed_call(lambda: convert(Path(folder), Path(tmp) / "out.wds", options),
                          len(peers.image_files(Path(folder))))


CHILDREN = {"load_ffcv": peers.load_ffcv, "load_datapipe": peers.load_datapipe,
            "load_datapipe_threads": functools.partial(peers.load_datapipe, backend="threads"),
            "load_naive": peers.load_naive, "load_dali": peers.load_dali, "load_litdata": peers.load_litdata,
            "load_spdl": peers.load_spdl,
            "load_tdnodes_thread": functools.partial(peers.load_tdnodes, method="thread"),
            "load_tdnodes_process": functools.partial(peers.load_tdnodes, method="process"),
            "ceiling": peers.ceiling, "profile_datapipe": peers.profile_datapipe,
            "convert_litdata": convert_litdata, "convert_datapipe": convert_datapipe,
            "convert_datapipe_ray": functools.partial(convert_datapipe, engine="ray")}


# ---- driver -------------------------------------------------------------------------------------

PEER_PACKAGES = ("numpy", "numba", "opencv-python-headless", "pillow", "litdata==0.2.76", "spdl==0.8.0",
                 "torchdata==0.11.0")


def setup(venv: Path) -> None:
    """FFCV's apt libraries, then a venv with the CPU torch pinned (a constraints file keeps every
    later install from swapping it for a CUDA build), LitData, SPDL, torchdata and FFCV."""
    subprocess.run(["apt-get", "install", "-y", "-q", "libturbojpeg0-dev", "libopencv-dev", "pkg-config"], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pin = venv / "torch-constraint.txt"
    pin.write_text("torch==2.13.0\n")
    pip = [str(venv / "bin" / "pip"), "install", "-q", "-c", str(pin)]
    subprocess.run(pip + ["torch==2.13.0"], check=True)  # the CPU build first: peers would pull CUDA torch
    subprocess.run(pip + list(PEER_PACKAGES), check=True)
    subprocess.run(pip + ["--no-build-isolation", "ffcv==1.0.2"], check=True)
    torch = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    if not torch.endswith("+cpu"):
        sys.exit(f"{venv}: torch {torch} is not the CPU build; remove the venv and rerun --setup")


class TreeMeter(threading.Thread):
    """Samples a process tree until its root ends: per-process CPU ticks and the RSS sum every
    `interval` s, the PSS sum every `pss_every` samples, each with its time.monotonic."""

    def __init__(self, pid: int, interval: float = 0.05, pss_every: int = 10) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval, self.pss_every = pid, interval, pss_every
        self.samples: list[tuple[float, dict[int, int], int]] = []
        self.pss: list[tuple[float, int]] = []
        self.done = threading.Event()

    def tree(self) -> list[int]:
        try:
            return [self.pid, *descendants(self.pid)]
        except (FileNotFoundError, ProcessLookupError):
            return []

    def run(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        n = 0
        while not self.done.wait(self.interval):
            cpu, rss, pids = {}, 0, self.tree()
            for pid in pids:
                try:
                    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                    cpu[pid] = int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
                    rss += int(fields[21]) * page
                except (FileNotFoundError, ProcessLookupError, IndexError):
                    continue
            self.samples.append((time.monotonic(), cpu, rss))
            if n % self.pss_every == 0:
                self.pss.append((time.monotonic(), sum(pss(pid) for pid in pids)))
            n += 1

    def summary(self, t0: float, t1: float) -> dict:
        """CPU-seconds of the tree between t0 and t1, and its peak RSS and PSS sums (MB) then."""
        before = next((cpu for t, cpu, _ in reversed(self.samples) if t <= t0), {})
        inside = [(cpu, rss) for t, cpu, rss in self.samples if t0 <= t <= t1] or [({}, 0)]
        last: dict[int, int] = {}
        for cpu, _ in inside:
            last.update(cpu)
        ticks = sum(v - before.get(pid, 0) for pid, v in last.items())
        peak_pss = max((v for t, v in self.pss if t0 <= t <= t1),
                       default=next((v for t, v in self.pss if t >= t0), 0))  # a window shorter than pss_every
        return {"cpu_s": ticks / os.sysconf("SC_CLK_TCK"), "peak_rss_mb": max(r for _, r in inside) / 2**20,
                "peak_pss_mb": peak_pss / 2**20}


def pss(pid: int) -> int:
    try:
        return memory(pid)["pss"]
    except (FileNotFoundError, ProcessLookupError, KeyError):
        return 0


def run_child(python: str, name: str, data: str, workers: int, epochs: int, script: str = __file__,
              pythonpath: str | None = None) -> dict:
    """One row in a fresh process (`script --child name data workers epochs`, which prints one JSON
    line): its result plus the tree's CPU-s per 1,000 images, peak RSS, PSS. `pythonpath`: the tree
    the child imports datapipe from (default: this one)."""
    env = {**os.environ, "PYTHONPATH": pythonpath or str(ROOT)}
    child = subprocess.Popen([python, script, "--child", name, data, str(workers), str(epochs)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    meter = TreeMeter(child.pid)
    meter.start()
    out, err = child.communicate()
    meter.done.set()
    meter.join()
    if child.returncode:
        sys.exit(f"{name} {data} failed:\n{err[-3000:]}")
    result = json.loads(out.splitlines()[-1])
    used = meter.summary(result["t0"], result["t1"])
    return {**result, "cpu_s_per_1k": 1e3 * used.pop("cpu_s") / result["images"], **used}


def prepare(folder: Path, work: Path, peers_python: str, workers: int) -> dict[str, Path]:
    """The loaders' inputs, built once per folder (not timed): the list of good files, a .beton,
    LitData's optimize output, an LMDB and a .wds of the folder."""
    work.mkdir(parents=True, exist_ok=True)
    out = {kind: work / f"{folder.name}.{kind}" for kind in ("good.json", "beton", "litdata", "lmdb", "wds")}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not out["good.json"].exists():
        out["good.json"].write_text(json.dumps(peers.good_files(folder)))
    if not out["beton"].exists():
        subprocess.run([peers_python, __file__, "--child", "write_beton", str(folder), str(out["beton"]), str(workers)],
                       env=env, check=True)
    if not out["litdata"].exists():
        subprocess.run([peers_python, __file__, "--child", "write_litdata", str(out["good.json"]), str(out["litdata"]),
                        str(workers)], env=env, check=True)
    for kind in ("lmdb", "wds"):
        if not out[kind].exists():
            subprocess.run([sys.executable, "-m", "datapipe", "convert", str(folder), str(out[kind])], check=True)
    return out


def loader_rows(inputs: dict[str, Path], peers_python: str) -> dict[str, tuple[str, str, str]]:
    """row -> (python, child, input) for every loader; datapipe's `threads` backend where it exists."""
    from datapipe.backends import BACKENDS

    good, me = str(inputs["good.json"]), sys.executable
    rows = {"load: FFCV .beton (anchor)": (peers_python, "load_ffcv", str(inputs["beton"])),
            "load: SPDL PipelineBuilder, threads": (peers_python, "load_spdl", good),
            "load: torchdata.nodes ParallelMapper, threads": (peers_python, "load_tdnodes_thread", good),
            "load: torchdata.nodes ParallelMapper, processes": (peers_python, "load_tdnodes_process", good),
            "load: LitData StreamingDataLoader": (peers_python, "load_litdata", str(inputs["litdata"])),
            "load: DALI CPU pipeline": (me, "load_dali", good),
            "load: naive DataLoader + ImageFolder-style": (me, "load_naive", good),
            "load: datapipe dataloader, LMDB": (me, "load_datapipe", str(inputs["lmdb"])),
            "load: datapipe dataloader, .wds": (me, "load_datapipe", str(inputs["wds"]))}
    if "threads" in BACKENDS:
        rows["load: datapipe threads, LMDB"] = (me, "load_datapipe_threads", str(inputs["lmdb"]))
        rows["load: datapipe threads, .wds"] = (me, "load_datapipe_threads", str(inputs["wds"]))
    rows[CEILING] = (me, "ceiling", str(inputs["lmdb"]))
    return rows


def convert_rows(folder: Path, peers_python: str) -> dict[str, tuple[str, str, str]]:
    return {"convert: LitData optimize (anchor)": (peers_python, "convert_litdata", str(folder)),
            "convert: datapipe convert .wds": (sys.executable, "convert_datapipe", str(folder)),
            "convert: datapipe convert .wds --engine ray": (sys.executable, "convert_datapipe_ray", str(folder))}


def measure(rows: dict[str, tuple], passes: int, workers: int, epochs: int,
            script: str = __file__) -> dict[str, list[dict]]:
    """Every row once a pass, in order on odd passes and reversed on even ones; `script` runs the
    children (tools/peer_recipes.py has its own). A row is (python, child, input) or (python, child,
    input, PYTHONPATH) for a child that imports datapipe from another tree."""
    results: dict[str, list[dict]] = {row: [] for row in rows}
    for n in range(passes):
        for row in (list(rows) if n % 2 == 0 else list(reversed(rows))):
            python, child, data, *path = rows[row]
            results[row].append(run_child(python, child, data, workers, epochs, script, *path))
            print(f"pass {n + 1}: {row}: {results[row][-1]['images_per_s']:.0f} img/s", file=sys.stderr, flush=True)
    return results


def compare(folder: Path, args: argparse.Namespace, peers_python: str) -> dict:
    """One corpus: its tables (and datapipe's profile), returned for the JSON file."""
    inputs = prepare(folder, args.work, peers_python, args.workers)
    rows = {}
    if args.only in (None, "load"):
        rows.update(loader_rows(inputs, peers_python))
    if args.only in (None, "convert"):
        rows.update(convert_rows(folder, peers_python))
    results = measure(rows, args.passes, args.workers, args.epochs)
    print(f"\n{folder} ({args.workers} workers, {args.passes} passes, {args.epochs} timed epochs)")
    print_table(results)
    report = {"runs": results}
    if args.only in (None, "load"):
        report["profile"] = child_json("profile_datapipe", str(inputs["lmdb"]))
        print_profile(report["profile"], results)
    return report


def child_json(name: str, data: str) -> dict:
    """A child that is not a timed row (the profile): its JSON line."""
    done = subprocess.run([sys.executable, __file__, "--child", name, data, "0", "1"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        sys.exit(f"{name} {data} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", type=Path, nargs="*", help="image folders (ImageNet layout), one table each")
    parser.add_argument("--setup", action="store_true", help="install the peers in --peers-venv")
    parser.add_argument("--peers-venv", type=Path, default=ROOT / "build" / "peers-venv")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "peers")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=peers.EPOCHS, help="timed epochs per run (after a warm-up)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", choices=("load", "convert"), help="measure one table only")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return run_as_child(*args.child)
    if args.setup:
        setup(args.peers_venv)
        return 0
    if not args.folders:
        parser.error("give the image folder(s) to compare on")
    peers_python = str(args.peers_venv / "bin" / "python")
    if not Path(peers_python).exists():
        sys.exit(f"no peers venv at {args.peers_venv}: run with --setup first")
    machine = machine_description()
    print(f"machine: {machine['cpu']}, {machine['cpus']} CPUs, SIMD: {' '.join(machine['simd']) or 'baseline'}")
    reports = {str(folder): compare(folder, args, peers_python) for folder in args.folders}
    if args.json:
        args.json.write_text(json.dumps({"workers": args.workers, "passes": args.passes, "epochs": args.epochs,
                                         "machine": machine, "corpora": reports}, indent=1))
    return 0


def machine_description() -> dict:
    """The CPU the figures were taken on (Linux): its model and vector extensions. Peers that compile
    for the host CPU (FFCV's numba pipeline) or dispatch on it (OpenCV) move with them."""
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    simd = sorted(f for f in flags if f.startswith(("avx", "sse4", "amx")))
    return {"cpu": model, "cpus": os.cpu_count(), "simd": simd}


def run_as_child(name: str, *rest: str) -> int:
    if name in ("write_beton", "write_litdata"):
        getattr(peers, name)(rest[0], rest[1], int(rest[2]))
        return 0
    print(json.dumps(CHILDREN[name](rest[0], int(rest[1]), int(rest[2]))))
    return 0


def print_table(results: dict[str, list[dict]]) -> None:
    """Medians of every row; ratios to the anchor of its table and, for loaders, to the ceiling."""
    median = {row: {key: statistics.median(r[key] for r in runs) for key in runs[0] if key not in ("t0", "t1")}
              for row, runs in results.items()}
    ceiling = median.get(CEILING, {}).get("images_per_s")
    anchor = 0.0
    print(f"| {'row':<48} | img/s | vs anchor | vs ceiling | CPU-s/1k img | peak RSS MB | peak PSS MB | runs img/s |")
    print(f"|{'-' * 50}|-------|-----------|------------|--------------|-------------|-------------|------------|")
    for row, m in median.items():
        rate = m["images_per_s"]
        if "(anchor)" in row:
            anchor = rate
        vs_ceiling = f"{rate / ceiling:9.2f}x" if ceiling and row.startswith(("load", "ceiling")) else " " * 10
        runs = ", ".join(f"{r['images_per_s']:.0f}" for r in results[row])
        print(f"| {row:<48} | {rate:5,.0f} | {rate / anchor:8.2f}x | {vs_ceiling} | {m['cpu_s_per_1k']:12.2f} | "
              f"{m['peak_rss_mb']:11,.0f} | {m['peak_pss_mb']:11,.0f} | {runs} |")


def print_profile(profile: dict, results: dict[str, list[dict]]) -> None:
    """Where datapipe's LMDB row goes beyond the ceiling: one core's ms per image, part by part."""
    one_core = statistics.median(r["one_core"] for r in results[CEILING])
    row = results["load: datapipe threads, LMDB"]
    cpu_ms = statistics.median(r["cpu_s_per_1k"] for r in row)
    print(f"\ndatapipe threads, LMDB: {cpu_ms:.2f} CPU-ms per image; the ceiling's work "
          f"alone {1e3 / one_core:.2f} ms. In one thread (num_workers=0; split by cProfile), "
          f"{profile['cpu_ms_per_image']:.2f} CPU-ms per image:")
    for part, ms in profile["ms_per_image"].items():
        print(f"  {part:<40} {ms:6.2f} ms")
    print(f"  {'threads: hand-offs, GIL, consumer':<40} {cpu_ms - profile['cpu_ms_per_image']:6.2f} ms "
          f"(the row's CPU-ms per image less the one-thread figure)")


if __name__ == "__main__":
    raise SystemExit(main())
