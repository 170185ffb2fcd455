"""Errors attnkit raises beyond plain TypeError / ValueError for bad arguments."""


class BackendUnavailableError(ValueError):
    """The named backend cannot run on this device or build; the message says why."""


class UnsupportedProblemError(NotImplementedError):
    """The named backend runs here but not for these inputs; the message says why."""
