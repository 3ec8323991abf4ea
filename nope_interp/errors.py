"""The toolkit's user-facing error type.

Every bad-input case (unknown preset, hook point or task; sizes that make no sense; a missing or
corrupt run directory) raises :class:`NopeInterpError` with a one-line message that names the parameter
and the allowed values. The CLI turns it into exit status 2.
"""


class NopeInterpError(ValueError):
    """Bad input to the toolkit: the message names the parameter and what is allowed."""
