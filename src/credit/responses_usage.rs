//! [`ResponsesUsage`]: the usage of an OpenAI Responses answer.

use serde_json::Value;

use super::Usage;
use super::usage::UsageFields;

/// The usage of a Responses answer: a whole answer's `usage`, or a
/// stream's, which comes once, in its last event (`response.completed`,
/// `response.incomplete` or `response.failed`, under `response.usage`).
///
/// The counts follow OpenAI's convention, which [`Usage`] keeps:
/// `input_tokens` includes the cached ones
/// (`input_tokens_details.cached_tokens`, the cache reads) and
/// `output_tokens` the reasoning ones
/// (`output_tokens_details.reasoning_tokens`). A count that is not a whole
/// number, or a detail past its total, makes the usage none (the request is
/// then charged as one without usage), never a smaller number, as chat's
/// reading does. Web searches are the answer's `web_search_call` output
/// items (or `usage.server_tool_use.web_search_requests` when an upstream
/// says more).
///
/// ```
/// use modelgate::credit::ResponsesUsage;
/// use serde_json::json;
///
/// let mut usage = ResponsesUsage::default();
/// usage.merge_event(&json!({"type": "response.output_text.delta", "delta": "Hi"}));
/// usage.merge_event(&json!({"type": "response.completed", "response": {
///     "output": [{"type": "web_search_call", "status": "completed"}, {"type": "message"}],
///     "usage": {"input_tokens": 1200, "input_tokens_details": {"cached_tokens": 1024},
///               "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 256}}}}));
/// let usage = usage.usage().unwrap();
/// assert_eq!((usage.prompt_tokens, usage.cache_read_tokens), (1200, 1024));
/// assert_eq!((usage.completion_tokens, usage.reasoning_tokens), (300, 256));
/// assert_eq!(usage.web_search_requests, 1);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResponsesUsage {
    usage: Option<Usage>,
    /// A usage that could not be read: none is trusted after it.
    malformed: bool,
}

impl ResponsesUsage {
    /// Takes in one stream event's data: the final events' `response`;
    /// other events carry no usage.
    pub fn merge_event(&mut self, data: &Value) {
        let last = matches!(
            data.get("type").and_then(Value::as_str),
            Some("response.completed" | "response.incomplete" | "response.failed")
        );
        if let (true, Some(response)) = (last, data.get("response")) {
            self.merge_response(response);
        }
    }

    /// Takes in a whole answer (a response object): its `usage` and its
    /// web searches. One without usage (null or absent) changes nothing.
    pub fn merge_response(&mut self, response: &Value) {
        let usage = match response.get("usage") {
            None | Some(Value::Null) => return,
            Some(Value::Object(usage)) => usage,
            Some(_) => {
                self.malformed = true;
                return;
            }
        };
        let read = Usage::from_fields(&UsageFields {
            prompt_tokens: usage.get("input_tokens").cloned(),
            completion_tokens: usage.get("output_tokens").cloned(),
            cost: usage.get("cost").cloned(),
            prompt_tokens_details: usage.get("input_tokens_details").cloned(),
            completion_tokens_details: usage.get("output_tokens_details").cloned(),
        });
        let Some(mut read) = read else {
            self.malformed = true;
            return;
        };
        let called = response
            .get("output")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|item| item.get("type").and_then(Value::as_str) == Some("web_search_call"))
            .count() as u64;
        let reported = match usage
            .get("server_tool_use")
            .and_then(|tools| tools.get("web_search_requests"))
        {
            None | Some(Value::Null) => 0,
            Some(count) => match count.as_u64() {
                Some(count) => count,
                None => {
                    self.malformed = true;
                    return;
                }
            },
        };
        read.web_search_requests = called.max(reported);
        self.usage = Some(read);
    }

    /// The usage; `None` before any, or after one that could not be read.
    pub fn usage(&self) -> Option<Usage> {
        if self.malformed { None } else { self.usage }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn completed(usage: Value) -> Value {
        json!({"type": "response.completed", "sequence_number": 9, "response": {
            "id": "resp_1", "status": "completed", "output": [], "usage": usage}})
    }

    fn read(events: &[Value]) -> Option<Usage> {
        let mut usage = ResponsesUsage::default();
        for event in events {
            usage.merge_event(event);
        }
        usage.usage()
    }

    #[test]
    fn a_codex_stream_gives_its_final_events_usage() {
        let events = [
            json!({"type": "response.created", "response": {"id": "resp_1", "usage": null}}),
            json!({"type": "response.output_text.delta", "delta": "All"}),
            json!({"type": "response.output_item.done", "item": {"type": "message"}}),
            completed(
                json!({"input_tokens": 20_000, "input_tokens_details": {"cached_tokens": 19_456},
                "output_tokens": 640, "output_tokens_details": {"reasoning_tokens": 512},
                "total_tokens": 20_640}),
            ),
        ];
        assert_eq!(
            read(&events),
            Some(Usage {
                prompt_tokens: 20_000,
                completion_tokens: 640,
                cache_read_tokens: 19_456,
                reasoning_tokens: 512,
                ..Usage::default()
            })
        );
        // Cut before its end, a stream has no usage.
        assert_eq!(read(&events[..3]), None);
    }

    #[test]
    fn an_incomplete_or_failed_answer_gives_what_it_used() {
        for kind in ["response.incomplete", "response.failed"] {
            let event = json!({"type": kind, "response": {"usage": {"input_tokens": 10, "output_tokens": 4}}});
            let usage = read(&[event]).unwrap();
            assert_eq!((usage.prompt_tokens, usage.completion_tokens), (10, 4));
        }
        let failed = json!({"type": "response.failed", "response": {"usage": null, "error": {"code": "server_error"}}});
        assert_eq!(read(&[failed]), None);
    }

    #[test]
    fn a_whole_answer_gives_its_usage_and_its_searches() {
        let mut usage = ResponsesUsage::default();
        usage.merge_response(&json!({"object": "response", "output": [
            {"type": "web_search_call", "id": "ws_1"}, {"type": "web_search_call", "id": "ws_2"},
            {"type": "message", "content": []}],
            "usage": {"input_tokens": 50, "output_tokens": 7, "cost": 0.001}}));
        let usage = usage.usage().unwrap();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (50, 7));
        assert_eq!(usage.web_search_requests, 2);
        assert_eq!(usage.cost_nanos, Some(1_000_000));
        // An upstream that reports more searches than it lists is taken at
        // its word.
        let mut usage = ResponsesUsage::default();
        usage.merge_response(&json!({"output": [{"type": "web_search_call"}],
            "usage": {"input_tokens": 1, "output_tokens": 1, "server_tool_use": {"web_search_requests": 3}}}));
        assert_eq!(usage.usage().unwrap().web_search_requests, 3);
    }

    #[test]
    fn malformed_counts_or_details_past_their_totals_are_no_usage() {
        for usage in [
            json!({"input_tokens": -1, "output_tokens": 2}),
            json!({"input_tokens": 1.5, "output_tokens": 2}),
            json!({"input_tokens": "10", "output_tokens": 2}),
            json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 11}, "output_tokens": 2}),
            json!({"input_tokens": 10, "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 3}}),
            json!({"input_tokens": 10, "output_tokens": 2, "output_tokens_details": []}),
            json!({"input_tokens": 10, "output_tokens": 2, "server_tool_use": {"web_search_requests": -1}}),
            json!({}),
            json!([1]),
        ] {
            assert_eq!(read(&[completed(usage.clone())]), None, "{usage}");
        }
        // A bad usage is not mended by a later good one.
        assert_eq!(
            read(&[
                completed(json!({"input_tokens": -1})),
                completed(json!({"input_tokens": 5, "output_tokens": 1}))
            ]),
            None
        );
        // Details at their totals are fine.
        let usage = read(&[completed(
            json!({"input_tokens": 10, "input_tokens_details": {"cached_tokens": 10},
            "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 2}}),
        )])
        .unwrap();
        assert_eq!((usage.cache_read_tokens, usage.reasoning_tokens), (10, 2));
    }

    /// An embeddings answer's usage is chat's: `prompt_tokens`, and no
    /// completion.
    #[test]
    fn an_embeddings_answer_is_read_by_chats_reader() {
        let answer = json!({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1]}],
            "model": "text-embedding-3-small", "usage": {"prompt_tokens": 8, "total_tokens": 8}});
        assert_eq!(
            Usage::from_response(&answer),
            Some(Usage {
                prompt_tokens: 8,
                ..Usage::default()
            })
        );
        let bad = json!({"usage": {"prompt_tokens": -8, "total_tokens": 8}});
        assert_eq!(Usage::from_response(&bad), None);
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<u32>().prop_map(Value::from),
            (-1000i64..0).prop_map(Value::from),
            Just(Value::from(0.5)),
            Just(Value::from("response.completed")),
            Just(Value::from("web_search_call")),
            "[a-z_]{0,12}".prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            let names = proptest::sample::select(
                &[
                    "type",
                    "response",
                    "usage",
                    "output",
                    "input_tokens",
                    "output_tokens",
                    "input_tokens_details",
                    "output_tokens_details",
                    "cached_tokens",
                    "reasoning_tokens",
                    "server_tool_use",
                    "web_search_requests",
                ][..],
            )
            .prop_map(str::to_owned);
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map(names, inner, 0..5)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn no_value_panics_and_details_stay_within_their_totals(data in any_json()) {
            let mut usage = ResponsesUsage::default();
            usage.merge_event(&data);
            usage.merge_response(&data);
            if let Some(read) = usage.usage() {
                prop_assert!(read.cache_read_tokens <= read.prompt_tokens);
                prop_assert!(read.reasoning_tokens <= read.completion_tokens);
            }
        }

        /// Whatever counts a final event gives are read as given.
        #[test]
        fn counts_are_read_as_given(
            input in 0u64..1_000_000, cached in 0u64..1_000_000,
            output in 0u64..1_000_000, reasoning in 0u64..1_000_000,
        ) {
            let read = read(&[completed(json!({"input_tokens": input, "output_tokens": output,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens_details": {"reasoning_tokens": reasoning}}))]);
            if cached <= input && reasoning <= output {
                let read = read.unwrap();
                prop_assert_eq!((read.prompt_tokens, read.cache_read_tokens), (input, cached));
                prop_assert_eq!((read.completion_tokens, read.reasoning_tokens), (output, reasoning));
            } else {
                prop_assert_eq!(read, None);
            }
        }
    }
}
