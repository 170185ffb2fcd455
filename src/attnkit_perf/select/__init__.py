"""Which perf rows and correctness tests a diff can affect (the gate runs those on a pull request).

* :mod:`~attnkit_perf.select.symbols`: the symbol graph of the library, read with ``ast``;
* ``dependencies.json``: what the graph cannot show (roots of each backend, shared code, data
  files and their readers, files that affect nothing);
* :mod:`~attnkit_perf.select.rules`: each changed file's effect, and the decision (the
  selection file's model: ``Affected.to_dict`` / ``from_dict``);
* :mod:`~attnkit_perf.select.tables`: a changed table read with the library's own readers;
* :mod:`~attnkit_perf.select.changes`: the files a diff touches (git);
* :mod:`~attnkit_perf.select.collection`: the pytest side (deselection, its summary);
* ``python -m attnkit_perf.select --base REF [--json] [--json-out FILE]``: the decision, for
  people and scripts; FILE is what each step of a gate run reads (``--attnkit-selection``).
"""
