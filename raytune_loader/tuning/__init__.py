"""The search: its options, the space's bounds, the Tune run and the Optuna searcher.

:class:`~raytune_loader.tuning.options.SearchOptions` is every knob of a search,
validated in one place, and :func:`~raytune_loader.tuning.options.job_from_options` the
one constructor of the job; :class:`~raytune_loader.tuning.space.SearchSpace` is the
space the search explores (the Optuna define-by-run function, valid by construction,
and the baselines), which :mod:`~raytune_loader.tuning.bounds` makes from the options
and the cluster; :mod:`~raytune_loader.tuning.costmodel` predicts every
candidate from the profile; :mod:`~raytune_loader.tuning.searcher` is Optuna behind
Tune's ``Searcher``; :mod:`~raytune_loader.tuning.tuner` (driver side) and
:mod:`~raytune_loader.tuning.trainable` (trial side) hold every Ray and Tune call of the
search. Importing this room imports no Ray: only ``tuner``, ``trainable`` and
``searcher`` do.

May import: the foundations, ``machine``, ``candidates``, ``pipeline``, ``loaders``,
``stores``, ``sources``, ``raydata``, ``engines``, ``measuring``.
"""
