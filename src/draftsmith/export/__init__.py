"""Export stage: serving-ready folders for vLLM and SGLang, and importing EAGLE-3 checkpoints."""
