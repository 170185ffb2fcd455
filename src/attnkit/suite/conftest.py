"""Settings of the installed suite when pytest collects it from the package
(``pytest --pyargs attnkit.suite``): hypothesis' profiles (:mod:`attnkit.testing.profiles`,
``HYPOTHESIS_PROFILE`` choosing one), with the failing examples of ``dev`` and ``thorough`` kept in
pytest's cache folder, never in the folder pytest was started from."""

from hypothesis.database import DirectoryBasedExampleDatabase, InMemoryExampleDatabase

from attnkit.testing.profiles import load_profiles


def pytest_configure(config):
    # A conftest's pytest_configure runs as soon as it is loaded, before the test modules are
    # imported: their @settings then start from the loaded profile.
    cache = getattr(config, "cache", None)
    database = (
        InMemoryExampleDatabase()
        if cache is None
        else DirectoryBasedExampleDatabase(cache.mkdir("attnkit-hypothesis"))
    )
    load_profiles(database)
