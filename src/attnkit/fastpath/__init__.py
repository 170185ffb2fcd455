"""attnkit's compiled fast path: one optional accelerator in front of :func:`attnkit.attention`.

:func:`attnkit.attention` keeps what each call signature needs (the validated problem, the
backend's :class:`~attnkit.prepared.PreparedRun`) in a Python memo. In Python, that memo and the
fused-kernel layout test cost 7-12 us per call with gradients on an H100 host (torch 2.11)
before SDPA runs. The compiled memo (``csrc/fast_calls.cpp``) does the same lookup in C++ and
reads only the prepared run's typed fields (:mod:`attnkit.prepared`):

* ``plain_sdpa_call``: it makes the layout test, sets the forced kernel's enable-flags and makes
  the SDPA call itself;
* ``native_forward``: for a forward without gradients it allocates the outputs and launches the
  kernels a layout's first call bound (:mod:`attnkit.triton.native_launch`), through the CUDA driver,
  after asking each launch whether Triton's knobs and hooks still allow it.

Every other call, and every first call of a signature, goes through the Python memo, with the
same errors. Three rules exist in both languages (which calls have a memo key, the layout rule,
and whether a call records a backward); ``tests/correctness/test_fastpath_parity.py`` runs both
over one table of cases per rule.

Modules: ``loader`` (build, find and load the extension; :data:`memo` and :data:`status`),
``__main__`` (``python -m attnkit.fastpath [build|status]``),
``csrc/fast_calls.cpp`` (the extension).

It is a C++ extension built against the installed torch, so it is built on the machine that
runs it, once, into a cache directory (:func:`attnkit.cache.cache_root`, ``ATTNKIT_CACHE_DIR``):

* ``python -m attnkit.fastpath build`` builds it (a C++ compiler, and ``ninja`` from the
  ``fast`` extra); ``python -m attnkit.fastpath`` says whether it is in use and why not.
* ``ATTNKIT_FAST_CALLS``: ``auto`` (default) loads a build made for this torch and this source,
  if there is one, and otherwise runs the Python memo alone; ``build`` builds it at import if
  needed and raises if it cannot; ``off`` never loads it.
"""

from attnkit.fastpath.loader import build, memo, status

__all__ = ["build", "memo", "status"]
