"""python -m launch.report DIR... [--out PREFIX] (see launch/report/__init__.py)."""

import sys

from . import main

sys.exit(main())
