"""Markdown table of s20_memo.py's JSON: python s20_memo_table.py call1_memo_pairs_0e9abf3.json"""
import json, sys

rows = {}
for r in json.load(open(sys.argv[1])):
    rows.setdefault((r["size"], r["grad"], r["path"]), {})[r["pair"]] = r
print("| size | grad | path | Python memo - raw | compiled memo - raw | compiled - Python |")
print("|---|---|---|---|---|---|")
for (size, grad, path), d in rows.items():
    f = lambda p: f"{d[p]['extra']:+.1f} [{d[p]['lo']:+.1f}, {d[p]['hi']:+.1f}]" if p in d else "declined"
    print(f"| {size} | {grad} | {path} | {f('python-raw')} | {f('compiled-raw')} | {f('compiled-python')} |")
