"""``python -m abwatch.service.cli``: the ``abwatch`` command."""

import sys

from abwatch.service.cli.main import main

sys.exit(main())
