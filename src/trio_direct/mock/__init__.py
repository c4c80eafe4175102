"""CPU mock SGLang engine: speaks the real wire contract, with no model behind it.

The scheduling core (``scheduler``, ``radix_cache``, ``timing``, ``kv_types``) is plain
synchronous code; the gRPC server, KV-event publisher and PD bootstrap are trio shells on it.
"""

#: The model name a mock engine serves unless told otherwise (``--served-model-name``): the name
#: `trio-direct serve` uses for its built-in mocks, so one request works against either.
MOCK_MODEL_NAME = "trio-direct-mock"
