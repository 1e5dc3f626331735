"""Train stage: TTT unrolling, the loss, metrics, and the training loop."""
