"""Tools above the library and the gate: the performance grid, the Triton tuner, the timing
check and the demo. Each is run as ``python -m attnkit_tools.<name>``."""
