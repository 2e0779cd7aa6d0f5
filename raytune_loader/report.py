"""``python -m raytune_loader.report results/<dataset>``: rebuild ``report.md`` and its plots.

The report is made from ``trials.csv`` and ``best_config.json`` alone
(:mod:`raytune_loader.outputs.report`), so this rebuilds it without re-running anything.
"""

from __future__ import annotations

import sys

from raytune_loader.outputs.report import main, write_report

__all__ = ["main", "write_report"]

if __name__ == "__main__":
    sys.exit(main())
