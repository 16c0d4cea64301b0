"""`python -m rloo.cli ...` (what `torchrun -m` and `accelerate launch -m` run)."""

import sys

from rloo.cli import main

sys.exit(main())
