"""A user module that calls ``sys.exit`` while it is imported (``exits_at_import:game``)."""

import sys

sys.exit(0)


def game():  # never reached
    return None
