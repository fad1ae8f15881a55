"""`python -m benchmarks.device_check`: see the package's docstring."""

import sys

from benchmarks.device_check.cli import main

sys.exit(main())
