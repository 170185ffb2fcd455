"""Tools above the library and the gate, grouped by job; each is run as
``python -m attnkit_tools.<job>.<tool>``:

* :mod:`~attnkit_tools.tune`: measure on this GPU the data the library reads (tile configs,
  the ``auto`` dispatch table);
* :mod:`~attnkit_tools.pages`: the generated pages of ``docs/<gpu>/``, and the command that
  regenerates them all;
* :mod:`~attnkit_tools.gate`: record the gate's baselines, and check the gate and its timing
  against measurements made apart from it;
* :mod:`~attnkit_tools.demo`: ``attnkit-demo``, every backend on one problem.

What they time, they time as the gate does: cases, runners and the timing protocol come from the
gate's bench layer, through its one public door (:mod:`attnkit_perf.bench`).
"""
