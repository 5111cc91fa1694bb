"""``python -m engine.gpu_check``: the team's documented name for ``python -m engine.tools.gpu_check``
(the tool lives in ``engine/tools/gpu_check.py``); same flags."""

import sys

from engine.tools.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
