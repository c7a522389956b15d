//! Usage and stop reasons, each API's in the other's words. Money is
//! charged from the usage, so it is carried exactly or not at all: a usage
//! that cannot be read (a count missing, negative or fractional, cached
//! tokens past the prompt) comes out missing, never as a smaller number.

use serde_json::{Map, Value, json};

/// Token counts both APIs can say, in OpenAI's convention: `prompt_tokens`
/// includes the tokens read from and written to the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Tokens {
    pub(super) prompt: u64,
    pub(super) completion: u64,
    pub(super) cache_read: u64,
    pub(super) cache_write: u64,
}

impl Tokens {
    /// A chat `usage` object: `prompt_tokens` and `completion_tokens`
    /// whole numbers, `prompt_tokens_details.cached_tokens` and
    /// `…cache_write_tokens` (absent or null: 0) within the prompt.
    pub(super) fn from_chat(usage: &Value) -> Option<Tokens> {
        let usage = usage.as_object()?;
        let prompt = usage.get("prompt_tokens")?.as_u64()?;
        let completion = usage.get("completion_tokens")?.as_u64()?;
        let detail = |name: &str| match usage.get("prompt_tokens_details") {
            None | Some(Value::Null) => Some(0),
            Some(Value::Object(details)) => match details.get(name) {
                None | Some(Value::Null) => Some(0),
                Some(count) => count.as_u64(),
            },
            Some(_) => None,
        };
        let cache_read = detail("cached_tokens")?;
        let cache_write = detail("cache_write_tokens")?;
        if cache_read.checked_add(cache_write)? > prompt {
            return None;
        }
        Some(Tokens {
            prompt,
            completion,
            cache_read,
            cache_write,
        })
    }

    /// The usage in Anthropic's words: `input_tokens` without the cache's.
    pub(super) fn to_messages(self) -> Value {
        json!({
            "input_tokens": self.prompt - self.cache_read - self.cache_write,
            "cache_read_input_tokens": self.cache_read,
            "cache_creation_input_tokens": self.cache_write,
            "output_tokens": self.completion,
        })
    }

    /// The usage in chat's words (`cache_write_tokens` only when there
    /// were writes, as OpenRouter says them).
    pub(super) fn to_chat(self) -> Value {
        let mut details = Map::new();
        details.insert("cached_tokens".into(), self.cache_read.into());
        if self.cache_write > 0 {
            details.insert("cache_write_tokens".into(), self.cache_write.into());
        }
        json!({
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt.saturating_add(self.completion),
            "prompt_tokens_details": details,
        })
    }
}

/// A chat `usage` object in the Responses API's words: `input_tokens`
/// with the cache in it (`input_tokens_details.cached_tokens`, and
/// `cache_write_tokens` when there were writes, which the gateway's reader
/// takes as chat's), `output_tokens` with the reasoning in it
/// (`output_tokens_details.reasoning_tokens`), and chat's `cost` as sent.
/// `None` when the usage cannot be read ([`Tokens::from_chat`], or a
/// reasoning count that is not a whole number or passes the completion).
pub(super) fn responses_usage_of_chat(usage: &Value) -> Option<Value> {
    let tokens = Tokens::from_chat(usage)?;
    let reasoning = match usage.get("completion_tokens_details") {
        None | Some(Value::Null) => 0,
        Some(Value::Object(details)) => match details.get("reasoning_tokens") {
            None | Some(Value::Null) => 0,
            Some(count) => count.as_u64()?,
        },
        Some(_) => return None,
    };
    if reasoning > tokens.completion {
        return None;
    }
    let mut input_details = Map::new();
    input_details.insert("cached_tokens".into(), tokens.cache_read.into());
    if tokens.cache_write > 0 {
        input_details.insert("cache_write_tokens".into(), tokens.cache_write.into());
    }
    let mut out = Map::new();
    out.insert("input_tokens".into(), tokens.prompt.into());
    out.insert("input_tokens_details".into(), Value::Object(input_details));
    out.insert("output_tokens".into(), tokens.completion.into());
    out.insert(
        "output_tokens_details".into(),
        json!({"reasoning_tokens": reasoning}),
    );
    out.insert(
        "total_tokens".into(),
        tokens.prompt.saturating_add(tokens.completion).into(),
    );
    if let Some(cost) = usage.get("cost").filter(|cost| !cost.is_null()) {
        out.insert("cost".into(), cost.clone());
    }
    Some(Value::Object(out))
}

/// A chat `finish_reason` as a Responses answer's `status` and, when
/// incomplete, its `incomplete_details.reason`.
pub(super) fn responses_status_of(
    finish_reason: Option<&str>,
) -> (&'static str, Option<&'static str>) {
    match finish_reason {
        Some("length") => ("incomplete", Some("max_output_tokens")),
        Some("content_filter") => ("incomplete", Some("content_filter")),
        _ => ("completed", None),
    }
}

/// An Anthropic usage as its events report it: each field the last value
/// seen (values are cumulative; a stream may give input only at its end).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct MessagesTokens {
    input: Option<u64>,
    output: Option<u64>,
    cache_read: Option<u64>,
    cache_creation: Option<u64>,
    creation_5m: Option<u64>,
    creation_1h: Option<u64>,
    malformed: bool,
}

impl MessagesTokens {
    /// Takes in one `usage` object, field by field.
    pub(super) fn merge(&mut self, usage: &Value) {
        let Some(usage) = usage.as_object() else {
            if !usage.is_null() {
                self.malformed = true;
            }
            return;
        };
        let mut take = |slot: &mut Option<u64>, value: Option<&Value>| match value {
            None | Some(Value::Null) => {}
            Some(value) => match value.as_u64() {
                Some(count) => *slot = Some(count),
                None => self.malformed = true,
            },
        };
        take(&mut self.input, usage.get("input_tokens"));
        take(&mut self.output, usage.get("output_tokens"));
        take(&mut self.cache_read, usage.get("cache_read_input_tokens"));
        take(
            &mut self.cache_creation,
            usage.get("cache_creation_input_tokens"),
        );
        let split = usage.get("cache_creation");
        take(
            &mut self.creation_5m,
            split.and_then(|split| split.get("ephemeral_5m_input_tokens")),
        );
        take(
            &mut self.creation_1h,
            split.and_then(|split| split.get("ephemeral_1h_input_tokens")),
        );
    }

    /// The usage, once both counts are known and every value was a whole
    /// number.
    pub(super) fn tokens(&self) -> Option<Tokens> {
        if self.malformed {
            return None;
        }
        let cache_read = self.cache_read.unwrap_or(0);
        let cache_write = match self.cache_creation {
            Some(total) => total,
            None => self
                .creation_5m
                .unwrap_or(0)
                .checked_add(self.creation_1h.unwrap_or(0))?,
        };
        Some(Tokens {
            prompt: self
                .input?
                .checked_add(cache_read)?
                .checked_add(cache_write)?,
            completion: self.output?,
            cache_read,
            cache_write,
        })
    }
}

/// A chat `finish_reason` as a Messages `stop_reason`.
pub(super) fn stop_reason_of(finish_reason: &str) -> &'static str {
    match finish_reason {
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        _ => "end_turn",
    }
}

/// A Messages `stop_reason` as a chat `finish_reason`.
pub(super) fn finish_reason_of(stop_reason: &str) -> &'static str {
    match stop_reason {
        "max_tokens" | "model_context_window_exceeded" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        _ => "stop",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_usage_becomes_anthropic_usage_without_the_cache_in_the_input() {
        let tokens = Tokens::from_chat(&json!({
            "prompt_tokens": 1000, "completion_tokens": 300, "total_tokens": 1300,
            "prompt_tokens_details": {"cached_tokens": 600, "cache_write_tokens": 150},
            "completion_tokens_details": {"reasoning_tokens": 200},
        }))
        .unwrap();
        // 1000 - 600 read - 150 written; reasoning stays in the output.
        assert_eq!(
            tokens.to_messages(),
            json!({"input_tokens": 250, "cache_read_input_tokens": 600,
                   "cache_creation_input_tokens": 150, "output_tokens": 300})
        );
        let plain =
            Tokens::from_chat(&json!({"prompt_tokens": 12, "completion_tokens": 3})).unwrap();
        assert_eq!(plain.to_messages()["input_tokens"], 12);
        assert_eq!(plain.to_messages()["cache_read_input_tokens"], 0);
    }

    #[test]
    fn an_unreadable_chat_usage_is_none() {
        for usage in [
            json!(null),
            json!({"completion_tokens": 3}),
            json!({"prompt_tokens": 12}),
            json!({"prompt_tokens": -1, "completion_tokens": 3}),
            json!({"prompt_tokens": 12.5, "completion_tokens": 3}),
            json!({"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 11}}),
            json!({"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 6, "cache_write_tokens": 5}}),
            json!({"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": "4"}}),
            json!({"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": 4}),
        ] {
            assert_eq!(Tokens::from_chat(&usage), None, "{usage}");
        }
    }

    #[test]
    fn anthropic_usage_becomes_chat_usage_with_the_cache_in_the_prompt() {
        let mut usage = MessagesTokens::default();
        usage.merge(&json!({"input_tokens": 12, "output_tokens": 1,
            "cache_read_input_tokens": 20000, "cache_creation_input_tokens": 3000,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 3000}}));
        usage.merge(&json!({"output_tokens": 95}));
        let tokens = usage.tokens().unwrap();
        // 12 + 20000 + 3000
        assert_eq!(
            tokens.to_chat(),
            json!({"prompt_tokens": 23012, "completion_tokens": 95, "total_tokens": 23107,
                   "prompt_tokens_details": {"cached_tokens": 20000, "cache_write_tokens": 3000}})
        );
        let mut split_only = MessagesTokens::default();
        split_only.merge(&json!({"input_tokens": 5, "output_tokens": 2,
            "cache_creation": {"ephemeral_5m_input_tokens": 7, "ephemeral_1h_input_tokens": 9}}));
        assert_eq!(split_only.tokens().unwrap().prompt, 21);
    }

    #[test]
    fn an_unreadable_anthropic_usage_is_none() {
        let read = |values: &[Value]| {
            let mut usage = MessagesTokens::default();
            for value in values {
                usage.merge(value);
            }
            usage.tokens()
        };
        assert_eq!(read(&[]), None);
        assert_eq!(read(&[json!({"output_tokens": 5})]), None, "no input yet");
        assert_eq!(read(&[json!({"input_tokens": 5})]), None, "no output yet");
        assert_eq!(
            read(&[json!({"input_tokens": -5, "output_tokens": 2})]),
            None
        );
        assert_eq!(
            read(&[json!({"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 1.5})]),
            None
        );
        assert_eq!(
            read(&[
                json!({"input_tokens": u64::MAX, "output_tokens": 2, "cache_read_input_tokens": 1})
            ]),
            None,
            "past u64: not a smaller number"
        );
        assert_eq!(read(&[json!("usage")]), None);
    }

    #[test]
    fn chat_usage_becomes_responses_usage_as_the_gateway_reads_it() {
        let usage = json!({
            "prompt_tokens": 20000, "completion_tokens": 640, "total_tokens": 20640, "cost": 0.0125,
            "prompt_tokens_details": {"cached_tokens": 19456, "cache_write_tokens": 300},
            "completion_tokens_details": {"reasoning_tokens": 512},
        });
        let responses = responses_usage_of_chat(&usage).unwrap();
        assert_eq!(
            responses,
            json!({"input_tokens": 20000,
                   "input_tokens_details": {"cached_tokens": 19456, "cache_write_tokens": 300},
                   "output_tokens": 640, "output_tokens_details": {"reasoning_tokens": 512},
                   "total_tokens": 20640, "cost": 0.0125})
        );
        // The gateway charges the Responses reading exactly as the chat one.
        let mut read = crate::credit::ResponsesUsage::default();
        read.merge_response(&json!({"usage": responses}));
        assert_eq!(
            read.usage(),
            crate::credit::Usage::from_response(&json!({"usage": usage}))
        );
        let plain =
            responses_usage_of_chat(&json!({"prompt_tokens": 12, "completion_tokens": 3})).unwrap();
        assert_eq!(
            plain,
            json!({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
                   "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0},
                   "total_tokens": 15})
        );
    }

    #[test]
    fn an_unreadable_chat_usage_has_no_responses_usage() {
        for usage in [
            json!(null),
            json!({"prompt_tokens": 12}),
            json!({"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 11}}),
            json!({"prompt_tokens": 10, "completion_tokens": 3, "completion_tokens_details": {"reasoning_tokens": 4}}),
            json!({"prompt_tokens": 10, "completion_tokens": 3, "completion_tokens_details": {"reasoning_tokens": 1.5}}),
            json!({"prompt_tokens": 10, "completion_tokens": 3, "completion_tokens_details": 2}),
        ] {
            assert_eq!(responses_usage_of_chat(&usage), None, "{usage}");
        }
    }

    #[test]
    fn stop_reasons_map_both_ways() {
        for (finish, stop) in [
            ("stop", "end_turn"),
            ("length", "max_tokens"),
            ("tool_calls", "tool_use"),
            ("content_filter", "refusal"),
        ] {
            assert_eq!(stop_reason_of(finish), stop);
            assert_eq!(finish_reason_of(stop), finish);
        }
        assert_eq!(finish_reason_of("stop_sequence"), "stop");
        assert_eq!(finish_reason_of("pause_turn"), "stop");
    }
}
