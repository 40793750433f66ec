import sys

from rankpack.cli import main

sys.exit(main())
