"""How a measurement becomes a verdict: statistics, the decision rule, baselines, A/A noise,
the verdict model and the JSON Schemas of every file the gate reads or writes."""
