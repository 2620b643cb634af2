"""The one exception type that means "the user's input is wrong".

The CLI turns it into one line on stderr and exit code 2; anything else is a bug and keeps its traceback.
"""


class InputError(ValueError):
    """Bad user input: unknown name, malformed file, impossible request, out-of-range option."""


class DoesNotFit(InputError):
    """A model that does not fit its GPUs' memory: a search over deployments (`simctl plan`) skips the
    configuration and says so, where a single run stops."""
