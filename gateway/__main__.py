"""`python -m gateway serve --config FILE` = `specroute-gateway serve --config FILE`."""

import sys

from gateway.cli import main

sys.exit(main())
