"""A black-box external kernel that switches code paths at a size, for showing what the installed
suite reaches: exact below ``switch_at`` queries, and at or above it a causal mask that drops
each row's own key (the diagonal), the kind of bug that lives only on a large-shape path. It
declares nothing (no supports, no dispatch boundaries) and is installed as its own distribution
with an ``attnkit.backends`` entry point, then the installed suite runs against it in a fresh
pytest process from another directory, as a kernel team runs it.

Run it by hand (the GPU variant, default options of the suite)::

    python tests/correctness/switch_kernel.py --switch-at 4096          # on a GPU
    python tests/correctness/switch_kernel.py --switch-at 700           # on a CPU

It prints each command it runs and exits 0 when the buggy kernel fails the suite and the fixed
one passes."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: The kernel's module; ``{switch_at}`` and ``{dropped}`` are filled in by :func:`install`.
KERNEL = '''"""A plugin kernel: softmax(scale q k^T) v in float32, one path below N = {switch_at}
queries and another from it."""

import torch

SWITCH_AT = {switch_at}
DROPS_DIAGONAL = {dropped}


def attention(q, k, v, *, causal, scale, window):
    n, m = q.shape[2], k.shape[2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    group = q.shape[1] // k.shape[1]
    kf = k.to(acc).repeat_interleave(group, dim=1)
    vv = v.repeat_interleave(group, dim=1)
    scores = q.to(acc) @ kf.transpose(-1, -2) * scale
    rows = torch.arange(n, device=q.device)[:, None] + (m - n)
    cols = torch.arange(m, device=q.device)[None, :]
    visible = torch.ones(n, m, dtype=torch.bool, device=q.device)
    if causal:
        # The large-shape path's bug: a strict inequality drops each row's own key.
        visible &= (cols < rows) if DROPS_DIAGONAL and n >= SWITCH_AT else (cols <= rows)
    if window is not None:
        left, right = window
        if left >= 0:
            visible &= cols >= rows - left
        if right >= 0:
            visible &= cols <= rows + right
    scores = scores.masked_fill(~visible, float("-inf"))
    row_max = scores.amax(-1, keepdim=True).detach()
    weights = torch.exp(scores - torch.where(torch.isfinite(row_max), row_max, 0.0))
    total = weights.sum(-1, keepdim=True)
    weights = weights / torch.where(total == 0, 1.0, total)
    return (weights.to(v.dtype) @ vv).to(q.dtype)
'''

ENTRY = """from attnkit import Backend

from attnkit_switch.kernel import attention

backend = Backend(name="switch", fn=attention, description="switches paths at N = SWITCH_AT")
"""


def install(site: Path, switch_at: int, dropped: bool) -> None:
    """Install the kernel into ``site`` as pip would: the package and a ``*.dist-info`` with its
    entry point."""
    package = site / "attnkit_switch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(ENTRY)
    (package / "kernel.py").write_text(KERNEL.format(switch_at=switch_at, dropped=dropped))
    info = site / "attnkit_switch-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: attnkit-switch\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[attnkit.backends]\nswitch = attnkit_switch:backend\n")


def suite_command(*select: str) -> list[str]:
    """``pytest --pyargs attnkit.suite --attnkit-backend switch`` (``select``: more arguments,
    e.g. a module or ``-k``); ``-p attnkit_pytest`` for an attnkit run from a checkout."""
    target = select or ("attnkit.suite",)
    plugins = ("-p", "attnkit_pytest", "-p", "no:cacheprovider")
    return [
        sys.executable,
        "-m",
        "pytest",
        "--pyargs",
        *target,
        "--attnkit-backend",
        "switch",
        *plugins,
        "-q",
    ]


def run_suite(root: Path, switch_at: int, dropped: bool, *select: str, env: dict | None = None):
    """Install the kernel under ``root`` and run the installed suite on it from ``root``/elsewhere."""
    import attnkit

    site, workdir = root / "site", root / "elsewhere"
    install(site, switch_at, dropped)
    workdir.mkdir()
    attnkit_root = str(Path(attnkit.__file__).resolve().parents[1])
    # Folders already on PYTHONPATH (wheels a GPU runner carries) stay visible, after these two.
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    path = os.pathsep.join([str(site), attnkit_root, *inherited])
    environment = {**os.environ, **(env or {}), "PYTHONPATH": path}
    command = suite_command(*select)
    return subprocess.run(command, cwd=workdir, env=environment, capture_output=True, text=True, timeout=3000)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--switch-at", type=int, default=4096, help="first N of the buggy path")
    args = parser.parse_args()
    verdicts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dropped in (True, False):
            label = "buggy" if dropped else "fixed"
            command = " ".join(suite_command())
            print(f"$ {command}   # {label} kernel, switch at N = {args.switch_at}", flush=True)
            result = run_suite(Path(tmp) / label, args.switch_at, dropped)
            tail = (result.stdout + result.stderr).strip().splitlines()
            print("\n".join(tail[-15:]), flush=True)
            verdicts[label] = result.returncode
    ok = verdicts["buggy"] == 1 and verdicts["fixed"] == 0
    buggy, fixed = verdicts["buggy"], verdicts["fixed"]
    print(f"buggy kernel: exit {buggy} (expected 1); fixed kernel: exit {fixed} (expected 0)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
