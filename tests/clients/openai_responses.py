"""The OpenAI Python SDK on the Responses API and embeddings (tests/it/clients.rs).

Environment: MODELGATE_BASE_URL (`http://127.0.0.1:PORT/api/v1`, or the
mock's own `…/v1`), MODELGATE_MODEL, MODELGATE_EMBEDDING_MODEL,
MODELGATE_KEY (a funded key). Through the gateway also MODELGATE_BROKE_KEY
(a key of an account without credits) and MODELGATE_LIMITED_KEY (a key
whose own rate limit admits one request); without them only the refusal
the upstream itself makes (`store=True`) is tried. Prints one JSON object:
what each call answered, the generation ids of the answered ones, and the
exception each refusal raised.
"""

import json
import os

import openai

BASE = os.environ["MODELGATE_BASE_URL"]
MODEL = os.environ["MODELGATE_MODEL"]
EMBEDDING_MODEL = os.environ["MODELGATE_EMBEDDING_MODEL"]


def client(key):
    # No retries: a 429 must reach this script, not be waited out.
    return openai.OpenAI(base_url=BASE, api_key=key, max_retries=0)


funded = client(os.environ["MODELGATE_KEY"])
out = {"generation_ids": []}


def usage_of(response):
    return response.usage.model_dump(exclude_none=True)


def create(**params):
    raw = funded.responses.with_raw_response.create(model=MODEL, **params)
    out["generation_ids"].append(raw.headers.get("x-generation-id"))
    return raw.parse()


# Stateless: the whole conversation in `input`, nothing stored.
response = create(input="Hi there", max_output_tokens=16, store=False)
out["create"] = {
    "id": response.id,
    "status": response.status,
    "text": response.output_text,
    "model": response.model,
    "usage": usage_of(response),
}

# Streamed, read event by event as a client without the helper reads it.
stream = create(
    input=[{"role": "user", "content": "Hi there"}],
    max_output_tokens=16,
    stream=True,
    prompt_cache_key="the-tests",
    reasoning={"effort": "low"},
)
text, kinds, usage = "", [], None
for event in stream:
    kinds.append(event.type)
    if event.type == "response.output_text.delta":
        text += event.delta
    elif event.type == "response.completed":
        usage = usage_of(event.response)
out["stream"] = {"text": text, "usage": usage, "events": kinds}

# The SDK's stream helper, which rebuilds the response from the events.
with funded.responses.stream(
    model=MODEL, input="Hi there", max_output_tokens=16
) as helper:
    deltas = "".join(
        event.delta for event in helper if event.type == "response.output_text.delta"
    )
    final = helper.get_final_response()
    out["generation_ids"].append(helper._response.headers.get("x-generation-id"))
out["helper"] = {"deltas": deltas, "text": final.output_text, "usage": usage_of(final)}

tools = [
    {
        "type": "function",
        "name": "get_time",
        "description": "The time now.",
        "parameters": {"type": "object", "properties": {}},
    },
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
]
asked = [
    {
        "role": "user",
        "content": 'Weather, please. mock-tool: get_weather {"city": "Paris"}',
    }
]
called = create(input=asked, tools=tools, max_output_tokens=16)
call = next(item for item in called.output if item.type == "function_call")
answered = create(
    input=asked
    + [
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
    ],
    tools=tools,
    max_output_tokens=16,
)
out["tool"] = {
    "types": [item.type for item in called.output],
    "name": call.name,
    "arguments": json.loads(call.arguments),
    "after_types": [item.type for item in answered.output],
    "after_text": answered.output_text,
}


def embed(**params):
    raw = funded.embeddings.with_raw_response.create(model=EMBEDDING_MODEL, **params)
    out["generation_ids"].append(raw.headers.get("x-generation-id"))
    return raw.parse()


def embedded(result):
    return {
        "vectors": [item.embedding for item in result.data],
        "indexes": [item.index for item in result.data],
        "usage": result.usage.model_dump(exclude_none=True),
        "model": result.model,
    }


# The SDK asks for base64 by itself and decodes it; `float` asks for numbers.
out["embeddings"] = {
    "one": embedded(embed(input="The food was delicious")),
    "list": embedded(
        embed(input=["The food was delicious", "and the waiter..."], dimensions=4)
    ),
    "float": embedded(
        embed(input=["The food was delicious"], encoding_format="float")
    ),
}


def refusal(call):
    try:
        call()
    except openai.APIStatusError as error:
        return {
            "class": type(error).__name__,
            "status": error.status_code,
            "body": error.body,
        }
    return {"class": None}


def respond(key, **params):
    return lambda: client(key).responses.create(
        model=MODEL, max_output_tokens=16, **{"input": "Hi there", **params}
    )


key = os.environ["MODELGATE_KEY"]
out["errors"] = {"400": refusal(respond(key, store=True))}
if "MODELGATE_LIMITED_KEY" in os.environ:
    limited = os.environ["MODELGATE_LIMITED_KEY"]
    client(limited).responses.create(model=MODEL, input="Hi there", max_output_tokens=16)
    broke = os.environ["MODELGATE_BROKE_KEY"]
    out["errors"].update(
        {
            "401": refusal(respond("mg-v1-" + "0" * 43)),
            "402": refusal(respond(broke)),
            "429": refusal(respond(limited)),
            "embeddings 402": refusal(
                lambda: client(broke).embeddings.create(
                    model=EMBEDDING_MODEL, input="Hi there"
                )
            ),
        }
    )
print(json.dumps(out))
