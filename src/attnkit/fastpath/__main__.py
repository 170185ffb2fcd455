"""``python -m attnkit.fastpath [build|status]``: build the compiled fast path for this torch
(:mod:`attnkit.fastpath`), or say whether it is in use and why not. Exit 1 if a build failed."""

from __future__ import annotations

import sys

from attnkit.fastpath import loader


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = "usage: python -m attnkit.fastpath [build|status]"
    if args in (["-h"], ["--help"]):
        print(f"{usage}\n\n{__doc__.strip()}")
        return 0
    if args not in ([], ["build"], ["status"]):
        print(usage, file=sys.stderr)
        return 2
    if args == ["build"] and loader.memo is None:
        try:
            loader.build(verbose=True)
        except Exception as err:  # the compiler's output is above; say what failed last
            print(f"attnkit fast path: build failed: {err}", file=sys.stderr)
            return 1
        print(f"attnkit fast path: built in {loader.build_location()[1]}")
        return 0
    print(f"attnkit fast path: {loader.status}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
