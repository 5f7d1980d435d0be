"""SmolLM2-135M-Instruct (models/smollm2, stage smollm2) on this machine: load time, greedy
decoding tokens/s for one sequence, peak RSS.

    python benchmarks/smollm2.py [--model models/smollm2] [--new-tokens 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import resource
import time

# On the shared 2-core machine, spinning OpenMP threads and a second thread made decoding
# ~10x slower (measured 0.9 tokens/s with 2 spinning threads against 8.8 with 1 passive).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    load_s = time.perf_counter() - started
    messages = [{"role": "user", "content": "I need a cheap hotel in the north of Cambridge with free parking. What should I ask the booking desk?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        model.generate(**inputs, max_new_tokens=4, do_sample=False)  # warm-up
        started = time.perf_counter()
        # min_new_tokens: a fixed count, so tokens/s does not depend on where the answer ends
        out = model.generate(**inputs, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
        decode_s = time.perf_counter() - started
    new = out.shape[1] - inputs["input_ids"].shape[1]
    rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"model {args.model}: load {load_s:.1f} s; greedy {new} tokens in {decode_s:.1f} s = {new / decode_s:.1f} tokens/s "
          f"(prompt {inputs['input_ids'].shape[1]} tokens, {args.threads} threads); peak RSS {rss_gb:.2f} GB")
    print("answer:", tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)[:300])


if __name__ == "__main__":
    main()
