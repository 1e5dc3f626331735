"""The shared runtime under synth, extract, train and eval: the target engine (static KV cache,
CUDA graphs), its self-check and generic fallback, token sampling and lossless verification,
hidden-state capture by hooks, and the target's output path that training's teacher uses
(head.py). Imports only the core (target, layers, errors)."""
