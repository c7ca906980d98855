class BundleError(Exception):
    """A bundle that must not be loaded. The message names the file or field at fault."""
