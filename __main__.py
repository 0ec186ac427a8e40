"""`python -m convalue`: the console script, for an environment whose scripts folder is not on PATH."""

import sys

from convalue.engine.driver.cli import main

sys.exit(main())
