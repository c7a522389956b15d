"""The Anthropic Python SDK on the gateway's Messages API (tests/it/clients.rs).

Environment: MODELGATE_BASE_URL (`http://127.0.0.1:PORT/api`: the SDK adds
`/v1/messages`), MODELGATE_MODEL, MODELGATE_MISSING_MODEL (one the
upstream answers 404), MODELGATE_KEY (a funded key), MODELGATE_BROKE_KEY (a
key of an account without credits), MODELGATE_LIMITED_KEY (a key whose own
rate limit admits one request), MODELGATE_FORBIDDEN_KEY (a key whose
allowed models leave MODELGATE_MODEL out). Everything runs twice: the key
sent as `x-api-key` (`api_key`) and as `Authorization: Bearer`
(`auth_token`). Prints one JSON object.
"""

import json
import os

import anthropic

BASE = os.environ["MODELGATE_BASE_URL"]
MODEL = os.environ["MODELGATE_MODEL"]
HELLO = [{"role": "user", "content": "Hi there"}]
TOOLS = [
    {
        "name": "get_time",
        "description": "The time now.",
        "input_schema": {"type": "object", "properties": {}},
    },
    {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
]


def client(key, auth):
    # No retries: a 429 must reach this script, not be waited out. The
    # other credential is None, so only the one asked for is sent.
    if auth == "api_key":
        return anthropic.Anthropic(base_url=BASE, api_key=key, max_retries=0)
    return anthropic.Anthropic(
        base_url=BASE, api_key=None, auth_token=key, max_retries=0
    )


def usage_of(message):
    return message.usage.model_dump(exclude_none=True)


def run(auth, out):
    c = client(os.environ["MODELGATE_KEY"], auth)

    def create(**params):
        raw = c.messages.with_raw_response.create(model=MODEL, max_tokens=64, **params)
        out["generation_ids"].append(raw.headers.get("x-generation-id"))
        return raw.parse()

    message = create(messages=HELLO)
    result = {
        "create": {
            "text": "".join(b.text for b in message.content if b.type == "text"),
            "stop_reason": message.stop_reason,
            "usage": usage_of(message),
        }
    }

    with c.messages.stream(model=MODEL, max_tokens=64, messages=HELLO) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
        out["generation_ids"].append(stream.response.headers.get("x-generation-id"))
    result["stream"] = {
        "text": text,
        "stop_reason": final.stop_reason,
        "usage": usage_of(final),
    }

    asked = [
        {
            "role": "user",
            "content": 'Weather, please. mock-tool: get_weather {"city": "Paris"}',
        }
    ]
    called = create(messages=asked, tools=TOOLS)
    use = next(block for block in called.content if block.type == "tool_use")
    after = create(
        messages=asked
        + [
            {
                "role": "assistant",
                "content": [block.model_dump(exclude_none=True) for block in called.content],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}
                ],
            },
        ],
        tools=TOOLS,
    )
    result["tool"] = {
        "stop_reason": called.stop_reason,
        "name": use.name,
        "input": use.input,
        "after_stop_reason": after.stop_reason,
        "after_text": "".join(b.text for b in after.content if b.type == "text"),
    }

    result["count_tokens"] = c.messages.count_tokens(
        model=MODEL, messages=HELLO
    ).input_tokens

    def refusal(key, model=MODEL, messages=HELLO):
        try:
            client(key, auth).messages.create(
                model=model, max_tokens=64, messages=messages
            )
        except anthropic.APIStatusError as error:
            return {
                "class": type(error).__name__,
                "status": error.status_code,
                "body": error.body,
            }
        return {"class": None}

    key = os.environ["MODELGATE_KEY"]
    result["errors"] = {
        "401": refusal("mg-v1-" + "0" * 43),
        "402": refusal(os.environ["MODELGATE_BROKE_KEY"]),
        "403": refusal(os.environ["MODELGATE_FORBIDDEN_KEY"]),
        "404": refusal(key, model=os.environ["MODELGATE_MISSING_MODEL"]),
        "429": refusal(os.environ["MODELGATE_LIMITED_KEY"]),
        "400": refusal(key, messages=[]),
    }
    return result


out = {"generation_ids": []}
# The limited key's one request; each run below meets its limit.
client(os.environ["MODELGATE_LIMITED_KEY"], "api_key").messages.create(
    model=MODEL, max_tokens=64, messages=HELLO
)
for auth in ["api_key", "auth_token"]:
    out[auth] = run(auth, out)
print(json.dumps(out))
