"""Data stage: reading conversation formats, chat-template tokenization with loss masks
(`prepare`), the tokenized dataset format, and the draft vocabulary (`vocab`)."""
