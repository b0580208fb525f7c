"""The error of a bad or missing option of the ``metaq`` source (its own module so that
options.py and login.py can both raise it without importing each other)."""


class OptionError(ValueError):
    """A bad or missing option of the metaq source; the message names the option."""
