"""Tools that serve the perf gate (:mod:`attnkit_perf`) from outside it:

* ``baselines``: re-record a GPU model's stored baseline and noise files, the machine's GPUs
  sharing the work;
* ``acceptance``: the summary of the GPU acceptance run (``.ci/gpu-acceptance.sh``);
* ``ab_dobench``: a change's true effect, timed by ``triton.testing.do_bench`` in alternating
  fresh processes of two checkouts;
* ``detection``: the gate's verdict on a change beside that true effect;
* ``timing_check``: the timing protocol against ``do_bench``, and its noise.
"""
