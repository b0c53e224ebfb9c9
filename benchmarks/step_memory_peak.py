"""Diagnosis: the live CUDA blocks at the peak of one training step, stock vs converted.
Usage: python benchmarks/step_memory_peak.py MODE FAMILY SIZE VOCAB  (MODE: eager, compile or
reduce-overhead; FAMILY / SIZE as in `--what models`; VOCAB 0: the benchmark's own)"""
import gc, sys
import torch
import cutlass_nn
from cutlass_nn.bench import models as M

mode, fam, size_name, vocab = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
import dataclasses
size = M.MODEL_SIZES[size_name]
if vocab:
    size = dataclasses.replace(size, vocab=vocab)
batches = M.make_batches(size, 4, "cuda")

def frames(entry):
    keep = []
    for f in entry.get("frames") or []:
        fn = f.get("filename", "")
        if fn.endswith(".py") and any(k in fn for k in ("cutlass_nn", "transformers", "_inductor", "autograd", "optim", "functional")):
            keep.append(f"{fn.split('site-packages/')[-1].split('/work/')[-1]}:{f['line']} {f['name']}")
    return keep[:4]

for side in ("stock", "cutlass_nn"):
    torch._dynamo.reset(); gc.collect(); torch.cuda.empty_cache()
    with torch.device("cuda"):
        model = M.build_model(fam, size).to(dtype=torch.bfloat16)
    if side == "cutlass_nn":
        model = M.convert_side(model)
    tr = M.Trainer(model, mode, "cuda")
    for i in range(3):
        tr.step(batches[i % 4])
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=500000, stacks="python")
    torch.cuda.reset_peak_memory_stats()
    tr.step(batches[3]); torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    live, cur, best, best_live = {}, 0, -1, None
    for e in snap["device_traces"][0]:
        if e["action"] == "alloc":
            live[e["addr"]] = e; cur += e["size"]
        elif e["action"] == "free_completed" and e["addr"] in live:
            cur -= live.pop(e["addr"])["size"]
        if cur > best:
            best, best_live = cur, dict(live)
    print(f"== {side}: base {base/2**20:.0f} MiB, step peak {(peak-base)/2**20:.0f} MiB above base; "
          f"traced live at peak {best/2**20:.0f} MiB in {len(best_live)} blocks")
    for e in sorted(best_live.values(), key=lambda e: -e["size"])[:10]:
        print(f"   {e['size']/2**20:8.1f} MiB  {' <- '.join(frames(e))}")
    del tr, model
