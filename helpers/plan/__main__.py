"""``python -m helpers.plan PROFILE [--quick] [--json]``."""

import sys

from . import main

sys.exit(main())
