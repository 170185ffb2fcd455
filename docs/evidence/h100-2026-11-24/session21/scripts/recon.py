"""Session 21 recon: triton 3.6 launcher internals and our kernels' compiled signatures."""
import inspect, json, os, sys, shutil
import torch, triton
out_dir = os.environ["W"]
import triton.backends.nvidia.driver as drv
import triton.backends.nvidia.compiler as comp
import triton.runtime.jit as jit
import triton.knobs as knobs
for mod, name in ((drv, "driver.py"), (comp, "compiler.py"), (jit, "jit.py"), (knobs, "knobs.py")):
    shutil.copy(inspect.getsourcefile(mod), os.path.join(out_dir, name))
c_src = os.path.join(os.path.dirname(drv.__file__), "driver.c")
if os.path.exists(c_src):
    shutil.copy(c_src, os.path.join(out_dir, "driver.c"))
try:
    src = drv.make_launcher({}, {0: "*bf16", 1: "i32", 2: "fp32", 3: "constexpr"}, None)
    open(os.path.join(out_dir, "launcher_example.c"), "w").write(src)
except Exception as e:
    print("make_launcher", repr(e))
import attnkit
from attnkit.triton import launch as L, decode as D, fast_launch as F
report = {"triton": triton.__version__, "torch": torch.__version__}
def describe(kl):
    out = {}
    for key, entry in kl._entries.items():
        pass
    return out
q = torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.bfloat16)
k, v = torch.randn_like(q), torch.randn_like(q)
for _ in range(2):
    attnkit.attention(q, k, v, causal=True, backend="triton")
qd = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
kd = torch.randn(1, 8, 4096, 128, device="cuda", dtype=torch.bfloat16)
vd = torch.randn_like(kd)
for _ in range(2):
    attnkit.attention(qd, kd, vd, causal=True, backend="triton")
torch.cuda.synchronize()
from triton.runtime.jit import JITFunction
from attnkit.triton.forward_kernels import _attn_fwd_kernel
from attnkit.triton.decode_kernels import _decode_split_kernel, _decode_combine_kernel
for kern in (_attn_fwd_kernel, _decode_split_kernel, _decode_combine_kernel):
    for dev, caches in kern.device_caches.items():
        cache = caches[0]
        for key, compiled in cache.items():
            md = compiled.metadata
            rec = {
                "kernel": kern.__name__, "signature": {str(a): b for a, b in compiled.src.signature.items()},
                "constants": {str(a): repr(b) for a, b in compiled.src.constants.items()},
                "packed_metadata": repr(compiled.packed_metadata),
                "metadata": {f: repr(getattr(md, f)) for f in md._fields if f not in ("target",)},
                "run_type": repr(type(compiled.run)),
                "run_attrs": sorted(vars(compiled.run).keys()),
                "function": repr(compiled.function),
            }
            report.setdefault("kernels", []).append(rec)
json.dump(report, open(os.path.join(out_dir, "recon.json"), "w"), indent=1)
print("ok", len(report.get("kernels", [])))
