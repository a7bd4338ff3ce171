"""What tests/unit/test_forkserver.py forks: prints what it was started with, as JSON,
and exits with the status its first argument names."""

import json
import os
import sys

if __name__ == "__main__":
    print(
        json.dumps(
            {
                "argv": sys.argv[1:],
                "cwd": os.getcwd(),
                "probe": os.environ.get("PROBE"),
                "own_session": os.getsid(0) == os.getpid(),
                "torch_loaded": "torch" in sys.modules,
            }
        )
    )
    sys.exit(int(sys.argv[1]))
