"""Settings of the installed suite when pytest collects it from the package
(``pytest --pyargs attnkit.suite``): hypothesis' profiles (:mod:`attnkit.testing.profiles`,
``HYPOTHESIS_PROFILE`` choosing one). Hypothesis keeps its files (the failing examples of ``dev``
and ``thorough``, its cache of the constants of the code under test) in pytest's cache folder
(``.pytest_cache/d/attnkit-hypothesis``), or in a temporary folder removed after the run under
``-p no:cacheprovider``: never in a ``.hypothesis/`` of the folder pytest was started from,
unless ``HYPOTHESIS_STORAGE_DIRECTORY`` names one."""

import os
import shutil
import tempfile
from pathlib import Path

from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.database import DirectoryBasedExampleDatabase

from attnkit.testing.profiles import load_profiles


def pytest_configure(config):
    # One block per failing check instead of a traceback per example (attnkit.suite.reporting).
    from attnkit.suite import reporting

    if not config.pluginmanager.is_registered(reporting):
        config.pluginmanager.register(reporting, "attnkit-suite-reporting")
    # A conftest's pytest_configure runs as soon as it is loaded, before the test modules are
    # imported: their @settings then start from the loaded profile.
    home = os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY")
    if not home:
        cache = getattr(config, "cache", None)
        if cache is not None:
            home = cache.mkdir("attnkit-hypothesis")
        else:
            home = tempfile.mkdtemp(prefix="attnkit-hypothesis-")
            config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))
        set_hypothesis_home_dir(home)
    load_profiles(DirectoryBasedExampleDatabase(Path(home) / "examples"))
