"""Data: the on-disk formats that the stages share, and the two commands that make the first
ones. Reading conversation formats and chat-template tokenization with loss masks (`prepare`),
the tokenized dataset format, the draft vocabulary (`vocab`), and the hidden-state store's
layout and reader (store.py; extract/writer.py writes it). Imports only the core."""
