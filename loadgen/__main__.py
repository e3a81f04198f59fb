"""`python -m loadgen` = the `loadgen` console script."""

import sys

from loadgen.cli import main

sys.exit(main())
