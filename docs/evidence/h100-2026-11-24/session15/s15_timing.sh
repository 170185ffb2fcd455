# GPU checks of the timing protocol and the host share, with their printed figures.
python3 -m pytest tests/gate/test_timing.py -q -s -p no:cacheprovider 2>&1 | tail -30
