import sys

from crewwork.cli import main

sys.exit(main())
