import sys

from vpp.cli import main

sys.exit(main())
