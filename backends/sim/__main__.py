"""`python -m backends.sim ...` = `specroute sim ...` (spawns twins without the console script)."""

import sys

from backends.sim.cli import main

sys.exit(main(sys.argv[1:]))
