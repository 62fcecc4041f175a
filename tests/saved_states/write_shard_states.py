"""Wrote tests/saved_states/loader_shards.json and loader_mix_shards.json with the code at 8b2a9ad, before #49
renamed shard interleaving's `mix_shards` to `interleave_shards` (their states carry the old key; run from the
repository root: python tests/saved_states/write_shard_states.py tests/saved_states WORKDIR)."""
import json, sys
from pathlib import Path
from converters import ConvertOptions, convert
from datapipe import Mix, make_loader

out, work = Path(sys.argv[1]), Path(sys.argv[2])
packed = {}
for suffix in (".lmdb", ".wds"):
    dst = work / f"fixture{suffix}"
    if not dst.exists():
        convert(Path("fixtures/imagefolder"), dst, ConvertOptions(workers=2, progress=False, shard_bytes=64 << 10))
    packed[suffix] = str(dst)
SMALL = dict(batch_size=5, image_size=32, num_workers=1, sampling="shards", mix_shards=3)

def write(name, source, shown, **extra):
    loader = make_loader(source, backend="threads", **SMALL, **extra)
    loader.set_epoch(1)
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = loader.state_dict()
    batch = next(it)
    following = {f: [int(v) for v in getattr(batch, f)] for f in shown}
    (out / f"{name}.json").write_text(json.dumps({"state": state, "next_batch": following}, indent=1) + "\n")
    print(name, following)

write("loader_shards", packed[".wds"], ["indices"])
write("loader_mix_shards", Mix({"web": packed[".wds"], "lm": packed[".lmdb"]}, weights={"web": 0.6, "lm": 0.4}),
      ["sources", "indices"], fields=("image", "label", "source"))
