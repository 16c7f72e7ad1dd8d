"""`python -m client.demo` (what `make demo` runs)."""

import sys

from client.demo.cli import main

sys.exit(main())
