from attnkit_perf.report.markdown import main

raise SystemExit(main())
