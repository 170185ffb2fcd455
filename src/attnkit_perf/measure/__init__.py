"""What is timed and how: benchmark cases, the timing protocol, calibration and the worker
processes of paired mode."""
