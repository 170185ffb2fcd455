"""Settings of the installed suite when pytest collects it from the package
(``pytest --pyargs attnkit.suite``): hypothesis' profiles, ``HYPOTHESIS_PROFILE`` choosing one."""

from attnkit.testing.profiles import load_profiles

load_profiles()
