"""Is the low peak reading of the tiled backward the previous step's gradients, still held by the
autograd engine's device thread? Tiled, float32, B1 H16 N4096 D128 causal, fwd+bwd step.
Readings: (a) one call each, back to back (the old test's method); (b) the same, each after a
tiny CUDA backward has gone through the engine (its device thread must have finished the
previous graph task's loop iteration first); (c) attnkit_perf's peak_extra_bytes (settled, largest of 3).
With and without 16 busy processes loading the CPU."""
import argparse, json, multiprocessing as mp, os, sys, time
import torch
sys.path.insert(0, "tests/correctness")
from attnkit_perf.measure.timing import peak_extra_bytes
from test_memory import _train_step


def busy(stop):
    while not stop.is_set():
        sum(i * i for i in range(10000))


def one(step, dev):
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    r = step()
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev) - before
    del r
    return peak


def main():
    ap = argparse.ArgumentParser(); ap.add_argument("--out"); ap.add_argument("--n", type=int, default=30)
    a = ap.parse_args()
    dev = torch.device("cuda")
    step = _train_step("tiled", 4096, dev, d=128, heads=16)
    tiny = torch.ones(4, device=dev, requires_grad=True)
    step(); step()
    res = {}
    for load in (True,):
        stop = mp.Event(); procs = []
        if load:
            procs = [mp.Process(target=busy, args=(stop,)) for _ in range(16)]
            [p.start() for p in procs]; time.sleep(1)
        key = "loaded" if load else "quiet"
        res[key + "_single"] = [one(step, dev) for _ in range(a.n)]
        flushed = []
        for _ in range(a.n):
            step_result = step(); torch.cuda.synchronize(dev); del step_result
            torch.autograd.grad(tiny.sum() * 2, tiny)  # through the engine's device thread
            flushed.append(one(step, dev))
        res[key + "_after_tiny_backward"] = flushed
        res[key + "_peak_extra_bytes"] = [peak_extra_bytes(step, dev) for _ in range(a.n)]
        stop.set(); [p.join() for p in procs]
    for k, v in res.items():
        print(k, {x / 2**20: v.count(x) for x in sorted(set(v))})
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
