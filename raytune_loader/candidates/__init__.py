"""What one candidate is: plain data, valid by construction.

:class:`~raytune_loader.candidates.config.LoaderConfig` is one candidate: the DataLoader
arguments the search tunes, the stages of the pipeline around the loader, and the
knobs of its engine (``engine`` names who makes the batches; the
:mod:`raytune_loader.engines` answer for it). :mod:`~raytune_loader.candidates.rules`
says, once, which values each field takes and when it applies (the constructor, the
search space, the labels and the JSON all read it);
:mod:`~raytune_loader.candidates.structure` says what a candidate is built of (the
profile and the cost model see the space by structure). The space of candidates a
search explores is the search's own (:class:`raytune_loader.tuning.space.SearchSpace`).
No torch, no Ray.

May import: the foundations.
"""
