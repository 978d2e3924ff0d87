"""Worker adapters behind one protocol (:class:`laneway.backends.base.Worker`)."""
