"""After the search: verification, the winner, and the findings.

:mod:`~raytune_loader.verdict.verify` re-measures the best candidates and the baselines
one at a time in rotated rounds; :mod:`~raytune_loader.verdict.selection` chooses the
cheapest within noise of the best; :mod:`~raytune_loader.verdict.probes` measures the
winner's variants the findings need, and :mod:`~raytune_loader.verdict.findings` says
what would break training hours later, each with its fix. They measure through the
:class:`~raytune_loader.measuring.measurer.Measurer` seam, so the bench and the
experiments run them without Ray.

May import: the foundations, ``machine``, ``candidates``, ``pipeline``, ``loaders``,
``stores``, ``sources``, ``raydata``, ``engines``, ``measuring``, ``tuning``.
"""
