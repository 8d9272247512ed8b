"""`python -m trialbox.cli …`: the `trialbox` command."""

import sys

from trialbox.cli import main

sys.exit(main())
