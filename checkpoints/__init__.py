"""The checkpoint, effect and review store."""
