"""The generated pages of ``docs/<gpu>/``: each tool measures on a GPU, keeps its raw measurement
as JSON, and renders its page again from that JSON without a GPU. Every page heads itself with
its command and the machine's provenance (``provenance``). ``python -m
attnkit_tools.pages.regenerate`` runs every page's tool for the GPU it runs on, in one command
(``gpu_jobs``: the jobs spread over the machine's GPUs):

* ``grid``: the Triton path against SDPA's flash and cuDNN (PERFORMANCE.md);
* ``per_call``: host cost per call against raw SDPA (PER_CALL.md; ``per_call_report`` renders it);
* ``decode_table``: decode / KV-cache throughput and the split-KV tile sweep (DECODE.md);
* ``yardstick``: how strict the tolerance rule's yardstick is (YARDSTICK.md);
* ``window_table``: sliding-window attention against full causal and masked SDPA;
* ``profile``: Nsight Compute counters of Triton against cuDNN (PROFILE.md).

The AUTO pages come with the table they describe, from :mod:`attnkit_tools.tune.auto_table`.
"""
