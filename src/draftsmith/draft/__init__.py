"""The EAGLE-3 drafter model (no I/O): config, modules, and weight (de)serialisation."""
