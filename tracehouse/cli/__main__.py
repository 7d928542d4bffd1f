"""`python -m tracehouse.cli`: the `tracehouse` command."""

import sys

from tracehouse.cli.main import main

sys.exit(main())
