import sys

from fusekit.cli import main

sys.exit(main())
