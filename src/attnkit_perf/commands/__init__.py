"""The gate's command-line programs, each run as ``python -m attnkit_perf.commands.<name>``.
The report and the history are stages with a command of their own
(``python -m attnkit_perf.report``, ``python -m attnkit_perf.history``)."""
