"""The search tier: millions of plans evaluated as arrays, the best re-checked exactly."""
