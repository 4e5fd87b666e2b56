"""``python -m sarathi``: see sarathi/entrypoints/cli.py."""

import sys

from sarathi.entrypoints.cli import main

sys.exit(main())
