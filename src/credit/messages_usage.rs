//! [`MessagesUsage`]: the usage of an Anthropic Messages response.

use serde_json::{Map, Value};

use super::Usage;

/// The usage of an Anthropic Messages response, read the way Anthropic
/// reports it: the fields reported so far, each the last value seen.
///
/// A stream reports usage in `message_start` (under `message.usage`) and
/// again in each `message_delta` (under `usage`). Every value is
/// cumulative, and any field may come in any of those events (a server
/// tool sends several deltas; some upstreams give the input only in the
/// last one): the fields are merged one by one, the last value of each
/// winning, never summed. A non-streamed answer has one `usage`.
///
/// Anthropic counts `input_tokens` without the tokens read from or written
/// to the cache; the [`Usage`] this gives counts them in, as OpenAI's
/// `prompt_tokens` does, with the cache reads and writes (split into
/// five-minute and one-hour writes when `cache_creation` says) apart.
/// `output_tokens` includes any thinking.
///
/// ```
/// use modelgate::credit::MessagesUsage;
/// use serde_json::json;
///
/// let mut usage = MessagesUsage::default();
/// usage.merge_event(&json!({"type": "message_start", "message": {"usage": {
///     "input_tokens": 0, "output_tokens": 1, "cache_read_input_tokens": 900}}}));
/// usage.merge_event(&json!({"type": "message_delta", "usage": {
///     "input_tokens": 120, "output_tokens": 40, "server_tool_use": {"web_search_requests": 2}}}));
/// let usage = usage.usage().unwrap();
/// assert_eq!((usage.prompt_tokens, usage.completion_tokens), (1020, 40));
/// assert_eq!((usage.cache_read_tokens, usage.web_search_requests), (900, 2));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MessagesUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_write_5m_tokens: Option<u64>,
    cache_write_1h_tokens: Option<u64>,
    web_search_requests: Option<u64>,
    /// A count that was not a whole number: the usage cannot be trusted,
    /// and is none (the request is then charged as one without usage).
    malformed: bool,
}

impl MessagesUsage {
    /// Takes in one stream event's data: `message_start`'s
    /// `message.usage`, `message_delta`'s `usage`; other events carry none.
    pub fn merge_event(&mut self, data: &Value) {
        let usage = match data.get("type").and_then(Value::as_str) {
            Some("message_start") => data.get("message").and_then(|message| message.get("usage")),
            Some("message_delta") => data.get("usage"),
            _ => None,
        };
        if let Some(Value::Object(usage)) = usage {
            self.merge_usage(usage);
        }
    }

    /// Takes in a whole answer: its `usage`.
    pub fn merge_message(&mut self, message: &Value) {
        if let Some(Value::Object(usage)) = message.get("usage") {
            self.merge_usage(usage);
        }
    }

    /// Takes in one `usage` object, field by field: each present (not
    /// null) field replaces the value before it.
    pub fn merge_usage(&mut self, usage: &Map<String, Value>) {
        let mut take = |slot: &mut Option<u64>, value: Option<&Value>| match value {
            None | Some(Value::Null) => {}
            Some(value) => match value.as_u64() {
                Some(count) => *slot = Some(count),
                None => self.malformed = true,
            },
        };
        take(&mut self.input_tokens, usage.get("input_tokens"));
        take(&mut self.output_tokens, usage.get("output_tokens"));
        take(
            &mut self.cache_read_input_tokens,
            usage.get("cache_read_input_tokens"),
        );
        take(
            &mut self.cache_creation_input_tokens,
            usage.get("cache_creation_input_tokens"),
        );
        let creation = usage.get("cache_creation");
        take(
            &mut self.cache_write_5m_tokens,
            creation.and_then(|split| split.get("ephemeral_5m_input_tokens")),
        );
        take(
            &mut self.cache_write_1h_tokens,
            creation.and_then(|split| split.get("ephemeral_1h_input_tokens")),
        );
        take(
            &mut self.web_search_requests,
            usage
                .get("server_tool_use")
                .and_then(|tools| tools.get("web_search_requests")),
        );
    }

    /// The usage, in OpenAI's convention (see [`MessagesUsage`]);
    /// `None` before any token count, or after a malformed one.
    pub fn usage(&self) -> Option<Usage> {
        if self.malformed || (self.input_tokens.is_none() && self.output_tokens.is_none()) {
            return None;
        }
        let split_1h = self.cache_write_1h_tokens.unwrap_or(0);
        let split_5m = self.cache_write_5m_tokens.unwrap_or(0);
        // The total when given; else what the split adds up to. Written
        // tokens the split leaves out are five-minute writes.
        let written = self
            .cache_creation_input_tokens
            .unwrap_or(split_5m.saturating_add(split_1h));
        let cache_write_1h_tokens = split_1h.min(written);
        let cache_read_tokens = self.cache_read_input_tokens.unwrap_or(0);
        Some(Usage {
            prompt_tokens: self
                .input_tokens
                .unwrap_or(0)
                .saturating_add(cache_read_tokens)
                .saturating_add(written),
            completion_tokens: self.output_tokens.unwrap_or(0),
            cost_nanos: None,
            cache_read_tokens,
            cache_write_tokens: written - cache_write_1h_tokens,
            cache_write_1h_tokens,
            reasoning_tokens: 0,
            web_search_requests: self.web_search_requests.unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn merged(events: &[Value]) -> Option<Usage> {
        let mut usage = MessagesUsage::default();
        for event in events {
            usage.merge_event(event);
        }
        usage.usage()
    }

    #[test]
    fn a_claude_code_stream_counts_its_cache_and_takes_the_last_values() {
        let start = json!({"type": "message_start", "message": {"id": "msg_1", "usage": {
            "input_tokens": 12, "output_tokens": 1,
            "cache_creation_input_tokens": 3000, "cache_read_input_tokens": 20000,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 3000}}}});
        let delta = |output: u64| {
            json!({"type": "message_delta", "delta": {"stop_reason": null},
                   "usage": {"output_tokens": output}})
        };
        let usage = merged(&[start, json!({"type": "ping"}), delta(40), delta(95)]).unwrap();
        assert_eq!(
            usage,
            Usage {
                prompt_tokens: 23_012,
                completion_tokens: 95,
                cache_read_tokens: 20_000,
                cache_write_1h_tokens: 3000,
                ..Usage::default()
            }
        );
    }

    #[test]
    fn input_given_only_at_the_end_is_counted() {
        // Some upstreams send `input_tokens: 0` first and the count last.
        let usage = merged(&[
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 0, "output_tokens": 0}}}),
            json!({"type": "message_delta", "usage": {"input_tokens": 5400, "output_tokens": 12,
                   "cache_read_input_tokens": 100, "server_tool_use": {"web_search_requests": 3}}}),
        ])
        .unwrap();
        assert_eq!(usage.prompt_tokens, 5500);
        assert_eq!(usage.web_search_requests, 3);
    }

    #[test]
    fn writes_without_a_split_are_five_minute_writes() {
        let mut usage = MessagesUsage::default();
        usage.merge_message(&json!({"usage": {"input_tokens": 10, "output_tokens": 2,
            "cache_creation_input_tokens": 700}}));
        let usage = usage.usage().unwrap();
        assert_eq!(usage.prompt_tokens, 710);
        assert_eq!(
            (usage.cache_write_tokens, usage.cache_write_1h_tokens),
            (700, 0)
        );
        // A split that says more than the total is held to it.
        let mut over = MessagesUsage::default();
        over.merge_message(
            &json!({"usage": {"input_tokens": 1, "cache_creation_input_tokens": 50,
            "cache_creation": {"ephemeral_1h_input_tokens": 80}}}),
        );
        let over = over.usage().unwrap();
        assert_eq!(
            (over.cache_write_tokens, over.cache_write_1h_tokens),
            (0, 50)
        );
    }

    #[test]
    fn no_counts_or_a_malformed_one_is_no_usage() {
        assert_eq!(merged(&[json!({"type": "message_stop"})]), None);
        assert_eq!(
            merged(&[json!({"type": "message_delta", "usage": {"output_tokens": -1}})]),
            None
        );
        assert_eq!(
            merged(&[
                json!({"type": "message_start", "message": {"usage": {"input_tokens": 5}}}),
                json!({"type": "message_delta", "usage": {"output_tokens": 2.5}}),
            ]),
            None
        );
        // A null is no value: the one before stands.
        assert_eq!(
            merged(&[
                json!({"type": "message_start", "message": {"usage": {"input_tokens": 5, "output_tokens": 1}}}),
                json!({"type": "message_delta", "usage": {"input_tokens": null, "output_tokens": 9}}),
            ])
            .map(|usage| (usage.prompt_tokens, usage.completion_tokens)),
            Some((5, 9))
        );
    }

    proptest! {
        /// However the fields are spread over the events, the merge is
        /// each field's last value.
        #[test]
        fn the_merge_is_each_fields_last_value(
            events in proptest::collection::vec(
                proptest::collection::vec((0usize..4, 0u64..1_000_000), 0..5), 1..6),
        ) {
            let names = ["input_tokens", "output_tokens", "cache_read_input_tokens",
                         "cache_creation_input_tokens"];
            let mut last = [None; 4];
            let mut usage = MessagesUsage::default();
            for (index, fields) in events.iter().enumerate() {
                let mut object = Map::new();
                for (field, count) in fields {
                    object.insert(names[*field].to_owned(), Value::from(*count));
                }
                for (field, count) in fields {
                    // In an object a repeated name keeps its last value too.
                    last[*field] = object.get(names[*field]).and_then(Value::as_u64).or(Some(*count));
                }
                let event = if index == 0 {
                    json!({"type": "message_start", "message": {"usage": object}})
                } else {
                    json!({"type": "message_delta", "usage": object})
                };
                usage.merge_event(&event);
            }
            let read = usage.usage();
            if last[0].is_none() && last[1].is_none() {
                prop_assert_eq!(read, None);
            } else {
                let read = read.unwrap();
                let [input, output, cache_read, written] = last.map(|value| value.unwrap_or(0));
                prop_assert_eq!(read.prompt_tokens, input + cache_read + written);
                prop_assert_eq!(read.completion_tokens, output);
                prop_assert_eq!(read.cache_read_tokens, cache_read);
                prop_assert_eq!(read.cache_write_tokens, written);
            }
        }

        #[test]
        fn no_value_panics_and_details_stay_within_the_prompt(data in any_json()) {
            let mut usage = MessagesUsage::default();
            usage.merge_event(&data);
            usage.merge_message(&data);
            if let Some(read) = usage.usage() {
                prop_assert!(read.cache_read_tokens + read.cache_write_tokens + read.cache_write_1h_tokens
                    <= read.prompt_tokens);
            }
        }
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<u32>().prop_map(Value::from),
            (-1000i64..0).prop_map(Value::from),
            Just(Value::from(0.5)),
            Just(Value::from("message_start")),
            Just(Value::from("message_delta")),
            "[a-z_]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            let names = prop_oneof![
                Just("type".to_owned()),
                Just("message".to_owned()),
                Just("usage".to_owned()),
                Just("input_tokens".to_owned()),
                Just("output_tokens".to_owned()),
                Just("cache_read_input_tokens".to_owned()),
                Just("cache_creation_input_tokens".to_owned()),
                Just("cache_creation".to_owned()),
                Just("ephemeral_1h_input_tokens".to_owned()),
                Just("message_start".to_owned()),
                Just("message_delta".to_owned()),
            ];
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map(names, inner, 0..5)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }
}
