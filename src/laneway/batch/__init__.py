"""The Batch API's pure parts: input validation, completion windows, result lines."""
