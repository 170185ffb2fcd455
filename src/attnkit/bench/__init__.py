"""Benchmark support: cases and runners (cases), timing, statistics, baselines and the gate."""
