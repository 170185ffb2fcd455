"""pytest plugin: the thorough profile with max_examples from SHARD_EXAMPLES (one shard of a split run)."""
import os

import pytest
from hypothesis import settings


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    n = int(os.environ["SHARD_EXAMPLES"])
    settings.register_profile("thorough-shard", parent=settings.get_profile("thorough"), max_examples=n)
    settings.load_profile("thorough-shard")
    print(f"thorough-shard: max_examples={settings.default.max_examples}")
