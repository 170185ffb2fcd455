# The flush's GPU checks alone (nothing else on the GPU meanwhile), printing their figures.
python3 -m pytest tests/gate/test_timing.py -s -v -p no:cacheprovider 2>&1 | tee $W/timing_test.txt | tail -15
