"""One measurement: a short segment of the user's training with one candidate.

:class:`~raytune_loader.measuring.job.TrialJob` is what every measurement of a search
repeats (the model and step, the segment, the data); :mod:`~raytune_loader.measuring.prepare`
and :mod:`~raytune_loader.measuring.shards` make its data ready before any trial.
:mod:`~raytune_loader.measuring.measure` runs one measurement in one process (a trial,
the ceiling, the input pipeline alone), :mod:`~raytune_loader.measuring.segment` its
training segment and :mod:`~raytune_loader.measuring.steady` its steady window;
:mod:`~raytune_loader.measuring.ranks` runs it as several DDP ranks. What comes back is
:mod:`~raytune_loader.measuring.outcomes` (one measurement) and
:mod:`~raytune_loader.measuring.records` (one finished trial, ``trials.csv``).
:mod:`~raytune_loader.measuring.profile` measures what each stage costs, for the cost
model. :class:`~raytune_loader.measuring.measurer.Measurer` is the seam every consumer
measures through: in this process (the bench, the experiments) or in Ray tasks (the
search). Nothing here imports Ray.

May import: the foundations, ``machine``, ``candidates``, ``pipeline``, ``loaders``,
``stores``, ``sources``, ``raydata``, ``engines``.
"""
