"""What a search leaves behind, and everything that reads it back.

:mod:`~raytune_loader.outputs.bestconfig` makes the content of ``best_config.json``;
:mod:`~raytune_loader.outputs.reader` is the one module that reads it back
(:func:`~raytune_loader.outputs.reader.load_best_config` for training code, the options
the bench replays, the report's view); :mod:`~raytune_loader.outputs.report` and
:mod:`~raytune_loader.outputs.plots` write ``report.md`` and its plots from the result
files; :mod:`~raytune_loader.outputs.console` is everything the command lines print.
Files are written atomically (:mod:`raytune_loader.files`).

May import: every room below it (the foundations up to ``verdict``).
"""
