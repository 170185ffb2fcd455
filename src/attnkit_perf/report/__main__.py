import sys

if sys.argv[1:2] == ["merge"]:
    from attnkit_perf.report.merge import main

    raise SystemExit(main(sys.argv[2:]))

from attnkit_perf.report.markdown import main

raise SystemExit(main())
