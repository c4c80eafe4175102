"""The request core every API surface plugs into, one stage per module, in the order a request runs:

- `plan`: a surface's request, already turned into prompts and sampling, becomes a `RequestPlan`:
  one engine request and one output pipeline (detokenizer, stop strings, parsers) per choice.
- `dispatch`: route the plan (aggregated, or a prefill + decode pair), run every engine call in the
  request's nursery, retry an unreachable engine before the first output; events come back in
  batches (`events`), and leaving the block ends or aborts every engine request.
- `render`: a surface's `Renderer` turns event batches into its wire format; `render` drives it for
  streamed and unary responses alike.
"""
