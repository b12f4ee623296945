"""The workbook's checkpoints against Hugging Face transformers, both ways.

Run by `cargo xtask interop` (it needs torch and transformers; nothing else
in the workbook does). Two commands:

  compare DIR LOGITS TEXT PROMPT N
      Loads DIR with AutoModelForCausalLM and AutoTokenizer alone (no workbook
      code) and checks it against what `cargo infer` wrote: the prompt's token
      ids (AutoTokenizer must give the same), the logits for them (within
      1e-4), and the greedy continuation of N tokens (the same text).

  make DIR TOKENIZER_DIR
      Saves a small random Llama that uses grouped-query attention (4 query
      heads, 2 key/value heads) and tied embeddings, with transformers, into
      DIR, tokenizer files copied from TOKENIZER_DIR; `infer` then loads it
      and `compare` checks the two agree.
"""

import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

LOGITS_TOLERANCE = 1e-4


def compare(model_dir, logits_file, text_file, prompt, new_tokens):
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    saved = load_file(logits_file)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    if not torch.equal(ids, saved["ids"]):
        first = next(i for i, (a, b) in enumerate(zip(ids[0].tolist(), saved["ids"][0].tolist())) if a != b) \
            if ids.shape == saved["ids"].shape else "length"
        fail(f"AutoTokenizer gives other ids for the prompt (first difference at {first}): "
             f"{ids[0, :12].tolist()} vs the workbook's {saved['ids'][0, :12].tolist()}")
    with torch.no_grad():
        logits = model(ids).logits
    worst = (logits - saved["logits"]).abs().max().item()
    if worst > LOGITS_TOLERANCE:
        fail(f"logits differ by up to {worst:.2e} (tolerance {LOGITS_TOLERANCE:.0e})")
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=tokenizer.eos_token_id)
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    expected = Path(text_file).read_text().removesuffix("\n")
    if prompt + text != expected:
        fail(f"greedy text differs:\n  transformers: {prompt + text!r}\n  workbook:     {expected!r}")
    print(f"  {model_dir}: same ids ({ids.shape[1]}), logits within {worst:.1e}, same greedy text")


def make(model_dir, tokenizer_dir):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=257, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        rope_theta=5000.0, rms_norm_eps=2e-5, tie_word_embeddings=True,
        bos_token_id=256, eos_token_id=256,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)  # larger than the default 0.02, so the text is not all one token
    model.save_pretrained(model_dir, safe_serialization=True)
    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        shutil.copy(Path(tokenizer_dir) / name, Path(model_dir) / name)
    print(f"  {model_dir}: a transformers Llama with 4 query heads, 2 key/value heads, tied embeddings")


def fail(message):
    print(f"interop: {message}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "compare":
        compare(args[0], args[1], args[2], args[3], int(args[4]))
    elif command == "make":
        make(args[0], args[1])
    else:
        fail(f"unknown command {command}")
