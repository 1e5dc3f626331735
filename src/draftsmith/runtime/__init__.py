"""The shared runtime under synth, extract, train and eval: the target engine (static KV cache,
CUDA graphs), its self-check and generic fallback, token sampling and lossless verification,
and hidden-state capture by hooks. Imports only the core (target, layers, errors)."""
