"""attnkit's performance gate, a pytest plugin (``plugin``, its entry) in stages: ``run`` (the
options, the sides compared, the session sequencing the stages), ``measure`` (cases, the one
timing protocol, calibration, paired-mode worker processes), ``decide`` (statistics, the
decision rule, baselines, A/A noise, the verdict model and its JSON Schemas) and ``report``
(Markdown and plots of a verdict); ``history`` (the performance history), ``commands`` (bisect,
pooled baselines, noise files) and ``suite`` (the installed perf tests: ``pytest --pyargs
attnkit_perf.suite``). It imports the library; the library never imports it."""
