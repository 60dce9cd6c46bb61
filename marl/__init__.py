"""marl package."""
