"""Extract stage: hook-based hidden-state capture into the on-disk store, and its writer."""
