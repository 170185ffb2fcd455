"""A/B of the split-KV combine as a programmatic dependent launch (DecodeConfig.pdl) against the
plain launch, same process, interleaved: graph replays and eager calls, contiguous and paged."""
import argparse, dataclasses, json, statistics, sys
sys.path.insert(0, "tools")
import torch
from attnkit.inputs import check_inputs
from attnkit.triton.decode import decode_config, decode_forward
import decode_table as dt

parser = argparse.ArgumentParser(); parser.add_argument("--out"); args = parser.parse_args()
copy = dt.copy_bandwidth()
shapes = [(8, 1, 4096), (8, 1, 32768), (1, 1, 131072), (4, 16, 16384), (2, 1, 16384), (1, 1, 4096),
          (8, 16, 4096), (1, 16, 65536)]
rows = []
for b, n, m in shapes:
    q, k, v = dt.operands(b, n, m)
    problem = check_inputs(q, k, v, True, None)
    kp, vp, table = dt.paged_copy(k, v)
    seqlens = torch.full((b,), m, dtype=torch.int32, device="cuda")
    for paged in (False, True):
        base = decode_config(paged)
        cfgs = {"pdl": dataclasses.replace(base, pdl=True), "plain": dataclasses.replace(base, pdl=False)}
        def call(cfg):
            if paged:
                return lambda: decode_forward(q, kp, vp, problem, seqlens=seqlens, block_table=table, config=cfg)
            return lambda: decode_forward(q, k, v, problem, config=cfg)
        ref = call(cfgs["plain"])()[0]
        got = call(cfgs["pdl"])()[0]
        assert torch.equal(ref, got), f"pdl output differs at {(b, n, m, paged)}"
        times = {f"{name} {mode}": [] for name in cfgs for mode in ("graph", "eager")}
        for _ in range(3):
            for name, cfg in cfgs.items():
                times[f"{name} graph"].append(dt.graph_us(call(cfg)))
                times[f"{name} eager"].append(dt.median_us(call(cfg)))
        med = {key: statistics.median(vals) for key, vals in times.items()}
        gbs = lambda us: dt.kv_bytes(b, m) / (us * 1e3)
        row = {"B": b, "N": n, "M": m, "paged": paged, "times_us": times, "median_us": med,
               "pct_copy_graph": {name: 100 * gbs(med[f"{name} graph"]) / copy for name in cfgs},
               "pdl_over_plain_graph": med["pdl graph"] / med["plain graph"],
               "pdl_over_plain_eager": med["pdl eager"] / med["plain eager"]}
        rows.append(row)
        print(f"B{b} N{n} M{m} paged={paged}: graph pdl {med['pdl graph']:.1f} us ({row['pct_copy_graph']['pdl']:.1f}%) "
              f"plain {med['plain graph']:.1f} us ({row['pct_copy_graph']['plain']:.1f}%) ratio {row['pdl_over_plain_graph']:.3f}; "
              f"eager pdl {med['pdl eager']:.1f} plain {med['plain eager']:.1f}", flush=True)
json.dump({"copy_gbs": copy, "rows": rows}, open(args.out, "w"), indent=1)
