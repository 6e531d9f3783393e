"""The one error type the data package raises for bad configuration or bad input."""


class DataConfigError(ValueError):
    """A data source, a file or an argument cannot be used; the message names the problem and the fix."""
