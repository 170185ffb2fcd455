"""How a measurement becomes a verdict: statistics, the decision rules, A/A noise and pooled
spreads as sigma bounds, and the assembly of a run's decisions into its verdict (the files
themselves: :mod:`attnkit_perf.formats`)."""
