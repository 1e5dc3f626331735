"""draftsmith: train, export and measure EAGLE-3 speculative-decoding drafters.

The package is split by pipeline stage (data/, extract/, draft/, train/, export/, evaluate/,
synth/). Each command is a `run(cfg) -> Path` function taking one typed config; `cli.py` turns
those configs into the `draftsmith` command line.
"""

__version__ = "0.1.0"
