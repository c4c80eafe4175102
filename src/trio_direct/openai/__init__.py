"""The OpenAI API as plain synchronous code: request schemas and validation (`requests`), the
mapping to engine sampling (`sampling`), response bytes (`responses`) and errors (`errors`).

No I/O here; the HTTP shell decodes with these and writes what they build.
"""
