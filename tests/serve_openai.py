"""The official `openai` Python client against swerve-serve (run by tests/serve_openai.rs).

usage: serve_openai.py BASE_URL MODEL_NAME API_KEY

The server runs the scripted model of tests/common/serve.rs: after "The answer is" it writes
" forty-two.<|im_end|>", and after a chat generation prompt it writes a <tool_call> block calling
`sleep` with {"seconds": 5}. Any failed check raises, and the process exits non-zero.
"""

import json
import random
import sys

import openai
from openai import OpenAI

base, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
client = OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1


# Models.
models = client.models.list()
check([m.id for m in models.data] == [model], f"models: {models}")

# Completions: text, token ids, logprobs, usage with cached tokens.
r = client.completions.create(model=model, prompt="The answer is", max_tokens=10, logprobs=2)
c = r.choices[0]
check(c.text == " forty-two.", f"completion text: {r}")
check(c.finish_reason == "stop", f"finish_reason: {c.finish_reason}")
check(isinstance(c.token_ids, list) and len(c.token_ids) == 4, f"token_ids: {c}")
check(r.prompt_token_ids == c.prompt_token_ids and len(r.prompt_token_ids) == 3, f"prompt ids: {r}")
check(len(c.logprobs.tokens) == 4 and c.logprobs.tokens[0] == " forty", f"logprobs: {c.logprobs}")
check(all(lp <= 0 for lp in c.logprobs.token_logprobs), "logprobs are <= 0")
check(all(len(t) == 2 for t in c.logprobs.top_logprobs), "two alternatives per token")
check(r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 4, f"usage: {r.usage}")
check(r.usage.prompt_tokens_details.cached_tokens >= 0, f"cached tokens: {r.usage}")
check(r.weight_version == 0, f"weight_version: {r}")
answer_ids = c.token_ids
prompt_ids = r.prompt_token_ids

# Token ids in: as `prompt`, and as the `prompt_token_ids` extension.
r = client.completions.create(model=model, prompt=prompt_ids, max_tokens=10, temperature=0)
check(r.choices[0].token_ids == answer_ids, f"ids prompt: {r}")
r = client.completions.create(model=model, prompt=None, max_tokens=10, extra_body={"prompt_token_ids": prompt_ids})
check(r.choices[0].text == " forty-two.", f"prompt_token_ids: {r}")

# Streaming completions with usage.
text, ids, finish, usage = "", [], None, None
for chunk in client.completions.create(
    model=model, prompt="The answer is", max_tokens=10, stream=True, stream_options={"include_usage": True}
):
    for ch in chunk.choices:
        text += ch.text
        ids += ch.token_ids
        finish = ch.finish_reason or finish
    usage = chunk.usage or usage
check(text == " forty-two." and ids == answer_ids and finish == "stop", f"stream: {text!r} {ids} {finish}")
check(usage is not None and usage.completion_tokens == 4, f"stream usage: {usage}")

# Stop strings.
r = client.completions.create(model=model, prompt="The answer is", max_tokens=10, stop=["-two"])
check(r.choices[0].text == " forty" and r.choices[0].finish_reason == "stop", f"stop: {r}")

# Chat with tools: tool_calls, finish_reason "tool_calls", logprobs, token ids.
tools = [{"type": "function", "function": {"name": "sleep", "description": "Sleep a while.",
          "parameters": {"type": "object", "properties": {"seconds": {"type": "integer"}}}}}]
messages = [{"role": "system", "content": "You are a helpful agent."},
            {"role": "user", "content": "Wait five seconds."}]
r = client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=40,
                                   logprobs=True, top_logprobs=2)
c = r.choices[0]
check(c.finish_reason == "tool_calls", f"chat finish: {r}")
call = c.message.tool_calls[0]
check(call.type == "function" and call.function.name == "sleep", f"tool call: {call}")
check(json.loads(call.function.arguments) == {"seconds": 5}, f"arguments: {call.function.arguments}")
check(c.logprobs.content[0].token == "<tool_call>", f"chat logprobs: {c.logprobs}")
check(len(c.logprobs.content) == len(c.token_ids), "one logprob per token")
check(all(len(e.top_logprobs) == 2 for e in c.logprobs.content), "two alternatives per token")
check(r.usage.prompt_tokens == len(r.prompt_token_ids), f"chat usage: {r.usage}")

# The assistant's tool call and the tool's answer go back into the conversation.
messages2 = messages + [c.message.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": call.id, "content": "slept 5 s"}]
r2 = client.chat.completions.create(model=model, messages=messages2, tools=tools, max_tokens=40)
check(r2.choices[0].finish_reason == "tool_calls", f"second turn: {r2}")
check(r2.usage.prompt_tokens > r.usage.prompt_tokens, "the conversation grew")

# A multi-turn tool-calling loop (developer role, vLLM extension fields through extra_body): every
# turn calls the tool, the history grows, each choice says which weights sampled it, and the
# fields this server does not implement are named in a response header.
history = [{"role": "developer", "content": "You are a helpful agent."},
           {"role": "user", "content": "Wait five seconds, four times."}]
for turn in range(4):
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=history, tools=tools, max_tokens=40, logprobs=True,
        extra_body={"min_tokens": 1, "return_tokens_as_token_ids": True, "not_a_vllm_field": 1})
    r = raw.parse()
    c = r.choices[0]
    check(raw.headers.get("x-swerve-ignored-fields") == "not_a_vllm_field", f"turn {turn}: {raw.headers}")
    check(c.finish_reason == "tool_calls", f"turn {turn}: {r}")
    check(c.weight_version_first == 0 and c.weight_version_last == 0 and c.weight_version_change_index is None,
          f"turn {turn}: weight versions {c}")
    check([e.token for e in c.logprobs.content] == [f"token_id:{t}" for t in c.token_ids], f"turn {turn}: ids")
    call = c.message.tool_calls[0]
    history += [c.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": f"slept 5 s ({turn + 1})"}]
check(len(history) == 10, "four tool round trips")

# Streaming chat with tools: the deltas assemble into the same call.
name, args, finish, content = "", "", None, ""
for chunk in client.chat.completions.create(model=model, messages=messages, tools=tools, max_tokens=40, stream=True):
    for ch in chunk.choices:
        content += ch.delta.content or ""
        for tc in ch.delta.tool_calls or []:
            name += tc.function.name or ""
            args += tc.function.arguments or ""
        finish = ch.finish_reason or finish
check(name == "sleep" and json.loads(args) == {"seconds": 5} and finish == "tool_calls", f"chat stream: {name} {args} {finish}")
check(content == "", f"no content around the call: {content!r}")

# Greedy is deterministic; the same seed gives the same sample.
rng = random.Random(7)
ids = [rng.randrange(150000) for _ in range(30)]
a = client.completions.create(model=model, prompt=ids, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
b = client.completions.create(model=model, prompt=ids, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
check(a.choices[0].token_ids == b.choices[0].token_ids, "greedy repeats")
a = client.completions.create(model=model, prompt=ids, max_tokens=8, seed=11, extra_body={"ignore_eos": True})
b = client.completions.create(model=model, prompt=ids, max_tokens=8, seed=11, extra_body={"ignore_eos": True})
check(a.choices[0].token_ids == b.choices[0].token_ids, "same seed, same sample")

# A 20-turn agent loop that extends its own token history: prefix-cache hits every turn after
# the first, covering at least the whole blocks of the previous turn's prompt.
history = [rng.randrange(150000) for _ in range(40)]
previous = None
for turn in range(20):
    r = client.completions.create(model=model, prompt=None, max_tokens=8, seed=turn,
                                  extra_body={"prompt_token_ids": history, "ignore_eos": True})
    c = r.choices[0]
    check(r.prompt_token_ids == history, f"turn {turn}: the prompt is the history")
    cached = r.usage.prompt_tokens_details.cached_tokens
    check(r.usage.cached_tokens == cached, "cached_tokens in both places")
    if turn > 0:
        check(cached > 0, f"turn {turn}: no prefix-cache hit ({r.usage})")
        check(cached >= len(previous) // 16 * 16, f"turn {turn}: {cached} cached of a {len(previous)}-token previous prompt")
    check(len(c.token_ids) == 8, f"turn {turn}: {c}")
    previous = history
    observation = [rng.randrange(150000) for _ in range(rng.randrange(5, 25))]
    history = history + c.token_ids + observation

# The recipe of docs/serving.md: an observation tokenized by the server, appended to the exact history.
observation = client.post("/tokenize", body={"prompt": "<|im_start|>user\nok<|im_end|>\n<|im_start|>assistant\n"},
                          cast_to=object)["tokens"]
check(observation[0] == 151644 and len(observation) == 9, f"tokenize: {observation}")
r = client.completions.create(model=model, prompt=None, max_tokens=4,
                              extra_body={"prompt_token_ids": history + observation})
check(r.usage.cached_tokens >= len(previous) // 16 * 16 > 0, f"docs/serving.md recipe: {r.usage}")

# Errors: OpenAI-shaped, raised as the client's exception types.
try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    check(False, "unknown model accepted")
except openai.NotFoundError as e:
    check(e.status_code == 404 and "no-such-model" in str(e), f"bad model: {e}")
try:
    client.completions.create(model=model, prompt="x", max_tokens=10_000)
    check(False, "too long accepted")
except openai.BadRequestError as e:
    check("max_tokens" in str(e) and "4096" in str(e), f"length: {e}")
try:
    client.chat.completions.create(model=model, messages=[], max_tokens=1)
    check(False, "empty messages accepted")
except openai.BadRequestError as e:
    check("messages" in str(e), f"empty messages: {e}")
try:
    OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0).models.list()
    check(False, "wrong key accepted")
except openai.AuthenticationError as e:
    check(e.status_code == 401, f"auth: {e}")

print(f"openai {openai.__version__}: {checks} checks passed")
