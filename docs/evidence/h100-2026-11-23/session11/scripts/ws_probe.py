"""One forward config compiled for sm_90a with warp_specialize on the unmasked loop; prints
whether the TTGIR holds a warp_specialize partition op and whether the PTX reallocates registers."""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from attnkit.triton.forward_kernels import _attn_fwd_kernel as kernel
d, causal, bm, bn, w, st = json.loads(sys.argv[1])
consts = dict(HEAD_DIM=d, HEAD_PAD=d, VALUE_DIM=d, VALUE_PAD=d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, WINDOW=False,
              DOT_PRECISION="tf32", TMA=True, NEGATE_Q=False, WARP_SPECIALIZE=True)
types, attrs = {}, {}
for i, n in enumerate(kernel.arg_names):
    if n in consts: types[n] = "constexpr"
    elif n.isupper():
        if n in ("K", "V"): types[n] = f"tensordesc<bf16[1, 1, {bn}, {d}]>"
        else: types[n] = "*fp32" if n == "LSE" else "*bf16"; attrs[(i,)] = [["tt.divisibility", 16]]
    else: types[n] = "fp32" if n == "qk_scale" else "i32"
ck = triton.compile(ASTSource(kernel, types, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                    options={"num_warps": w, "num_stages": st})
g = ck.asm["ttgir"]
print(json.dumps({"config": sys.argv[1], "triton": triton.__version__, "loop_attr_tt.warp_specialize": "tt.warp_specialize" in g,
                  "ttg.warp_specialize_ops": g.count("ttg.warp_specialize"), "ptx_setmaxnreg": "setmaxnreg" in ck.asm["ptx"]}))
