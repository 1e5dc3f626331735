"""Eval stage: lossless speculative decoding (chain and EAGLE-2 tree), tau and speed-up."""
