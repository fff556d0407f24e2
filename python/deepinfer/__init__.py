"""DeepInfer: DeepSeek-V4 inference, from Python.

    import deepinfer
    llm = deepinfer.LLM()                      # the embedded nano model; or LLM(model="path/to/dir")
    outs = llm.generate(["In the beginning"], deepinfer.SamplingParams(max_tokens=32, seed=1))
    print(outs[0].outputs[0].text)

The classes follow vLLM's offline API (LLM, SamplingParams, RequestOutput, CompletionOutput,
Logprob) so that code written for vLLM's LLM.generate runs with few or no changes.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

from . import _core

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams", "GuidedDecodingParams", "RequestOutput",
           "CompletionOutput", "Logprob", "default_model_dir"]


def default_model_dir() -> str:
    """The embedded default model: the copy inside the installed package, else the source tree's."""
    packaged = os.path.join(os.path.dirname(__file__), "models", "nano-v4")
    if os.path.isfile(os.path.join(packaged, "config.json")):
        return packaged
    return _core.default_model_dir()


_REGEX_META = set("\\.^$*+?{}[]|()")


@dataclass
class StructuredOutputsParams:
    """Constrain the output, as vLLM's StructuredOutputsParams (docs/structured-outputs.md).

    Exactly one of: json (a JSON Schema, as a dict or JSON text), regex (full match), choice (one of
    these strings), grammar (GBNF text, start rule `root`), json_object=True (any JSON object).
    vLLM options that this engine does not implement raise ValueError when set.
    """
    json: Union[None, str, dict] = None
    regex: Optional[str] = None
    choice: Optional[List[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: Optional[str] = None
    structural_tag: Optional[str] = None

    def __post_init__(self):
        kinds = [k for k in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, k) not in (None, False)]
        if len(kinds) != 1:
            raise ValueError("structured outputs need exactly one of json, regex, choice, grammar, "
                             f"json_object; got {kinds or 'none'}")
        for opt in ("disable_additional_properties", "whitespace_pattern", "structural_tag"):
            if getattr(self, opt) not in (None, False):
                raise ValueError(f"structured outputs: {opt} is not supported")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) for c in self.choice)):
            raise ValueError("structured outputs: choice must be a non-empty list of strings")

    def _to_core(self) -> "_core.StructuredOutput":
        s = _core.StructuredOutput()
        if self.json is not None:
            s.kind = _core.StructuredKind.json_schema
            s.text = self.json if isinstance(self.json, str) else json.dumps(self.json)
        elif self.regex is not None:
            s.kind, s.text = _core.StructuredKind.regex, self.regex
        elif self.choice is not None:
            # One of the strings exactly: an alternation of escaped literals.
            esc = ["".join("\\" + c if c in _REGEX_META else c for c in ch) for ch in self.choice]
            s.kind, s.text = _core.StructuredKind.regex, "(" + "|".join(esc) + ")"
        elif self.grammar is not None:
            s.kind, s.text = _core.StructuredKind.grammar, self.grammar
        else:
            s.kind = _core.StructuredKind.json_object
        s.disable_any_whitespace = bool(self.disable_any_whitespace)
        return s


class GuidedDecodingParams(StructuredOutputsParams):
    """vLLM's older name for StructuredOutputsParams (SamplingParams(guided_decoding=...)).

    `backend` is accepted and ignored: this engine has one grammar backend."""

    def __init__(self, *args, backend: Optional[str] = None, **kwargs):
        self.backend = backend
        super().__init__(*args, **kwargs)


class SamplingParams:
    """Sampling parameters with vLLM's names, defaults and meaning (docs/sampling.md).

    Invalid values raise ValueError naming the field, here for ranges and again when a request
    is added for what depends on the model (logit_bias / stop_token_ids ids within the vocabulary).
    """

    _FIELDS = ("n", "max_tokens", "min_tokens", "temperature", "top_k", "top_p", "min_p",
               "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "stop",
               "stop_token_ids", "ignore_eos", "include_stop_str_in_output", "seed", "logprobs",
               "prompt_logprobs", "skip_special_tokens", "structured_outputs")

    def __init__(self, n: int = 1, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                 repetition_penalty: float = 1.0, temperature: float = 1.0, top_p: float = 1.0,
                 top_k: int = 0, min_p: float = 0.0, seed: Optional[int] = None,
                 stop: Union[None, str, List[str]] = None, stop_token_ids: Optional[List[int]] = None,
                 ignore_eos: bool = False, max_tokens: Optional[int] = 16, min_tokens: int = 0,
                 logprobs: Optional[int] = None, prompt_logprobs: Optional[int] = None,
                 skip_special_tokens: bool = True, include_stop_str_in_output: bool = False,
                 logit_bias: Optional[Dict[int, float]] = None,
                 structured_outputs: Optional[StructuredOutputsParams] = None,
                 guided_decoding: Optional[StructuredOutputsParams] = None):
        self.n = n
        self.presence_penalty = presence_penalty
        self.frequency_penalty = frequency_penalty
        self.repetition_penalty = repetition_penalty
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.seed = seed
        self.stop = [stop] if isinstance(stop, str) else list(stop or [])
        self.stop_token_ids = list(stop_token_ids or [])
        self.ignore_eos = ignore_eos
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.logprobs = logprobs
        self.prompt_logprobs = prompt_logprobs
        self.skip_special_tokens = skip_special_tokens
        self.include_stop_str_in_output = include_stop_str_in_output
        self.logit_bias = dict(logit_bias or {})
        if structured_outputs is not None and guided_decoding is not None:
            raise ValueError("give structured_outputs or guided_decoding (its older name), not both")
        self.structured_outputs = structured_outputs if structured_outputs is not None else guided_decoding
        if self.structured_outputs is not None and not isinstance(self.structured_outputs,
                                                                  StructuredOutputsParams):
            raise ValueError("structured_outputs must be a StructuredOutputsParams")
        self._to_core().validate()

    @property
    def guided_decoding(self) -> Optional[StructuredOutputsParams]:
        return self.structured_outputs

    def _to_core(self) -> "_core.SamplingParams":
        p = _core.SamplingParams()
        for name in self._FIELDS:
            value = getattr(self, name)
            if name == "seed" and value is not None:
                if not isinstance(value, int) or value < 0 or value >= 2**64:
                    raise ValueError(f"seed must be an integer in [0, 2^64), got {value!r}")
            if name == "logit_bias":
                value = {int(k): float(v) for k, v in value.items()}
            if name == "structured_outputs":
                if value is not None:
                    p.structured = value._to_core()
                continue
            try:
                setattr(p, name, value)
            except TypeError as e:
                raise ValueError(f"{name} has the wrong type: {value!r}") from e
        return p

    def clone(self) -> "SamplingParams":
        return SamplingParams(**{k: getattr(self, k) for k in self._FIELDS})

    def __repr__(self) -> str:
        return "SamplingParams(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self._FIELDS) + ")"


@dataclass
class Logprob:
    logprob: float
    rank: Optional[int] = None           # 1 = the most likely token
    decoded_token: Optional[str] = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: List[int]
    cumulative_logprob: Optional[float]
    logprobs: Optional[List[Dict[int, Logprob]]]  # per generated token: chosen + top-k ids
    finish_reason: Optional[str] = None  # "stop", "length", "abort"
    stop_reason: Union[int, str, None] = None  # the stop string or stop token id that matched

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput] = field(default_factory=list)
    finished: bool = True


PromptType = Union[str, List[int], Dict[str, object]]


class LLM:
    """An engine for offline batches, as vLLM's LLM.

    model: a Hugging Face checkpoint directory of a DeepSeek-V4 model (default: the embedded model).
    tokenizer: a directory or tokenizer.json (default: the model's). Other arguments size the engine;
    async_scheduling plans decode step N+1 while step N runs, and device_sampling picks the tokens of rows
    without grammar or logprobs on the backend, their logit processors applied there (the same outputs
    either way).
    """

    def __init__(self, model: Optional[str] = None, tokenizer: Optional[str] = None, *,
                 threads: int = 0, cache_bytes: int = 256 << 20, max_num_seqs: int = 16,
                 max_num_batched_tokens: int = 512, max_model_len: Optional[int] = None,
                 show_progress: bool = False, async_scheduling: bool = True, device_sampling: bool = True):
        self._engine = _core.Engine(model or default_model_dir(), tokenizer or "", threads, cache_bytes,
                                    max_num_seqs, max_num_batched_tokens, max_model_len or 0,
                                    show_progress, async_scheduling, device_sampling)
        self._next_id = 0

    @property
    def model_dir(self) -> str:
        return self._engine.model_dir

    @property
    def vocab_size(self) -> int:
        return self._engine.vocab_size

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    def encode(self, text: str, add_special_tokens: bool = False) -> List[int]:
        return self._engine.encode(text, add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self._engine.decode(list(ids), skip_special_tokens)

    def stats(self) -> dict:
        return self._engine.stats()

    def generate(self, prompts: Union[PromptType, Sequence[PromptType]],
                 sampling_params: Union[None, SamplingParams, Sequence[SamplingParams]] = None,
                 use_tqdm: bool = False) -> List[RequestOutput]:
        """Runs every prompt to completion; returns one RequestOutput per prompt, in order.

        A prompt is a string, a list of token ids, or a dict with "prompt" or "prompt_token_ids".
        """
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                 and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            params = [SamplingParams()] * len(prompts)
        elif isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling params for {len(prompts)} prompts")
        reqs, texts = [], []
        for prompt, sp in zip(prompts, params):
            r = _core.Request()
            text = None
            if isinstance(prompt, str):
                text = prompt
            elif isinstance(prompt, dict):
                if "prompt_token_ids" in prompt:
                    r.prompt_ids = [int(t) for t in prompt["prompt_token_ids"]]
                elif "prompt" in prompt:
                    text = str(prompt["prompt"])
                else:
                    raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
            else:
                r.prompt_ids = [int(t) for t in prompt]
                if not r.prompt_ids:
                    raise ValueError("a prompt needs at least one token")
            if text is not None:
                r.prompt = text
                r.add_special_tokens = True  # BOS as the tokenizer config says (vLLM's default)
            r.params = sp._to_core()
            r.params.validate(self.vocab_size)
            reqs.append(r)
            texts.append(text)
        results = self._engine.generate(reqs)
        return [self._convert(res, text, sp) for res, text, sp in zip(results, texts, params)]

    def chat(self, messages, sampling_params: Optional[SamplingParams] = None, *,
             thinking: bool = False, reasoning_effort: str = "") -> List[RequestOutput]:
        """One conversation (a list of OpenAI-style messages) or a list of them, in the V4 chat format."""
        convs = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [{"prompt_token_ids": self._engine.chat_prompt_ids(json.dumps(c), thinking,
                                                                      reasoning_effort)} for c in convs]
        return self.generate(prompts, sampling_params)

    def _convert(self, res, text, sp: SamplingParams) -> RequestOutput:
        outs = []
        for c in res.outputs:
            if c.finish_reason == "error":
                raise ValueError(c.error)
            logprobs, cum = None, None
            if sp.logprobs is not None:
                logprobs, cum = [], 0.0
                for t in c.logprobs:
                    entry = {}
                    for rank, alt in enumerate(t.top, start=1):
                        entry[alt.token] = Logprob(alt.logprob, rank, self.decode([alt.token]))
                    if t.token not in entry:  # sampled outside the top list: its rank is not computed
                        entry[t.token] = Logprob(t.logprob, None, self.decode([t.token]))
                    logprobs.append(entry)
                    cum += t.logprob
            reason = c.stop_reason or None
            if reason is not None and reason not in sp.stop:
                reason = int(reason) if reason.isdigit() and int(reason) in sp.stop_token_ids else None
            outs.append(CompletionOutput(c.index, c.text, list(c.token_ids), cum, logprobs,
                                         c.finish_reason or None, reason))
        return RequestOutput(str(res.request_id), text, list(res.prompt_ids), outs, True)
