"""Tools above the library and the gate, each run as ``python -m attnkit_tools.<name>``.

Pages in docs/<gpu>/ that a tool writes carry its command and the machine's provenance
(:mod:`attnkit_tools.provenance`), and each renders again from its saved JSON without a GPU;
``pages`` runs every page's tool for the GPU it runs on, in one command:

* ``grid``: the Triton path against SDPA's flash and cuDNN (PERFORMANCE.md);
* ``auto_table``: the table ``backend="auto"`` reads, and its check (AUTO.md, AUTO_CHECK.md);
* ``per_call``: host cost per call against raw SDPA (PER_CALL.md);
* ``decode_table``: decode / KV-cache throughput and the split-KV tile sweep (DECODE.md);
* ``yardstick``: how strict the tolerance rule's yardstick is (YARDSTICK.md);
* ``window_table``: sliding-window attention against full causal and masked SDPA;
* ``profile``: Nsight Compute counters of Triton against cuDNN (PROFILE.md);
* ``tune``: the Triton tile configs and the Gluon tiles and routed cells per GPU
  (``tune_gluon``); ``timing_check``: the timing protocol's checks; ``ab_dobench``: two
  checkouts timed side by side; ``detection``; ``demo``.
"""
