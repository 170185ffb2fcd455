"""attnkit's performance gate, a pytest plugin in three layers: ``measure`` (cases, the one
timing protocol, calibration, paired-mode worker processes), ``decide`` (statistics, the
decision rule, baselines, A/A noise, the verdict model and its JSON Schemas) and ``report``
(Markdown and plots of a verdict). It imports the library; the library never imports it."""
