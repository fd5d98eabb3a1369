"""spark-submit entry point: the same ``rmq-polling-report`` command line.

spark-submit starts the JVM with the master and settings it was given, so the job finds
that session and runs on the cluster (``polling_report.session`` does not default to
``local[*]`` under spark-submit).
"""

import sys

from polling_report.cli import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
