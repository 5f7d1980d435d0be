"""A local transformers backend: batched generation, and token scores of given texts.

``generate`` renders each conversation with the tokenizer's chat template (a plain
"role: content" transcript when it has none), left-pads the batch so that every prompt ends
at the same position, and decodes only the new tokens.

``score`` runs one forward pass per batch and returns, for every scored token, its
log-probability and the entropy of the distribution it was drawn from. Logits are SHIFTED:
token j is scored with the logits at position j-1 (the logits at position j predict token
j+1). The PIR teacher needs these numbers; a silently unshifted computation would still
produce plausible-looking values, which is why the tests compare against a manual one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pipelines.config import positive_int
from pipelines.llm.config import HFConfig, SamplingParams

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Message = Mapping[str, Any]


@dataclass(frozen=True)
class TokenScores:
    """The scored tokens of one text: ids, log-probabilities (<= 0) and the entropies (>= 0, in
    nats) of the predictive distributions, aligned index by index."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    entropies: tuple[float, ...]


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """OpenAI semantics: the first stop string ends the reply and is not part of it."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:cut]


def _batches(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class HFBackend:
    """Generation and scoring with a loaded causal LM.

    Build it from a configuration (``from_config``) or around a model and tokenizer already in
    memory (for instance the teacher being trained). ``batch_size`` bounds the texts per
    forward pass, which bounds memory: scoring holds batch x length x vocabulary logits."""

    def __init__(self, model: "PreTrainedModel", tokenizer: "PreTrainedTokenizerBase", *, batch_size: int = 8):
        positive_int(batch_size, "batch_size")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        # Padding needs a pad token; decoder-only checkpoints often have none. The padded
        # positions are masked out, so which token fills them does not matter.
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if self.pad_token_id is None:
            raise ValueError("the tokenizer has neither a pad nor an eos token; cannot pad batches")

    @classmethod
    def from_config(cls, config: HFConfig) -> "HFBackend":
        import torch
        from transformers import AutoModelForCausalLM

        from pipelines.llm.tokenizer import faithful_tokenizer

        dtype: Any = "auto" if config.dtype == "auto" else getattr(torch, config.dtype, None)
        if dtype is None or (dtype != "auto" and not isinstance(dtype, torch.dtype)):
            raise ValueError(f"hf.dtype: unknown torch dtype {config.dtype!r}")
        # the tokenizer the model was trained with (AutoTokenizer rebuilds a qwen2 model's)
        tokenizer = faithful_tokenizer(config.model_path)
        model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=dtype).to(config.device)
        return cls(model, tokenizer, batch_size=config.batch_size)

    @property
    def device(self) -> "torch.device":
        return next(self.model.parameters()).device

    # ---- generation ----

    def render(self, messages: Sequence[Message]) -> str:
        """The prompt text of one conversation, ending where the assistant's reply begins."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=True
            )
        transcript = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return f"{transcript}assistant:"

    def generate(self, conversations: Sequence[Sequence[Message]], sampling: SamplingParams, seed: int = 0) -> list[str]:
        """One reply per conversation, in order.

        Greedy when ``sampling.temperature == 0``; otherwise sampled with ``seed`` (batch k of
        the call uses ``seed + k``, under a forked RNG so that the caller's torch RNG state is
        left alone). Sampled replies are reproducible for the same inputs, batch size and seed.
        ``sampling.extra_body`` is passed to ``model.generate`` (e.g. ``top_k``); the OpenAI
        penalties have no exact transformers equivalent and are refused rather than approximated.
        """
        import torch

        if sampling.presence_penalty is not None or sampling.frequency_penalty is not None:
            raise ValueError("the hf backend does not support presence_penalty / frequency_penalty")
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        prompts = [self.render(conversation) for conversation in conversations]
        generate_kwargs = self.generate_kwargs(sampling)

        replies: list[str] = []
        devices = [self.device] if self.device.type == "cuda" else []
        for k, batch in enumerate(_batches(prompts, self.batch_size)):
            encoded = self.tokenizer(
                list(batch),
                return_tensors="pt",
                padding=True,
                padding_side="left",
                # A rendered chat template already contains its special tokens (BOS included).
                add_special_tokens=not has_template,
            ).to(self.device)
            with torch.random.fork_rng(devices=devices), torch.inference_mode():
                torch.manual_seed(seed + k)
                output = self.model.generate(**encoded, **generate_kwargs)
            new_tokens = output[:, encoded["input_ids"].shape[1] :]
            for text in self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True):
                replies.append(cut_at_stop(text, sampling.stop))
        return replies

    def generate_kwargs(self, sampling: SamplingParams) -> dict[str, Any]:
        """``model.generate`` keyword arguments for ``sampling``."""
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "do_sample": not sampling.greedy,
            "pad_token_id": self.pad_token_id,
            **sampling.extra_body,
        }
        if not sampling.greedy:
            kwargs["temperature"] = sampling.temperature
            if sampling.top_p is not None:
                kwargs["top_p"] = sampling.top_p
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        return kwargs


    # ---- scoring ----

    def score(self, texts: Sequence[str], contexts: Sequence[str] | None = None) -> list[TokenScores]:
        """Log-probabilities and entropies of the tokens of each text, one forward pass per batch.

        Without contexts, a text is scored on its own: every token that has a left neighbour
        (the tokenizer's BOS counts, when it adds one) is scored, so for tokenizers without BOS
        the first token is not. With ``contexts[i]``, the context is the conditioning prefix
        and every token of ``texts[i]`` is scored. Context and text are tokenized separately, so
        the scored tokens are exactly the text's tokens, never one merged across the boundary.
        """
        if contexts is not None and len(contexts) != len(texts):
            raise ValueError(f"got {len(texts)} texts but {len(contexts)} contexts")
        sequences: list[tuple[list[int], int]] = []  # (token ids, index of the first scored token)
        for i, text in enumerate(texts):
            if contexts is None:
                ids = self.tokenizer(text, add_special_tokens=True)["input_ids"]
                sequences.append((ids, 1))
            else:
                prefix = self.tokenizer(contexts[i], add_special_tokens=True)["input_ids"]
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                # An empty prefix (empty context, no BOS) leaves nothing to condition token 0 on.
                sequences.append((prefix + ids, max(len(prefix), 1)))
        # Texts with nothing to score (empty, or a lone first token) skip the forward pass.
        empty = TokenScores((), (), ())
        results: list[TokenScores] = [empty] * len(sequences)
        scorable = [i for i, (ids, first) in enumerate(sequences) if len(ids) > first]
        for batch in _batches(scorable, self.batch_size):
            for i, scores in zip(batch, self._score_batch([sequences[i] for i in batch])):
                results[i] = scores
        return results

    def token_logprobs(self, texts: Sequence[str], contexts: Sequence[str] | None = None) -> list[list[float]]:
        """Per-token log-probabilities; ``score`` gives them together with the entropies."""
        return [list(s.logprobs) for s in self.score(texts, contexts)]

    def token_entropies(self, texts: Sequence[str], contexts: Sequence[str] | None = None) -> list[list[float]]:
        """Per-token predictive entropies (nats); ``score`` gives them with the log-probabilities."""
        return [list(s.entropies) for s in self.score(texts, contexts)]

    def _score_batch(self, batch: Sequence[tuple[list[int], int]]) -> list[TokenScores]:
        import torch

        # Right padding: real tokens keep positions 0..len-1, so no position ids are needed.
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, _) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        with torch.inference_mode():
            logits = self.model(
                input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device)
            ).logits
            # Shift: the logits at position j-1 predict token j. float32 for the softmax, since
            # bf16 log-probabilities of unlikely tokens are badly rounded.
            log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            targets = input_ids[:, 1:].to(self.device)
            token_logprobs = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
            entropies = -(log_probs.exp() * log_probs).sum(-1)
        results = []
        for row, (ids, first) in enumerate(batch):
            # Token j sits at shifted index j-1.
            scored = slice(first - 1, len(ids) - 1)
            results.append(
                TokenScores(
                    token_ids=tuple(ids[first:]),
                    logprobs=tuple(token_logprobs[row, scored].tolist()),
                    # Rounding can leave -0.0 or -1e-9 for a near-certain prediction.
                    entropies=tuple(max(0.0, h) for h in entropies[row, scored].tolist()),
                )
            )
        return results
