"""The gate's file formats, one module per file: the baseline, the verdict, the A/A noise file,
the spread between pooled recordings, and the JSON Schemas (``schemas/``) every file the gate
reads or writes is validated against (the selection's and the history's among them). What the
gate decides from them: :mod:`attnkit_perf.decide`."""
