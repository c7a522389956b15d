//! `edit_request_body` on arbitrary bytes: never panics; an edited body is
//! a JSON object with the bound in the provider's field and none in the
//! other, the usage request, and every other top-level field byte for byte
//! as it was. A chat request that set no
//! bound is always given one.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use modelgate::body::ChatRequest;
use modelgate::credit::{edit_request_body, BodyEdits, BoundField};
use serde_json::value::RawValue;

/// Top-level members by name, values as written.
fn members(text: &[u8]) -> Option<BTreeMap<String, &RawValue>> {
    serde_json::from_slice(text).ok()
}

fuzz_target!(|input: (u8, u64, &[u8])| {
    let (choice, tokens, body) = input;
    let field = if choice & 1 == 0 {
        BoundField::MaxTokens
    } else {
        BoundField::MaxCompletionTokens
    };
    let (name, other) = match field {
        BoundField::MaxCompletionTokens => ("max_completion_tokens", "max_tokens"),
        _ => ("max_tokens", "max_completion_tokens"),
    };
    let edits = BodyEdits {
        write_bound: (choice & 2 != 0).then_some((field, tokens)),
        ask_stream_usage: choice & 4 != 0,
        // A Responses request's edits, on any body.
        max_tool_calls: (choice & 8 != 0).then_some(tokens % 16),
        stateless: choice & 16 != 0,
    };
    let Some(out) = edit_request_body(body, &edits) else {
        if let Ok(chat) = ChatRequest::parse(body) {
            assert!(
                edits.write_bound.is_none() || chat.max_tokens.is_some(),
                "a chat request with no bound got none"
            );
            assert!(
                !edits.ask_stream_usage || chat.stream_usage_requested,
                "a chat request that did not ask for usage was not made to"
            );
        }
        return;
    };
    let before = members(body).expect("only an object is edited");
    let after = members(&out).expect("an object out");
    for (member, value) in &before {
        let bound_field = edits.write_bound.is_some() && (member == name || member == other);
        let responses_field = (edits.max_tool_calls.is_some() && member == "max_tool_calls")
            || (edits.stateless && member == "store");
        if member != "stream_options" && !bound_field && !responses_field {
            assert_eq!(after[member].get(), value.get(), "{member} changed");
        }
    }
    if let Some(calls) = edits.max_tool_calls {
        assert_eq!(after["max_tool_calls"].get(), calls.to_string());
    }
    if edits.stateless {
        // The client's own `store` stays; none becomes false.
        let expected = before.get("store").map_or("false", |value| value.get());
        assert_eq!(after["store"].get(), expected);
    }
    if let Some((_, tokens)) = edits.write_bound {
        assert_eq!(after[name].get(), tokens.to_string());
        // Only the provider's field may bound what the upstream generates.
        assert!(!after.contains_key(other), "{other} kept beside {name}");
    }
    if edits.ask_stream_usage {
        // Read narrowly: other values may be numbers beyond f64's range,
        // valid JSON that a `Value` cannot hold.
        #[derive(serde::Deserialize)]
        struct Asked {
            stream_options: Options,
        }
        #[derive(serde::Deserialize)]
        struct Options {
            include_usage: bool,
        }
        let asked: Asked = serde_json::from_slice(&out).expect("usage asked for");
        assert!(asked.stream_options.include_usage);
    }
    // As the gateway calls it: a bound (of at least 1) only for a request
    // that set none.
    let Ok(chat) = ChatRequest::parse(body) else {
        return;
    };
    if edits.write_bound.is_some() && (chat.max_tokens.is_some() || tokens == 0) {
        return;
    }
    let edited = ChatRequest::parse(&out).expect("an edited request parses");
    assert_eq!(edited.messages, chat.messages);
    assert_eq!(edited.model, chat.model);
    assert_eq!(edited.stream, chat.stream);
    if edits.ask_stream_usage {
        assert!(edited.stream_usage_requested);
    }
    if edits.write_bound.is_some() {
        assert_eq!(edited.max_tokens, Some(tokens));
    }
});
