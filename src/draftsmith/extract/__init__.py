"""Extract stage: hook-based hidden-state capture, the on-disk store, and `plan`."""
