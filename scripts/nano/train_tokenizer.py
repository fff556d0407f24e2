#!/usr/bin/env python3
"""Train the nano model's byte-level BPE tokenizer (HF `tokenizers`) on the train split of the corpus.

Pre-tokenizer and decoder are the DeepSeek-V3 blocks (copied from
/work/shared/data/deepseek-v3-tokenizer/tokenizer.json, MIT); special tokens follow DeepSeek's
spelling, ids 0..6. A TemplateProcessing post-processor prepends BOS (add_special_tokens=True).
Writes models/nano-v4/{tokenizer.json, tokenizer_config.json}.
"""
import argparse
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers, Regex

import common as C

V3_TOKENIZER = "/work/shared/data/deepseek-v3-tokenizer/tokenizer.json"
# Same regexes as DeepSeek-V3's pre_tokenizer (used when the V3 file is not at hand).
V3_SPLITS = [
    r"\p{N}{1,3}",
    r"[一-龥぀-ゟ゠-ヿ]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]


def v3_pre_tokenizer():
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in V3_SPLITS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=C.MODEL_DIR)
    ap.add_argument("--vocab", type=int, default=C.VOCAB_SIZE)
    a = ap.parse_args()
    chapters = C.load_chapters()
    train = [c for c in chapters if c["split"] == "train"]
    texts = [C.chapter_text(c) for c in train]
    texts += [u + "\n" + v for u, v in C.chat_pairs(train, 4000)]

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = v3_pre_tokenizer()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=C.SPECIALS, min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{C.BOS} $A", pair=f"{C.BOS} $A {C.BOS} $B",
                                                       special_tokens=[(C.BOS, 0)])
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "tokenizer.json")
    tok.save(path)

    # Put the V3 pre_tokenizer / decoder JSON blocks in verbatim when the V3 file is available.
    j = json.load(open(path, encoding="utf-8"))
    if os.path.exists(V3_TOKENIZER):
        v3 = json.load(open(V3_TOKENIZER, encoding="utf-8"))
        j["pre_tokenizer"] = v3["pre_tokenizer"]
        j["decoder"] = v3["decoder"]
    for i, s in enumerate(C.SPECIALS):
        assert j["added_tokens"][i]["id"] == i and j["added_tokens"][i]["content"] == s, j["added_tokens"][i]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))

    def added(s):
        return {"content": s, "lstrip": False, "normalized": False,
                "rstrip": False, "single_word": False}

    cfg = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": C.BOS,
        "eos_token": C.EOS,
        "pad_token": C.PAD,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": 4096,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": C.CHAT_TEMPLATE,
        "added_tokens_decoder": {str(i): {**added(s), "special": True} for i, s in enumerate(C.SPECIALS)},
    }
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)

    t2 = Tokenizer.from_file(path)
    s = "In the beginning God created the heaven and the earth. 1234 words"
    enc = t2.encode(s)
    assert t2.decode(enc.ids, skip_special_tokens=True) == s
    n = sum(len(t2.encode(x, add_special_tokens=False).ids) for x in texts[:200])
    c = sum(len(x) for x in texts[:200])
    print(f"vocab {t2.get_vocab_size()}, {c / n:.2f} chars/token on 200 chapters; ids[:12]={enc.ids[:12]}")


if __name__ == "__main__":
    main()
