"""The perf gate's tests, installed with attnkit: time the registered backends on the perf
grid and compare them with a base commit of the repository pytest runs in, or with a stored
baseline, from any directory::

    pytest --pyargs attnkit_perf.suite --attnkit-backend NAME --attnkit-base origin/main   # paired
    pytest --pyargs attnkit_perf.suite --attnkit-backend NAME --attnkit-record             # record
    pytest --pyargs attnkit_perf.suite --attnkit-backend NAME --benchmark-compare          # stored

``--attnkit-backend`` is repeatable; without it, a repository other than attnkit's times every
backend that its ``attnkit.backends`` entry points register. Paired mode imports each side's
code from the repository's import roots (``[tool.attnkit] src = ["src"]`` in its
pyproject.toml). docs/EXTENDING.md and docs/PERF_GATE.md tell the rest.

Test code on top of the gate (it imports the gate's run and pytest; nothing in the gate imports
it: tests/gate/test_layout.py). attnkit's own repository collects the same
tests (tests/perf/test_attention_perf.py): there is one definition of the perf tests.
"""
