"""A perf run in order: the options, the backends and the code on each side, the session that
sequences measure -> decide -> report, one benchmark's paired sequence, and the stored recheck
(a stored "slower" measured again in paired mode against the baseline's commit)."""
