"""Measure on this GPU the data the library reads, and write it where the library reads it:

* ``configs``: the Triton tile config table (``src/attnkit/triton/configs/<gpu>.json``), and
  with ``--gluon`` its Gluon section (``gluon``: the Gluon tiles and routed cells);
* ``auto_table``: the table ``backend="auto"`` reads (``src/attnkit/auto_tables/<gpu>.json``,
  and its pages AUTO.md, AUTO_CHECK.md), and its check;
* ``ranking``: the inputs of one tuning point and the time-over-best rule every tuner ranks by.
"""
