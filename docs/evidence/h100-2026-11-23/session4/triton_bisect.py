"""Bisect the Triton illegal memory access / wrong rows found by the ci profile on the H100
(test_window_zero_returns_the_aligned_value[triton]'s problem, without its window): each variant
in a fresh process (an illegal access poisons the context), CUDA_LAUNCH_BLOCKING=1, forward only,
compared with the naive path in float64."""
import json, os, subprocess, sys
BASE = dict(batch=4, q_heads=2, kv_heads=1, q_len=1, kv_len=46, head_dim=40, value_dim=24, causal=False,
            dtype="float16", scale=-0.18456691482860818, q_layout="expanded", kv_layout="strided",
            magnitude="large", seed=1309075932, window=None)
VARIANTS = {
    "as-drawn": {}, "no-fast-launch": {"_env": {"ATTNKIT_FAST_LAUNCH": "0"}},
    "q-contiguous": {"q_layout": "contiguous"}, "kv-contiguous": {"kv_layout": "contiguous"},
    "positive-scale": {"scale": 0.18}, "dv40": {"value_dim": 40}, "mha": {"q_heads": 1},
    "batch1": {"batch": 1}, "bf16": {"dtype": "bfloat16"}, "d64-dv64": {"head_dim": 64, "value_dim": 64},
    "d64-dv24": {"head_dim": 64}, "d40-dv32": {"value_dim": 32}, "d40-dv16": {"value_dim": 16},
    "both-contiguous": {"q_layout": "contiguous", "kv_layout": "contiguous"},
}
def child(spec):
    import torch
    sys.path[:0] = ["src", "tests/correctness"]  # run from the repository root
    from strategies import Problem
    import attnkit
    spec["dtype"] = getattr(torch, spec["dtype"]); spec["window"] = tuple(spec["window"]) if spec["window"] else None
    p = Problem(**spec)
    q, k, v, g = p.tensors("cuda")
    print("strides", q.stride(), k.stride(), v.stride(), flush=True)
    out = attnkit.attention(q, k, v, causal=p.causal, scale=p.scale, window=p.window, backend="triton")
    torch.cuda.synchronize()
    ref = attnkit.attention(q.double(), k.double(), v.double(), causal=p.causal, scale=p.scale, window=p.window, backend="naive")
    print(f"forward ok max|diff| {float((out.double() - ref).abs().max()):.3e}", flush=True)
if __name__ == "__main__":
    if len(sys.argv) > 1:
        child(json.loads(sys.argv[1])); sys.exit(0)
    only = os.environ.get("ONLY")
    for name, change in VARIANTS.items():
        if only and name not in only.split(","):
            continue
        change = dict(change); extra = change.pop("_env", {})
        env = {**os.environ, "CUDA_LAUNCH_BLOCKING": "1", **extra}
        cmd = [sys.executable, __file__, json.dumps({**BASE, **change})]
        if os.environ.get("SANITIZE"):
            r = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--print-limit", "2", *cmd], capture_output=True, text=True, env=env, timeout=150)
            print("\n".join((r.stdout + r.stderr).splitlines()[:60]), flush=True)
            continue
        if False:
            cmd = ["compute-sanitizer", "--tool", "memcheck", "--print-limit", "3", *cmd]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=150)
        except subprocess.TimeoutExpired:
            print(f"{name:16s} timeout", flush=True); continue
        lines = (r.stdout + r.stderr).strip().splitlines()
        keep = [l for l in lines if "ok" in l or "rror" in l or "Invalid" in l or "at " in l[:8] or "by thread" in l or "Address" in l]
        print(f"{name:16s} rc={r.returncode} " + " | ".join(keep[:12])[:1500], flush=True)
