"""litellm and mini-swe-agent against swerve-serve (run by tests/serve_agents.rs).

usage: serve_agents.py BASE_URL MODEL_NAME API_KEY WORKDIR

The server runs the agent model of tests/common/serve.rs: every chat turn is one `bash` tool
call whose command makes a file in its working folder and prints mini-swe-agent's submission
sentinel on its third run. Nothing here reaches past the loopback server (litellm's model cost
map is read from its package: LITELLM_LOCAL_MODEL_COST_MAP is set by the test).

1. litellm (as mini-swe-agent's LitellmModel calls it: litellm.completion with `tools`) drives a
   multi-turn tool-calling loop, non-streaming and streaming, the tool results going back as
   `tool` messages.
2. mini-swe-agent 2.x (DefaultAgent + LitellmModel + LocalEnvironment, its own code unchanged)
   runs an episode: three bash steps, then `Submitted`.
"""

import json
import os
import subprocess
import sys

import litellm

base, model, key, workdir = sys.argv[1:5]
api_base = base + "/v1"
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise AssertionError(what)
    checks += 1


BASH_TOOL = {"type": "function", "function": {"name": "bash", "description": "Execute a bash command",
             "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                            "required": ["command"]}}}

# 1. litellm: a tool-calling loop, the history growing each turn.
messages = [{"role": "developer", "content": "You are a helpful agent."},
            {"role": "user", "content": "Count the files."}]
for turn in range(3):
    r = litellm.completion(model="openai/" + model, api_base=api_base, api_key=key, messages=messages,
                           tools=[BASH_TOOL], temperature=1.0, max_tokens=200, logprobs=True)
    c = r.choices[0]
    check(c.finish_reason == "tool_calls", f"turn {turn}: finish {c.finish_reason}")
    call = c.message.tool_calls[0]
    args = json.loads(call.function.arguments)
    check(call.function.name == "bash" and "mktemp" in args["command"], f"turn {turn}: {call}")
    check(r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, f"usage: {r.usage}")
    out = subprocess.run(args["command"], shell=True, cwd=workdir, capture_output=True, text=True)
    messages.append(c.message.model_dump())
    messages.append({"role": "tool", "tool_call_id": call.id, "content": out.stdout or "(no output)"})
check(len(os.listdir(workdir)) == 3, f"three commands ran: {os.listdir(workdir)}")

# Streaming through litellm: the tool call assembles from the deltas.
name, arguments, finish = "", "", None
for chunk in litellm.completion(model="openai/" + model, api_base=api_base, api_key=key, messages=messages,
                                tools=[BASH_TOOL], max_tokens=200, stream=True):
    for ch in chunk.choices:
        for tc in ch.delta.tool_calls or []:
            name += tc.function.name or ""
            arguments += tc.function.arguments or ""
        finish = ch.finish_reason or finish
check(name == "bash" and "COMPLETE_TASK" in json.loads(arguments)["command"], f"stream: {name} {arguments}")
check(finish == "tool_calls", f"stream finish: {finish}")

# An unknown model is a 404, which litellm raises as NotFoundError (mini-swe-agent does not retry it).
try:
    litellm.completion(model="openai/no-such-model", api_base=api_base, api_key=key,
                       messages=[{"role": "user", "content": "x"}], max_retries=0)
    check(False, "unknown model accepted")
except litellm.exceptions.NotFoundError as e:
    check("no-such-model" in str(e), f"not found: {e}")

# 2. mini-swe-agent: an episode that ends with Submitted.
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402

episode = os.path.join(workdir, "episode")
os.mkdir(episode)
agent = DefaultAgent(
    LitellmModel(model_name="openai/" + model, cost_tracking="ignore_errors",
                 model_kwargs={"api_base": api_base, "api_key": key, "temperature": 1.0}),
    LocalEnvironment(cwd=episode),
    system_template="You are a helpful assistant that can interact with a computer.",
    instance_template="Please solve this issue: {{task}}",
    step_limit=10,
)
result = agent.run("Make three files, then submit.")
check(result.get("exit_status") == "Submitted", f"exit: {result}")
check(agent.n_calls == 3, f"{agent.n_calls} model calls")
check(len(os.listdir(episode)) == 3, f"files: {os.listdir(episode)}")
tools = [m for m in agent.messages if m.get("role") == "tool"]
check(len(tools) == 2, f"two observations before the submission: {tools}")

from importlib.metadata import version  # noqa: E402

print(f"litellm {version('litellm')}, mini-swe-agent {version('mini-swe-agent')}: {checks} checks passed")
