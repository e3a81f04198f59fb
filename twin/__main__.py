"""`python -m twin ...` = `specroute sim ...` (spawns twins without the console script)."""

import sys

from twin.cli import main

sys.exit(main(sys.argv[1:]))
