"""On a GPU: the DALI graph of every op kind under DALI_ENABLE_CSE unset, 0, and DALI_OPTIMIZE_GRAPH=0, then the
smallest kind set that fails to build (the session-18 H100 finding, benchmarks/gpu-h100-session18). Run: python tools/dali_cse_probe.py"""
import os, subprocess, sys
if len(sys.argv) > 1 and sys.argv[1] == "rows":
    import torch
    from datapipe.doctor.selftest import recipe_ops as R
    try:
        rows = R.recipe_op_results(torch.device("cuda", 0))
        print("rows:", len(rows), "failing:", [f"{r.check}:{r.figure}" for r in rows if r.status != "pass"])
        for r in rows: print("  ", r.check, r.status, r.figure)
    except Exception as e:
        print("error:", type(e).__name__, str(e).splitlines()[0][:200])
    sys.exit()
if len(sys.argv) > 1 and sys.argv[1] == "prefix":
    from datapipe.augment.ops import KINDS
    from datapipe.augment.slots import OpBounds as OB
    from datapipe.doctor.selftest import recipe_ops as R
    images = R.synthetic_images()[:1]
    def build(kinds):
        R.OpBounds = lambda n, _k: OB(n, tuple(kinds))
        try:
            R.run_graph(images, [((0, 0.0),)], device_id=0); return None
        except Exception as e:
            return str(e).splitlines()[0][:120]
    for k in range(3, len(KINDS) + 1):
        err = build(KINDS[:k])
        print(k, KINDS[k - 1], err or "ok", flush=True)
        if err: break
    if err:  # drop kinds from the front while it still fails
        kinds = list(KINDS[:k])
        for name in list(kinds[1:-1]):
            trial = [x for x in kinds if x != name]
            if build(trial): kinds = trial
        print("minimal failing set:", kinds, build(kinds))
    sys.exit()
for label, env in (("default", {}), ("DALI_ENABLE_CSE=0", {"DALI_ENABLE_CSE": "0"}),
                   ("DALI_OPTIMIZE_GRAPH=0", {"DALI_OPTIMIZE_GRAPH": "0"})):
    print("==", label, flush=True)
    subprocess.run([sys.executable, __file__, "rows"], env={**os.environ, **env}, timeout=120)
print("== prefix search (default)", flush=True)
subprocess.run([sys.executable, __file__, "prefix"], timeout=200)
