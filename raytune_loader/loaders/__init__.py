"""The tuned loader: one constructor, worker processes or threads, map-style or streams.

:func:`~raytune_loader.loaders.loader.build_dataloader` is the one place a loader is
built from a candidate (what a trial measures and what ``best_config.json`` gives a
training script); :mod:`~raytune_loader.loaders.batches` is what every tuned loader
shares (the measurement's stamps, the workers' thread limits, resuming an epoch);
:mod:`~raytune_loader.loaders.sharding` decides which samples each rank and worker
reads; :class:`~raytune_loader.loaders.shard_stream.ShardStream` is the stream every
sharded source reads through, and :mod:`~raytune_loader.loaders.streams` its loaders.

May import: the foundations, ``candidates``, ``pipeline``.
"""
