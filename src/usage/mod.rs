//! What an account sees of its usage: a record of every chat request (its
//! generation), the app each came from, and the app ranking.
//!
//! With [`CreditGuardLayer::generations`](crate::credit::CreditGuardLayer::generations),
//! every chat response CreditGuard admitted carries an `X-Generation-Id`
//! ([`GENERATION_ID_HEADER`]), and its record is kept in the store with
//! the request's settlement, in the same atomic step: a record exists
//! exactly when the cost was recorded, once, and its `total_cost` is what
//! the key was charged. It appears once the request is settled, normally
//! within milliseconds of the response's end (a 404 right after may be
//! retried), and lives [`Generations::retention`] (30 days by default),
//! at most [`Generations::max_per_account`] per account (the oldest go
//! first). A request the gateway refused (401, 402, 429, …) costs nothing
//! and has no record.
//!
//! The fields follow OpenRouter's names where they exist: `id`, `model`
//! (as served; `requested_model` beside it), `provider_name`,
//! `tokens_prompt`, `tokens_completion` (as reported, or counted from a
//! stream; `null` when neither), `total_cost` and `usage` (credits),
//! `cost_basis`, `streamed`, `is_byok`, `cancelled` (the client went away),
//! `status` (the upstream's HTTP status), `latency` (ms from admission to
//! the end) and `generation_time` (ms from the upstream call to the end),
//! `created_at`, and the app: `origin` / `http_referer`, `app_id`,
//! `app_title`; `user_id` is the account.
//!
//! With the `apps` feature, the app ([`app_from_headers`]) is named by `HTTP-Referer` (an absolute
//! http(s) URL of at most 2048 bytes, kept without query or fragment) and
//! `X-Gateway-Title` or the older `X-Title` (1 to 100 printable
//! characters); a header that is there but malformed is a 400 naming it,
//! before anything is counted. An app on a local address (localhost, a
//! private network) is ranked only under its title. [`AppRanking`] counts
//! requests and tokens per app and model in the current UTC day, week and
//! month, for the whole gateway and per account, written to the store
//! about once a second.
//!
//! | route | who | answer |
//! |---|---|---|
//! | `GET /api/v1/generation?id=` | the key that made the request, or a management key of its account (the operator's adds `account=`) | `{"data": {…}}`; 404 to anyone else |
//! | `GET /api/v1/generations?limit=&offset=&key=&model=&from=&to=&format=&account=` | any key of the account | `{"data": [{…}, …], "next_offset"}`: the newest first, 20 by default, at most 100 a page, a key's read by the store's index, filtered by model or time among the 10,000 newest ([`GENERATIONS_SCAN_DEPTH`]); an inference key's own only; `format=csv` the page as CSV |
//! | `GET /api/v1/activity?date=&account=` | a management key of the account (the operator's names it with `account=`) | `{"data": [{date, model, provider_name, requests, prompt_tokens, completion_tokens, usage, byok_usage_inference, hold_charged_requests, hold_charged_usage}, …]}`: per UTC day (the last [`ACTIVITY_DAYS`] and today, or the one `date`) and model, by day then model, summed from the records as `generations` scans them ([`activity_rows`]), a lapsed or unanswered request's charged hold included and counted apart ([`charged_hold`]) |
//! | `GET /api/v1/apps?period=day\|week\|month&account=` | any key | `{"data": {period, starts_at, ends_at, apps: [{rank, id, url, title, requests, tokens, models: [{model, requests, tokens}]}]}}`: the top 100 apps by tokens of the key's own account (any account the operator names); `account=*`, the whole gateway's: the operator's (the default for its key), or any key's with `api::KeyRoutesLayer::public_ranking`, then by host only (`id` the host, `url` its origin, no title) |
//!
//! ```
//! use std::sync::Arc;
//! use http::HeaderMap;
//! use modelgate::usage::{app_from_headers, Generations, AppRanking};
//! use modelgate::keys::SharedStore;
//! use modelgate::store::MemoryStore;
//!
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! // Records kept a week, counted in the ranking.
//! let generations = Generations::new()
//!     .retention(std::time::Duration::from_secs(7 * 86_400))
//!     .app_ranking(AppRanking::new(store));
//! # let _ = generations;
//!
//! let mut headers = HeaderMap::new();
//! headers.insert("http-referer", "https://chat.example.com/?session=1".parse().unwrap());
//! headers.insert("x-title", "Example Chat".parse().unwrap());
//! # if cfg!(feature = "apps") {
//! let app = app_from_headers(&headers).unwrap().unwrap();
//! assert_eq!(app.id, "chat.example.com");
//! assert_eq!(app.url.as_deref(), Some("https://chat.example.com/"));
//! # }
//! ```

mod activity;
mod app;
mod generations;
mod query;
mod ranking;
mod record;

pub use activity::{
    ACTIVITY_DAYS, ActivityQuery, LAPSED_BASIS, LATE_ANSWER_BASIS, UNANSWERED_BASIS, UNKNOWN_MODEL,
    activity_query, activity_rows, activity_window_start, charged_hold, complete_from, cost_note,
    record_day,
};
pub use app::{
    App, LEGACY_TITLE_HEADER, MAX_REFERER_BYTES, MAX_TITLE_CHARS, REFERER_HEADER, TITLE_HEADER,
    app_from_headers,
};
pub use generations::{DEFAULT_MAX_PER_ACCOUNT, DEFAULT_RETENTION, Generations};
pub use query::{
    DEFAULT_RECENT_GENERATIONS, GENERATIONS_SCAN_DEPTH, MAX_MODEL_FILTER_CHARS,
    MAX_RECENT_GENERATIONS, UsageQuery, usage_query,
};
pub use ranking::{AppRanking, MAX_RANKED_APPS, PUBLIC_SCOPE};
pub(crate) use ranking::{by_host, ranking_json};
pub use record::{GENERATION_ID_HEADER, parse_generation_id};
pub(crate) use record::{
    GenerationContext, GenerationEnd, TokenDetails, generation_id, readable_by,
};
