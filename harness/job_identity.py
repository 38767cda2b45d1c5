"""``python -m harness.job_identity``: the command's path, kept; the code is harness/job/identity.py."""

import sys

from kvbench.harness.job.identity import main

if __name__ == "__main__":
    sys.exit(main())
