//! What the crate's readers of JSON input share: request bodies (chat
//! completions, the management API, OAuth, webhook payloads), GitHub's
//! alerts and keys, and configuration. One object read with each key once,
//! the names of JSON types as messages say them, the refusals that name
//! their field in `metadata.param`, and bounded text.
//!
//! Each reader keeps its own words for what it refuses; what is here says
//! nothing a reader did not say before, so every message stays the same.

use std::fmt;

use serde_json::{Map, Value};

use crate::error::{ErrorKind, GatewayError};

/// 400 `invalid_request_error` about one field, naming it in
/// `metadata.param`: the field is missing or the body is unusable there.
pub(crate) fn bad_request(field: &str, message: impl Into<String>) -> GatewayError {
    GatewayError::new(ErrorKind::InvalidRequest, message.into()).with_metadata("param", field)
}

/// 400: a required field is absent.
pub(crate) fn missing(field: &str, why: &str) -> GatewayError {
    bad_request(field, format!("`{field}` is required: {why}"))
}

/// 422 `invalid_parameter` about one field, naming it in
/// `metadata.param`: a value of the wrong type or out of range.
pub(crate) fn invalid_parameter(param: &str, message: impl Into<String>) -> GatewayError {
    GatewayError::new(ErrorKind::InvalidParameter, message.into()).with_metadata("param", param)
}

/// 422: a field's value is of the wrong type or out of range, the message
/// being "`field` problem".
pub(crate) fn invalid(field: &str, problem: &str) -> GatewayError {
    invalid_parameter(field, format!("`{field}` {problem}"))
}

/// 422 for a value present but of the wrong JSON type (a missing one is a
/// 400 `invalid_request_error` instead), naming the field.
pub(crate) fn wrong_type(param: &str, expected: &str, found: &Value) -> GatewayError {
    invalid_parameter(
        param,
        format!("`{param}` must be {expected}, not {}", json_type(found)),
    )
}

/// 400 `invalid_request_error` about the body as a whole (no field to name).
pub(crate) fn invalid_request(message: impl Into<String>) -> GatewayError {
    GatewayError::new(ErrorKind::InvalidRequest, message.into())
}

/// The top-level fields of a model request's body (chat completions,
/// Messages): 400 `invalid_request_error` for a body that is not JSON (with
/// line and column), not an object, or names a field twice (naming it).
pub(crate) fn request_body_fields(body: &[u8]) -> Result<Map<String, Value>, GatewayError> {
    match top_level_fields(body) {
        Ok(fields) => Ok(fields),
        Err(JsonBodyError::NotJson(reason)) => Err(invalid_request(format!(
            "the request body is not valid JSON: {reason}; \
             check the escaping of quotes, backslashes and non-ASCII characters"
        ))),
        Err(JsonBodyError::NotObject(found)) => Err(invalid_request(format!(
            "the request body must be a JSON object, not {found}"
        ))),
        Err(JsonBodyError::Duplicate(key)) => Err(bad_request(
            &key,
            format!("the request body has a duplicate field `{key}`: each field may appear once"),
        )),
    }
}

/// Takes a model request's `model` as sent: 400 when absent, null or
/// blank, 422 when not a string. Its syntax is `ModelId::parse`'s, which
/// readers call last, so each other field's error reads the same whatever
/// the model.
pub(crate) fn take_model(fields: &mut Map<String, Value>) -> Result<String, GatewayError> {
    match fields.remove("model") {
        None | Some(Value::Null) => Err(bad_request(
            "model",
            "`model` is required: name a model such as \"openai/gpt-4o\"",
        )),
        Some(Value::String(model)) if model.trim().is_empty() => {
            Err(bad_request("model", "`model` must not be empty"))
        }
        Some(Value::String(model)) => Ok(model),
        Some(other) => Err(wrong_type("model", "a string", &other)),
    }
}

/// `messages`, taken from a request's fields: a non-empty array of
/// messages (400 when absent, null or empty; 422 when not an array).
pub(crate) fn take_messages(fields: &mut Map<String, Value>) -> Result<Vec<Value>, GatewayError> {
    let messages = match fields.remove("messages") {
        None | Some(Value::Null) => {
            return Err(missing(
                "messages",
                "an array of {\"role\", \"content\"} objects",
            ));
        }
        Some(Value::Array(messages)) => messages,
        Some(other) => return Err(wrong_type("messages", "an array", &other)),
    };
    if messages.is_empty() {
        return Err(bad_request(
            "messages",
            "`messages` must contain at least one message",
        ));
    }
    Ok(messages)
}

/// `stream`, taken from a request's fields: false when absent or null,
/// 422 when not a boolean.
pub(crate) fn take_stream(fields: &mut Map<String, Value>) -> Result<bool, GatewayError> {
    match fields.remove("stream") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(stream)) => Ok(stream),
        Some(other) => Err(wrong_type("stream", "a boolean", &other)),
    }
}

/// An optional integer of at least `min`: absent or null is `None`; 422
/// naming `param` for another type or a smaller (or fractional) number.
/// `param` is formatted only on the way to an error.
pub(crate) fn integer_at_least(
    value: Option<&Value>,
    param: impl fmt::Display,
    min: u64,
) -> Result<Option<u64>, GatewayError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(number)) => match number.as_u64() {
            Some(value) if value >= min => Ok(Some(value)),
            _ => Err(invalid(
                &param.to_string(),
                &format!("must be an integer of at least {min}, not {number}"),
            )),
        },
        Some(other) => Err(wrong_type(&param.to_string(), "an integer", other)),
    }
}

/// An optional number from `min` to `max`: absent or null is `None`; 422
/// naming `param` for another type or a number outside.
pub(crate) fn number_in(
    value: Option<&Value>,
    param: impl fmt::Display,
    min: f64,
    max: f64,
) -> Result<Option<f64>, GatewayError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(number)) => {
            let value = number.as_f64().unwrap_or(f64::NAN);
            if (min..=max).contains(&value) {
                Ok(Some(value))
            } else {
                Err(invalid(
                    &param.to_string(),
                    &format!("must be between {min} and {max}, not {number}"),
                ))
            }
        }
        Some(other) => Err(wrong_type(&param.to_string(), "a number", other)),
    }
}

/// A field's path (`messages[2].content[0].source`), for messages and
/// `metadata.param`: built as a parser descends, formatted only on the way
/// to an error.
#[derive(Clone, Copy)]
pub(crate) enum At<'a> {
    /// The body itself: its fields are named alone (`store`, not `.store`).
    Root,
    Top(&'static str),
    Field(&'a At<'a>, &'static str),
    Index(&'a At<'a>, usize),
}

impl At<'_> {
    pub(crate) fn field(&self, name: &'static str) -> At<'_> {
        At::Field(self, name)
    }

    pub(crate) fn index(&self, index: usize) -> At<'_> {
        At::Index(self, index)
    }

    pub(crate) fn param(&self) -> String {
        self.to_string()
    }

    /// 400: the field is absent or null.
    pub(crate) fn missing(&self, why: &str) -> GatewayError {
        missing(&self.param(), why)
    }

    /// 422: the field is of another type.
    pub(crate) fn wrong_type(&self, expected: &str, found: &Value) -> GatewayError {
        wrong_type(&self.param(), expected, found)
    }

    /// 400: the field holds a value the API does not know.
    pub(crate) fn unknown(&self, found: &str, known: &str) -> GatewayError {
        let param = self.param();
        bad_request(
            &param,
            format!("`{param}` is {found:?}, which is not known here; use {known}"),
        )
    }
}

impl fmt::Display for At<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Root => Ok(()),
            At::Top(name) | At::Field(At::Root, name) => f.write_str(name),
            At::Field(parent, name) => write!(f, "{parent}.{name}"),
            At::Index(parent, index) => write!(f, "{parent}[{index}]"),
        }
    }
}

/// Takes the required string `key` of the object at `at`: 400 when absent
/// or null, 422 when of another type.
pub(crate) fn take_string(
    fields: &mut Map<String, Value>,
    at: &At<'_>,
    key: &'static str,
) -> Result<String, GatewayError> {
    match fields.remove(key) {
        Some(Value::String(text)) => Ok(text),
        None | Some(Value::Null) => Err(at.field(key).missing("a string")),
        Some(other) => Err(at.field(key).wrong_type("a string", &other)),
    }
}

/// Takes the optional string `key` of the object at `at`: absent or null
/// is `None`, another type 422.
pub(crate) fn take_optional_string(
    fields: &mut Map<String, Value>,
    at: &At<'_>,
    key: &'static str,
) -> Result<Option<String>, GatewayError> {
    match fields.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(other) => Err(at.field(key).wrong_type("a string", &other)),
    }
}

/// Takes the optional boolean `key` of the object at `at`: absent or null
/// is `None`, another type 422.
pub(crate) fn take_optional_bool(
    fields: &mut Map<String, Value>,
    at: &At<'_>,
    key: &'static str,
) -> Result<Option<bool>, GatewayError> {
    match fields.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(flag)) => Ok(Some(flag)),
        Some(other) => Err(at.field(key).wrong_type("a boolean", &other)),
    }
}

/// The size of `value` as JSON, without writing it anywhere: what a
/// prompt's bound counts for JSON the upstream reads as text.
pub(crate) fn json_bytes(value: &impl serde::Serialize) -> u64 {
    struct Counter(u64);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len() as u64;
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    // Serializing JSON values into a writer that never fails cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

/// What a JSON value is, as messages name it: `a string`, `null`, ….
pub(crate) fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Why a body is not a JSON object with distinct top-level keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JsonBodyError {
    /// Not JSON: what is wrong and where (`… at line L, column C`).
    NotJson(String),
    /// JSON, but not an object: what it is instead (`an array`, …).
    NotObject(&'static str),
    /// A top-level key appears twice.
    Duplicate(String),
}

/// The top-level fields of a JSON object body. A repeated key is refused:
/// the gateway and whoever reads the body next could each take a different
/// one of the two (`"model"` twice would let one spelling dodge the quota).
pub(crate) fn top_level_fields(body: &[u8]) -> Result<Map<String, Value>, JsonBodyError> {
    match serde_json::from_slice::<UniqueKeys>(body) {
        Ok(UniqueKeys(fields)) => Ok(fields),
        Err(error) if error.is_data() => {
            let text = error.to_string();
            if let Some(key) = text.strip_prefix(DUPLICATE_MARK) {
                let key = key.rfind("` at line ").map_or(key, |end| &key[..end]);
                return Err(JsonBodyError::Duplicate(key.to_owned()));
            }
            // Valid JSON that is not an object says what it is instead.
            match serde_json::from_slice::<Value>(body) {
                Ok(value) => Err(JsonBodyError::NotObject(json_type(&value))),
                Err(error) => Err(not_json(&error)),
            }
        }
        Err(error) => Err(not_json(&error)),
    }
}

const DUPLICATE_MARK: &str = "duplicate top-level key `";

fn not_json(error: &serde_json::Error) -> JsonBodyError {
    JsonBodyError::NotJson(json_error_reason(error))
}

/// What serde_json found wrong and where: `… at line L, column C`.
pub(crate) fn json_error_reason(error: &serde_json::Error) -> String {
    // serde_json appends " at line L column C"; say it once, with a comma.
    let text = error.to_string();
    let reason = match text.rfind(" at line ") {
        Some(index) => &text[..index],
        None => &text,
    };
    format!(
        "{reason} at line {}, column {}",
        error.line(),
        error.column()
    )
}

struct UniqueKeys(Map<String, Value>);

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;

        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = UniqueKeys;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a JSON object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<UniqueKeys, A::Error> {
                let mut fields = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if fields.contains_key(&key) {
                        return Err(serde::de::Error::custom(format_args!(
                            "{DUPLICATE_MARK}{key}`"
                        )));
                    }
                    let value: Value = map.next_value()?;
                    fields.insert(key, value);
                }
                Ok(UniqueKeys(fields))
            }
        }

        deserializer.deserialize_map(Visitor)
    }
}

/// A JSON object whose every field is taken at most once; fields it was
/// not asked for are refused.
pub(crate) struct Fields {
    object: Map<String, Value>,
}

impl Fields {
    pub(crate) fn parse(body: &[u8], allowed: &[&str]) -> Result<Fields, GatewayError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Err(GatewayError::new(
                ErrorKind::InvalidRequest,
                "the request body is empty; send a JSON object",
            ));
        }
        let value: Value = serde_json::from_slice(body).map_err(|error| {
            GatewayError::new(
                ErrorKind::InvalidRequest,
                format!("the request body is not valid JSON: {error}"),
            )
        })?;
        let Value::Object(object) = value else {
            return Err(GatewayError::new(
                ErrorKind::InvalidRequest,
                "the request body must be a JSON object",
            ));
        };
        if let Some(unknown) = object.keys().find(|key| !allowed.contains(&key.as_str())) {
            return Err(bad_request(
                unknown,
                format!(
                    "unknown field `{unknown}`; the fields are {}",
                    allowed.join(", ")
                ),
            ));
        }
        Ok(Fields { object })
    }

    pub(crate) fn take(&mut self, name: &str) -> Option<Value> {
        self.object.remove(name)
    }
}

/// Takes `key` from `fields` as a short text: absent or null is `None`;
/// a string is trimmed and must then be 1 to `max_chars` characters with
/// no control character. The error is the problem, as the caller's message
/// goes on after the field's name.
#[cfg(any(feature = "flows", feature = "notify", feature = "proxy"))]
pub(crate) fn take_short_text(
    fields: &mut Map<String, Value>,
    key: &str,
    max_chars: usize,
) -> Result<Option<String>, String> {
    match fields.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => {
            let trimmed = text.trim();
            if trimmed.is_empty()
                || trimmed.chars().count() > max_chars
                || trimmed.chars().any(char::is_control)
            {
                return Err(format!(
                    "must be 1 to {max_chars} characters without control characters"
                ));
            }
            Ok(Some(trimmed.to_owned()))
        }
        Some(_) => Err("must be a string".to_owned()),
    }
}

/// `serde_json::from_slice`, with the UTF-8 checked once for the whole
/// text rather than string by string, which costs a streamed chunk several
/// times more. A text that is not UTF-8 takes the byte-wise path, so the
/// result is always `from_slice`'s (which lets an ignored string through
/// unchecked).
pub(crate) fn json_from_bytes<'de, T: serde::Deserialize<'de>>(
    bytes: &'de [u8],
) -> serde_json::Result<T> {
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(bytes),
    }
}

/// Generators the parsers' property tests share.
#[cfg(test)]
pub(crate) mod strategies {
    use proptest::prelude::*;
    use serde_json::Value;

    /// Any JSON value, its strings sometimes one of `words` and its
    /// objects' keys sometimes one of `keys` (the words a parser reads).
    pub(crate) fn any_json(
        words: &'static [&'static str],
        keys: &'static [&'static str],
    ) -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |x| x.is_finite())
                .prop_map(Value::from),
            ".{0,8}".prop_map(Value::from),
            proptest::sample::select(words).prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 24, 4, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map(
                    prop_oneof![
                        proptest::sample::select(keys).prop_map(str::to_owned),
                        "[a-z]{1,4}"
                    ],
                    inner,
                    0..4,
                )
                .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    /// Every JSON pointer into `value` (but the root).
    pub(crate) fn collect_pointers(value: &Value, at: String, pointers: &mut Vec<String>) {
        let children: Vec<(String, &Value)> = match value {
            Value::Object(fields) => fields
                .iter()
                .map(|(key, child)| (key.replace('~', "~0").replace('/', "~1"), child))
                .collect(),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(index, child)| (index.to_string(), child))
                .collect(),
            _ => return,
        };
        for (key, child) in children {
            let pointer = format!("{at}/{key}");
            pointers.push(pointer.clone());
            collect_pointers(child, pointer, pointers);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[cfg(any(feature = "flows", feature = "notify", feature = "proxy"))]
    #[test]
    fn short_texts_are_trimmed_and_bounded() {
        use serde_json::json;
        let mut fields =
            json!({"a": "  ab ", "b": "", "c": "abc", "d": "a\u{7}", "e": 1, "f": null})
                .as_object()
                .unwrap()
                .clone();
        let mut take = |key| take_short_text(&mut fields, key, 2);
        assert_eq!(take("a"), Ok(Some("ab".to_owned())));
        let bounds = Err("must be 1 to 2 characters without control characters".to_owned());
        assert_eq!(take("b"), bounds);
        assert_eq!(take("c"), bounds);
        assert_eq!(take("d"), bounds);
        assert_eq!(take("e"), Err("must be a string".to_owned()));
        assert_eq!(take("f"), Ok(None));
        assert_eq!(take("absent"), Ok(None));
    }

    #[test]
    fn a_body_is_one_object_with_each_key_once() {
        assert_eq!(
            top_level_fields(br#"{"a": 1, "b": {"a": 1, "a": 2}}"#).map(|fields| fields.len()),
            Ok(2)
        );
        assert_eq!(
            top_level_fields(br#"{"a": 1, "a": 2}"#),
            Err(JsonBodyError::Duplicate("a".into()))
        );
        assert_eq!(
            top_level_fields(b"[1]"),
            Err(JsonBodyError::NotObject("an array"))
        );
        assert_eq!(
            top_level_fields(b"{\"a\": }"),
            Err(JsonBodyError::NotJson(
                "expected value at line 1, column 7".into()
            ))
        );
    }

    proptest! {
        #[test]
        fn json_from_bytes_reads_as_from_slice_does(
            members in proptest::collection::vec(
                ("[a-c]", r#"[a-c"\\é]{0,4}"#, proptest::option::of((0usize..4, 0x80u8..=0xff))),
                0..4,
            ),
            stray in proptest::option::of((0usize..60, 0x80u8..=0xff)),
        ) {
            // Objects of string members, some strings with a byte that is
            // not UTF-8 in them (read by one type, skipped by the other),
            // and sometimes such a byte anywhere.
            let mut bytes = b"{".to_vec();
            for (index, (name, value, bad)) in members.iter().enumerate() {
                if index > 0 {
                    bytes.push(b',');
                }
                bytes.extend_from_slice(format!("\"{name}\":\"").as_bytes());
                let mut value = value.clone().into_bytes();
                if let Some((at, byte)) = bad {
                    value.insert((*at).min(value.len()), *byte);
                }
                bytes.extend_from_slice(&value);
                bytes.push(b'"');
            }
            bytes.push(b'}');
            if let Some((at, byte)) = stray {
                bytes.insert(at.min(bytes.len()), byte);
            }
            #[derive(Debug, PartialEq, serde::Deserialize)]
            struct OnlyA {
                a: Option<String>,
            }
            let ours = json_from_bytes::<serde_json::Value>(&bytes).ok();
            prop_assert_eq!(ours, serde_json::from_slice::<serde_json::Value>(&bytes).ok());
            let ours = json_from_bytes::<OnlyA>(&bytes).ok();
            prop_assert_eq!(ours, serde_json::from_slice::<OnlyA>(&bytes).ok());
        }

    }
}
