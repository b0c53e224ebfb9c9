"""``python -m cutlass_nn.bench``."""

import sys

from cutlass_nn.bench.cli import main

sys.exit(main())
