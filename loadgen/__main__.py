import sys

import locust  # noqa: F401 — first: Locust monkey-patches the standard library for gevent on import

from loadgen.cli import main

sys.exit(main())
