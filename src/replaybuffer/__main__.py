"""``python -m replaybuffer`` runs the command-line interface."""

import sys

from replaybuffer.cli import main

sys.exit(main())
