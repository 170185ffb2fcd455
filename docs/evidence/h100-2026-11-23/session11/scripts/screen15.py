"""Compile attnkit's Triton kernels for sm_90a on the CPU (triton of PYTHONPATH) and report
compile success, shared memory, registers and spills (ptxas -v) per candidate config.
    PYTHONPATH=/work/triton36:src python scratch/screen15.py
"""
import os, re, subprocess, sys, tempfile, time, json
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="screen15-"))
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnkit.triton.forward_kernels import _attn_fwd_kernel
from attnkit.triton.backward_kernels import _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel

KERNELS = {"fwd": _attn_fwd_kernel, "dkdv": _attn_bwd_dkdv_kernel, "dq": _attn_bwd_dq_kernel}
DESC = {"fwd": ("K", "V"), "dkdv": ("Q", "DO"), "dq": ("K", "V")}
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")

def compile_one(kernel_name, d, causal, bm, bn, warps, stages, tma, ws=False, dtype="bf16"):
    kernel = KERNELS[kernel_name]
    consts = dict(HEAD_DIM=d, HEAD_PAD=d, VALUE_DIM=d, VALUE_PAD=d, BLOCK_M=bm, BLOCK_N=bn,
                  CAUSAL=causal, WINDOW=False, DOT_PRECISION="tf32", TMA=tma)
    if kernel_name == "fwd":
        consts.update(NEGATE_Q=False)
    types, attrs = {}, {}
    desc_block = bn if kernel_name != "dkdv" else bm
    for i, name in enumerate(kernel.arg_names):
        if name in consts:
            types[name] = "constexpr"
        elif name.isupper():
            if tma and name in DESC[kernel_name]:
                types[name] = f"tensordesc<{dtype}[1, 1, {desc_block}, {d}]>"
            else:
                types[name] = "*fp32" if name in ("LSE", "DELTA") else f"*{dtype}"
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            types[name] = "fp32" if name in ("qk_scale", "scale") else "i32"
    src = ASTSource(kernel, types, constexprs=consts, attrs=attrs)
    t0 = time.perf_counter()
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    secs = time.perf_counter() - t0
    ptx = ck.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    out = subprocess.run([PTXAS, "-arch=sm_90a", "-v", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    info = out.stderr
    regs = re.search(r"Used (\d+) registers", info)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
    ws_found = "setmaxnreg" in ptx
    return dict(kernel=kernel_name, d=d, causal=causal, cfg=f"{bm}x{bn}-w{warps}-s{stages}{'-ws' if ws else ''}",
                tma=tma, shared=ck.metadata.shared, regs=int(regs.group(1)) if regs else None,
                spill=(int(spill.group(1)), int(spill.group(2))) if spill else None, setmaxnreg=ws_found,
                seconds=round(secs, 1))

if __name__ == "__main__":
    todo = json.loads(sys.argv[1])
    for item in todo:
        try:
            print(compile_one(*item), flush=True)
        except Exception as e:
            print(item, "FAILED", type(e).__name__, str(e).splitlines()[0][:300] if str(e) else "", flush=True)
