"""Output parsers (sans-IO): split a choice's detokenized text into the OpenAI response fields.

`reasoning` separates chain-of-thought (`reasoning_content`) from the answer (`content`) and
runs before tool-call parsing (`tools`). Each parser is per request and per choice, fed every
text delta in order and flushed once at the end of the stream, and its result is the same for
every way the text is cut into deltas.
"""
