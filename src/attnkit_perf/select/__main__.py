"""``python -m attnkit_perf.select --base REF [--gpu KEY] [--json] [--json-out FILE] [--backends]``:
what the diff between REF and the working tree can affect, as the gate decides it.

Prints the decision (everything, the backends and passes, or nothing) and each changed file's
effect; ``--json`` the same as data; ``--json-out FILE`` also writes that data to FILE, the
selection file each step of a gate run reads (``pytest --attnkit-selection=FILE``), so that the
decision is made once per run; ``--backends`` the affected backends' names, one a line (empty
when nothing is affected; ``all`` when everything is).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnkit_perf.formats.schema import validate
from attnkit_perf.select.changes import ChangesError, changed_files, text_at
from attnkit_perf.select.rules import DependencyMap, affected


def main(argv: list[str] | None = None) -> int:
    about = __doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m attnkit_perf.select", description=about)
    parser.add_argument("--base", required=True, metavar="REF", help="git ref to compare with")
    parser.add_argument("--root", default=".", help="the checkout (default: the current directory)")
    parser.add_argument(
        "--gpu",
        default=None,
        metavar="KEY",
        help="GPU model key, as attnkit.device.gpu_key names it (e.g. nvidia-h200; default: any model)",
    )
    parser.add_argument("--json", action="store_true", help="print the decision as JSON")
    parser.add_argument(
        "--json-out",
        default=None,
        metavar="FILE",
        help="also write the decision as JSON to FILE (pytest --attnkit-selection=FILE reads it)",
    )
    parser.add_argument("--backends", action="store_true", help="print the affected backends only")
    args = parser.parse_args(argv)
    try:
        changed = changed_files(Path(args.root), args.base)
    except ChangesError as err:
        print(f"attnkit select: {err}", file=sys.stderr)
        return 2
    root = Path(args.root)
    if args.gpu is not None:
        known = DependencyMap(root).gpu_keys()
        if args.gpu not in known:
            # A model with no data here is allowed (a new runner), but a typo would select nothing
            # of a GPU-keyed change without a word: say so.
            print(
                f"attnkit select: note: --gpu {args.gpu!r} holds no table or baseline here (GPU models "
                f"with data: {', '.join(sorted(known)) or 'none'}); changes to other models' files "
                "select nothing on it",
                file=sys.stderr,
            )
    decision = affected(root, args.base, changed, args.gpu, lambda path: text_at(root, args.base, path))
    data = decision.to_dict()
    validate("selection", data, "the selection made")  # what --attnkit-selection will accept
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(data, indent=1) + "\n", encoding="utf8")
    if args.json:
        print(json.dumps(data, indent=1))
    elif args.backends:
        print("all" if decision.everything else "\n".join(sorted(decision.backends)))
    else:
        print("\n".join(decision.describe()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
