//! The alert body GitHub sends ([`parse_alert`]) and the answer it expects
//! back ([`alert_answer`]).

use std::fmt;

use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::json_input::{JsonBodyError, json_error_reason, json_type, top_level_fields};

/// Most tokens read from one alert; a longer alert is refused whole.
pub const MAX_TOKENS_PER_ALERT: usize = 1000;

/// Longest `token` accepted, in bytes.
pub const MAX_TOKEN_BYTES: usize = 1024;

/// Longest `type` accepted, in bytes.
pub const MAX_TOKEN_TYPE_BYTES: usize = 128;

/// Longest `url` accepted, in bytes.
pub const MAX_URL_BYTES: usize = 2048;

/// Longest `source` accepted, in bytes.
pub const MAX_SOURCE_BYTES: usize = 64;

/// Longest field name an error message repeats; a longer one is cut.
const MAX_NAMED_FIELD_CHARS: usize = 64;

/// One token GitHub reports: the alert body is a JSON array of these.
///
/// `Debug` prints the token's length, never the token.
#[derive(Clone, PartialEq, Eq)]
pub struct ReportedToken {
    /// The token as found, exactly: 1 to [`MAX_TOKEN_BYTES`] bytes.
    pub token: String,
    /// The secret type GitHub matched (JSON field `type`): 1 to
    /// [`MAX_TOKEN_TYPE_BYTES`] bytes.
    pub token_type: String,
    /// Where GitHub found it (JSON `url`), at most [`MAX_URL_BYTES`] bytes.
    pub url: Option<String>,
    /// What kind of place that is (JSON `source`: `content`, `commit`, …),
    /// at most [`MAX_SOURCE_BYTES`] bytes.
    pub source: Option<String>,
}

impl ReportedToken {
    /// The lowercase hex SHA-256 of the token's bytes: how the answer (and
    /// any log) names the token without repeating it.
    pub fn token_hash(&self) -> String {
        hex::encode(Sha256::digest(self.token.as_bytes()))
    }
}

impl fmt::Debug for ReportedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReportedToken")
            .field("token", &format_args!("<{} bytes>", self.token.len()))
            .field("token_type", &self.token_type)
            .field("url", &self.url)
            .field("source", &self.source)
            .finish()
    }
}

/// Why an alert body was refused. Items are counted from 0, as in the
/// array; no message repeats a token.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum AlertError {
    /// The body is not JSON: what is wrong and where.
    #[error("the alert is not valid JSON: {0}")]
    NotJson(String),
    /// The body is JSON but not an array: what it is instead.
    #[error("the alert must be a JSON array of reported tokens, not {0}")]
    NotAnArray(&'static str),
    /// The array is empty.
    #[error("the alert lists no tokens")]
    NoTokens,
    /// More items than [`MAX_TOKENS_PER_ALERT`]: how many.
    #[error("the alert lists {0} tokens; at most {MAX_TOKENS_PER_ALERT} are accepted in one alert")]
    TooManyTokens(usize),
    /// An item is not an object.
    #[error("item {index} must be an object with `token` and `type`, not {found}")]
    NotAnObject {
        /// The item's place in the array, from 0.
        index: usize,
        /// What the item is instead (`a string`, …).
        found: &'static str,
    },
    /// An item nests deeper than serde_json's recursion limit.
    #[error("item {index} cannot be read: {reason}")]
    Unreadable {
        /// The item's place in the array, from 0.
        index: usize,
        /// What serde_json said.
        reason: String,
    },
    /// An item has a field twice: which one would count is ambiguous.
    #[error("item {index}: the field `{field}` appears twice; each field may appear once")]
    DuplicateField {
        /// The item's place in the array, from 0.
        index: usize,
        /// The field's name (cut after 64 characters).
        field: String,
    },
    /// `token` or `type` is absent.
    #[error("item {index}: `{field}` is required")]
    MissingField {
        /// The item's place in the array, from 0.
        index: usize,
        /// `token` or `type`.
        field: &'static str,
    },
    /// A field has the wrong JSON type.
    #[error("item {index}: `{field}` must be {expected}, not {found}")]
    WrongType {
        /// The item's place in the array, from 0.
        index: usize,
        /// `token`, `type`, `url` or `source`.
        field: &'static str,
        /// `a string`, or `a string or null` for the optional fields.
        expected: &'static str,
        /// What it is instead.
        found: &'static str,
    },
    /// `token` or `type` is the empty string.
    #[error("item {index}: `{field}` must not be empty")]
    EmptyField {
        /// The item's place in the array, from 0.
        index: usize,
        /// `token` or `type`.
        field: &'static str,
    },
    /// A field is longer than its bound.
    #[error("item {index}: `{field}` is {length} bytes long; at most {max} are accepted")]
    TooLong {
        /// The item's place in the array, from 0.
        index: usize,
        /// `token`, `type`, `url` or `source`.
        field: &'static str,
        /// Its length in bytes (of UTF-8, after JSON unescaping).
        length: usize,
        /// The bound.
        max: usize,
    },
}

/// Reads an alert body: a JSON array of 1 to [`MAX_TOKENS_PER_ALERT`]
/// objects, each with the strings `token` and `type` and optionally `url`
/// and `source` (strings or null). Fields GitHub may add later are ignored;
/// a field given twice in one item is refused. The tokens come back in the
/// alert's order.
pub fn parse_alert(body: &[u8]) -> Result<Vec<ReportedToken>, AlertError> {
    // One scan for validity first, without building values and without a
    // depth limit (serde_json skips values iteratively), so a body that is
    // not JSON is named as such, with its position, whatever its shape.
    let raw: &RawValue = serde_json::from_slice(body)
        .map_err(|error| AlertError::NotJson(json_error_reason(&error)))?;
    let text = raw.get();
    if !text.starts_with('[') {
        return Err(AlertError::NotAnArray(kind_of(text)));
    }
    let Items { items, count } = serde_json::from_str(text)
        .map_err(|error| AlertError::NotJson(json_error_reason(&error)))?;
    if count == 0 {
        return Err(AlertError::NoTokens);
    }
    if count > MAX_TOKENS_PER_ALERT {
        return Err(AlertError::TooManyTokens(count));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| parse_item(index, item))
        .collect()
}

/// What a valid JSON text is, from its first byte.
fn kind_of(text: &str) -> &'static str {
    match text.as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        Some(b'[') => "an array",
        _ => "a number",
    }
}

/// The array's first [`MAX_TOKENS_PER_ALERT`] items, unparsed, and how many
/// it has in all: items past the limit are only counted, never kept.
struct Items<'a> {
    items: Vec<&'a RawValue>,
    count: usize,
}

impl<'de> Deserialize<'de> for Items<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ItemsVisitor;

        impl<'de> Visitor<'de> for ItemsVisitor {
            type Value = Items<'de>;

            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a JSON array")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Items<'de>, A::Error> {
                let mut items = Vec::new();
                while items.len() < MAX_TOKENS_PER_ALERT {
                    match seq.next_element::<&'de RawValue>()? {
                        Some(item) => items.push(item),
                        None => {
                            let count = items.len();
                            return Ok(Items { items, count });
                        }
                    }
                }
                let mut count = items.len();
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    count += 1;
                }
                Ok(Items { items, count })
            }
        }

        deserializer.deserialize_seq(ItemsVisitor)
    }
}

fn parse_item(index: usize, item: &RawValue) -> Result<ReportedToken, AlertError> {
    let mut fields = top_level_fields(item.get().as_bytes()).map_err(|error| match error {
        JsonBodyError::NotJson(reason) => AlertError::Unreadable { index, reason },
        JsonBodyError::NotObject(found) => AlertError::NotAnObject { index, found },
        JsonBodyError::Duplicate(field) => AlertError::DuplicateField {
            index,
            field: cut(&field),
        },
    })?;
    Ok(ReportedToken {
        token: required(&mut fields, index, "token", MAX_TOKEN_BYTES)?,
        token_type: required(&mut fields, index, "type", MAX_TOKEN_TYPE_BYTES)?,
        url: optional(&mut fields, index, "url", MAX_URL_BYTES)?,
        source: optional(&mut fields, index, "source", MAX_SOURCE_BYTES)?,
    })
}

fn required(
    fields: &mut Map<String, Value>,
    index: usize,
    field: &'static str,
    max: usize,
) -> Result<String, AlertError> {
    match fields.remove(field) {
        None => Err(AlertError::MissingField { index, field }),
        Some(Value::String(text)) if text.is_empty() => {
            Err(AlertError::EmptyField { index, field })
        }
        Some(Value::String(text)) => bounded(index, field, text, max),
        Some(other) => Err(AlertError::WrongType {
            index,
            field,
            expected: "a string",
            found: json_type(&other),
        }),
    }
}

fn optional(
    fields: &mut Map<String, Value>,
    index: usize,
    field: &'static str,
    max: usize,
) -> Result<Option<String>, AlertError> {
    match fields.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => bounded(index, field, text, max).map(Some),
        Some(other) => Err(AlertError::WrongType {
            index,
            field,
            expected: "a string or null",
            found: json_type(&other),
        }),
    }
}

fn bounded(
    index: usize,
    field: &'static str,
    text: String,
    max: usize,
) -> Result<String, AlertError> {
    if text.len() > max {
        return Err(AlertError::TooLong {
            index,
            field,
            length: text.len(),
            max,
        });
    }
    Ok(text)
}

/// A field name as a message repeats it: any name an alert sends, so cut
/// to keep the message short.
fn cut(field: &str) -> String {
    match field.char_indices().nth(MAX_NAMED_FIELD_CHARS) {
        Some((end, _)) => format!("{}…", &field[..end]),
        None => field.to_owned(),
    }
}

/// What the service provider found each reported token to be: GitHub's
/// feedback labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeakLabel {
    /// A real credential (here: a live key, now revoked).
    TruePositive,
    /// Not a credential of ours.
    FalsePositive,
}

impl LeakLabel {
    /// The label as GitHub spells it: `true_positive` or `false_positive`.
    pub fn as_str(self) -> &'static str {
        match self {
            LeakLabel::TruePositive => "true_positive",
            LeakLabel::FalsePositive => "false_positive",
        }
    }
}

/// The answer GitHub expects to an alert: a JSON array with one entry per
/// reported token, in order, each
/// `{"token_hash": "<lowercase hex SHA-256 of the token>", "token_type": "<type>", "label": "true_positive" | "false_positive"}`.
/// The token is named by its hash, so the answer never repeats a secret.
///
/// `labels[i]` labels `tokens[i]`; pass one label per token (an unmatched
/// tail of either slice is left out).
pub fn alert_answer(tokens: &[ReportedToken], labels: &[LeakLabel]) -> Vec<u8> {
    debug_assert_eq!(tokens.len(), labels.len(), "one label per reported token");
    let entries = tokens
        .iter()
        .zip(labels)
        .map(|(token, label)| {
            let mut entry = Map::new();
            entry.insert("token_hash".into(), Value::String(token.token_hash()));
            entry.insert("token_type".into(), Value::String(token.token_type.clone()));
            entry.insert("label".into(), Value::String(label.as_str().into()));
            Value::Object(entry)
        })
        .collect();
    // Display of a `Value` cannot fail, unlike `to_vec`.
    Value::Array(entries).to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn token(token: &str, token_type: &str) -> ReportedToken {
        ReportedToken {
            token: token.into(),
            token_type: token_type.into(),
            url: None,
            source: None,
        }
    }

    fn error(body: &str) -> String {
        parse_alert(body.as_bytes()).unwrap_err().to_string()
    }

    /// Serialises tokens as GitHub would send them.
    fn alert_json(tokens: &[ReportedToken]) -> Vec<u8> {
        let items: Vec<Value> = tokens
            .iter()
            .map(|token| {
                json!({"token": token.token, "type": token.token_type, "url": token.url, "source": token.source})
            })
            .collect();
        serde_json::to_vec(&items).unwrap()
    }

    #[test]
    fn reads_githubs_alert_in_order_with_optional_fields_and_unknown_ones_ignored() {
        let body = br#"[
            {"token": "mg-v1-abc", "type": "modelgate_key", "url": "https://github.com/o/r/blob/x/f", "source": "content"},
            {"token": "second", "type": "t", "url": null, "source": null, "added_later": {"a": [1, 2]}},
            {"type": "t", "token": "third"}
        ]"#;
        let tokens = parse_alert(body).unwrap();
        assert_eq!(
            tokens,
            vec![
                ReportedToken {
                    token: "mg-v1-abc".into(),
                    token_type: "modelgate_key".into(),
                    url: Some("https://github.com/o/r/blob/x/f".into()),
                    source: Some("content".into()),
                },
                token("second", "t"),
                token("third", "t"),
            ]
        );
        // Escapes are read: the token is the decoded string.
        let tokens = parse_alert(br#"[{"token": "a\"b\u00e9", "type": "t"}]"#).unwrap();
        assert_eq!(tokens[0].token, "a\"bé");
    }

    #[test]
    fn a_body_that_is_not_a_json_array_of_tokens_is_named() {
        assert_eq!(
            error("[{\"token\": "),
            "the alert is not valid JSON: EOF while parsing a value at line 1, column 11"
        );
        assert_eq!(
            error("[1] x"),
            "the alert is not valid JSON: trailing characters at line 1, column 5"
        );
        assert_eq!(
            error(""),
            "the alert is not valid JSON: EOF while parsing a value at line 1, column 0"
        );
        for (body, found) in [
            (r#"{"token": "x", "type": "t"}"#, "an object"),
            (r#" "x""#, "a string"),
            ("-1", "a number"),
            ("2.5", "a number"),
            ("true", "a boolean"),
            ("false", "a boolean"),
            ("null", "null"),
        ] {
            assert_eq!(
                error(body),
                format!("the alert must be a JSON array of reported tokens, not {found}")
            );
        }
        assert_eq!(error("[]"), "the alert lists no tokens");
        assert_eq!(error(" [ ]\n"), "the alert lists no tokens");
        assert_eq!(parse_alert(b"[]"), Err(AlertError::NoTokens));
    }

    #[test]
    fn at_most_max_tokens_per_alert() {
        let tokens: Vec<_> = (0..MAX_TOKENS_PER_ALERT)
            .map(|i| token(&format!("t{i}"), "t"))
            .collect();
        assert_eq!(parse_alert(&alert_json(&tokens)).unwrap(), tokens);
        let mut more = tokens.clone();
        more.push(token("one too many", "t"));
        assert_eq!(
            parse_alert(&alert_json(&more)),
            Err(AlertError::TooManyTokens(1001))
        );
        // Counted, not read: items past the limit need only be JSON.
        let body = format!("[{}]", vec!["[[0]]"; 2500].join(","));
        assert_eq!(
            error(&body),
            "the alert lists 2500 tokens; at most 1000 are accepted in one alert"
        );
    }

    #[test]
    fn each_item_error_names_the_item_and_the_field() {
        let cases = [
            (
                r#"[{"token": "a", "type": "t"}, 1]"#,
                "item 1 must be an object with `token` and `type`, not a number",
            ),
            (
                r#"[[]]"#,
                "item 0 must be an object with `token` and `type`, not an array",
            ),
            (
                r#"[null]"#,
                "item 0 must be an object with `token` and `type`, not null",
            ),
            (r#"[{"type": "t"}]"#, "item 0: `token` is required"),
            (r#"[{"token": "a"}]"#, "item 0: `type` is required"),
            (
                r#"[{"token": 3, "type": "t"}]"#,
                "item 0: `token` must be a string, not a number",
            ),
            (
                r#"[{"token": null, "type": "t"}]"#,
                "item 0: `token` must be a string, not null",
            ),
            (
                r#"[{"token": "a", "type": ["t"]}]"#,
                "item 0: `type` must be a string, not an array",
            ),
            (
                r#"[{"token": "a", "type": "t", "url": 1}]"#,
                "item 0: `url` must be a string or null, not a number",
            ),
            (
                r#"[{"token": "a", "type": "t", "source": {}}]"#,
                "item 0: `source` must be a string or null, not an object",
            ),
            (
                r#"[{"token": "a", "type": "t", "source": true}]"#,
                "item 0: `source` must be a string or null, not a boolean",
            ),
            (
                r#"[{"token": "", "type": "t"}]"#,
                "item 0: `token` must not be empty",
            ),
            (
                r#"[{"token": "a", "type": ""}]"#,
                "item 0: `type` must not be empty",
            ),
            (
                r#"[{"token": "a", "type": "t", "token": "b"}]"#,
                "item 0: the field `token` appears twice; each field may appear once",
            ),
            (
                r#"[{"token": "a", "type": "t", "x": 1, "x": 2}]"#,
                "item 0: the field `x` appears twice; each field may appear once",
            ),
        ];
        for (body, message) in cases {
            assert_eq!(error(body), message, "{body}");
        }
        // The first bad item and, within it, the first bad field.
        assert_eq!(
            error(r#"[{"token": "a", "type": "t"}, {"type": 1}, 5]"#),
            "item 1: `token` is required"
        );
        // A repeated name is cut in the message.
        let long = "k".repeat(100);
        let body = format!(r#"[{{"token": "a", "type": "t", "{long}": 1, "{long}": 2}}]"#);
        assert_eq!(
            parse_alert(body.as_bytes()),
            Err(AlertError::DuplicateField {
                index: 0,
                field: format!("{}…", "k".repeat(64))
            })
        );
    }

    #[test]
    fn an_item_nested_past_serde_jsons_limit_is_refused_not_overflowed() {
        // Deep enough to overflow a stack read recursively.
        let deep = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let body = format!(r#"[{{"token": "a", "type": "t", "x": {}}}]"#, deep(100_000));
        let message = error(&body);
        assert!(
            message
                .starts_with("item 0 cannot be read: recursion limit exceeded at line 1, column "),
            "{message}"
        );
        // Deep past the limit, counted only: still just too many.
        let body = format!("[{}]", vec![deep(200); 1001].join(","));
        assert_eq!(
            parse_alert(body.as_bytes()),
            Err(AlertError::TooManyTokens(1001))
        );
    }

    #[test]
    fn sizes_are_bounded_in_bytes_and_no_message_repeats_the_token() {
        let fits = |field: &str, length: usize| {
            let mut item = json!({"token": "a", "type": "t"});
            item[field] = json!("é".repeat(length / 2) + &"x".repeat(length % 2));
            parse_alert(&serde_json::to_vec(&json!([item])).unwrap())
        };
        for (field, name, max) in [
            ("token", "token", MAX_TOKEN_BYTES),
            ("type", "type", MAX_TOKEN_TYPE_BYTES),
            ("url", "url", MAX_URL_BYTES),
            ("source", "source", MAX_SOURCE_BYTES),
        ] {
            assert!(fits(field, max).is_ok(), "{field} of {max} bytes");
            let refused = fits(field, max + 1).unwrap_err();
            assert_eq!(
                refused.to_string(),
                format!(
                    "item 0: `{name}` is {} bytes long; at most {max} are accepted",
                    max + 1
                )
            );
        }
        let secret = format!("mg-v1-{}", "S".repeat(MAX_TOKEN_BYTES));
        let body = json!([{"token": secret, "type": "t"}]).to_string();
        let refused = parse_alert(body.as_bytes()).unwrap_err();
        assert!(!refused.to_string().contains("SSSS"));
        assert!(!format!("{refused:?}").contains("SSSS"));
    }

    #[test]
    fn debug_prints_the_tokens_length_not_the_token() {
        let reported = ReportedToken {
            token: "mg-v1-secret".into(),
            token_type: "modelgate_key".into(),
            url: Some("https://x".into()),
            source: None,
        };
        let printed = format!("{reported:?}");
        assert!(!printed.contains("secret"), "{printed}");
        assert_eq!(
            printed,
            r#"ReportedToken { token: <12 bytes>, token_type: "modelgate_key", url: Some("https://x"), source: None }"#
        );
    }

    #[test]
    fn the_answer_names_each_token_by_its_sha256_in_order() {
        let tokens = [token("some_token", "some_type"), token("other", "t2")];
        let answer = alert_answer(
            &tokens,
            &[LeakLabel::TruePositive, LeakLabel::FalsePositive],
        );
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(
            answer,
            json!([
                {"token_hash": "9a45520a1213f15016d2d768b5fb3d904492a44ee274b44d4de8803e00fb536a", "token_type": "some_type", "label": "true_positive"},
                {"token_hash": hex::encode(Sha256::digest(b"other")), "token_type": "t2", "label": "false_positive"},
            ])
        );
        assert!(
            !String::from_utf8(alert_answer(&tokens, &[LeakLabel::TruePositive; 2]))
                .unwrap()
                .contains("some_token")
        );
        assert_eq!(alert_answer(&[], &[]), b"[]");
        assert_eq!(
            serde_json::to_value(LeakLabel::FalsePositive).unwrap(),
            json!("false_positive")
        );
        assert_eq!(
            serde_json::from_value::<LeakLabel>(json!("true_positive")).unwrap(),
            LeakLabel::TruePositive
        );
    }

    fn json_leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            ".{0,12}".prop_map(Value::String),
        ]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        json_leaf().prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("token".to_owned()),
                        Just("type".to_owned()),
                        Just("url".to_owned()),
                        Just("source".to_owned()),
                        "[a-z]{1,6}",
                    ],
                    inner,
                    0..6
                )
                .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    /// Items shaped like GitHub's, with every field sometimes missing,
    /// null, of another type or oversized.
    fn alert_like() -> impl Strategy<Value = Value> {
        let field = || {
            prop_oneof![
                4 => ".{1,16}".prop_map(Value::String),
                1 => json_value(),
                1 => (1000usize..1100).prop_map(|n| Value::String("x".repeat(n))),
            ]
        };
        let item = (
            prop::option::of(field()),
            prop::option::of(field()),
            prop::option::of(field()),
            prop::option::of(field()),
        )
            .prop_map(|(token, kind, url, source)| {
                let mut item = Map::new();
                for (name, value) in [
                    ("token", token),
                    ("type", kind),
                    ("url", url),
                    ("source", source),
                ] {
                    if let Some(value) = value {
                        item.insert(name.into(), value);
                    }
                }
                Value::Object(item)
            });
        prop::collection::vec(prop_oneof![8 => item, 1 => json_value()], 0..8)
            .prop_map(Value::Array)
    }

    fn check_accepted(tokens: &[ReportedToken]) {
        assert!((1..=MAX_TOKENS_PER_ALERT).contains(&tokens.len()));
        for token in tokens {
            assert!((1..=MAX_TOKEN_BYTES).contains(&token.token.len()));
            assert!((1..=MAX_TOKEN_TYPE_BYTES).contains(&token.token_type.len()));
            assert!(
                token
                    .url
                    .as_ref()
                    .is_none_or(|url| url.len() <= MAX_URL_BYTES)
            );
            assert!(
                token
                    .source
                    .as_ref()
                    .is_none_or(|source| source.len() <= MAX_SOURCE_BYTES)
            );
        }
        // Written out again as GitHub would, the alert reads the same.
        assert_eq!(parse_alert(&alert_json(tokens)).as_deref(), Ok(tokens));
    }

    proptest! {
        #[test]
        fn any_bytes_give_tokens_or_an_error_never_a_panic(body in prop::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(tokens) = parse_alert(&body) {
                check_accepted(&tokens);
            }
        }

        #[test]
        fn any_json_text_gives_tokens_or_an_error_never_a_panic(body in r#"[\[\]{}",:0-9a-z\\ ]{0,64}"#) {
            if let Ok(tokens) = parse_alert(body.as_bytes()) {
                check_accepted(&tokens);
            }
        }

        #[test]
        fn any_json_value_gives_tokens_or_an_error_and_accepted_ones_round_trip(value in prop_oneof![json_value(), alert_like()]) {
            let body = serde_json::to_vec(&value).unwrap();
            match parse_alert(&body) {
                Ok(tokens) => check_accepted(&tokens),
                Err(error) => prop_assert!(!error.to_string().is_empty()),
            }
        }

        #[test]
        fn tokens_within_bounds_round_trip(
            tokens in prop::collection::vec(
                (".{1,40}", ".{1,20}", prop::option::of(".{0,60}"), prop::option::of("[a-z]{0,16}"))
                    .prop_map(|(token, token_type, url, source)| ReportedToken { token, token_type, url, source }),
                1..20,
            )
        ) {
            prop_assert_eq!(parse_alert(&alert_json(&tokens)), Ok(tokens.clone()));
            let answer: Value = serde_json::from_slice(&alert_answer(&tokens, &vec![LeakLabel::TruePositive; tokens.len()])).unwrap();
            prop_assert_eq!(answer.as_array().map(Vec::len), Some(tokens.len()));
        }
    }
}
