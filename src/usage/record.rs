//! A request's generation record: what it was, what it cost, how long it
//! took, under OpenRouter's field names where they exist.

use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use http::HeaderName;
#[cfg(test)]
use serde::Serialize;
use serde_json::Value;

use super::Generations;
use super::app::App;
use crate::keys::credits::nanos_to_json;
use crate::store::NANOS_PER_CREDIT;
use crate::store::SettlementRecord;

/// The response header that names a chat request's generation record.
pub const GENERATION_ID_HEADER: HeaderName = HeaderName::from_static("x-generation-id");

/// What comes before the reservation id in a generation id.
const ID_PREFIX: &str = "gen-";

/// The generation id of the request held as `reservation_id`.
pub(crate) fn generation_id(reservation_id: &str) -> String {
    let mut id = String::with_capacity(ID_PREFIX.len() + reservation_id.len());
    id.push_str(ID_PREFIX);
    id.push_str(reservation_id);
    id
}

/// The reservation id a generation id names, when it is one the gateway
/// gives: `gen-` and 32 lower-case hex digits.
pub fn parse_generation_id(id: &str) -> Option<&str> {
    let reservation = id.strip_prefix(ID_PREFIX)?;
    (reservation.len() == 32
        && reservation
            .bytes()
            .all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte)))
    .then_some(reservation)
}

/// What is known of a chat request from its admission on, for its record.
#[derive(Clone, Debug)]
pub(crate) struct GenerationContext {
    pub(crate) settings: std::sync::Arc<Generations>,
    pub(crate) app: Option<App>,
    /// The API the request spoke (`chat`, `messages`).
    pub(crate) api: &'static str,
    /// The model the client asked for (before any fallback).
    pub(crate) requested_model: String,
    /// The model this attempt went to (shared with the admission's charge).
    pub(crate) model: std::sync::Arc<str>,
    /// The provider part of `model` (`openai` of `openai/gpt-4o`).
    pub(crate) provider: std::sync::Arc<str>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) started: tokio::time::Instant,
    /// When the request went on to the upstream (admission done).
    pub(crate) sent: Option<tokio::time::Instant>,
    /// The response's status, once there is one.
    pub(crate) status: Option<u16>,
    /// Whether the response was an event stream.
    pub(crate) streamed: bool,
}

/// How a request ended, as its record tells it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GenerationEnd {
    /// Tokens of the prompt and of the completion: reported, or counted
    /// from a stream; `None` when neither is known.
    pub(crate) tokens: Option<(u64, u64)>,
    /// What the upstream's usage said of its tokens, when it reported
    /// usage.
    pub(crate) details: Option<TokenDetails>,
    pub(crate) cost_nanos: i64,
    /// What the cost is made of (each kind of token and fee, rounded up
    /// on its own), when the gateway priced it from the usage.
    pub(crate) cost_details: Option<[(&'static str, i64); 8]>,
    /// What the cost was worked out from (`usage`, `streamed`, …).
    pub(crate) cost_basis: &'static str,
    pub(crate) byok: bool,
    /// The client went away before the end.
    pub(crate) cancelled: bool,
}

/// The parts of the tokens a usage reports apart (as OpenRouter's
/// generation names them).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TokenDetails {
    /// Of the prompt, read from the cache.
    pub(crate) cache_read: u64,
    /// Of the prompt, written to the cache (for five minutes or an hour).
    pub(crate) cache_write: u64,
    /// Of the completion, reasoning.
    pub(crate) reasoning: u64,
    pub(crate) web_searches: u64,
}

impl GenerationContext {
    /// The record of this request, written with its settlement, and the
    /// app's usage counted for the ranking.
    pub(crate) fn finish(
        &self,
        account: &str,
        key_hash: &str,
        reservation_id: &str,
        end: GenerationEnd,
    ) -> SettlementRecord {
        let now = tokio::time::Instant::now();
        let millis = |since: tokio::time::Instant| {
            u64::try_from(now.saturating_duration_since(since).as_millis()).unwrap_or(u64::MAX)
        };
        let (tokens_prompt, tokens_completion) = match end.tokens {
            Some((prompt, completion)) => (Some(prompt), Some(completion)),
            None => (None, None),
        };
        let cost = nanos_to_json(end.cost_nanos);
        let url = self.app.as_ref().and_then(|app| app.url.as_deref());
        let record = RecordFields {
            id: GenerationIdField(reservation_id),
            api: self.api,
            model: &self.model,
            requested_model: &self.requested_model,
            provider_name: &self.provider,
            tokens_prompt,
            tokens_completion,
            native_tokens_cached: end.details.map(|details| details.cache_read),
            native_tokens_cache_write: end.details.map(|details| details.cache_write),
            native_tokens_reasoning: end.details.map(|details| details.reasoning),
            web_search_requests: end.details.map(|details| details.web_searches),
            total_cost: &cost,
            usage: &cost,
            cost_details: end.cost_details.map(CostDetails),
            cost_basis: end.cost_basis,
            streamed: self.streamed,
            is_byok: end.byok,
            cancelled: end.cancelled,
            status: self.status,
            latency: millis(self.started),
            generation_time: self.sent.map(millis),
            created_at: CreatedAt(self.created_at),
            origin: url,
            http_referer: url,
            app_id: self.app.as_ref().map(|app| app.id.as_str()),
            app_title: self.app.as_ref().and_then(|app| app.title.as_deref()),
            user_id: account,
            key_hash,
        };
        // Straight to bytes, by hand: no `Value` tree, no serializer.
        let bytes = record.to_json();
        if let (Some(ranking), Some(app)) = (&self.settings.ranking, &self.app) {
            let tokens = end
                .tokens
                .map_or(0, |(prompt, completion)| prompt.saturating_add(completion));
            ranking.count(account, app, &self.model, tokens);
        }
        SettlementRecord {
            bytes: Bytes::from(bytes),
            retention: self.settings.retention,
            max_per_account: self.settings.max_per_account,
        }
    }
}

/// A generation record's fields as stored and answered, in this order.
#[cfg_attr(test, derive(Serialize))]
struct RecordFields<'a> {
    id: GenerationIdField<'a>,
    /// The API the request spoke.
    api: &'static str,
    model: &'a str,
    requested_model: &'a str,
    provider_name: &'a str,
    tokens_prompt: Option<u64>,
    tokens_completion: Option<u64>,
    /// Of the prompt, read from the cache (as OpenRouter names it).
    native_tokens_cached: Option<u64>,
    /// Of the prompt, written to the cache (five minutes and an hour).
    native_tokens_cache_write: Option<u64>,
    /// Of the completion, reasoning.
    native_tokens_reasoning: Option<u64>,
    web_search_requests: Option<u64>,
    total_cost: &'a Value,
    usage: &'a Value,
    /// What `total_cost` is made of, each part in credits.
    cost_details: Option<CostDetails>,
    cost_basis: &'static str,
    streamed: bool,
    is_byok: bool,
    cancelled: bool,
    status: Option<u16>,
    latency: u64,
    generation_time: Option<u64>,
    created_at: CreatedAt,
    origin: Option<&'a str>,
    http_referer: Option<&'a str>,
    app_id: Option<&'a str>,
    app_title: Option<&'a str>,
    user_id: &'a str,
    key_hash: &'a str,
}

impl RecordFields<'_> {
    /// The record's JSON: the bytes serde_json writes for these fields
    /// (the tests hold them equal, and the API answers them as stored),
    /// written by hand at a fraction of a serializer's cost per request.
    fn to_json(&self) -> Vec<u8> {
        let texts = self.model.len()
            + self.requested_model.len()
            + self.provider_name.len()
            + self.id.0.len()
            + self.user_id.len()
            + self.key_hash.len()
            + 2 * self.origin.map_or(0, str::len)
            + self.app_id.map_or(0, str::len)
            + self.app_title.map_or(0, str::len);
        let mut json = JsonWriter(Vec::with_capacity(768 + texts));
        json.key("{\"id\":");
        json.0.extend_from_slice(b"\"");
        json.0.extend_from_slice(ID_PREFIX.as_bytes());
        json.string_contents(self.id.0);
        json.0.push(b'"');
        json.key(",\"api\":");
        json.string(self.api);
        json.key(",\"model\":");
        json.string(self.model);
        json.key(",\"requested_model\":");
        json.string(self.requested_model);
        json.key(",\"provider_name\":");
        json.string(self.provider_name);
        json.key(",\"tokens_prompt\":");
        json.number(self.tokens_prompt);
        json.key(",\"tokens_completion\":");
        json.number(self.tokens_completion);
        json.key(",\"native_tokens_cached\":");
        json.number(self.native_tokens_cached);
        json.key(",\"native_tokens_cache_write\":");
        json.number(self.native_tokens_cache_write);
        json.key(",\"native_tokens_reasoning\":");
        json.number(self.native_tokens_reasoning);
        json.key(",\"web_search_requests\":");
        json.number(self.web_search_requests);
        json.key(",\"total_cost\":");
        json.value(self.total_cost);
        json.key(",\"usage\":");
        json.value(self.usage);
        json.key(",\"cost_details\":");
        match &self.cost_details {
            None => json.key("null"),
            Some(CostDetails(parts)) => {
                for (index, (name, nanos)) in parts.iter().enumerate() {
                    json.key(if index == 0 { "{" } else { "," });
                    json.string(name);
                    json.0.push(b':');
                    json.credits(*nanos);
                }
                json.key("}");
            }
        }
        json.key(",\"cost_basis\":");
        json.string(self.cost_basis);
        json.key(",\"streamed\":");
        json.boolean(self.streamed);
        json.key(",\"is_byok\":");
        json.boolean(self.is_byok);
        json.key(",\"cancelled\":");
        json.boolean(self.cancelled);
        json.key(",\"status\":");
        json.number(self.status);
        json.key(",\"latency\":");
        json.number(Some(self.latency));
        json.key(",\"generation_time\":");
        json.number(self.generation_time);
        json.key(",\"created_at\":");
        self.created_at.write_to(&mut json);
        json.key(",\"origin\":");
        json.optional_string(self.origin);
        json.key(",\"http_referer\":");
        json.optional_string(self.http_referer);
        json.key(",\"app_id\":");
        json.optional_string(self.app_id);
        json.key(",\"app_title\":");
        json.optional_string(self.app_title);
        json.key(",\"user_id\":");
        json.string(self.user_id);
        json.key(",\"key_hash\":");
        json.string(self.key_hash);
        json.key("}");
        json.0
    }
}

/// When a record was made: RFC 3339 in UTC to the millisecond, as
/// `to_rfc3339_opts(SecondsFormat::Millis, true)` writes it.
struct CreatedAt(DateTime<Utc>);

// For the test that holds the hand-written record to serde_json's.
#[cfg(test)]
impl Serialize for CreatedAt {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0.to_rfc3339_opts(SecondsFormat::Millis, true))
    }
}

impl CreatedAt {
    /// The quoted text, its digits written by hand (chrono's formatter
    /// costs a record more than the rest of its numbers); a year outside
    /// 0 to 9999, or a leap second, as chrono writes it.
    fn write_to(&self, json: &mut JsonWriter) {
        use chrono::{Datelike, Timelike};
        let at = self.0;
        let year = at.year();
        if !(0..=9999).contains(&year) || at.nanosecond() >= 1_000_000_000 {
            json.string(&at.to_rfc3339_opts(SecondsFormat::Millis, true));
            return;
        }
        let mut text = *b"\"0000-00-00T00:00:00.000Z\"";
        for (digits, value) in [
            (1..5, year.unsigned_abs()),
            (6..8, at.month()),
            (9..11, at.day()),
            (12..14, at.hour()),
            (15..17, at.minute()),
            (18..20, at.second()),
            (21..24, at.timestamp_subsec_millis()),
        ] {
            let mut rest = value;
            for digit in text[digits].iter_mut().rev() {
                *digit = b'0' + (rest % 10) as u8;
                rest /= 10;
            }
        }
        json.0.extend_from_slice(&text);
    }
}

/// Compact JSON written into a buffer, as serde_json writes it.
struct JsonWriter(Vec<u8>);

impl JsonWriter {
    /// Text that is JSON already (a key with its punctuation).
    fn key(&mut self, text: &str) {
        self.0.extend_from_slice(text.as_bytes());
    }

    fn string(&mut self, text: &str) {
        self.0.push(b'"');
        self.string_contents(text);
        self.0.push(b'"');
    }

    /// A string's contents, escaped as serde_json escapes them (only
    /// quotes, backslashes and control characters): most texts need none.
    fn string_contents(&mut self, text: &str) {
        // One pass without an early exit, which the compiler vectorises:
        // a record's strings are short, and most need no escape.
        let needs_escape = text.bytes().fold(false, |found, byte| {
            found | (byte < 0x20) | (byte == b'"') | (byte == b'\\')
        });
        let plain = !needs_escape;
        if plain {
            self.0.extend_from_slice(text.as_bytes());
        } else {
            let quoted = serde_json::to_string(text).expect("a string always serializes");
            self.0
                .extend_from_slice(&quoted.as_bytes()[1..quoted.len() - 1]);
        }
    }

    fn optional_string(&mut self, text: Option<&str>) {
        match text {
            Some(text) => self.string(text),
            None => self.key("null"),
        }
    }

    fn number<N: itoa::Integer>(&mut self, number: Option<N>) {
        match number {
            Some(number) => self
                .0
                .extend_from_slice(itoa::Buffer::new().format(number).as_bytes()),
            None => self.key("null"),
        }
    }

    fn boolean(&mut self, value: bool) {
        self.key(if value { "true" } else { "false" });
    }

    fn value(&mut self, value: &Value) {
        match value.as_i64() {
            Some(whole) => self.number(Some(whole)),
            None => serde_json::to_writer(&mut self.0, value).expect("a number always serializes"),
        }
    }

    /// Nano-credits as [`nanos_to_json`] gives them: whole credits as an
    /// integer, without building the value.
    fn credits(&mut self, nanos: i64) {
        match nanos % NANOS_PER_CREDIT {
            0 => self.number(Some(nanos / NANOS_PER_CREDIT)),
            _ => self.value(&nanos_to_json(nanos)),
        }
    }
}

/// A charge's parts, written as an object of credits.
struct CostDetails([(&'static str, i64); 8]);

#[cfg(test)]
impl Serialize for CostDetails {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, nanos) in &self.0 {
            map.serialize_entry(name, &nanos_to_json(*nanos))?;
        }
        map.end()
    }
}

/// [`generation_id`] written out without building the string first.
struct GenerationIdField<'a>(&'a str);

#[cfg(test)]
impl Serialize for GenerationIdField<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&format_args!("{ID_PREFIX}{}", self.0))
    }
}

/// Who may read a stored record: the key that made the request, or a
/// management key of its account.
pub(crate) fn readable_by(record: &Value, account: &str, key_hash: &str, management: bool) -> bool {
    record["user_id"].as_str() == Some(account)
        && (management || record["key_hash"].as_str() == Some(key_hash))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn generation_ids_name_reservations() {
        let reservation = format!("{:032x}", 0xabcdef_u128);
        let id = generation_id(&reservation);
        assert_eq!(parse_generation_id(&id), Some(reservation.as_str()));
        for bad in [
            "",
            "gen-",
            "gen-123",
            "GEN-0000000000000000000000000000abcd",
            "gen-0000000000000000000000000000ABCD",
            "gen-0000000000000000000000000000abcdx",
            "gen-0000000000000000000000000000abcg",
            "chatcmpl-0000000000000000000000000000abcd",
        ] {
            assert_eq!(parse_generation_id(bad), None, "{bad}");
        }
    }

    fn some_text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9/:.-]{0,20}",
            any::<String>(),
            "[\"\\\\\\x00-\\x1f\\x7fé…a]{0,12}",
        ]
    }

    fn some_nanos() -> impl Strategy<Value = i64> {
        prop_oneof![
            (-5i64..5).prop_map(|credits| credits * NANOS_PER_CREDIT),
            any::<i64>(),
            0i64..2_000_000_000,
        ]
    }

    proptest! {
        /// The hand-written JSON is, byte for byte, what serde_json writes
        /// for the same fields: the stored records and the API's answers
        /// stay as they were.
        #[test]
        fn a_record_is_written_as_serde_json_writes_it(
            texts in proptest::collection::vec(some_text(), 10),
            optional in proptest::collection::vec(proptest::option::of(any::<u64>()), 7),
            flags in proptest::collection::vec(any::<bool>(), 4),
            status in proptest::option::of(any::<u16>()),
            cost in some_nanos(),
            parts in proptest::option::of(proptest::collection::vec(some_nanos(), 8)),
            app in any::<bool>(),
            created_at in prop_oneof![
                // Around now, and anywhere chrono can go.
                1_700_000_000_000i64..1_900_000_000_000,
                -8_334_601_228_800_000i64..8_210_266_876_799_999,
            ].prop_map(|millis| DateTime::from_timestamp_millis(millis).unwrap()),
        ) {
            let total_cost = nanos_to_json(cost);
            let names = ["prompt", "completion", "cache_read", "cache_write", "reasoning", "web", "image", "request"];
            let cost_details = parts.map(|parts| {
                let mut details = [("", 0); 8];
                for (detail, (name, nanos)) in details.iter_mut().zip(names.iter().zip(parts)) {
                    *detail = (*name, nanos);
                }
                CostDetails(details)
            });
            let record = RecordFields {
                id: GenerationIdField(&texts[0]),
                api: if flags[3] { "chat" } else { "messages" },
                model: &texts[1],
                requested_model: &texts[2],
                provider_name: &texts[3],
                tokens_prompt: optional[0],
                tokens_completion: optional[1],
                native_tokens_cached: optional[2],
                native_tokens_cache_write: optional[3],
                native_tokens_reasoning: optional[4],
                web_search_requests: optional[5],
                total_cost: &total_cost,
                usage: &total_cost,
                cost_details,
                cost_basis: "usage",
                streamed: flags[0],
                is_byok: flags[1],
                cancelled: flags[2],
                status,
                latency: optional[6].unwrap_or(7),
                generation_time: optional[6],
                created_at: CreatedAt(created_at),
                origin: app.then_some(texts[5].as_str()),
                http_referer: app.then_some(texts[5].as_str()),
                app_id: app.then_some(texts[6].as_str()),
                app_title: (!app).then_some(texts[7].as_str()),
                user_id: &texts[8],
                key_hash: &texts[9],
            };
            let by_hand = record.to_json();
            prop_assert_eq!(
                String::from_utf8(by_hand).unwrap(),
                serde_json::to_string(&record).unwrap()
            );
        }

        #[test]
        fn any_text_parses_or_not_without_panicking(text in ".{0,80}") {
            if let Some(reservation) = parse_generation_id(&text) {
                prop_assert_eq!(generation_id(reservation), text);
            }
        }
    }
}
