"""Plan stage: disk, memory and time estimates for extract and train, before running them."""
