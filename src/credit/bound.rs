//! The request edits that make a hold a bound: a completion limit the
//! upstream must obey, and streamed usage asked for so the real cost
//! arrives.

use bytes::Bytes;

use crate::edit::JsonObject;

/// Which request field carries the completion bound for a provider.
///
/// Newer OpenAI models refuse `max_tokens` and take
/// `max_completion_tokens`; most other upstreams know only `max_tokens`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundField {
    /// `max_tokens`
    #[default]
    MaxTokens,
    /// `max_completion_tokens`
    MaxCompletionTokens,
    /// `max_output_tokens`: the Responses API's, never a provider's choice.
    #[serde(skip)]
    MaxOutputTokens,
}

impl BoundField {
    /// The field's name in a request body.
    pub(crate) fn name(self) -> &'static str {
        match self {
            BoundField::MaxTokens => "max_tokens",
            BoundField::MaxCompletionTokens => "max_completion_tokens",
            BoundField::MaxOutputTokens => "max_output_tokens",
        }
    }

    /// The field a provider reading this one may ignore.
    fn other(self) -> Option<BoundField> {
        match self {
            BoundField::MaxTokens => Some(BoundField::MaxCompletionTokens),
            BoundField::MaxCompletionTokens => Some(BoundField::MaxTokens),
            BoundField::MaxOutputTokens => None,
        }
    }
}

/// What the gateway must change in a chat request body before it goes
/// upstream. The default changes nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BodyEdits {
    /// Sets this field to this many tokens, and removes the other bound
    /// field: the bound the hold pays for goes in the one field the
    /// provider reads, whichever field the client used (a provider that
    /// reads only `max_tokens` would ignore a `max_completion_tokens`
    /// bound, and generate up to its own default).
    pub write_bound: Option<(BoundField, u64)>,
    /// Makes `stream_options.include_usage` true: for a streamed request
    /// whose client did not ask for usage.
    pub ask_stream_usage: bool,
    /// Sets `max_tool_calls`: a Responses request that may search the web
    /// without a bound of its own gets the one its hold pays for.
    pub max_tool_calls: Option<u64>,
    /// Sets `store` to false where the client left it out: a Responses
    /// upstream stores answers by default, and the gateway is stateless.
    pub stateless: bool,
}

/// The request body with `edits` made; `None` when nothing needs changing
/// (no edits, or `include_usage` already true and no bound to write), or
/// when `body` is not a JSON object with each edited field once (which
/// [`ChatRequest::parse`](crate::body::ChatRequest::parse) refuses before).
///
/// `write_bound` sets that top-level field (in its place when the body has
/// it, as a `null`, say; else last) and removes the other bound field when
/// the body has it. `ask_stream_usage` makes
/// `stream_options.include_usage` true: it creates `stream_options`, or
/// merges into the client's object, keeping its other fields (a
/// `stream_options` that is not an object, which the parser refuses, is
/// replaced). Every other top-level field goes on byte for byte as the
/// client sent it: only the top level is parsed, so no message is rebuilt.
///
/// ```
/// use modelgate::credit::{edit_request_body, BodyEdits, BoundField};
///
/// let body = br#"{"model": "openai/gpt-4o", "stream": true, "messages": [{"role": "user", "content": "Hi"}]}"#;
/// let edits = BodyEdits {
///     write_bound: Some((BoundField::MaxCompletionTokens, 4096)),
///     ask_stream_usage: true,
///     ..BodyEdits::default()
/// };
/// let edited = edit_request_body(body, &edits).unwrap();
/// assert_eq!(
///     &edited[..],
///     br#"{"model": "openai/gpt-4o", "stream": true, "messages": [{"role": "user", "content": "Hi"}],"max_completion_tokens":4096,"stream_options":{"include_usage":true}}"#,
/// );
/// assert_eq!(edit_request_body(body, &BodyEdits::default()), None);
/// ```
pub fn edit_request_body(body: &[u8], edits: &BodyEdits) -> Option<Bytes> {
    if *edits == BodyEdits::default() {
        return None;
    }
    let mut object = JsonObject::parse(body)?;
    let mut changed = false;
    if let Some((field, tokens)) = edits.write_bound {
        let tokens = tokens.to_string();
        if object.get(field.name()).ok()? != Some(tokens.as_str()) {
            object.set(field.name(), tokens).ok()?;
            changed = true;
        }
        if let Some(other) = field.other()
            && object.get(other.name()).ok()?.is_some()
        {
            object.remove(other.name()).ok()?;
            changed = true;
        }
    }
    if let Some(calls) = edits.max_tool_calls {
        object.set("max_tool_calls", calls.to_string()).ok()?;
        changed = true;
    }
    if edits.stateless && object.get("store").ok()?.is_none() {
        object.set("store", "false".to_owned()).ok()?;
        changed = true;
    }
    if edits.ask_stream_usage
        && let Some(options) = stream_options_with_usage(object.get("stream_options").ok()?)
    {
        object.set("stream_options", options).ok()?;
        changed = true;
    }
    changed.then(|| Bytes::from(object.to_bytes()))
}

/// The `stream_options` text that asks for usage, given the client's;
/// `None` when the client's asks already.
fn stream_options_with_usage(options: Option<&str>) -> Option<String> {
    const ASKING: &str = r#"{"include_usage":true}"#;
    let Some(options) = options else {
        return Some(ASKING.to_owned());
    };
    let Some(mut object) = JsonObject::parse(options.as_bytes()) else {
        // `null`, or a value the parser refuses: only an object can ask.
        return Some(ASKING.to_owned());
    };
    match object.get("include_usage") {
        Ok(Some("true")) => None,
        Ok(_) => {
            // In its place when the client sent `false` or `null`, else last.
            object.set("include_usage", "true".to_owned()).ok()?;
            String::from_utf8(object.to_bytes()).ok()
        }
        // Twice in the client's object: which one an upstream reads is
        // unclear, so the gateway's request is the whole object.
        Err(_) => Some(ASKING.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::ChatRequest;
    use proptest::prelude::*;
    use serde_json::Value;
    use serde_json::value::RawValue;
    use std::collections::BTreeMap;

    const BOUND: BodyEdits = BodyEdits {
        write_bound: Some((BoundField::MaxTokens, 512)),
        ask_stream_usage: false,
        max_tool_calls: None,
        stateless: false,
    };
    const USAGE: BodyEdits = BodyEdits {
        write_bound: None,
        ask_stream_usage: true,
        max_tool_calls: None,
        stateless: false,
    };

    /// A Responses request's edits: its bound in `max_output_tokens`, the
    /// searches its hold pays for in `max_tool_calls`, `store: false` where
    /// the client left it out; every other byte as sent.
    #[test]
    fn a_responses_request_gets_its_bound_its_tool_calls_and_store_false() {
        let edits = BodyEdits {
            write_bound: Some((BoundField::MaxOutputTokens, 300)),
            max_tool_calls: Some(8),
            stateless: true,
            ..BodyEdits::default()
        };
        assert_eq!(
            edit(r#"{"model": "a/b", "input": "Hi", "max_tokens": 5}"#, edits).unwrap(),
            r#"{"model": "a/b", "input": "Hi", "max_tokens": 5,"max_output_tokens":300,"max_tool_calls":8,"store":false}"#
        );
        // The client's own `store: false` stays as sent.
        assert_eq!(
            edit(
                r#"{"store": false, "max_output_tokens": 300}"#,
                BodyEdits {
                    max_tool_calls: None,
                    ..edits
                }
            ),
            None
        );
    }

    fn edit(body: &str, edits: BodyEdits) -> Option<String> {
        edit_request_body(body.as_bytes(), &edits)
            .map(|out| String::from_utf8(out.to_vec()).unwrap())
    }

    const CHAT: &str =
        r#"{ "model":"p/m", "messages":[{"role":"user","content":"caf\u00e9 \"x\"  1.0e0"}] }"#;

    #[test]
    fn a_missing_bound_is_written_after_the_other_fields() {
        assert_eq!(
            edit(CHAT, BOUND).unwrap(),
            r#"{ "model":"p/m", "messages":[{"role":"user","content":"caf\u00e9 \"x\"  1.0e0"}],"max_tokens":512 }"#
        );
        let edits = BodyEdits {
            write_bound: Some((BoundField::MaxCompletionTokens, 7)),
            ask_stream_usage: false,
            ..BodyEdits::default()
        };
        assert_eq!(
            edit(r#"{"model":"p/m"}"#, edits).unwrap(),
            r#"{"model":"p/m","max_completion_tokens":7}"#
        );
    }

    #[test]
    fn the_bound_moves_to_the_field_the_provider_reads() {
        // A client that bounds only `max_completion_tokens` sent to a
        // provider that reads `max_tokens`: the bound it was held for goes
        // where that provider reads it, and the field it would ignore goes.
        assert_eq!(
            edit(
                r#"{"model":"p/m","max_completion_tokens":1}"#,
                BodyEdits {
                    write_bound: Some((BoundField::MaxTokens, 1)),
                    ask_stream_usage: false,
                    ..BodyEdits::default()
                }
            )
            .unwrap(),
            r#"{"model":"p/m","max_tokens":1}"#
        );
        let to_completion = BodyEdits {
            write_bound: Some((BoundField::MaxCompletionTokens, 9)),
            ask_stream_usage: false,
            ..BodyEdits::default()
        };
        assert_eq!(
            edit(
                r#"{"max_tokens":9,"max_completion_tokens":9,"model":"p/m"}"#,
                to_completion
            )
            .unwrap(),
            r#"{"max_completion_tokens":9,"model":"p/m"}"#
        );
        assert_eq!(edit(r#"{"max_completion_tokens":9}"#, to_completion), None);
    }

    #[test]
    fn a_null_bound_is_replaced_in_its_place_and_an_equal_one_left_alone() {
        assert_eq!(
            edit(r#"{"max_tokens": null, "model":"p/m"}"#, BOUND).unwrap(),
            r#"{"max_tokens": 512, "model":"p/m"}"#
        );
        assert_eq!(edit(r#"{"max_tokens":512}"#, BOUND), None);
    }

    #[test]
    fn stream_usage_is_asked_for_with_or_without_stream_options() {
        assert_eq!(
            edit(r#"{"stream":true}"#, USAGE).unwrap(),
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#
        );
        assert_eq!(
            edit(r#"{"stream_options": null,"stream":true}"#, USAGE).unwrap(),
            r#"{"stream_options": {"include_usage":true},"stream":true}"#
        );
        // The client's other options stay, as they were written.
        assert_eq!(
            edit(
                r#"{"stream_options": { "continuous_usage_stats" : true }, "stream":true}"#,
                USAGE
            )
            .unwrap(),
            r#"{"stream_options": { "continuous_usage_stats" : true,"include_usage":true }, "stream":true}"#
        );
        assert_eq!(
            edit(r#"{"stream_options":{"include_usage":false,"x":1}}"#, USAGE).unwrap(),
            r#"{"stream_options":{"include_usage":true,"x":1}}"#
        );
        // Already asked: nothing to change.
        assert_eq!(
            edit(r#"{"stream_options":{"include_usage":true}}"#, USAGE),
            None
        );
        // Only with a bound to write does the body change then.
        let both = BodyEdits {
            ask_stream_usage: true,
            ..BOUND
        };
        assert_eq!(
            edit(r#"{"stream_options":{"include_usage":true}}"#, both).unwrap(),
            r#"{"stream_options":{"include_usage":true},"max_tokens":512}"#
        );
    }

    #[test]
    fn odd_bodies_are_left_alone_or_made_to_ask() {
        assert_eq!(edit(CHAT, BodyEdits::default()), None);
        for not_an_object in ["", "[]", "{", "null", r#"{"a":1} {}"#] {
            assert_eq!(edit(not_an_object, BOUND), None, "{not_an_object}");
        }
        // Repeated fields (the parser refuses them): an edit could be read
        // past, so the body is not edited.
        assert_eq!(edit(r#"{"max_tokens":1,"max_tokens":2}"#, BOUND), None);
        assert_eq!(
            edit(r#"{"stream_options":{},"stream_options":{}}"#, USAGE),
            None
        );
        // Options the parser refuses: the gateway's request replaces them.
        assert_eq!(
            edit(r#"{"stream_options":"x"}"#, USAGE).unwrap(),
            r#"{"stream_options":{"include_usage":true}}"#
        );
        assert_eq!(
            edit(
                r#"{"stream_options":{"include_usage":false,"include_usage":false}}"#,
                USAGE
            )
            .unwrap(),
            r#"{"stream_options":{"include_usage":true}}"#
        );
    }

    #[test]
    fn bound_fields_read_from_config_in_snake_case() {
        let field: BoundField = serde_json::from_str(r#""max_completion_tokens""#).unwrap();
        assert_eq!(field, BoundField::MaxCompletionTokens);
        let field: BoundField = serde_json::from_str(r#""max_tokens""#).unwrap();
        assert_eq!(field, BoundField::MaxTokens);
        assert!(serde_json::from_str::<BoundField>(r#""maxTokens""#).is_err());
        assert_eq!(BoundField::default(), BoundField::MaxTokens);
    }

    #[test]
    fn an_edited_chat_request_parses_to_the_same_request_with_the_edits() {
        let body = r#"{"model":"openai/gpt-4o","stream":true,"stream_options":{"x":1},"messages":[{"role":"user","content":"Hi"}],"user":"u"}"#;
        let before = ChatRequest::parse(body.as_bytes()).unwrap();
        let edits = BodyEdits {
            write_bound: Some((BoundField::MaxCompletionTokens, 300)),
            ask_stream_usage: true,
            ..BodyEdits::default()
        };
        let after =
            ChatRequest::parse(&edit_request_body(body.as_bytes(), &edits).unwrap()).unwrap();
        assert_eq!(after.max_tokens, Some(300));
        assert!(after.stream_usage_requested);
        assert_eq!(after.messages, before.messages);
        assert_eq!(after.extra["user"], "u");
        assert_eq!(after.extra["stream_options"]["x"], 1);
    }

    /// Top-level members by name, values as written.
    fn members(text: &[u8]) -> BTreeMap<String, &RawValue> {
        serde_json::from_slice(text).unwrap()
    }

    fn json_value() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_owned()),
            any::<bool>().prop_map(|b| b.to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| format!("{f:e}")),
            any::<String>().prop_map(|s| serde_json::to_string(&s).unwrap()),
            "\"(\\\\u00[0-7][0-9a-f]|[a-z ])*\"",
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4)
                    .prop_map(|items| format!("[ {} ]", items.join(" ,"))),
                proptest::collection::vec(("[a-z_]{0,6}", inner), 0..4).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(name, value)| format!("\"{name}\" :{value}"))
                        .collect();
                    format!("{{{}}}", members.join(",\n"))
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn an_edited_body_has_the_edits_and_every_other_field_as_it_was(
            fields in proptest::collection::btree_map("[a-z_]{1,8}", json_value(), 0..6),
            options in proptest::option::of(proptest::collection::btree_map("[a-z_]{1,8}", json_value(), 0..3)),
            tokens in 1u64..=u64::MAX,
            completion_field: bool,
            ask_stream_usage: bool,
            write_bound: bool,
            client_bounds in proptest::option::of((proptest::option::of(1u64..1000), proptest::option::of(1u64..1000))),
        ) {
            let mut parts: Vec<String> = fields
                .iter()
                .filter(|(name, _)| !matches!(name.as_str(), "max_tokens" | "max_completion_tokens" | "stream_options"))
                .map(|(name, value)| format!("\"{name}\": {value}"))
                .collect();
            let (client_max_tokens, client_max_completion_tokens) = client_bounds.unwrap_or_default();
            for (name, value) in [("max_tokens", client_max_tokens), ("max_completion_tokens", client_max_completion_tokens)] {
                if let Some(value) = value {
                    parts.push(format!("\"{name}\": {value}"));
                }
            }
            if let Some(options) = &options {
                let options: Vec<String> = options.iter().map(|(name, value)| format!("\"{name}\":{value}")).collect();
                parts.push(format!("\"stream_options\": {{ {} }}", options.join(", ")));
            }
            let body = format!(" {{ {} }}", parts.join(" , "));
            let field = if completion_field { BoundField::MaxCompletionTokens } else { BoundField::MaxTokens };
            let edits = BodyEdits { write_bound: write_bound.then_some((field, tokens)), ask_stream_usage, ..BodyEdits::default() };
            let already_asked = options.as_ref().and_then(|o| o.get("include_usage")).is_some_and(|v| v == "true");
            let out = edit_request_body(body.as_bytes(), &edits);
            let before = members(body.as_bytes());
            let Some(out) = out else {
                let bound_in_place = before.get(field.name()).is_some_and(|value| value.get() == tokens.to_string())
                    && !field.other().is_some_and(|other| before.contains_key(other.name()));
                prop_assert!((!write_bound || bound_in_place) && (!ask_stream_usage || already_asked));
                return Ok(());
            };
            let after = members(&out);
            let bound_fields = ["max_tokens", "max_completion_tokens"];
            for (name, value) in &before {
                if name != "stream_options" && !(write_bound && bound_fields.contains(&name.as_str())) {
                    prop_assert_eq!(after[name].get(), value.get(), "{} changed", name);
                }
            }
            if write_bound {
                prop_assert_eq!(after[field.name()].get(), tokens.to_string());
                prop_assert!(!field.other().is_some_and(|other| after.contains_key(other.name())), "the other bound field stays");
            }
            let value: Value = serde_json::from_slice(&out).unwrap();
            if ask_stream_usage {
                prop_assert_eq!(&value["stream_options"]["include_usage"], &Value::Bool(true));
            }
            // The client's other options survive, byte for byte.
            if let (Some(options), Some(after_options)) = (&options, after.get("stream_options")) {
                let after_options = members(after_options.get().as_bytes());
                for (name, value) in options {
                    if name != "include_usage" || !ask_stream_usage {
                        prop_assert_eq!(after_options[name].get(), value.trim());
                    }
                }
            }
            let bounds_before = bound_fields.iter().filter(|name| before.contains_key(**name)).count();
            // With a bound written, exactly one bound field is left.
            let names_before = if write_bound { before.len() + 1 - bounds_before } else { before.len() };
            let expected_names = names_before
                + usize::from(ask_stream_usage && !before.contains_key("stream_options"));
            prop_assert_eq!(after.len(), expected_names);
        }

        #[test]
        fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200), ask: bool) {
            let edits = BodyEdits { write_bound: Some((BoundField::MaxTokens, 1)), ask_stream_usage: ask, ..BodyEdits::default() };
            if let Some(out) = edit_request_body(&body, &edits) {
                prop_assert!(serde_json::from_slice::<&RawValue>(&out).is_ok());
            }
        }
    }
}
