"""`python -m parsim`: see parsim.cli."""

import sys

from parsim.cli import main

sys.exit(main())
