"""The OpenAI Python SDK on the gateway's chat route (tests/it/clients.rs).

Environment: MODELGATE_BASE_URL (`http://127.0.0.1:PORT/api/v1`),
MODELGATE_MODEL, MODELGATE_KEY (a funded key), MODELGATE_BROKE_KEY (a key
of an account without credits), MODELGATE_LIMITED_KEY (a key whose own
rate limit admits one request). Prints one JSON object: what each call
answered, the generation ids of the answered ones, and the exception each
refusal raised.
"""

import json
import os

import openai

BASE = os.environ["MODELGATE_BASE_URL"]
MODEL = os.environ["MODELGATE_MODEL"]


def client(key):
    # No retries: a 429 must reach this script, not be waited out.
    return openai.OpenAI(base_url=BASE, api_key=key, max_retries=0)


funded = client(os.environ["MODELGATE_KEY"])
out = {"generation_ids": []}


def create(**params):
    raw = funded.chat.completions.with_raw_response.create(model=MODEL, **params)
    out["generation_ids"].append(raw.headers.get("x-generation-id"))
    return raw.parse()


hello = [{"role": "user", "content": "Hi there"}]
completion = create(messages=hello, max_tokens=16)
out["create"] = {
    "text": completion.choices[0].message.content,
    "finish_reason": completion.choices[0].finish_reason,
    "model": completion.model,
    "usage": completion.usage.model_dump(exclude_none=True),
}

stream = create(
    messages=hello,
    max_tokens=16,
    stream=True,
    stream_options={"include_usage": True},
)
text, usage, usage_chunks = "", None, 0
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
    if chunk.usage is not None:
        usage = chunk.usage.model_dump(exclude_none=True)
        usage_chunks += 1
out["stream"] = {"text": text, "usage": usage, "usage_chunks": usage_chunks}

tools = [
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
]
asked = [
    {
        "role": "user",
        "content": 'Weather, please. mock-tool: get_weather {"city": "Paris"}',
    }
]
called = create(messages=asked, tools=tools, max_tokens=16)
message = called.choices[0].message
call = message.tool_calls[0]
answered = create(
    messages=asked
    + [
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ],
    tools=tools,
    max_tokens=16,
)
out["tool"] = {
    "finish_reason": called.choices[0].finish_reason,
    "name": call.function.name,
    "arguments": json.loads(call.function.arguments),
    "after_finish_reason": answered.choices[0].finish_reason,
    "after_text": answered.choices[0].message.content,
}


def refusal(key, **params):
    try:
        client(key).chat.completions.create(
            model=MODEL, max_tokens=16, **{"messages": hello, **params}
        )
    except openai.APIStatusError as error:
        return {
            "class": type(error).__name__,
            "status": error.status_code,
            "body": error.body,
        }
    return {"class": None}


limited = os.environ["MODELGATE_LIMITED_KEY"]
client(limited).chat.completions.create(model=MODEL, messages=hello, max_tokens=16)
out["errors"] = {
    "401": refusal("mg-v1-" + "0" * 43),
    "402": refusal(os.environ["MODELGATE_BROKE_KEY"]),
    "429": refusal(limited),
    "400": refusal(os.environ["MODELGATE_KEY"], messages=[]),
}
print(json.dumps(out))
