"""What every layer shares and nothing depends on: the input-error type and the checks of option values."""
