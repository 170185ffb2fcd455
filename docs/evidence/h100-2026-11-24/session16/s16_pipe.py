"""Issue 15 experiment: the Triton forward's unmasked key loop software-pipelined by hand (the
next block's QK^T issued before the current block's softmax and PV, so the tensor cores can
run during the exponentials), with the table's tile and 128-row tiles, against the committed
table and cuDNN, on the H100. Each variant runs in its own process on a patched copy of src.
    python scratch/s16_pipe.py --out pipe.json"""
import argparse, json, os, shutil, subprocess, sys, tempfile
from pathlib import Path

SHAPES = [  # (B, H, N, D, causal)
    (4, 16, 4096, 128, False), (4, 16, 4096, 128, True),
    (2, 16, 8192, 128, False), (2, 16, 8192, 128, True),
    (4, 32, 4096, 64, False), (4, 32, 4096, 64, True),
]
VARIANTS = {  # name: (pipelined, fwd config or None for the table)
    "table": (False, None),
    "pipe-table": (True, None),
    "m128n128w8s3": (False, dict(block_m=128, block_n=128, num_warps=8, num_stages=3)),
    "pipe-m128n128w8s3": (True, dict(block_m=128, block_n=128, num_warps=8, num_stages=3)),
    "pipe-m128n64w8s3": (True, dict(block_m=128, block_n=64, num_warps=8, num_stages=3)),
    "pipe-m64n64w4s2": (True, dict(block_m=64, block_n=64, num_warps=4, num_stages=2)),
    "pipe-m64n128w4s2": (True, dict(block_m=64, block_n=128, num_warps=4, num_stages=2)),
}
if os.environ.get("S16_VARIANTS"):
    VARIANTS = {k: v for k, v in VARIANTS.items() if k == "table" or k in os.environ["S16_VARIANTS"].split(",")}
PIPELINED = """
    if not MASKED:
        # Hand-pipelined: block j+1's scores are issued before block j's softmax and PV.
        if start_n < end_n:
            k = _head_rows_tile(K, k_offs, stride_kn, batch, kv_head, start_n, start_n + offs_n, kv_len, offs_d,
                                HEAD_DIM, HEAD_PAD, BLOCK_N, MASKED, TMA)
            qk = _dot(q, tl.trans(k), None, DOT_PRECISION)
            for start in range(start_n + BLOCK_N, end_n, BLOCK_N):
                cols = start + offs_n
                k = _head_rows_tile(K, k_offs, stride_kn, batch, kv_head, start, cols, kv_len, offs_d,
                                    HEAD_DIM, HEAD_PAD, BLOCK_N, MASKED, TMA)
                qk_next = _dot(q, tl.trans(k), None, DOT_PRECISION)
                m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
                p = tl.exp2(qk * qk_scale - m_new[:, None])
                alpha = tl.exp2(m_i - m_new)
                l_i = l_i * alpha + tl.sum(p, 1)
                v = _head_rows_tile(V, v_offs, stride_vn, batch, kv_head, start - BLOCK_N, cols - BLOCK_N, kv_len,
                                    offs_dv, VALUE_DIM, VALUE_PAD, BLOCK_N, MASKED, TMA)
                acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], DOT_PRECISION)
                m_i = m_new
                qk = qk_next
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.exp2(qk * qk_scale - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            last = end_n - BLOCK_N
            v = _head_rows_tile(V, v_offs, stride_vn, batch, kv_head, last, last + offs_n, kv_len,
                                offs_dv, VALUE_DIM, VALUE_PAD, BLOCK_N, MASKED, TMA)
            acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], DOT_PRECISION)
            m_i = m_new
        return acc, l_i, m_i
"""
ANCHOR = '    """Online softmax over keys [start_n, end_n); ``qk_scale >= 0`` (see the kernel)."""\n'


def side(variant):
    import torch
    import attnkit
    from attnkit_perf.measure.timing import median_time_s
    rows = []
    for b, h, n, d, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        flops = 4 * b * h * n * n * d / (2 if causal else 1)
        row = {"shape": [b, h, n, d, causal]}
        for backend in ("triton", "sdpa-cudnn") if variant == "table" else ("triton",):
            fn = lambda: attnkit.attention(q, k, v, causal=causal, backend=backend)
            try:
                out = fn()
                ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
                row[backend + "_err"] = float((out.float() - ref).abs().max())
                t = median_time_s(fn, torch.device("cuda"), budget_s=0.3)
                row[backend + "_ms"] = t * 1e3
                row[backend + "_tflops"] = flops / t / 1e12
            except Exception as e:  # a variant that does not compile is a result too
                row[backend + "_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        print(variant, row, file=sys.stderr, flush=True)
    print(json.dumps(rows))


def main():
    p = argparse.ArgumentParser(); p.add_argument("--out"); p.add_argument("--side")
    a = p.parse_args()
    if a.side:
        return side(a.side)
    root = Path(__file__).resolve().parent.parent
    table = json.loads((root / "src/attnkit/triton/configs/nvidia-h100-80gb-hbm3.json").read_text())
    results = {}
    for name, (ws, fwd) in VARIANTS.items():
        tmp = Path(tempfile.mkdtemp())
        shutil.copytree(root / "src", tmp / "src")
        if ws:
            f = tmp / "src/attnkit/triton/forward_kernels.py"
            s = f.read_text(); assert ANCHOR in s
            f.write_text(s.replace(ANCHOR, ANCHOR + PIPELINED))
        env = dict(os.environ, PYTHONPATH=f"{tmp/'src'}:{os.environ.get('PYTHONPATH', '')}")
        if fwd:
            t = json.loads(json.dumps(table))
            for fam in t["families"].values():
                fam["fwd"] = fwd
            (tmp / "table.json").write_text(json.dumps(t))
            env["ATTNKIT_TRITON_CONFIG"] = str(tmp / "table.json")
        r = subprocess.run([sys.executable, __file__, "--side", name], env=env, capture_output=True, text=True, timeout=400)
        try:
            results[name] = json.loads(r.stdout.strip().splitlines()[-1])
        except Exception:
            results[name] = {"error": r.stderr[-2000:]}
        print(name, "rc", r.returncode, flush=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    base = {tuple(r["shape"]): r for r in results["table"]}
    for name, rows in results.items():
        if isinstance(rows, dict):
            print(f"{name}: FAILED {rows['error'][-300:]}"); continue
        cells = []
        for r in rows:
            cud = base[tuple(r["shape"])].get("sdpa-cudnn_tflops")
            tf = r.get("triton_tflops")
            cells.append(f"{tf/cud:.2f}" if tf and cud else "err")
        print(f"{name:18s} triton/cudnn: " + " ".join(cells))
    print("shapes:", SHAPES)
    print("cudnn TFLOP/s:", [round(base[tuple(r['shape'])].get('sdpa-cudnn_tflops', 0)) for r in results['table']])


if __name__ == "__main__":
    main()
