"""Where the Triton forward's host time goes at B1 H8 N128 D64 (the per-call target shape)."""
import argparse, cProfile, io, json, pstats, time
import torch
import attnkit
parser = argparse.ArgumentParser(); parser.add_argument("--out"); args = parser.parse_args()
res = {}
for causal in (True, False):
    q, k, v = (torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    call = lambda: attnkit.attention(q, k, v, causal=causal, backend="triton")
    raw = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    with torch.no_grad():
        for _ in range(50):
            call(); raw()
        torch.cuda.synchronize()
        loops = {"attnkit": [], "raw": []}
        for _ in range(7):
            for name, fn in (("attnkit", call), ("raw", raw)):
                t = time.perf_counter()
                for _ in range(500):
                    fn()
                loops[name].append((time.perf_counter() - t) / 500 * 1e6)
                torch.cuda.synchronize()
        pr = cProfile.Profile(); pr.enable()
        for _ in range(2000):
            call()
        pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30)
    res[f"causal={causal}"] = {"loops_us": loops, "profile": s.getvalue()}
    print(causal, {k_: min(v_) for k_, v_ in loops.items()}); print(s.getvalue())
json.dump(res, open(args.out, "w"), indent=1)
