"""The Batch API: its pure parts (input validation, completion windows, result lines) and
the runner that runs batches' lines through the runtime (:mod:`laneway.batch.runner`)."""
