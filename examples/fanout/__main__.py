"""``python -m saga.examples.fanout``: see :mod:`saga.examples.fanout.run`."""

import sys

from saga.examples.fanout.run import main

sys.exit(main())
