"""Tools above the library and the gate, each run as ``python -m attnkit_tools.<name>``.

Pages in docs/ that a tool writes carry its command and the machine's provenance
(:mod:`attnkit_tools.provenance`), and each renders again from its saved JSON without a GPU:

* ``grid``: the Triton path against SDPA's flash and cuDNN (docs/PERFORMANCE.md);
* ``per_call``: host cost per call against raw SDPA (docs/PER_CALL.md);
* ``decode_table``: decode / KV-cache throughput and the split-KV tile sweep (docs/DECODE.md);
* ``yardstick``: how strict the tolerance rule's yardstick is (docs/YARDSTICK.md);
* ``window_table``: sliding-window attention against full causal and masked SDPA;
* ``profile``: Nsight Compute counters of Triton against cuDNN (docs/PROFILE.md);
* ``tune``: the Triton tile configs per GPU; ``timing_check``: the timing protocol's checks;
  ``ab_dobench``: two checkouts timed side by side; ``detection``; ``demo``.
"""
