"""A user module that raises while it is imported (tests name ``broken_at_import:game``)."""

raise RuntimeError("this module is broken")


def game():  # never reached
    return None
