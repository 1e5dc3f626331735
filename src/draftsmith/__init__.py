"""draftsmith: train, export and measure EAGLE-3 speculative-decoding drafters.

The package is split by pipeline stage (synth/, data/, extract/, train/, export/, evaluate/,
pipeline/) over a core that every stage may use (runtime/, draft/, data/'s formats, target,
layers, config, progress). Each command is a `run(cfg) -> Path` function taking one typed
config; `commands.py` lists them and `cli.py` turns them into the `draftsmith` command line.
docs/architecture.md draws the layout and says what may import what.
"""

__version__ = "0.1.0"
