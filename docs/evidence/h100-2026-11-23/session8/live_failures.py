"""pytest plugin: write the first failures' full reports to $OUT/failures/<n>.txt as they come, and
every test's start time and call duration to $OUT/<TAG>durations.txt (survives an interrupted run)."""
import itertools, os, time
_n = itertools.count()
_T0 = time.time()
_log = []


def _write(line):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the controller logs every worker's reports
        return
    if not _log:
        _log.append(open(os.path.join(os.environ.get("OUT", "."), f"{os.environ.get('TAG', '')}durations.txt"), "a"))
    _log[0].write(line + "\n"); _log[0].flush()


def pytest_runtest_logstart(nodeid, location):
    _write(f"{time.time() - _T0:7.1f} start    {nodeid}")


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _write(f"{time.time() - _T0:7.1f} {report.outcome:8} {report.duration:8.2f}s {report.nodeid}")
    if report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):
        n = next(_n)
        if n >= int(os.environ.get("MAX_FAILURE_FILES", "4")):
            return
        d = os.path.join(os.environ.get("OUT", "."), "failures"); os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{os.environ.get('TAG','')}{n:03d}.txt"), "w") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext[:30000]}\n")


def pytest_collection_modifyitems(session, config, items):
    """Longest first (LPT), from a previous run's durations file (LPT_FROM): tests it never
    finished count as the longest. The same order in every xdist worker (a sorted file)."""
    path = os.environ.get("LPT_FROM")
    if not path:
        return
    seconds = {}
    for line in open(path):
        parts = line.split()
        if len(parts) == 4 and parts[1] != "start":
            seconds[parts[3]] = float(parts[2].rstrip("s"))
    items.sort(key=lambda item: -seconds.get(item.nodeid, 1e9 if "[triton" in item.nodeid else 30.0))
