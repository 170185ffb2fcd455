for i in 1 2 3; do
  python3 -m pytest -q -p no:cacheprovider -n 8 tests/correctness/test_compile.py tests/correctness/test_sdpa_call.py 2>&1 | tail -1
done
