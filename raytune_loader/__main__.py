"""``python -m raytune_loader`` runs the search."""

import sys

from raytune_loader.search import main

sys.exit(main())
