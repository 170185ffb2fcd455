"""``python -m attnkit.fast_calls_cli [build|status]``: build the compiled call memo for this torch
(:mod:`attnkit.fast_calls`), or say whether it is in use and why not. Exit 1 if a build failed."""

from __future__ import annotations

import sys

from attnkit import fast_calls


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["build"], ["status"]):
        print("usage: python -m attnkit.fast_calls_cli [build|status]", file=sys.stderr)
        return 2
    if args == ["build"] and fast_calls.memo is None:
        try:
            fast_calls.build(verbose=True)
        except Exception as err:  # the compiler's output is above; say what failed last
            print(f"attnkit fast calls: build failed: {err}", file=sys.stderr)
            return 1
        print(f"attnkit fast calls: built in {fast_calls.build_location()[1]}")
        return 0
    print(f"attnkit fast calls: {fast_calls.status}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
