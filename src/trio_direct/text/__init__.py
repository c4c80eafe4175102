"""The text pipeline (sans-IO): prompts to token ids, engine token ids back to text.

Plain synchronous code the HTTP layer calls per request: `ModelTokenizer` (loaded once, shared),
chat templates rendered as HF transformers renders them, and per-stream `IncrementalDetokenizer`
and `StopStringMatcher` objects that hold back partial characters and partial stop strings.
"""

from trio_direct.text.chat_template import (
    ChatTemplate,
    ChatTemplateError,
    compile_chat_template,
    load_chat_template,
    render_chat,
    select_chat_template,
)
from trio_direct.text.detokenizer import IncrementalDetokenizer
from trio_direct.text.stop_strings import StopStringMatcher
from trio_direct.text.tokenizer import ModelTokenizer, TokenizerLoadError

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "ModelTokenizer",
    "StopStringMatcher",
    "TokenizerLoadError",
    "compile_chat_template",
    "load_chat_template",
    "render_chat",
    "select_chat_template",
]
