"""The one error every part of the team runtime raises."""


class TeamError(ValueError):
    """A team that cannot be built or run as asked; the message says what to change."""
