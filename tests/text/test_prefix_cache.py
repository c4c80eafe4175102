"""The prompt prefix cache: the same token ids as a full encode, whatever the conversation."""

from __future__ import annotations

import gc
import random
import struct
import threading
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support import TRACE_SAMPLE
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from trio_direct.bench.trace import BLOCK_SIZE, conversation_turns, load_trace
from trio_direct.engine.packed_ids import pack_ids, pack_u32le
from trio_direct.routing.block_hash import token_array
from trio_direct.text import prefix_cache
from trio_direct.text.chat_template import render_chat
from trio_direct.text.prefix_cache import PromptPrefixCache, cut_tokens
from trio_direct.text.tokenizer import ModelTokenizer

TEMPLATES = Path(__file__).parent / "templates"

# Text that BPE merges eagerly and pre-tokenizers split in many ways: words, digits, punctuation,
# whitespace runs, CJK, accents, and the pieces (and whole texts) of chat-template tokens.
_WORDS = [
    "the", "quick", "brown", "fox", "router", "model", "token", "12345", "3.14159", ",;:!?", "...", "--",
    "(", ")", "[", "]", "{", "}", "\n", "\n\n", "\t", "  ", "", "naïve", "café", "中文字符", "日本語",
    "ＡＢＣ", "emoji🙂", "▁", "Ġ", "don't", "it's", "<|", "|>", "<|im_", "<|im_end|>", "<|im_start|>",
    "im_end", "<｜", "｜>", "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>",
]  # fmt: skip


def words(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_WORDS) + rng.choice(("", " ", " ", "\n")) for _ in range(n))


def deepseek_v3(deepseek_dir: Path, tmp_path: Path) -> ModelTokenizer:
    """The real DeepSeek tokenizer with a DeepSeek V3 layout template (<｜User｜>, <｜Assistant｜>)."""
    directory = tmp_path / "deepseek-v3"
    directory.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (directory / name).write_bytes((deepseek_dir / name).read_bytes())
    (directory / "chat_template.jinja").write_text((TEMPLATES / "deepseek_v3_tools.jinja").read_text())
    return ModelTokenizer.from_directory(directory)


def conversation(tokenizer: ModelTokenizer, rng: random.Random, turns: int) -> list[str]:
    """The rendered prompt of every turn of one chat (history resent each turn)."""
    messages = [{"role": "system", "content": words(rng, rng.randint(0, 300))}]
    prompts = []
    for _ in range(turns):
        messages.append({"role": "user", "content": words(rng, rng.randint(1, 400))})
        prompts.append(render_chat(tokenizer, messages))
        messages.append({"role": "assistant", "content": words(rng, rng.randint(0, 200))})
    return prompts


def assert_same_as_full_encode(tokenizer: ModelTokenizer, prompts: list[str]) -> None:
    """Each prompt's ids are those of a full encode, and so are the ids packed for the wire."""
    for prompt in prompts:
        full = tokenizer.encode(prompt, add_special_tokens=False)
        assert tokenizer.encode_prompt(prompt) == full
        packed = tokenizer.encode_prompt_packed(prompt)
        assert list(packed.ids) == full
        assert packed.payload == pack_ids(full)


def test_a_chat_prompts_ids_take_four_bytes_an_id_and_no_garbage_collector_walk(tiny):
    """A prompt's ids live as long as its request. As a list they take ~40 bytes an id (a pointer
    and an int object: ~0.8 MB for a 20k-token prompt) and every young garbage collection walks
    them; the cache hands out one array of unsigned 32-bit ints instead, for a new prompt and for a
    follow-up whose history it holds, which the KV router hashes as it is (no copy)."""
    for turn, prompt in enumerate(conversation(tiny, random.Random(21), 3)):
        packed = tiny.encode_prompt_packed(prompt)
        assert isinstance(packed.ids, array) and packed.ids.itemsize == 4
        assert len(gc.get_referents(packed.ids)) <= 1  # what a collection walks: its type at most, no ids
        assert token_array(packed.ids) is packed.ids
        assert list(packed.ids) == tiny.encode(prompt, add_special_tokens=False)
        assert (tiny.prompt_cache.stats.hits > 0) == (turn > 0)


# --- equality with a full encode --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny", "deepseek_chatml", "deepseek_v3", "sentencepiece"])
def test_multi_turn_prompts_get_the_ids_of_a_full_encode_and_reuse_the_history(
    name, tiny, deepseek, deepseek_dir, sentencepiece, tmp_path
):
    tokenizer = {
        "tiny": tiny,
        "deepseek_chatml": deepseek,
        "deepseek_v3": deepseek_v3(deepseek_dir, tmp_path) if name == "deepseek_v3" else None,
        "sentencepiece": sentencepiece,
    }[name]
    if name == "sentencepiece":  # no chat template: a ChatML-like layout of its own special tokens
        turns = ["<s>" + words(random.Random(j), 120) for j in range(6)]
        prompts = ["</s>".join(turns[: i + 1]) + "</s>" for i in range(6)]
    else:
        prompts = [p for seed in range(6) for p in conversation(tokenizer, random.Random(seed), 6)]
    cache = tokenizer.prompt_cache
    assert cache is not None
    before = cache.stats.reused_chars
    assert_same_as_full_encode(tokenizer, prompts)
    assert cache.stats.reused_chars - before > sum(map(len, prompts)) / 2, "most of each history came cached"


def test_deepseek_cuts_at_its_turn_tokens_and_bos(deepseek_dir, tmp_path):
    tokenizer = deepseek_v3(deepseek_dir, tmp_path)
    assert tokenizer.prompt_cache is not None
    cuts = set(tokenizer.prompt_cache.cut_token_texts)
    assert {"<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>"} <= cuts


def trace_chats(tokenizer: ModelTokenizer, limit: int) -> list[list[str]]:
    """Rendered prompts of the trace's first multi-turn conversations, text drawn per block id."""
    path = TRACE_SAMPLE
    blocks: dict[int, str] = {}

    def block(hash_id: int, size: int = BLOCK_SIZE // 8) -> str:  # shorter blocks: a quick test
        if hash_id not in blocks:
            blocks[hash_id] = words(random.Random(hash_id), size)
        return blocks[hash_id]

    chats = []
    for turns in conversation_turns(load_trace(path, limit=600), min_turns=2)[:limit]:
        messages = [{"role": "system", "content": block(turns[0].request.hash_ids[0])}]
        prompts = []
        for index, turn in enumerate(turns[:6]):
            if index:
                messages.append({"role": "assistant", "content": block(-1 - turn.request.index, 16)})
            messages.append({"role": "user", "content": "".join(block(h) for h in turn.new_blocks[:12])})
            prompts.append(render_chat(tokenizer, messages))
        chats.append(prompts)
    return chats


@pytest.mark.parametrize("name", ["tiny", "deepseek_v3"])
def test_the_trace_conversations_get_the_ids_of_a_full_encode(name, tiny, deepseek_dir, tmp_path):
    tokenizer = tiny if name == "tiny" else deepseek_v3(deepseek_dir, tmp_path)
    chats = trace_chats(tokenizer, 25)
    assert sum(len(chat) for chat in chats) >= 50
    assert tokenizer.prompt_cache is not None
    before = tokenizer.prompt_cache.stats.hits
    for prompts in chats:
        assert_same_as_full_encode(tokenizer, prompts)
    assert tokenizer.prompt_cache.stats.hits - before >= sum(len(chat) - 1 for chat in chats)


_PARTS = [*"ab \n.1中", "<|im_end|>", "<|im_start|>", "<|im_", "|>", "<|endoftext|>"]
_texts = st.lists(st.sampled_from(_PARTS), max_size=30).map("".join)


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(_texts, min_size=1, max_size=12), edits=st.lists(st.integers(0, 11), max_size=3))
def test_any_text_gets_the_ids_of_a_full_encode(tiny, pieces, edits):
    """Arbitrary texts (special tokens anywhere, in pieces, back to back), a history that grows and
    one whose middle changed; a tiny segment size so that every cut token can be a cut."""
    cache = PromptPrefixCache(
        lambda text: tiny.encode(text, add_special_tokens=False),
        cut_tokens(tiny.tokenizer),
        min_segment_chars=1,
        max_bytes=4000,
    )
    prompts = ["".join(pieces[: i + 1]) for i in range(len(pieces))]
    for index in edits:
        changed = list(pieces)
        changed[index % len(pieces)] += "<|im_end|>x"
        prompts.append("".join(changed))
    for prompt in prompts + prompts[::-1]:
        full = tiny.encode(prompt, add_special_tokens=False)
        assert cache.encode(prompt) == full
        ids, payload = cache.encode_packed(prompt)
        assert (list(ids), payload) == (full, pack_ids(full))
        assert cache.stats.bytes <= 4000


def test_a_naive_cut_would_be_wrong_which_is_why_cuts_follow_added_tokens(tiny):
    """What the cache must not do: the ids of a + b are not the ids of a then those of b."""
    text = "the quick brown fox jumps over the lazy dog"
    wrong = [cut for cut in range(1, len(text)) if tiny.encode(text[:cut], add_special_tokens=False)
             + tiny.encode(text[cut:], add_special_tokens=False) != tiny.encode(text, add_special_tokens=False)]  # fmt: skip
    assert wrong, "BPE merges across some cut"
    cache = tiny.prompt_cache
    for cut in wrong:
        prompt = text[:cut] + "<|im_end|>" + text[cut:]
        assert cache.encode(prompt) == tiny.encode(prompt, add_special_tokens=False)


def test_a_follow_up_turn_packs_only_its_new_ids_for_the_wire(tiny, monkeypatch):
    """The history's ids come packed from the cache: a turn packs the ids it had to tokenize (what
    follows the cached history), not its whole prompt."""
    tokenized: list[int] = []
    packed: list[int] = []

    def encode(text):
        ids = tiny.encode(text, add_special_tokens=False)
        tokenized.append(len(ids))
        return ids

    def counting_pack_ids(ids):
        packed.append(len(ids))
        return pack_ids(ids)

    def counting_pack_u32le(data):
        packed.append(len(data) // 4)
        return pack_u32le(data)

    cache = PromptPrefixCache(encode, cut_tokens(tiny.tokenizer))
    monkeypatch.setattr(prefix_cache, "pack_ids", counting_pack_ids)
    monkeypatch.setattr(prefix_cache, "pack_u32le", counting_pack_u32le)
    for turn, prompt in enumerate(conversation(tiny, random.Random(3), 6)):
        tokenized.clear()
        packed.clear()
        ids, payload = cache.encode_packed(prompt)
        assert payload == pack_ids(ids)
        assert sum(packed) == sum(tokenized)
        if turn:
            assert sum(packed) < len(ids) / 2, "the history came packed from the cache"


@pytest.mark.parametrize("meanwhile", ["nothing", "cleared", "evicted", "other chats cached"])
def test_a_lookup_finished_later_gets_the_full_encode_ids_whatever_the_cache_did_meanwhile(tiny, meanwhile):
    """`lookup` (on the event loop) and `finish` (perhaps on a worker thread, later): other requests
    may change the trie in between. What the lookup found stays valid, and the ids are a full
    encode's; what `lookup` says is left to encode is what the follow-up adds."""

    def encode(text: str) -> list[int]:
        return tiny.encode(text, add_special_tokens=False)

    cache = PromptPrefixCache(encode, cut_tokens(tiny.tokenizer), max_bytes=120_000)
    turns = conversation(tiny, random.Random(11), 4)
    for prompt in turns[:-1]:
        cache.encode_packed(prompt)
    follow_up = turns[-1]
    found = cache.lookup(follow_up)
    assert found.start > len(turns[-2]) / 2 and found.new_chars == len(follow_up) - found.start
    assert found.cached_ids == len(encode(follow_up[: found.start]))
    if meanwhile == "cleared":
        cache.clear()
    elif meanwhile == "evicted":
        cache.max_bytes = 1
        cache.encode_packed(conversation(tiny, random.Random(12), 1)[0])  # evicts every node
        assert cache.stats.nodes <= 1
    elif meanwhile == "other chats cached":
        for seed in range(13, 18):
            for prompt in conversation(tiny, random.Random(seed), 2):
                cache.encode_packed(prompt)
    ids, payload = cache.finish(found)
    assert list(ids) == encode(follow_up) and payload == pack_ids(ids)
    assert cache.encode(follow_up) == encode(follow_up)


# --- the bound, the LRU order, the safety net ----------------------------------------------------------


def test_the_cache_stays_within_its_bound_and_keeps_the_conversation_in_use(tiny):
    """Other users' chats fill the cache between the turns of one conversation: they are evicted,
    oldest first, and the conversation in use keeps its history cached."""
    cache = PromptPrefixCache(
        lambda text: tiny.encode(text, add_special_tokens=False), cut_tokens(tiny.tokenizer), max_bytes=150_000
    )
    rng = random.Random(7)
    active = conversation(tiny, rng, 8)
    others = [p for seed in range(20) for p in conversation(tiny, random.Random(100 + seed), 3)]
    for turn, prompt in enumerate(active):
        hits = cache.stats.hits
        assert cache.encode(prompt) == tiny.encode(prompt, add_special_tokens=False)
        if turn:
            assert cache.stats.hits == hits + 1, "the conversation in use is never the one evicted"
        for other in others[turn * 5 : turn * 5 + 5]:
            assert cache.encode(other) == tiny.encode(other, add_special_tokens=False)
            assert cache.stats.bytes <= 150_000
    assert cache.stats.evicted > 0


def test_a_prompt_whose_encoding_misplaces_a_cut_token_is_encoded_but_not_cached(tiny):
    """The check before storing: ids that do not hold a cut token where its text is are not trusted."""
    im_end = tiny.tokenizer.token_to_id("<|im_end|>")

    def without_im_end(text: str) -> list[int]:  # an encoder that disagrees with the texts' tokens
        return [i for i in tiny.encode(text, add_special_tokens=False) if i != im_end]

    cache = PromptPrefixCache(without_im_end, cut_tokens(tiny.tokenizer), min_segment_chars=1)
    prompt = conversation(tiny, random.Random(3), 3)[-1]
    assert cache.encode(prompt) == without_im_end(prompt)
    assert cache.stats.unverified == 1 and cache.stats.nodes == 0


def test_a_cut_tokens_id_spelled_across_two_ids_is_no_occurrence(tiny):
    """The check reads the ids as packed integers: bytes of two neighbouring ids that happen to
    spell a cut token's id are not one more occurrence of it (which would refuse the prompt)."""
    im_end = tiny.tokenizer.token_to_id("<|im_end|>")
    spelled = im_end.to_bytes(4, "little")
    straddling = [
        int.from_bytes(b"\0\0" + spelled[:2], "little", signed=True),
        int.from_bytes(spelled[2:] + b"\0\0", "little", signed=True),
    ]

    def with_a_straddling_pair(text: str) -> list[int]:  # the pair after everything the cache keeps
        return [*tiny.encode(text, add_special_tokens=False), *straddling]

    cache = PromptPrefixCache(with_a_straddling_pair, cut_tokens(tiny.tokenizer), min_segment_chars=1)
    prompts = conversation(tiny, random.Random(4), 3)
    for prompt in prompts:
        assert cache.encode(prompt) == with_a_straddling_pair(prompt)
    assert cache.stats.unverified == 0 and cache.stats.nodes > 0 and cache.stats.hits == 2


def test_a_prompt_whose_ids_hold_its_cut_tokens_out_of_order_is_not_cached(tiny):
    im_end, im_start = (tiny.tokenizer.token_to_id(t) for t in ("<|im_end|>", "<|im_start|>"))

    def reordered(
        text: str,
    ) -> list[int]:  # every count right, the first "<|im_end|>" and the next "<|im_start|>" swapped
        ids = tiny.encode(text, add_special_tokens=False)
        at = ids.index(im_end)
        after = ids.index(im_start, at)
        ids[at], ids[after] = im_start, im_end
        return ids

    cache = PromptPrefixCache(reordered, cut_tokens(tiny.tokenizer), min_segment_chars=1)
    prompt = conversation(tiny, random.Random(5), 3)[-1]
    assert cache.encode(prompt) == reordered(prompt)
    assert cache.stats.unverified == 1 and cache.stats.nodes == 0


def test_threads_encoding_the_same_conversations_all_get_full_encode_ids(tiny):
    prompts = [p for seed in range(8) for p in conversation(tiny, random.Random(seed), 5)]
    expected = {p: tiny.encode(p, add_special_tokens=False) for p in prompts}
    cache = PromptPrefixCache(
        lambda text: tiny.encode(text, add_special_tokens=False), cut_tokens(tiny.tokenizer), max_bytes=200_000
    )
    failures: list[str] = []

    def work(seed: int) -> None:
        order = list(prompts)
        random.Random(seed).shuffle(order)
        failures.extend(prompt for prompt in order if cache.encode(prompt) != expected[prompt])

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert cache.stats.bytes <= 200_000


# --- which tokens are cuts --------------------------------------------------------------------------


def _bpe(*added: AddedToken, pre: pre_tokenizers.PreTokenizer | None = None, normalizer=None) -> Tokenizer:
    vocab = {c: i for i, c in enumerate("abcdefgh <>|")}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.add_tokens(list(added))
    return tokenizer


def test_tokens_whose_match_depends_on_what_follows_are_not_cuts():
    tokenizer = _bpe(
        AddedToken("<a>", special=True, normalized=False),
        AddedToken("<b>", special=True, normalized=False, rstrip=True),  # swallows the next whitespace
        AddedToken("<c>", special=True, normalized=False, single_word=True),
        AddedToken("<d>", special=True, normalized=False),
        AddedToken("<d>e", special=True, normalized=False),  # contains <d>: leftmost-longest would take it
        AddedToken("x<f>", special=True, normalized=False),
        AddedToken("<f>y", special=True, normalized=False),  # overlaps x<f>
        AddedToken("end", special=True, normalized=False),  # ends in a word character
        AddedToken("<g>", special=False, normalized=True),  # normalized, and there is no normalizer: fine
    )
    assert set(cut_tokens(tokenizer)) == {"<a>", "<g>"}
    assert set(cut_tokens(tokenizer, ["<a>"])) == {"<a>"}


def test_normalized_tokens_need_no_normalizer_and_position_dependent_pre_tokenizers_allow_no_cut():
    lower = _bpe(AddedToken("<a>", normalized=False), AddedToken("<g>", normalized=True), normalizer=normalizers.NFC())
    assert set(cut_tokens(lower)) == {"<a>"}
    first = _bpe(AddedToken("<a>", normalized=False), pre=pre_tokenizers.Metaspace(prepend_scheme="first"))
    assert cut_tokens(first) == {}
    always = _bpe(AddedToken("<a>", normalized=False), pre=pre_tokenizers.Metaspace(prepend_scheme="always"))
    assert set(cut_tokens(always)) == {"<a>"}
    assert PromptPrefixCache.for_tokenizer(first, lambda text: []) is None


def test_the_cache_can_be_turned_off(tiny_dir):
    tokenizer = ModelTokenizer.from_directory(tiny_dir, prompt_cache_bytes=0)
    assert tokenizer.prompt_cache is None
    prompt = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.encode_prompt(prompt) == tokenizer.encode(prompt, add_special_tokens=False)


# --- an encoder that cuts at added tokens itself (tiktoken) -------------------------------------------


def test_with_tiktoken_a_prompts_new_segments_are_encoded_apart(tiny, monkeypatch):
    """The tiny model's cache encodes each new segment on its own (no search of the whole prompt's
    ids for its cut tokens), and gets a full encode's ids."""
    cache = tiny.prompt_cache
    assert cache is not None and cache._encode_parts is not None

    def no_search(text, ids, occurrences, cuts):
        assert not cuts, "the ids were searched for the cut tokens"
        return []

    monkeypatch.setattr(cache, "_segments", no_search)
    cache.clear()
    ascii_words = [w for w in _WORDS if w.isascii()]
    prompts = []
    for seed in range(3):
        rng = random.Random(seed)
        messages: list[dict[str, str]] = []
        for _ in range(5):
            messages.append({"role": "user", "content": " ".join(rng.choice(ascii_words) for _ in range(150))})
            prompts.append(render_chat(tiny, messages))
            messages.append({"role": "assistant", "content": " ".join(rng.choice(ascii_words) for _ in range(60))})
    assert tiny.fast_encoder is not None and all(tiny.fast_encoder.encode(p) is not None for p in prompts)
    assert_same_as_full_encode(tiny, prompts)
    assert cache.stats.nodes > 0 and cache.stats.hits > 0


def test_a_segment_tiktoken_does_not_cover_sends_the_prompt_down_the_general_path(tiny):
    cache = tiny.prompt_cache
    assert cache is not None
    cache.clear()
    rng = random.Random(5)
    messages = [{"role": "user", "content": words(rng, 80) + " 中文字符 " + words(rng, 80)}]
    prompt = render_chat(tiny, messages)
    assert tiny.fast_encoder is not None and tiny.fast_encoder.encode(prompt) is None  # HF encodes it
    assert_same_as_full_encode(tiny, [prompt])
    assert cache.stats.nodes > 0 and cache.stats.unverified == 0  # cached by the general path


def test_parts_that_do_not_end_with_their_cut_token_are_not_trusted(tiny):
    """An `encode_parts` that breaks its promise (here: drops each part's last id) is caught by the
    check on each segment's last id; the general path encodes the prompt, as a full encode does."""

    def full(text):
        return tiny.encode(text, add_special_tokens=False)

    def short_by_one(text):
        ids = full(text)[:-1]
        return struct.pack(f"<{len(ids)}I", *ids) if ids else None

    cache = PromptPrefixCache(full, cut_tokens(tiny.tokenizer), encode_parts=short_by_one)
    for prompt in conversation(tiny, random.Random(9), 4):
        ids, payload = cache.encode_packed(prompt)
        assert (list(ids), payload) == (full(prompt), pack_ids(full(prompt)))
    assert cache.stats.hits > 0
