import sys

from argosy.cli import main

sys.exit(main())
