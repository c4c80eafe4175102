"""The compiled wire code matches the SGLang wire contracts, field by field.

The tables below are written by hand from the reference tables (`sglang-native-grpc.md` §3-§4,
`sglang-smg-grpc.md` §1.2-§1.7, `kv-events.md` §9), deliberately NOT derived from the .proto
files: they are an independent second reading, so a mis-numbered or mis-typed field in the
.proto (the classic upstream GenerateRequest 12/13 swap) fails here with the message and field
in the test id.

Field spec mini-language, close to how the reference tables read:
    [repeated | opt | opt?] [oneof:NAME] TYPE
  repeated      label repeated
  opt           proto3 `optional` (explicit presence)
  opt?          presence unconfirmed upstream: either label is accepted
  oneof:NAME    member of the real oneof NAME
  TYPE          int32 int64 uint32 uint64 float double bool string bytes;
                `int` = some varint integer whose width the reference does not state;
                `?` = the reference states no type; `map<K,V>`; `enum NAME`; otherwise a
                message name, relative to the table's package unless it contains a dot.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import grpclib.client
import grpclib.const
import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from trio_direct._proto.native import sglang_grpc, sglang_pb2
from trio_direct._proto.smg import common_pb2, sglang_scheduler_grpc, sglang_scheduler_pb2

NATIVE = "sglang.runtime.v1"
SMG = "sglang.grpc.scheduler"
COMMON = "smg.grpc.common"

# ---- native API: sglang-native-grpc.md §4 (0.5.23 contract) -------------------------------------

NATIVE_MESSAGES: dict[str, list[tuple[int, str, str]]] = {
    "GenerateRequest": [  # §4.1
        (1, "input_ids", "repeated int32"),
        (2, "sampling_params", "opt SamplingParams"),
        (3, "stream", "opt bool"),
        (4, "return_logprob", "opt bool"),
        (5, "top_logprobs_num", "opt int32"),
        (6, "logprob_start_len", "opt int32"),
        (7, "rid", "opt string"),
        (8, "lora_path", "opt string"),
        (9, "routing_key", "opt string"),
        (10, "routed_dp_rank", "opt int32"),
        (11, "trace_headers", "map<string,string>"),
        (12, "session_id", "opt string"),
        (13, "disaggregated_params", "opt DisaggregatedParams"),
        (14, "priority", "opt int32"),
        (15, "require_reasoning", "opt bool"),
        (16, "max_thinking_tokens", "opt uint32"),
        (17, "kv_hints", "opt KvHintsEnvelope"),
        (18, "return_text", "opt? bool"),  # §10: optional-or-not unconfirmed
        (19, "image_data", "repeated string"),
        (20, "video_data", "repeated string"),
        (21, "audio_data", "repeated string"),
    ],
    "GenerateResponse": [  # §4.2
        (1, "output_ids", "repeated int32"),
        (2, "meta_info", "map<string,string>"),
        (3, "finished", "bool"),
        (4, "text", "string"),
    ],
    "SamplingParams": [  # §4.3
        (1, "temperature", "opt float"),
        (2, "top_p", "opt float"),
        (3, "top_k", "opt int32"),
        (4, "min_p", "opt float"),
        (5, "frequency_penalty", "opt float"),
        (6, "presence_penalty", "opt float"),
        (7, "repetition_penalty", "opt float"),
        (8, "max_new_tokens", "opt int32"),
        (9, "min_new_tokens", "opt int32"),
        (10, "stop", "repeated string"),
        (11, "stop_token_ids", "repeated int32"),
        (12, "ignore_eos", "opt bool"),
        (13, "n", "opt int32"),
        (14, "json_schema", "opt string"),
        (15, "regex", "opt string"),
        (16, "seed", "opt int64"),
        (17, "guided_decoding", "opt GuidedDecoding"),
    ],
    "GuidedDecoding": [  # §4.4
        (1, "json_schema", "oneof:constraint string"),
        (2, "regex", "oneof:constraint string"),
        (3, "ebnf", "oneof:constraint string"),
        (4, "choice", "oneof:constraint ChoiceConstraint"),
        (5, "structural_tag", "oneof:constraint string"),
    ],
    "ChoiceConstraint": [(1, "values", "repeated string")],
    "DisaggregatedParams": [  # §4.5
        (1, "bootstrap_host", "string"),
        (2, "bootstrap_port", "int32"),
        (3, "bootstrap_room", "int64"),
    ],
    "KvHintsEnvelope": [  # §4.6
        (1, "protocol_version", "string"),
        (2, "message_id", "string"),
        (3, "actions", "repeated KvHintAction"),
    ],
    "KvHintAction": [
        (1, "action_id", "string"),
        (2, "action_type", "string"),
        (3, "action_version", "string"),
        (4, "payload", "google.protobuf.Struct"),
    ],
    "TextGenerateRequest": [  # §4.7
        (1, "text", "string"),
        (2, "sampling_params", "opt SamplingParams"),
        (3, "stream", "opt bool"),
        (4, "return_logprob", "opt bool"),
        (5, "top_logprobs_num", "opt int32"),
        (6, "logprob_start_len", "opt int32"),
        (7, "return_text_in_logprobs", "opt bool"),
        (8, "rid", "opt string"),
        (9, "lora_path", "opt string"),
        (10, "routing_key", "opt string"),
        (11, "routed_dp_rank", "opt int32"),
        (12, "trace_headers", "map<string,string>"),
        (13, "session_id", "opt string"),
        (14, "disaggregated_params", "opt DisaggregatedParams"),
        (15, "priority", "opt int32"),
        (16, "require_reasoning", "opt bool"),
        (17, "max_thinking_tokens", "opt uint32"),
        (18, "kv_hints", "opt KvHintsEnvelope"),
    ],
    "TextGenerateResponse": [
        (1, "text", "string"),
        (2, "meta_info", "map<string,string>"),
        (3, "finished", "bool"),
    ],
    # §4.8 control and info messages
    "AbortRequest": [(1, "rid", "string"), (2, "abort_all", "bool")],
    "AbortResponse": [(1, "success", "bool")],
    "HealthCheckRequest": [],
    "HealthCheckResponse": [(1, "healthy", "bool")],
    "GetModelInfoRequest": [],
    "GetModelInfoResponse": [(1, "model_path", "string"), (2, "json_info", "string")],
    "GetServerInfoRequest": [],
    "GetServerInfoResponse": [(1, "json_info", "string")],
    "GetLoadRequest": [(1, "dp_rank", "opt int32")],
    "GetLoadResponse": [(1, "json_info", "string")],
    "ListModelsRequest": [],
    "ListModelsResponse": [(1, "models", "repeated ModelCard")],
    "ModelCard": [
        (1, "id", "string"),
        (2, "root", "string"),
        (3, "parent", "opt string"),
        (4, "max_model_len", "opt int32"),
    ],
    "WatchEngineStateRequest": [],
    "EngineStateSnapshot": [
        (1, "instance_id", "uint64"),
        (2, "revision", "uint64"),
        (3, "healthy", "bool"),
        (4, "is_pause", "bool"),
        (5, "model_info", "GetModelInfoResponse"),
        (6, "server_info", "GetServerInfoResponse"),
    ],
    "TokenizeRequest": [(1, "text", "string"), (2, "add_special_tokens", "opt bool")],
    "TokenizeResponse": [
        (1, "tokens", "repeated int32"),
        (2, "count", "int32"),
        (3, "max_model_len", "int32"),
        (4, "input_text", "string"),
    ],
    "DetokenizeRequest": [(1, "tokens", "repeated int32")],
    "DetokenizeResponse": [(1, "text", "string")],
    "EmbedRequest": [
        (1, "input_ids", "repeated int32"),
        (2, "rid", "opt string"),
        (3, "routing_key", "opt string"),
        (4, "trace_headers", "map<string,string>"),
    ],
    "TextEmbedRequest": [
        (1, "text", "string"),
        (2, "rid", "opt string"),
        (3, "routing_key", "opt string"),
        (4, "trace_headers", "map<string,string>"),
    ],
    "ClassifyRequest": [
        (1, "text", "string"),
        (2, "input_ids", "repeated int32"),
        (3, "rid", "opt string"),
        (4, "routing_key", "opt string"),
        (5, "trace_headers", "map<string,string>"),
    ],
    "EmbedResponse": [(1, "embedding", "repeated float"), (2, "meta_info", "map<string,string>")],
    "TextEmbedResponse": [
        (1, "embedding", "repeated float"),
        (2, "meta_info", "map<string,string>"),
    ],
    "ClassifyResponse": [
        (1, "embedding", "repeated float"),
        (2, "meta_info", "map<string,string>"),
    ],
    "FlushCacheRequest": [],
    "FlushCacheResponse": [(1, "success", "bool"), (2, "message", "string")],
    "PauseGenerationRequest": [(1, "mode", "string")],
    "PauseGenerationResponse": [(1, "message", "string")],
    "ContinueGenerationRequest": [],
    "ContinueGenerationResponse": [(1, "message", "string")],
    "OpenAIRequest": [(1, "json_body", "bytes"), (2, "trace_headers", "map<string,string>")],
    "OpenAIStreamChunk": [(1, "json_chunk", "bytes"), (2, "finished", "bool")],
    "OpenAIResponse": [(1, "json_body", "bytes"), (2, "status_code", "int32")],
    "StartProfileRequest": [(1, "output_dir", "opt string")],
    "StartProfileResponse": [(1, "message", "string")],
    "StopProfileRequest": [],
    "StopProfileResponse": [(1, "message", "string")],
    "UpdateWeightsRequest": [(1, "model_path", "string"), (2, "load_format", "opt string")],
    "UpdateWeightsResponse": [(1, "success", "bool"), (2, "message", "string")],
}

# §3: every RPC of the service (26 in 0.5.21+). (request, response, server-streaming)
NATIVE_RPCS: dict[str, tuple[str, str, bool]] = {
    "TextGenerate": ("TextGenerateRequest", "TextGenerateResponse", True),
    "Generate": ("GenerateRequest", "GenerateResponse", True),
    "TextEmbed": ("TextEmbedRequest", "TextEmbedResponse", False),
    "Embed": ("EmbedRequest", "EmbedResponse", False),
    "Classify": ("ClassifyRequest", "ClassifyResponse", False),
    "Tokenize": ("TokenizeRequest", "TokenizeResponse", False),
    "Detokenize": ("DetokenizeRequest", "DetokenizeResponse", False),
    "HealthCheck": ("HealthCheckRequest", "HealthCheckResponse", False),
    "WatchEngineState": ("WatchEngineStateRequest", "EngineStateSnapshot", True),
    "GetModelInfo": ("GetModelInfoRequest", "GetModelInfoResponse", False),
    "GetServerInfo": ("GetServerInfoRequest", "GetServerInfoResponse", False),
    "ListModels": ("ListModelsRequest", "ListModelsResponse", False),
    "GetLoad": ("GetLoadRequest", "GetLoadResponse", False),
    "Abort": ("AbortRequest", "AbortResponse", False),
    "FlushCache": ("FlushCacheRequest", "FlushCacheResponse", False),
    "PauseGeneration": ("PauseGenerationRequest", "PauseGenerationResponse", False),
    "ContinueGeneration": ("ContinueGenerationRequest", "ContinueGenerationResponse", False),
    "ChatComplete": ("OpenAIRequest", "OpenAIStreamChunk", True),
    "Complete": ("OpenAIRequest", "OpenAIStreamChunk", True),
    "OpenAIEmbed": ("OpenAIRequest", "OpenAIResponse", False),
    "OpenAIClassify": ("OpenAIRequest", "OpenAIResponse", False),
    "Score": ("OpenAIRequest", "OpenAIResponse", False),
    "Rerank": ("OpenAIRequest", "OpenAIResponse", False),
    "StartProfile": ("StartProfileRequest", "StartProfileResponse", False),
    "StopProfile": ("StopProfileRequest", "StopProfileResponse", False),
    "UpdateWeightsFromDisk": ("UpdateWeightsRequest", "UpdateWeightsResponse", False),
}

# ---- SMG API: sglang-smg-grpc.md §1.3-§1.7 (smg-grpc-proto 0.4.28) ------------------------------

SMG_MESSAGES: dict[str, list[tuple[int, str, str]]] = {
    "SamplingParams": [  # §1.3
        (1, "temperature", "float"),
        (2, "top_p", "float"),
        (3, "top_k", "int32"),
        (4, "min_p", "float"),
        (5, "frequency_penalty", "float"),
        (6, "presence_penalty", "float"),
        (7, "repetition_penalty", "float"),
        (8, "max_new_tokens", "opt uint32"),
        (9, "stop", "repeated string"),
        (10, "stop_token_ids", "repeated uint32"),
        (11, "skip_special_tokens", "bool"),
        (12, "spaces_between_special_tokens", "bool"),
        (13, "regex", "oneof:constraint string"),
        (14, "json_schema", "oneof:constraint string"),
        (15, "ebnf_grammar", "oneof:constraint string"),
        (16, "structural_tag", "oneof:constraint string"),
        (17, "n", "uint32"),
        (18, "min_new_tokens", "uint32"),
        (19, "ignore_eos", "bool"),
        (20, "no_stop_trim", "bool"),
        (21, "stream_interval", "opt int32"),
        (22, "logit_bias", "map<string,float>"),
        (23, "custom_params", "google.protobuf.Struct"),
    ],
    "GenerateRequest": [  # §1.4
        (1, "request_id", "string"),
        (2, "tokenized", "TokenizedInput"),
        (3, "mm_inputs", "MultimodalInputs"),
        (4, "sampling_params", "SamplingParams"),
        (5, "return_logprob", "bool"),
        (6, "logprob_start_len", "int32"),
        (7, "top_logprobs_num", "int32"),
        (8, "token_ids_logprob", "repeated uint32"),
        (9, "return_hidden_states", "bool"),
        (10, "disaggregated_params", "DisaggregatedParams"),
        (11, "custom_logit_processor", "string"),
        (12, "timestamp", "google.protobuf.Timestamp"),
        (13, "log_metrics", "bool"),
        (14, "input_embeds", "repeated float"),
        (15, "lora_id", "string"),
        (16, "data_parallel_rank", "opt int32"),
        (17, "stream", "bool"),
        (18, "require_reasoning", "bool"),
    ],
    "TokenizedInput": [(1, "original_text", "string"), (2, "input_ids", "repeated uint32")],
    "DisaggregatedParams": [
        (1, "bootstrap_host", "string"),
        (2, "bootstrap_port", "int32"),
        (3, "bootstrap_room", "int32"),  # int32 here, int64 on the native API
    ],
    "GenerateResponse": [  # §1.5; field 4 reserved (was GenerateError)
        (1, "request_id", "string"),
        (2, "chunk", "oneof:response GenerateStreamChunk"),
        (3, "complete", "oneof:response GenerateComplete"),
    ],
    "GenerateStreamChunk": [
        (1, "token_ids", "repeated uint32"),
        (2, "prompt_tokens", "uint32"),
        (3, "completion_tokens", "uint32"),
        (4, "cached_tokens", "uint32"),
        (5, "output_logprobs", "OutputLogProbs"),
        (6, "hidden_states", "repeated float"),
        (7, "input_logprobs", "InputLogProbs"),
        (8, "index", "uint32"),
        (9, "reasoning_tokens", "uint32"),
    ],
    "GenerateComplete": [
        (1, "output_ids", "repeated uint32"),
        (2, "finish_reason", "string"),
        (3, "prompt_tokens", "uint32"),
        (4, "completion_tokens", "uint32"),
        (5, "cached_tokens", "uint32"),
        (6, "output_logprobs", "OutputLogProbs"),
        (7, "all_hidden_states", "repeated HiddenStates"),
        (8, "matched_token_id", "oneof:matched_stop uint32"),
        (9, "matched_stop_str", "oneof:matched_stop string"),
        (10, "input_logprobs", "InputLogProbs"),
        (11, "index", "uint32"),
        (12, "reasoning_tokens", "uint32"),
        (13, "spec_accepted_tokens", "uint32"),
        (14, "spec_draft_tokens", "uint32"),
    ],
    "OutputLogProbs": [
        (1, "token_logprobs", "repeated float"),
        (2, "token_ids", "repeated uint32"),
        (3, "top_logprobs", "repeated TopLogProbs"),
        (4, "token_ids_logprobs", "repeated TopLogProbs"),
    ],
    "InputLogProbs": [
        (1, "token_logprobs", "repeated InputTokenLogProb"),
        (2, "token_ids", "repeated uint32"),
        (3, "top_logprobs", "repeated TopLogProbs"),
    ],
    "InputTokenLogProb": [(1, "value", "opt float")],
    "TopLogProbs": [(1, "values", "repeated float"), (2, "token_ids", "repeated uint32")],
    "HiddenStates": [
        (1, "values", "repeated float"),
        (2, "layer", "int32"),
        (3, "position", "int32"),
    ],
    # §1.7 management messages
    "AbortRequest": [(1, "request_id", "string"), (2, "reason", "string")],
    "AbortResponse": [(1, "success", "bool"), (2, "message", "string")],
    "HealthCheckRequest": [],
    "HealthCheckResponse": [(1, "healthy", "bool"), (2, "message", "string")],
    "GetModelInfoRequest": [],
    "GetModelInfoResponse": [
        (1, "model_path", "string"),
        (2, "tokenizer_path", "string"),
        (3, "is_generation", "bool"),
        (4, "preferred_sampling_params", "string"),  # "JSON or ''"
        (5, "weight_version", "string"),
        (6, "served_model_name", "string"),
        (7, "max_context_length", "int32"),
        (8, "vocab_size", "int"),
        (9, "supports_vision", "bool"),
        (10, "model_type", "string"),
        (11, "eos_token_ids", "repeated int32"),
        (12, "pad_token_id", "int"),
        (13, "bos_token_id", "int"),
        (14, "max_req_input_len", "int"),
        (15, "architectures", "repeated string"),
        (16, "id2label_json", "string"),
        (17, "num_labels", "int"),
        (20, "default_sampling_params_json", "string"),
    ],
    "GetServerInfoRequest": [],
    "GetServerInfoResponse": [
        (1, "server_args", "google.protobuf.Struct"),
        (2, "scheduler_info", "google.protobuf.Struct"),
        (3, "active_requests", "int32"),
        (4, "is_paused", "bool"),
        (5, "last_receive_timestamp", "double"),
        (6, "uptime_seconds", "double"),
        (7, "sglang_version", "string"),
        (8, "server_type", "string"),
        (9, "start_time", "google.protobuf.Timestamp"),
        (10, "max_total_num_tokens", "int32"),
    ],
    "GetLoadsRequest": [(1, "dp_rank", "opt int32"), (2, "include", "repeated string")],
    "GetLoadsResponse": [
        (1, "timestamp", "string"),
        (2, "version", "?"),
        (3, "dp_rank_count", "int"),
        (4, "loads", "repeated SchedulerLoad"),
        (5, "aggregate", "AggregateMetrics"),
    ],
    "SchedulerLoad": [
        (1, "dp_rank", "int"),
        (2, "num_running_reqs", "int"),
        (3, "num_waiting_reqs", "int"),
        (4, "num_total_reqs", "int"),
        (5, "num_used_tokens", "int"),
        (6, "max_total_num_tokens", "int"),
        (7, "token_usage", "double"),
        (8, "gen_throughput", "double"),
        (9, "cache_hit_rate", "double"),
        (10, "utilization", "double"),
        (11, "max_running_requests", "int"),
        (12, "memory", "opt MemoryMetrics"),
        (13, "speculative", "opt SpeculativeMetrics"),
        (14, "lora", "opt LoRAMetrics"),
        (15, "disaggregation", "opt DisaggregationMetrics"),
        (16, "queues", "opt QueueMetrics"),
        (17, "num_waiting_uncached_tokens", "int"),
    ],
}

# kv-events.md §9 (common.proto, package smg.grpc.common)
COMMON_MESSAGES: dict[str, list[tuple[int, str, str]]] = {
    "SubscribeKvEventsRequest": [
        (1, "start_sequence_number", "uint64"),
        (2, "load_records_before_first_batch", "bool"),
    ],
    "KvEventBatch": [  # fields 5 and 6 reserved
        (1, "sequence_number", "uint64"),
        (2, "timestamp", "double"),
        (3, "events", "repeated KvCacheEvent"),
        (4, "dp_rank", "opt int32"),
        (7, "snapshot", "KvSnapshotChunk"),
        (8, "load", "EngineLoad"),
    ],
    "KvCacheEvent": [
        (1, "event_id", "uint64"),
        (2, "stored", "oneof:data KvBlocksStored"),
        (3, "removed", "oneof:data KvBlocksRemoved"),
        (4, "cleared", "oneof:data KvCacheCleared"),
    ],
    "KvBlocksStored": [
        (1, "blocks", "repeated KvBlock"),
        (2, "parent_block_hash", "opt int64"),
        (3, "tier", "opt enum KvCacheTier"),
        (4, "medium", "opt string"),
        (5, "group_idx", "opt uint32"),
        (6, "kv_cache_spec_kind", "opt string"),
        (7, "kv_cache_spec_sliding_window", "opt uint32"),
        (8, "locality", "opt enum KvCacheLocality"),
        (9, "ownership", "opt string"),
        (10, "session_id", "opt string"),
        (11, "lora_name", "opt string"),
        (12, "cache_salt", "opt string"),
    ],
    "KvBlock": [
        (1, "block_hash", "int64"),
        (2, "token_ids", "repeated uint32"),
        (3, "block_size", "int32"),
        (4, "lora_id", "opt int64"),
        (5, "cache_level", "opt int32"),
        (6, "extra_keys", "repeated KvBlockExtraKey"),
    ],
    "KvBlocksRemoved": [
        (1, "block_hashes", "repeated int64"),
        (2, "cache_level", "opt int32"),
        (3, "tier", "opt enum KvCacheTier"),
        (4, "medium", "opt string"),
        (5, "group_idx", "opt uint32"),
        (6, "locality", "opt enum KvCacheLocality"),
        (7, "ownership", "opt string"),
    ],
    "KvCacheCleared": [(1, "ownership", "opt string")],
}

RESERVED: dict[str, set[int]] = {
    f"{SMG}.GenerateResponse": {4},
    f"{SMG}.EmbedResponse": {1, 2, 3},
    f"{COMMON}.KvEventBatch": {5, 6},
}

# sglang-smg-grpc.md §1.2 (every RPC of 0.4.28). (request, response, server-streaming)
SMG_RPCS: dict[str, tuple[str, str, bool]] = {
    "Generate": ("GenerateRequest", "GenerateResponse", True),
    "Embed": ("EmbedRequest", "EmbedResponse", False),
    "HealthCheck": ("HealthCheckRequest", "HealthCheckResponse", False),
    "Abort": ("AbortRequest", "AbortResponse", False),
    "GetModelInfo": ("GetModelInfoRequest", "GetModelInfoResponse", False),
    "GetServerInfo": ("GetServerInfoRequest", "GetServerInfoResponse", False),
    "GetLoads": ("GetLoadsRequest", "GetLoadsResponse", False),
    "GetTokenizer": (f"{COMMON}.GetTokenizerRequest", f"{COMMON}.GetTokenizerChunk", True),
    "SubscribeKvEvents": (f"{COMMON}.SubscribeKvEventsRequest", f"{COMMON}.KvEventBatch", True),
    "FlushCache": (f"{COMMON}.FlushCacheRequest", f"{COMMON}.FlushCacheResponse", False),
    "StartProfile": (f"{COMMON}.StartProfileRequest", f"{COMMON}.ProfileResponse", False),
    "StopProfile": (f"{COMMON}.StopProfileRequest", f"{COMMON}.ProfileResponse", False),
    "LoadLoRAAdapter": ("LoadLoRAAdapterRequest", "LoadLoRAAdapterResponse", False),
    "UnloadLoRAAdapter": ("UnloadLoRAAdapterRequest", "UnloadLoRAAdapterResponse", False),
    "ListLoadedLoRAAdapters": (
        "ListLoadedLoRAAdaptersRequest",
        "ListLoadedLoRAAdaptersResponse",
        False,
    ),
}

# ---- the comparison ------------------------------------------------------------------------------

SCALARS = {
    "int32": FieldDescriptor.TYPE_INT32,
    "int64": FieldDescriptor.TYPE_INT64,
    "uint32": FieldDescriptor.TYPE_UINT32,
    "uint64": FieldDescriptor.TYPE_UINT64,
    "float": FieldDescriptor.TYPE_FLOAT,
    "double": FieldDescriptor.TYPE_DOUBLE,
    "bool": FieldDescriptor.TYPE_BOOL,
    "string": FieldDescriptor.TYPE_STRING,
    "bytes": FieldDescriptor.TYPE_BYTES,
}
VARINT_INTS = {SCALARS[t] for t in ("int32", "int64", "uint32", "uint64")}


@dataclass(frozen=True, slots=True)
class Expected:
    """One row of a reference table, parsed."""

    number: int
    name: str
    type: str  # scalar name, "int", "?", "map<K,V>", "enum", or "message"
    type_name: str | None  # full name of the message/enum type
    label: str  # "repeated" | "optional" | "singular" | "any"
    oneof: str | None


def parse(package: str, number: int, name: str, spec: str) -> Expected:
    words = spec.split()
    label, oneof = "singular", None
    while words[0] in ("repeated", "opt", "opt?") or words[0].startswith("oneof:"):
        word = words.pop(0)
        if word.startswith("oneof:"):
            oneof = word.removeprefix("oneof:")
        else:
            label = {"repeated": "repeated", "opt": "optional", "opt?": "any"}[word]
    if words[0] == "enum":
        type_, words = "enum", words[1:]
    else:
        type_ = words[0]
    (type_word,) = words
    if type_ in SCALARS or type_ in ("int", "?") or type_.startswith("map<"):
        return Expected(number, name, type_, None, label, oneof)
    full = type_word if "." in type_word else f"{package}.{type_word}"
    return Expected(number, name, "enum" if type_ == "enum" else "message", full, label, oneof)


def _rows(
    package: str, module: ModuleType, table: dict[str, list[tuple[int, str, str]]]
) -> list[tuple[str, ModuleType, str, Expected]]:
    return [(package, module, message, parse(package, *row)) for message, rows in table.items() for row in rows]


FIELD_ROWS = (
    _rows(NATIVE, sglang_pb2, NATIVE_MESSAGES)
    + _rows(SMG, sglang_scheduler_pb2, SMG_MESSAGES)
    + _rows(COMMON, common_pb2, COMMON_MESSAGES)
)
MESSAGE_ROWS = (
    [(NATIVE, sglang_pb2, m, rows) for m, rows in NATIVE_MESSAGES.items()]
    + [(SMG, sglang_scheduler_pb2, m, rows) for m, rows in SMG_MESSAGES.items()]
    + [(COMMON, common_pb2, m, rows) for m, rows in COMMON_MESSAGES.items()]
)


def _descriptor(package: str, module: ModuleType, message: str) -> Descriptor:
    desc = module.DESCRIPTOR.message_types_by_name[message]
    assert desc.full_name == f"{package}.{message}"
    return desc


def _field_proto(desc: Descriptor, name: str) -> descriptor_pb2.FieldDescriptorProto:
    proto = descriptor_pb2.DescriptorProto()
    desc.CopyToProto(proto)
    return next(f for f in proto.field if f.name == name)


def _actual_type(field: FieldDescriptor) -> tuple[str, str | None]:
    """(kind, full type name) in the vocabulary of the tables above."""
    if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
        key = field.message_type.fields_by_name["key"]
        value = field.message_type.fields_by_name["value"]
        return f"map<{_scalar_name(key.type)},{_scalar_name(value.type)}>", None
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        return "message", field.message_type.full_name
    if field.type == FieldDescriptor.TYPE_ENUM:
        return "enum", field.enum_type.full_name
    return _scalar_name(field.type), None


def _scalar_name(type_: int) -> str:
    names = {number: name for name, number in SCALARS.items()}
    return names.get(type_, f"FieldDescriptor type {type_}")


@pytest.mark.parametrize(
    ("package", "module", "message", "expected"),
    FIELD_ROWS,
    ids=[f"{p}.{m}.{e.name}" for p, _, m, e in FIELD_ROWS],
)
def test_field_matches_reference(package: str, module: ModuleType, message: str, expected: Expected) -> None:
    desc = _descriptor(package, module, message)
    field = desc.fields_by_number.get(expected.number)
    assert field is not None, f"field {expected.number} ({expected.name}) missing"
    assert field.name == expected.name

    kind, type_name = _actual_type(field)
    if expected.type == "int":
        assert field.type in VARINT_INTS, f"{kind} is not a varint integer"
    elif expected.type != "?":
        assert (kind, type_name) == (expected.type, expected.type_name)

    proto = _field_proto(desc, field.name)
    is_map = kind.startswith("map<")
    label = "repeated" if field.is_repeated and not is_map else "optional" if proto.proto3_optional else "singular"
    if is_map:
        assert field.is_repeated and expected.label == "singular"
    elif expected.label != "any":
        assert label == expected.label

    real_oneof = None if proto.proto3_optional or field.containing_oneof is None else (field.containing_oneof.name)
    assert real_oneof == expected.oneof


@pytest.mark.parametrize(
    ("package", "module", "message", "rows"),
    MESSAGE_ROWS,
    ids=[f"{p}.{m}" for p, _, m, _ in MESSAGE_ROWS],
)
def test_message_has_no_unlisted_fields(
    package: str, module: ModuleType, message: str, rows: list[tuple[int, str, str]]
) -> None:
    desc = _descriptor(package, module, message)
    assert sorted(desc.fields_by_number) == sorted(number for number, _, _ in rows)
    proto = descriptor_pb2.DescriptorProto()
    desc.CopyToProto(proto)
    reserved = {n for r in proto.reserved_range for n in range(r.start, r.end)}
    assert reserved == RESERVED.get(desc.full_name, set())


def test_kv_cache_tier_values() -> None:
    """kv-events.md §9: UNSPECIFIED=0, DEVICE=1, HOST=2, DISK=3, EXTERNAL=4."""
    values = common_pb2.KvCacheTier.DESCRIPTOR.values_by_name
    numbers = {name.removeprefix("KV_CACHE_TIER_"): v.number for name, v in values.items()}
    assert numbers == {"UNSPECIFIED": 0, "DEVICE": 1, "HOST": 2, "DISK": 3, "EXTERNAL": 4}


# ---- services: method paths and streaming cardinality --------------------------------------------

SERVICES = [
    (NATIVE, "SglangService", sglang_pb2, sglang_grpc, NATIVE_RPCS),
    (SMG, "SglangScheduler", sglang_scheduler_pb2, sglang_scheduler_grpc, SMG_RPCS),
]
RPC_ROWS = [
    (package, service, pb2, grpc_module, rpc, *spec)
    for package, service, pb2, grpc_module, rpcs in SERVICES
    for rpc, spec in rpcs.items()
]
CARDINALITY = {
    False: grpclib.const.Cardinality.UNARY_UNARY,
    True: grpclib.const.Cardinality.UNARY_STREAM,
}


def _full(package: str, name: str) -> str:
    return name if "." in name else f"{package}.{name}"


def _server_mapping(grpc_module: ModuleType, service: str) -> dict[str, grpclib.const.Handler]:
    base = getattr(grpc_module, f"{service}Base")
    impl = type("Impl", (base,), {n: lambda self, stream: None for n in base.__abstractmethods__})
    return impl().__mapping__()


@pytest.mark.parametrize(
    ("package", "service", "pb2", "grpc_module", "rpcs"),
    SERVICES,
    ids=[f"{s[0]}.{s[1]}" for s in SERVICES],
)
def test_service_has_exactly_the_reference_rpcs(
    package: str,
    service: str,
    pb2: ModuleType,
    grpc_module: ModuleType,
    rpcs: dict[str, tuple[str, str, bool]],
) -> None:
    desc = pb2.DESCRIPTOR.services_by_name[service]
    assert desc.full_name == f"{package}.{service}"
    assert set(desc.methods_by_name) == set(rpcs)
    paths = {f"/{package}.{service}/{rpc}" for rpc in rpcs}
    assert set(_server_mapping(grpc_module, service)) == paths


def test_native_service_has_26_rpcs() -> None:
    assert len(sglang_pb2.DESCRIPTOR.services_by_name["SglangService"].methods) == 26


@pytest.mark.parametrize(
    ("package", "service", "pb2", "grpc_module", "rpc", "request_name", "response", "streams"),
    RPC_ROWS,
    ids=[f"/{r[0]}.{r[1]}/{r[4]}" for r in RPC_ROWS],
)
def test_rpc_path_types_and_cardinality(
    package: str,
    service: str,
    pb2: ModuleType,
    grpc_module: ModuleType,
    rpc: str,
    request_name: str,
    response: str,
    streams: bool,
) -> None:
    path = f"/{package}.{service}/{rpc}"
    request_full, response_full = _full(package, request_name), _full(package, response)

    method = pb2.DESCRIPTOR.services_by_name[service].methods_by_name[rpc]
    assert (method.client_streaming, method.server_streaming) == (False, streams)
    assert method.input_type.full_name == request_full
    assert method.output_type.full_name == response_full

    # What the mock engine serves: grpclib's server-side handler table.
    handler = _server_mapping(grpc_module, service)[path]
    assert handler.cardinality is CARDINALITY[streams]
    assert handler.request_type.DESCRIPTOR.full_name == request_full
    assert handler.reply_type.DESCRIPTOR.full_name == response_full

    # What trio-direct sends: the generated client stub.
    client = getattr(getattr(grpc_module, f"{service}Stub")(channel=None), rpc)
    streaming = grpclib.client.UnaryStreamMethod if streams else grpclib.client.UnaryUnaryMethod
    assert type(client) is streaming
    assert client.name == path
    assert client.request_type.DESCRIPTOR.full_name == request_full
    assert client.reply_type.DESCRIPTOR.full_name == response_full


# ---- bytes on the wire ---------------------------------------------------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _records(data: bytes) -> list[tuple[int, bytes]]:
    """Split one message's wire bytes into (field number, record bytes including the tag)."""
    out, pos = [], 0
    while pos < len(data):
        start = pos
        tag, pos = _varint(data, pos)
        wire_type = tag & 7
        if wire_type == 0:
            _, pos = _varint(data, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 2:
            length, pos = _varint(data, pos)
            pos += length
        elif wire_type == 5:
            pos += 4
        else:
            raise AssertionError(f"unexpected wire type {wire_type}")
        out.append((tag >> 3, data[start:pos]))
    return out


def _full_generate_request() -> sglang_pb2.GenerateRequest:
    pb = sglang_pb2
    payload = {"prefix_len": 128.0, "tier": "host"}
    hint = pb.KvHintAction(action_id="a1", action_type="prefetch", action_version="1")
    hint.payload.update(payload)
    return pb.GenerateRequest(
        input_ids=[1, 2, 3, 70000],
        sampling_params=pb.SamplingParams(
            temperature=0.0,  # explicit zero is still sent (presence)
            top_p=0.9,
            top_k=-1,
            min_p=0.05,
            frequency_penalty=0.1,
            presence_penalty=0.2,
            repetition_penalty=1.1,
            max_new_tokens=16,
            min_new_tokens=1,
            stop=["\n\n"],
            stop_token_ids=[2],
            ignore_eos=False,
            n=1,
            json_schema='{"type":"object"}',
            regex="[a-z]+",
            seed=-(2**63),
            guided_decoding=pb.GuidedDecoding(choice=pb.ChoiceConstraint(values=["yes", "no"])),
        ),
        stream=True,
        return_logprob=False,
        top_logprobs_num=0,
        logprob_start_len=-1,
        rid="0b7e5a3c-6d0e-4a8e-9c61-3f1f0c2a9d11",
        lora_path="adapter-a",
        routing_key="user-42",
        routed_dp_rank=0,
        trace_headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        session_id="session-1",
        disaggregated_params=pb.DisaggregatedParams(
            bootstrap_host="10.0.0.7", bootstrap_port=8998, bootstrap_room=2**63 - 1
        ),
        priority=-5,
        require_reasoning=True,
        max_thinking_tokens=2**32 - 1,
        kv_hints=pb.KvHintsEnvelope(protocol_version="v1", message_id="m1", actions=[hint]),
        return_text=True,
        image_data=["data:image/png;base64,AAAA"],
        video_data=["file:///v.mp4"],
        audio_data=["file:///a.wav"],
    )


def test_full_generate_request_round_trips_with_every_field_on_the_wire() -> None:
    req = _full_generate_request()
    assert len(req.ListFields()) == len(req.DESCRIPTOR.fields)
    assert len(req.sampling_params.ListFields()) == len(req.sampling_params.DESCRIPTOR.fields)

    data = req.SerializeToString(deterministic=True)
    assert sglang_pb2.GenerateRequest.FromString(data) == req
    assert {number for number, _ in _records(data)} == set(range(1, 22))


def test_disaggregated_params_is_field_13_on_the_wire() -> None:
    """The classic upstream mis-numbering put DisaggregatedParams at 12 (session_id's slot)."""
    data = _full_generate_request().SerializeToString(deterministic=True)
    records = dict(_records(data))

    pd = records[13]
    assert pd[0] == 0x6A  # field 13, wire type 2 (length-delimited)
    length, start = _varint(pd, 1)
    parsed = sglang_pb2.DisaggregatedParams.FromString(pd[start : start + length])
    assert (parsed.bootstrap_host, parsed.bootstrap_port, parsed.bootstrap_room) == (
        "10.0.0.7",
        8998,
        2**63 - 1,
    )

    session = records[12]
    assert session[0] == 0x62  # field 12, wire type 2: the session_id string
    assert session.endswith(b"session-1")


def test_bootstrap_room_is_signed_int64() -> None:
    """§4.5: a varint of 2^63+7 arrives negative; a positive room below 2^63 survives."""
    value, out = 2**63 + 7, bytearray([0x18])  # field 3, wire type 0
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            break
    assert sglang_pb2.DisaggregatedParams.FromString(bytes(out)).bootstrap_room == 7 - 2**63
