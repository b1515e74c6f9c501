"""Runs the model on a scheduled batch and samples the next tokens (torch lives here, not in core/)."""
