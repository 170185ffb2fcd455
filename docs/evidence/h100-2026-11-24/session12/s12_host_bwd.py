"""Host vs GPU time of the Triton backward through autograd (the grid's bwd case), with a
cProfile of the host side: where a short backward's time goes."""
import argparse, cProfile, io, json, pstats, time
import torch
import attnkit
from attnkit_perf.measure.timing import median_time_s

parser = argparse.ArgumentParser(); parser.add_argument("--out"); args = parser.parse_args()
dev = torch.device("cuda")
result = {}
for name, (b, h, n, d, causal) in {"B4-H16-N1024-D128-causal": (4, 16, 1024, 128, True),
                                   "B4-H32-N1024-D64-causal": (4, 32, 1024, 64, True),
                                   "B1-H8-N128-D64-causal": (1, 8, 128, 64, True)}.items():
    for backend in ("triton", "sdpa-cudnn"):
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v, go = (torch.randn(b, h, n, d, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(4))
        for x in (q, k, v): x.requires_grad_()
        out = attnkit.attention(q, k, v, causal=causal, backend=backend)
        step = lambda: torch.autograd.grad(out, (q, k, v), go, retain_graph=True)
        for _ in range(20): step()
        torch.cuda.synchronize()
        calls = 300
        t0 = time.perf_counter()
        for _ in range(calls): step()
        t1 = time.perf_counter(); torch.cuda.synchronize(); t2 = time.perf_counter()
        timed = median_time_s(step, dev)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10): step()
            torch.cuda.synchronize()
        gpu = sum(getattr(e, 'self_device_time_total', 0.0) for e in prof.key_averages()) / 10
        row = {"host_us": 1e6 * (t1 - t0) / calls, "wall_us": 1e6 * (t2 - t0) / calls,
               "protocol_us": 1e6 * timed, "gpu_kernels_us": gpu}
        result[f"{backend} {name}"] = row
        print(f"== {backend} {name}: {row}", flush=True)
        if backend == "triton":
            pr = cProfile.Profile(); pr.enable()
            for _ in range(calls): step()
            pr.disable(); torch.cuda.synchronize()
            s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30); print(s.getvalue()[:7000])
json.dump(result, open(args.out, "w"), indent=1)
