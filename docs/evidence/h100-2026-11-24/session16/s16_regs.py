"""Registers, spills and shared memory of the two-pass backward kernels and of the one-pass
variants of scratch/s16_onepass.py (issue 15), from Triton's compiled kernels.

    PYTHONPATH=src:scratch python scratch/s16_regs.py --out regs.json
"""

import argparse
import json

import torch

from attnkit.triton import fast_launch
from attnkit.triton.launch import attention_backward
import s16_onepass
from s16_onepass import TILES, make, onepass_backward

ap = argparse.ArgumentParser()
ap.add_argument("--out", default="regs.json")
args = ap.parse_args()
seen = []
original = fast_launch.KernelLaunch._entry


def recording(self, compiled, positional):
    seen.append((self.kernel.fn.__name__, {k: v for k, v in self.kwargs.items() if k.isupper() or k.startswith("num_")},
                 compiled.n_regs, compiled.n_spills, compiled.metadata.shared))
    return original(self, compiled, positional)


fast_launch.KernelLaunch._entry = recording
rows = []
for d in (64, 128):
    for causal in (False, True):
        # B4 H(2048/D) N1024: above the TMA threshold, as the grid's cells are.
        seen.clear()
        q, k, v, g, out, lse, setup = make(4, 2048 // d, 1024, d, causal, "cuda")
        attention_backward(g, q, k, v, out, lse, setup)
        for name, kw, regs, spills, shared in seen:
            if name == "_attn_bwd_preprocess":
                continue
            rows.append(dict(D=d, causal=causal, kernel=name, tile=(kw["BLOCK_M"], kw["BLOCK_N"], kw["num_warps"], kw["num_stages"]), regs=regs, spills=spills, shared=shared))
        for tile in TILES:
            for dq_tma in (False, True):
                try:
                    onepass_backward(g, q, k, v, out, lse, setup, tile, True, dq_tma)
                except Exception as err:
                    rows.append(dict(D=d, causal=causal, kernel="onepass", tile=tile, dq_tma=dq_tma, error=type(err).__name__))
                    continue
                c = s16_onepass.LAST_COMPILED
                rows.append(dict(D=d, causal=causal, kernel="onepass", tile=tile, dq_tma=dq_tma, regs=c.n_regs, spills=c.n_spills, shared=c.metadata.shared))
        torch.cuda.synchronize()
for r in rows:
    print(r)
json.dump(rows, open(args.out, "w"), indent=1, default=str)
