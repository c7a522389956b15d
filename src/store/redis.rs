//! The shared store: every trait on Redis or Redis Cluster.
//!
//! Each operation is one Lua function of one Redis Functions library
//! (`FCALL`), so a check-and-add is one round trip and atomic; hence Redis
//! 7 or later. The store loads the library at connect (`FUNCTION LOAD`, on
//! every primary of a Cluster), and again when Redis answers that a
//! function is missing (a restart without persistence, `FUNCTION FLUSH`, a
//! node that never had it), then sends that call, which did not run, once
//! more. The library and its functions are named after a hash of its Lua
//! (`mg_<hash>`, `mg_<hash>_<operation>`), so instances of different
//! versions sharing a Redis each run their own; an older version's
//! library stays until deleted (`FUNCTION DELETE`). Counter, slot and ledger keys
//! are hash-tagged by account (`mg:{acct}:…`) and record keys by collection
//! (`mg:{r%3Akeys}:…`, the collection percent-escaped), so every function call touches one Cluster slot and declares
//! every key it touches. A record's lifetime is its score in the
//! collection's `exp` sorted set (Redis has no expiry per hash field before
//! 7.4): the record scripts remove the expired ones before they read,
//! count or list, and a collection whose records all expire has its keys
//! expire with its longest-lived record.
//!
//! A sick store fails fast: every call goes through one circuit breaker,
//! shared by all clones of the store. After
//! [`breaker_failures`](RedisStoreConfig::breaker_failures) calls in a
//! row fail for want of an answer (a timeout, a lost or refused
//! connection, a server loading, a cluster down), every call fails at once
//! with [`StoreErrorKind::CircuitOpen`] for
//! [`breaker_cool_down`](RedisStoreConfig::breaker_cool_down), instead of
//! each waiting its `call_timeout` on a hung Redis; then one call goes
//! through as a probe, and its success closes the breaker (its failure
//! opens it for another cool-down). The error is
//! [`is_unavailable`](super::StoreError::is_unavailable), so each layer's
//! [`FailurePolicy`](super::FailurePolicy) applies as for a timeout.
//! Replies the server did give (a script error) and arguments refused
//! before sending never count. [`RedisStore::circuit_open`] tells a
//! readiness check; opens and refusals are counted
//! ([`STORE_CIRCUIT_OPENS_TOTAL`](crate::telemetry::STORE_CIRCUIT_OPENS_TOTAL),
//! [`STORE_CIRCUIT_REFUSALS_TOTAL`](crate::telemetry::STORE_CIRCUIT_REFUSALS_TOTAL))
//! and logged (a warning when it opens, info when it closes).
//!
//! On connect the store reads `maxmemory-policy` and warns unless it is
//! `noeviction`: an evicted hold or counter lets requests past their
//! limits, the request of an evicted hold goes uncharged, and evicted
//! usage is lost. It also reads `appendonly` and `appendfsync`: without
//! an append-only file it warns that a restart loses every write since the
//! last RDB snapshot (balances, usage, holds, records); with `appendfsync
//! no` that a crash of the machine loses about 30 s of writes, and with
//! `everysec` says (at info) up to 1 s. (A Redis that refuses `CONFIG`, as
//! managed ones do, is not checked.)
//!
//! No call is sent twice by the client: the connection manager retries
//! only connecting, and the Cluster client is built with no retries, since
//! it would resend a script whose connection dropped after it ran. A call
//! whose reply is lost fails; the next one reconnects.
//!
//! Numbers: counters are exact up to 2^53 (limits and amounts above are
//! refused); ledger amounts are stored with Redis' own 64-bit integer
//! commands and compared in the scripts with exact two-part integers, so
//! nano-credits stay exact over the whole `i64` range.
//!
//! # Time
//!
//! With [`TimeSource::Redis`] (the default) every window, calendar period,
//! hold expiry and record lifetime is decided by Redis's own clock (`TIME`
//! inside the scripts; the UTC calendar is computed in Lua, `time.lua`),
//! so instances whose clocks differ agree. In-flight slot leases, which
//! bound concurrency and are no window, take the caller's instant.
//! [`TimeSource::Caller`] makes Redis take the caller's instant
//! throughout: the conformance suite drives both backends by hand that
//! way, which also holds the Lua calendar to the Rust one.
//!
//! # Key layout
//!
//! Keys are `<key_prefix>:{<tag>}:…` ([`RedisStoreConfig::key_prefix`],
//! `mg` by default, no braces); parts outside `[A-Za-z0-9._-]` are
//! percent-escaped. The hash tag keeps an account, a counter scope or a
//! record collection in one Cluster slot. The data's layout is recorded
//! under `mg:{layout}:version` ([`LEDGER_LAYOUT`]).
//!
//! | key | what |
//! |---|---|
//! | `mg:{acct}:acct` | the account's whole ledger, one hash: `balance`, `purchased`, the state `s`, per key its usage and holds (`k:<key hash>`), terms (`t:<key hash>`: limit, reset, BYOK counted, expiry), revocation (`r:<key hash>`) and until when its own order of records is known to live (`o:<key hash>`), per request its hold, settlement marker or lapse (`i:<id>`), per GCRA rate limit its next arrival (the field named by the counter's key); the packing is described at the top of `lua/ledger_common.lua` |
//! | `mg:{acct}:ids` | sorted set of the requests the ledger tracks: a live hold's expiry (µs, positive); minus the instant a settled or lapsed id is forgotten |
//! | `mg:{acct}:gen`, `mg:{acct}:genexp` | generation records: hash id → record JSON (and `k:<id>` → the key hash it was made with); sorted set id → expiry (µs), which is also their order; past the account's cap hidden at once, removed when the account is next tidied |
//! | `mg:{acct}:genexp:<key hash>`, `mg:{acct}:genkeyed` | each key's own order of its records (id → expiry), which records leave when they leave the account, kept as long as its newest record, so a key's page skips the other keys'; the mark that records kept before these orders were put in them (at an account's first key page) |
//! | `mg:{acct}:topup:<idempotency key>` (`topup:~<32 hex>` for a top-up without one) | hash `amount`, `purchased`, `balance` (after that top-up), `forget_at` (µs) |
//! | `mg:{apps%3A<scope>}:d`, `:w`, `:m` | app usage in the current day, week, month (`*` the gateway, or an account): `s` the period's start, `n` rows, `r␟app␟model` requests, `t␟app␟model` tokens, `a␟app` details; emptied when the period rolls forward, expiring at its end |
//! | `mg:{scope}:c:w:<name>` (hash: window start → count), `c:r:<name>` (+ `:aux`), `c:g:<name>` | fixed or calendar, rolling, GCRA counters (a GCRA state is the field `mg:{scope}:c:g:<name>` of the scope's account hash while that exists) |
//! | `mg:{scope}:s:<name>` | an in-flight slot set (holder → lease end) |
//! | `mg:{r%3A<collection>}:values`, `revs`, `order`, `seq`, `exp` | records, revisions, creation order, the sequence, and the expiries (id → µs) of records with a lifetime; when every record has one, the five keys expire with the longest-lived (plus [`expiry_slack`](RedisStoreConfig::expiry_slack)) |
//!
//! The account's hash and `ids` never expire (they hold money); the record
//! keys live as long as their longest-kept record.
//!
//! One ledger call (`ledger_write.lua`: settlements, renewals, then
//! optionally an admission) reads the account's hash with one `HMGET` and
//! writes it with one `HSET`, adds to `ids` with one `ZADD` and writes its
//! records with one `HSET` and one `ZADD`: about 5 commands (a GCRA
//! counter's state rides in the hash; other counters add their own),
//! however many settlements ride along. An admission with a new request
//! id, on an account with no upkeep due (no hold to lapse, no tidying),
//! carrying no settlements or only those of its key's live holds, takes a
//! shorter path to the same decision and the same writes, without the
//! general call's bookkeeping. Values are
//! packed a few to a field because what a call costs Redis is mostly
//! moving values between Lua and Redis and making Lua strings; sums are
//! added as Lua numbers while both have at most 15 digits, else as
//! two-part base-10⁹ integers. Holds lapse once `next` (in `s`) has passed;
//! settled and lapsed ids whose time is up count as gone at once and are
//! removed a minute later (`FORGOTTEN_KEPT_US`, so a clock that steps back
//! finds what it found before), at most ten times a second, with the
//! records past their time or cap: removing them late changes no answer.
//! A call writes nothing until it ends, so one that fails part way leaves
//! no half-written hold. The Functions decide as the Rust rules
//! (`store::rules`) do, which `MemoryStore` and `SqliteStore` call: a
//! differential test (`ledger_answers_and_state_exactly_as_the_rules_do`
//! in `tests/it/redis_store.rs`) runs the same random operations through
//! both and compares every answer and the state left.
//!
//! [`LedgerStore::top_up`] credits through
//! [`top_up_once`](LedgerStore::top_up_once)'s step under a random key of
//! its own, so a resent top-up cannot credit twice.
//!
//! # Scripts
//!
//! `lua/`, one library built by the `library!` macro below: the shared
//! parts once, then each operation's file as the body of its function
//! (`KEYS` and `ARGV` set for the shared parts too), so every body sees
//! every shared part. The library's own locals (`KEYS`, `ARGV`, the ledger
//! call's state `C`) outlive a call, so a function sets those it reads
//! before anything else (`ledger_begin`).
//!
//! - Shared: `int.lua` (`int`: integers as decimal text, `%d`, exact below
//!   2^63, never Lua's default formatting), `time.lua` (the instant and
//!   the UTC calendar), `counters.lua` (every counter kind),
//!   `ledger_common.lua` (layout 4, the call's state, holds, lapses,
//!   usage, tidying, exact big integers: `big`, `big_add`, `signed_add`,
//!   …), `records_common.lua` (removing expired records, the collection's
//!   key lifetime).
//! - Operations: `check_and_add.lua`, `acquire_slot.lua`,
//!   `ledger_write.lua` (settlements with their generation records, then
//!   optionally an admission: counters and a hold), `key_usage.lua`,
//!   `top_up.lua` (Redis's 64-bit `HINCRBY`), `generations.lua` (a record
//!   by id, or the newest), `app_usage_add.lua`, `app_usage_read.lua`, the
//!   record scripts `get_record.lua`, `put_record.lua` (the cap counted
//!   after the expired records are removed, in the same run),
//!   `delete_record.lua`, `list_records.lua`, and the migration from
//!   layouts 1 and 2, `migrate_key.lua` ([`RedisStore::move_key_ledger`])
//!   and `migrate_account.lua` ([`RedisStore::finish_account_ledger`]).

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, ToRedisArgs, Value};
use sha2::{Digest, Sha256};

use super::apps::{
    AppUsage, AppUsageStore, FIELD_SEPARATOR, MAX_APP_USAGE_ROWS, validate_app_usage,
};
use super::breaker::Breaker;
use super::counter::{duration_micros, micros_duration, validate_checks, validate_slot};
use super::ledger::{
    LAPSED_HOLD_MEMORY, SETTLEMENT_MEMORY, top_up_overflow, validate_admit, validate_amount,
    validate_key_terms, validate_renewals, validate_settlements, validate_top_up_once,
};
use super::records::validate_put;
use super::{
    AccountBalance, AdmitOutcome, AdmitRequest, Check, CheckOutcome, CounterStore, Decision,
    Expect, GenerationsPage, HoldRenewal, KeyTerms, KeyUsage, LedgerStore, Limit, PutOptions,
    PutOutcome, RecordStore, ReserveOutcome, Settlement, SlotOutcome, StoreError, StoreErrorKind,
    TopUpOutcome, Versioned, WriteOutcome,
};
use crate::clock::{Period, unix_micros};

/// How a [`RedisStore`] names its keys and bounds its calls.
#[derive(Clone, Debug)]
pub struct RedisStoreConfig {
    /// Put before every key, so several gateways can share one Redis (default `mg`).
    pub key_prefix: String,
    /// The most any store call may take, connecting included; past it the
    /// call fails with a timeout and the layer applies its failure policy.
    pub call_timeout: Duration,
    /// Extra lifetime given to counter keys beyond their window, to slot
    /// sets beyond their longest lease, and to a record collection whose
    /// records all expire beyond its longest-lived record. Expiry in Redis
    /// only reclaims memory (windows, leases and record lifetimes are
    /// judged by the store's time), so the slack just keeps a key alive
    /// across clock skew.
    pub expiry_slack: Duration,
    /// Whose clock decides windows, calendar periods and hold expiries.
    pub time_source: TimeSource,
    /// Consecutive failed calls (timeouts, lost connections, a server
    /// loading or a cluster down) that open the circuit breaker (default
    /// 3): while it is open every call fails at once with
    /// [`StoreErrorKind::CircuitOpen`] instead of waiting `call_timeout`.
    /// Replies the server gave (a script error) and refused arguments do
    /// not count. 0 turns the breaker off.
    pub breaker_failures: u32,
    /// How long an open breaker refuses every call (default 1 s); then one
    /// call goes through as a probe: its success closes the breaker, its
    /// failure opens it for another cool-down.
    pub breaker_cool_down: Duration,
    /// Whether [`connect`](RedisStore::connect) refuses a Redis whose data
    /// is in another layout than [`LEDGER_LAYOUT`] (on by default; only a
    /// migration turns it off).
    pub check_layout: bool,
}

/// Whose clock a [`RedisStore`] decides time by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimeSource {
    /// Redis's own (`TIME` inside each script): every gateway instance
    /// sharing the server agrees on every window, period and expiry,
    /// whatever its own clock says. The `now` the layers pass is ignored.
    #[default]
    Redis,
    /// The `now` each call passes (the layer's [`Clock`](crate::clock::Clock)):
    /// for tests that drive time by hand.
    Caller,
}

impl Default for RedisStoreConfig {
    fn default() -> Self {
        RedisStoreConfig {
            key_prefix: "mg".to_owned(),
            call_timeout: Duration::from_millis(500),
            expiry_slack: Duration::from_secs(10),
            time_source: TimeSource::Redis,
            breaker_failures: 3,
            breaker_cool_down: Duration::from_secs(1),
            check_layout: true,
        }
    }
}

/// The layout of the data this version keeps in Redis, recorded under
/// `{prefix}:{layout}:version`. Layout 4 keeps an account's whole ledger
/// (the account, its keys' usage and terms, the requests it tracks, and
/// the state of its GCRA rate limits) in one hash and one sorted set, run
/// by one script a call; layout 3 kept each GCRA state in a key of its
/// own, and layouts 1 and 2 kept five keys per key and two per account. A
/// store in an older layout is migrated once, with every instance
/// stopped: each key's ledger moved ([`RedisStore::move_key_ledger`],
/// from layouts 1 and 2), every key's terms written
/// ([`LedgerStore::set_key_terms`]), then
/// [`RedisStore::mark_layout_current`] (`proxy migrate-store --redis URL`
/// does all three). A GCRA state a layout 3 key holds is read from there
/// until its account's hash holds it: nothing of it is moved.
pub const LEDGER_LAYOUT: u32 = 4;

/// Every store trait on Redis (through a [`ConnectionManager`], which
/// reconnects by itself) or on Redis Cluster.
///
/// A sick store fails fast: after
/// [`breaker_failures`](RedisStoreConfig::breaker_failures) calls in a row
/// get no answer (a timeout, a lost connection), the circuit breaker
/// shared by all clones refuses every call at once with
/// [`StoreErrorKind::CircuitOpen`] (an [`is_unavailable`](StoreError::is_unavailable)
/// error: the layers' failure policies apply as for a timeout) for
/// [`breaker_cool_down`](RedisStoreConfig::breaker_cool_down); then one
/// call probes, and its success closes it. [`RedisStore::circuit_open`]
/// tells a readiness check. On connect, a `maxmemory-policy` other than
/// `noeviction`, and a Redis without an append-only file (`appendonly
/// no`) or one that leaves its flushing to the system (`appendfsync no`),
/// are logged as warnings. No call is resent by the client after a lost
/// reply: it fails, and the next call reconnects.
#[derive(Clone)]
pub struct RedisStore {
    connection: Connection,
    config: Arc<RedisStoreConfig>,
    scripts: Arc<Scripts>,
    breaker: Arc<Breaker>,
    reloads: Arc<Reloads>,
    /// Accounts whose records are known to be in their keys' orders
    /// (`genkeyed` seen), so a key's page checks no more.
    keyed_accounts: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// Records put in their keys' orders per call while an account's older
/// records are (a few milliseconds of Redis each, never seconds at once).
const KEY_ORDER_CHUNK: usize = 1000;
/// How far each chunk reaches back over the last, so that a record
/// removed meanwhile (shifting those after it) leaves none out.
const KEY_ORDER_OVERLAP: usize = 32;

/// How many times a store (all its clones) has loaded the library again,
/// and the lock under which one of the calls that found it missing
/// together loads it.
#[derive(Default)]
struct Reloads {
    done: std::sync::atomic::AtomicU64,
    loading: tokio::sync::Mutex<()>,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.connection {
            Connection::Single(_) => "single",
            Connection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("connection", &kind)
            .field("config", &self.config)
            .field("circuit_open", &self.circuit_open())
            .finish()
    }
}

/// Every operation's Lua, as one Redis Functions library: the shared parts
/// once, then each operation's file as a function of its own. Adding an
/// operation is one name here and its file `lua/<name>.lua`.
macro_rules! library {
    ($($operation:ident),+ $(,)?) => {
        /// Each operation's function in the [`LIBRARY`].
        struct Scripts {
            $($operation: Function,)+
        }

        impl Scripts {
            fn new(library: &Library) -> Self {
                Scripts {
                    $($operation: Function::new(library, stringify!($operation)),)+
                }
            }
        }

        /// Each operation's name and its file.
        const OPERATIONS: &[(&str, &str)] = &[
            $((
                stringify!($operation),
                include_str!(concat!("lua/", stringify!($operation), ".lua")),
            ),)+
        ];
    };
}

library!(
    check_and_add,
    acquire_slot,
    ledger_write,
    key_usage,
    top_up,
    get_record,
    put_record,
    delete_record,
    list_records,
    generations,
    app_usage_add,
    app_usage_read,
    migrate_key,
    migrate_account,
);

/// The shared parts, each defined once in the library, in the order they
/// build on each other.
const SHARED_LUA: [&str; 5] = [
    include_str!("lua/int.lua"),
    include_str!("lua/time.lua"),
    include_str!("lua/counters.lua"),
    include_str!("lua/ledger_common.lua"),
    include_str!("lua/records_common.lua"),
];

/// The library this binary loads, built once.
static LIBRARY: LazyLock<Library> = LazyLock::new(Library::new);

/// A Redis Functions library and its name.
struct Library {
    /// `mg_` and the first 12 hex digits of the SHA-256 of the library's
    /// text (under a placeholder name): binaries with different Lua load
    /// libraries and functions of different names, so neither replaces the
    /// other's, and the same Lua keeps its name across restarts.
    name: String,
    /// What `FUNCTION LOAD` is given.
    text: String,
}

impl Library {
    fn new() -> Self {
        let placeholder = Self::text("mg");
        let digest = hex::encode(Sha256::digest(placeholder.as_bytes()));
        let name = format!("mg_{}", &digest[..12]);
        let text = Self::text(&name);
        Library { name, text }
    }

    fn text(name: &str) -> String {
        let mut text = format!(
            "#!lua name={name}\n\
             -- The arguments of the running call: the shared parts read them\n\
             -- too, and a function's own are not visible to them.\n\
             local KEYS, ARGV\n"
        );
        for shared in SHARED_LUA {
            text.push_str(shared);
            text.push('\n');
        }
        for (operation, body) in OPERATIONS {
            text.push_str(&format!(
                "redis.register_function('{name}_{operation}', function(keys, argv)\n\
                 KEYS, ARGV = keys, argv\n\
                 {body}\n\
                 end)\n"
            ));
        }
        text
    }
}

/// One operation's function: `FCALL <library>_<operation>`.
struct Function {
    name: String,
}

impl Function {
    fn new(library: &Library, operation: &str) -> Self {
        Function {
            name: format!("{}_{operation}", library.name),
        }
    }

    /// A call to build: its keys and arguments, then [`RedisStore::run`].
    fn prepare_invoke(&self) -> FunctionCall<'_> {
        FunctionCall {
            function: &self.name,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// The keys and arguments of one `FCALL`, in the order they are added.
struct FunctionCall<'a> {
    function: &'a str,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl FunctionCall<'_> {
    fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// `FCALL function numkeys key… arg…`.
    fn command(&self) -> Cmd {
        let mut command = redis::cmd("FCALL");
        command
            .arg(self.function)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        command
    }
}

/// `FUNCTION LOAD REPLACE` of the [`LIBRARY`]; on a Cluster the client
/// sends it to every primary (each replica gets it from its primary).
fn load_library_command() -> Cmd {
    let mut command = redis::cmd("FUNCTION");
    command.arg("LOAD").arg("REPLACE").arg(&LIBRARY.text);
    command
}

/// Whether Redis refused a call for want of its function (restarted
/// without its functions, `FUNCTION FLUSH`, a node that never had them):
/// the call did not run.
fn function_missing(error: &redis::RedisError) -> bool {
    error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError)
        && error
            .detail()
            .is_some_and(|detail| detail.starts_with("Function not found"))
}

/// One Redis server or a Cluster, behind one `ConnectionLike`.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(connection) => connection.req_packed_command(cmd),
            Connection::Cluster(connection) => connection.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
            Connection::Cluster(connection) => {
                connection.req_packed_commands(pipeline, offset, count)
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(connection) => connection.get_db(),
            Connection::Cluster(connection) => connection.get_db(),
        }
    }
}

/// A prefix with `{` or `}` would move or empty the hash tag and split an
/// account over Cluster slots.
fn validate_config(config: &RedisStoreConfig) -> Result<(), StoreError> {
    if config.key_prefix.contains(['{', '}']) {
        return Err(StoreError::invalid(
            "connect",
            "key_prefix must not contain '{' or '}'",
        ));
    }
    if config.call_timeout.is_zero() {
        return Err(StoreError::invalid(
            "connect",
            "call_timeout must be positive",
        ));
    }
    if config.breaker_failures > 0 && config.breaker_cool_down.is_zero() {
        return Err(StoreError::invalid(
            "connect",
            "breaker_cool_down must be positive (or breaker_failures 0: no breaker)",
        ));
    }
    Ok(())
}

fn backend(operation: &'static str, error: impl fmt::Display) -> StoreError {
    StoreError::new(operation, StoreErrorKind::Backend(error.to_string()))
}

/// Whether `error` says the store cannot serve (no answer, a lost
/// connection, a server loading or a cluster down), which counts towards
/// opening the circuit breaker; as opposed to a reply about this call (a
/// script error, a wrong type), which shows that the server answers.
fn store_is_sick(error: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    !matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::ResponseError
                | ServerErrorKind::ExecAbort
                | ServerErrorKind::NoScript
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::CrossSlot
                | ServerErrorKind::NotBusy
                | ServerErrorKind::NoSub
                | ServerErrorKind::NoPerm
        ) | ErrorKind::Extension
            | ErrorKind::UnexpectedReturnType
            | ErrorKind::Parse
    ) || error.is_timeout()
}

/// Eviction policies that may drop keys the gateway needs: any but
/// `noeviction` (the `volatile-*` ones too, since holds, counters and
/// usage all carry a TTL).
fn warn_if_evicting(reply: redis::RedisResult<Vec<String>>) {
    match reply {
        Ok(pair) => match pair.get(1).map(String::as_str) {
            Some("noeviction") | None => {}
            Some(policy) => tracing::warn!(
                maxmemory_policy = policy,
                "Redis may evict keys when it reaches maxmemory (maxmemory-policy {policy}): \
                 an evicted hold or counter lets requests past their limits, the request of an \
                 evicted hold goes uncharged, and evicted usage is lost; set maxmemory-policy \
                 noeviction"
            ),
        },
        Err(error) => tracing::debug!(
            %error,
            "cannot read maxmemory-policy (CONFIG refused, as on managed Redis, or timed out); \
             not checked"
        ),
    }
}

/// Says what a restart or a crash loses given the append-only file's
/// settings (`CONFIG GET append*`): without AOF, every write since the last
/// RDB snapshot (a warning); with `appendfsync no`, about 30 s of writes on
/// a crash of the machine (a warning); with `everysec`, up to 1 s (info).
fn warn_if_not_durable(reply: redis::RedisResult<Vec<String>>) {
    let settings = match reply {
        Ok(settings) => settings,
        Err(error) => {
            tracing::debug!(
                %error,
                "cannot read appendonly (CONFIG refused, as on managed Redis, or timed out); \
                 not checked"
            );
            return;
        }
    };
    let setting = |name: &str| {
        settings
            .chunks_exact(2)
            .find(|pair| pair[0].eq_ignore_ascii_case(name))
            .map(|pair| pair[1].as_str())
    };
    match (setting("appendonly"), setting("appendfsync")) {
        (Some("no"), _) => tracing::warn!(
            appendonly = "no",
            "Redis keeps no append-only file (appendonly no): a restart, or a failover to a \
             replica that had not received them, loses every write since the last RDB \
             snapshot (all of them without snapshots): balances and purchases, usage, the \
             holds of requests in flight (which then go uncharged) and generation records; \
             turn AOF on with appendonly yes in redis.conf (CONFIG SET appendonly yes on a \
             running server)"
        ),
        (Some("yes"), Some("no")) => tracing::warn!(
            appendfsync = "no",
            "Redis leaves flushing its append-only file to the system (appendfsync no): a \
             crash of the machine loses up to about 30 s of writes (balances, usage, holds); \
             set appendfsync everysec (up to 1 s) or always (none)"
        ),
        (Some("yes"), Some("everysec")) => tracing::info!(
            appendfsync = "everysec",
            "Redis flushes its append-only file each second (appendfsync everysec): a crash \
             of the machine loses up to 1 s of writes; appendfsync always loses none"
        ),
        _ => {}
    }
}

impl RedisStore {
    /// Connects to the Redis server at `url` (`redis://host:port/db`).
    pub async fn connect(url: &str, config: RedisStoreConfig) -> Result<Self, StoreError> {
        validate_config(&config)?;
        let info = redis::IntoConnectionInfo::into_connection_info(url)
            .map_err(|error| backend("connect", error))?
            .set_tcp_settings(low_latency_tcp());
        let client = redis::Client::open(info).map_err(|error| backend("connect", error))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.call_timeout))
            .set_response_timeout(Some(config.call_timeout))
            .set_max_delay(Duration::from_secs(1))
            // Retries of connecting only: a command whose connection drops
            // fails with the dropped connection and is never sent again (a
            // script that ran would run twice), while the manager connects
            // afresh for the next call.
            .set_number_of_retries(2);
        let connecting = ConnectionManager::new_with_config(client, manager_config);
        let connection = tokio::time::timeout(config.call_timeout, connecting)
            .await
            .map_err(|_| StoreError::new("connect", StoreErrorKind::Timeout(config.call_timeout)))?
            .map_err(|error| backend("connect", error))?;
        let store = RedisStore::with_connection(Connection::Single(connection), config);
        store.load_library().await?;
        store.check_settings().await;
        store.check_layout().await?;
        Ok(store)
    }

    /// Connects to the Redis Cluster that `nodes` (any of its nodes) belong to.
    pub async fn connect_cluster(
        nodes: &[&str],
        config: RedisStoreConfig,
    ) -> Result<Self, StoreError> {
        validate_config(&config)?;
        let client = redis::cluster::ClusterClient::builder(nodes.iter().copied())
            .connection_timeout(config.call_timeout)
            .response_timeout(config.call_timeout)
            .tcp_settings(low_latency_tcp())
            // None: the client would resend a command after any error,
            // a dropped connection included, so a script that ran but whose
            // reply was lost would run twice (an admission counted twice).
            // The crate cannot limit retries to replies that prove the
            // command did not run (MOVED, ASK, TRYAGAIN), so such a call
            // fails too; the client still refreshes its slot map and
            // reconnects for the next call.
            .retries(0)
            .build()
            .map_err(|error| backend("connect", error))?;
        let connection = tokio::time::timeout(config.call_timeout, client.get_async_connection())
            .await
            .map_err(|_| StoreError::new("connect", StoreErrorKind::Timeout(config.call_timeout)))?
            .map_err(|error| backend("connect", error))?;
        let store = RedisStore::with_connection(Connection::Cluster(connection), config);
        store.load_library().await?;
        store.check_settings().await;
        store.check_layout().await?;
        Ok(store)
    }

    fn with_connection(connection: Connection, config: RedisStoreConfig) -> Self {
        RedisStore {
            connection,
            breaker: Arc::new(Breaker::new(
                config.breaker_failures,
                config.breaker_cool_down,
            )),
            config: Arc::new(config),
            scripts: Arc::new(Scripts::new(&LIBRARY)),
            reloads: Arc::default(),
            keyed_accounts: Arc::default(),
        }
    }

    /// Reads `maxmemory-policy` and the append-only file's settings (of
    /// one node, on a Cluster) and logs what they can cost: evicted keys,
    /// writes a restart loses. Never fails the connect: a refused `CONFIG`
    /// (managed Redis) is logged at debug.
    /// The layout version Redis records; `None` when none is.
    pub async fn layout(&self) -> Result<Option<u32>, StoreError> {
        const OPERATION: &str = "layout";
        let mut connection = self.connection.clone();
        let command = redis::cmd("GET").arg(self.layout_key()).to_owned();
        let version: Option<String> = self
            .bounded(OPERATION, command.query_async(&mut connection))
            .await?;
        version
            .map(|text| {
                text.parse()
                    .map_err(|_| StoreError::corrupt(OPERATION, format!("layout {text:?}")))
            })
            .transpose()
    }

    /// Records that the data is in [`LEDGER_LAYOUT`]: the last step of a
    /// migration, once every key's terms are written.
    pub async fn mark_layout_current(&self) -> Result<(), StoreError> {
        let mut connection = self.connection.clone();
        let command = redis::cmd("SET")
            .arg(self.layout_key())
            .arg(LEDGER_LAYOUT)
            .to_owned();
        let () = self
            .bounded("layout", command.query_async(&mut connection))
            .await?;
        Ok(())
    }

    /// Moves one key's ledger from an older layout into the current one
    /// (`migrate_key.lua`): its usage and terms into its account's ledger
    /// hash, its live holds with them. Part of a migration, run with every
    /// gateway instance stopped; running it again moves nothing. Returns
    /// how many holds moved.
    pub async fn move_key_ledger(&self, account: &str, key: &str) -> Result<u64, StoreError> {
        const OPERATION: &str = "migrate";
        let scoped = self.scoped(account);
        let [ledger, ids, ..] = self.account_ledger_keys(&scoped);
        let mut invocation = self.scripts.migrate_key.prepare_invoke();
        invocation.key(ledger).key(ids);
        for name in key_ledger_keys(&scoped, key) {
            invocation.key(name);
        }
        invocation
            .key(format!("{scoped}holds"))
            .key(format!("{scoped}holdamt"))
            .arg(key)
            .arg(duration_micros(LAPSED_HOLD_MEMORY));
        let reply = self.run(OPERATION, &invocation).await?;
        unsigned(OPERATION, &reply)
    }

    /// Ends an account's migration, once every key of it has moved
    /// ([`move_key_ledger`](Self::move_key_ledger)): the holds on its
    /// balance the older layout still has belong to keys no longer listed,
    /// whose requests ended with their instances, and are charged to the
    /// balance now, as their lapse would have been. Returns how many.
    pub async fn finish_account_ledger(&self, account: &str) -> Result<u64, StoreError> {
        const OPERATION: &str = "migrate";
        let scoped = self.scoped(account);
        let mut invocation = self.scripts.migrate_account.prepare_invoke();
        invocation
            .key(self.ledger_hash(account))
            .key(format!("{scoped}holds"))
            .key(format!("{scoped}holdamt"));
        let reply = self.run(OPERATION, &invocation).await?;
        unsigned(OPERATION, &reply)
    }

    fn layout_key(&self) -> String {
        format!("{}:{{layout}}:version", self.config.key_prefix)
    }

    /// Refuses a Redis whose data is in another layout: one recorded as
    /// older or newer, or none recorded over a gateway's data (layout 1,
    /// which recorded none). A Redis with no gateway data is given the
    /// current layout.
    async fn check_layout(&self) -> Result<(), StoreError> {
        const OPERATION: &str = "connect";
        if !self.config.check_layout {
            return Ok(());
        }
        let version = match self.layout().await? {
            Some(version) => version,
            None => {
                // A gateway's data always has its key records.
                let [values, ..] = self.collection_keys(super::KEYS);
                let mut connection = self.connection.clone();
                let command = redis::cmd("EXISTS").arg(values).to_owned();
                let existing: i64 = self
                    .bounded(OPERATION, command.query_async(&mut connection))
                    .await?;
                if existing == 0 {
                    let command = redis::cmd("SET")
                        .arg(self.layout_key())
                        .arg(LEDGER_LAYOUT)
                        .arg("NX")
                        .to_owned();
                    let _set: Option<String> = self
                        .bounded(OPERATION, command.query_async(&mut connection))
                        .await?;
                    return Ok(());
                }
                1
            }
        };
        match version.cmp(&LEDGER_LAYOUT) {
            std::cmp::Ordering::Equal => Ok(()),
            std::cmp::Ordering::Less => Err(StoreError::new(
                OPERATION,
                StoreErrorKind::Layout(format!(
                    "this Redis holds the gateway's data in layout {version}, written by an older \
                     version; this version uses layout {LEDGER_LAYOUT}. Stop the older instances \
                     and run `proxy migrate-store --redis URL` once (it moves each key's ledger \
                     and terms into its account's, then records layout {LEDGER_LAYOUT})"
                )),
            )),
            std::cmp::Ordering::Greater => Err(StoreError::new(
                OPERATION,
                StoreErrorKind::Layout(format!(
                    "this Redis holds the gateway's data in layout {version}, newer than this \
                     version's {LEDGER_LAYOUT}: run the newer version"
                )),
            )),
        }
    }

    async fn check_settings(&self) {
        warn_if_evicting(self.config_get("maxmemory-policy").await);
        warn_if_not_durable(self.config_get("append*").await);
    }

    /// `CONFIG GET pattern`: name, value, name, value….
    async fn config_get(&self, pattern: &str) -> redis::RedisResult<Vec<String>> {
        let mut connection = self.connection.clone();
        let command = redis::cmd("CONFIG").arg("GET").arg(pattern).to_owned();
        let query = command.query_async(&mut connection);
        match tokio::time::timeout(self.config.call_timeout, query).await {
            Ok(reply) => reply,
            Err(_) => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "CONFIG GET timed out",
            ))),
        }
    }

    /// Whether the circuit breaker is open: the store failed
    /// [`breaker_failures`](RedisStoreConfig::breaker_failures) calls in a
    /// row and calls fail at once with [`StoreErrorKind::CircuitOpen`]
    /// until a probe after the cool-down succeeds. For readiness checks:
    /// an open breaker means the store is not usable now. Shared by every
    /// clone of the store.
    pub fn circuit_open(&self) -> bool {
        self.breaker.is_open()
    }

    /// Sends `PING`: whether the store answers within its timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut connection = self.connection.clone();
        let reply: String = self
            .bounded("ping", redis::cmd("PING").query_async(&mut connection))
            .await?;
        if reply == "PONG" {
            Ok(())
        } else {
            Err(StoreError::corrupt("ping", reply))
        }
    }

    /// Every call to Redis: refused at once while the circuit breaker is
    /// open, else bounded by `call_timeout`, and its outcome told to the
    /// breaker.
    async fn bounded<T>(
        &self,
        operation: &'static str,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        let Some(permit) = self.breaker.admit() else {
            crate::telemetry::store_circuit_refusal(operation);
            return Err(StoreError::new(operation, StoreErrorKind::CircuitOpen));
        };
        let started = std::time::Instant::now();
        let result = match tokio::time::timeout(self.config.call_timeout, call).await {
            Err(_) => {
                permit.failed();
                Err(StoreError::new(
                    operation,
                    StoreErrorKind::Timeout(self.config.call_timeout),
                ))
            }
            Ok(Ok(value)) => {
                permit.succeeded();
                Ok(value)
            }
            Ok(Err(error)) => {
                if store_is_sick(&error) {
                    permit.failed();
                } else {
                    permit.succeeded();
                }
                Err(backend(operation, error))
            }
        };
        crate::telemetry::store_call(operation, started.elapsed(), result.is_ok());
        result
    }

    /// Loads the [`LIBRARY`] (on every primary of a Cluster), refusing a
    /// Redis without Functions (before 7).
    async fn load_library(&self) -> Result<(), StoreError> {
        const OPERATION: &str = "connect";
        let mut connection = self.connection.clone();
        let command = load_library_command();
        // A refused command is an answer, not a sick store.
        let loading = async {
            match command.query_async::<Value>(&mut connection).await {
                Ok(_) => Ok(Ok(())),
                Err(error)
                    if error.kind()
                        == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) =>
                {
                    Ok(Err(error))
                }
                Err(error) => Err(error),
            }
        };
        match self.bounded(OPERATION, loading).await? {
            Ok(()) => Ok(()),
            Err(error)
                if error
                    .detail()
                    .is_some_and(|detail| detail.starts_with("unknown command")) =>
            {
                Err(backend(
                    OPERATION,
                    format!(
                        "this Redis has no FUNCTION command ({error}): the store runs as a \
                         Redis Functions library, which needs Redis 7 or later"
                    ),
                ))
            }
            Err(error) => Err(backend(
                OPERATION,
                format!("cannot load the store's function library: {error}"),
            )),
        }
    }

    /// Sends one call as `FCALL`. A Redis that has lost the library (a
    /// restart without persistence, `FUNCTION FLUSH`, a node that never
    /// had it) refuses the call without running it: the library is loaded
    /// again and the call sent once more, within the same timeout. Nothing
    /// else is ever resent. Of the calls refused together, one loads the
    /// library and the others wait for it, so a restarted Redis compiles
    /// it once per instance rather than once per call in flight.
    async fn run(
        &self,
        operation: &'static str,
        invocation: &FunctionCall<'_>,
    ) -> Result<Value, StoreError> {
        let mut connection = self.connection.clone();
        let command = invocation.command();
        let call = async {
            use std::sync::atomic::Ordering;
            let reloads_before = self.reloads.done.load(Ordering::Acquire);
            match command.query_async(&mut connection).await {
                Err(error) if function_missing(&error) => {
                    let loading = self.reloads.loading.lock().await;
                    // Unless another call loaded it after this one was sent.
                    if self.reloads.done.load(Ordering::Acquire) == reloads_before {
                        let _: Value = load_library_command().query_async(&mut connection).await?;
                        self.reloads.done.fetch_add(1, Ordering::Release);
                    }
                    drop(loading);
                    command.query_async(&mut connection).await
                }
                reply => reply,
            }
        };
        self.bounded(operation, call).await
    }

    /// `{prefix}:{scope}:` — the hash tag keeps one account in one slot.
    fn scoped(&self, scope: &str) -> String {
        let mut key = String::with_capacity(self.config.key_prefix.len() + scope.len() + 8);
        key.push_str(&self.config.key_prefix);
        key.push_str(":{");
        escape_into(&mut key, scope);
        key.push_str("}:");
        key
    }

    /// A slot set: `{prefix}:{scope}:s:{name}`, in the scope's Cluster slot.
    fn slot_key(&self, scope: &str, name: &str) -> String {
        let mut key = self.scoped(scope);
        key.push_str("s:");
        escape_into(&mut key, name);
        key
    }

    /// An account's ledger hash (see `ledger_common.lua`).
    fn ledger_hash(&self, account: &str) -> String {
        self.ledger_hash_of(&self.scoped(account))
    }

    /// The same, of an account already scoped (`mg:{account}:`).
    fn ledger_hash_of(&self, scoped: &str) -> String {
        format!("{scoped}acct")
    }

    /// An account's ledger keys, every ledger script names first: its
    /// hash (the account, its keys and the requests it tracks), its ids
    /// zset, and its generation records (see `ledger_common.lua`).
    fn account_ledger_keys(&self, scoped: &str) -> [String; 4] {
        let [records, expiries] = self.generation_keys(scoped);
        [
            format!("{scoped}acct"),
            format!("{scoped}ids"),
            records,
            expiries,
        ]
    }

    /// The `now` a script is given: the caller's, or nothing, so that it
    /// reads Redis's clock.
    fn now_arg(&self, now: DateTime<Utc>) -> String {
        match self.config.time_source {
            TimeSource::Redis => String::new(),
            TimeSource::Caller => unix_micros(now).to_string(),
        }
    }

    fn slack_millis(&self) -> u64 {
        u64::try_from(self.config.expiry_slack.as_millis()).unwrap_or(u64::MAX)
    }

    /// A counter's base key and its script arguments (kind and parameter).
    fn counter_key(&self, scoped: &str, check: &Check) -> (String, &'static str, String) {
        let mut counter = String::with_capacity(scoped.len() + check.name.len() + 8);
        counter.push_str(scoped);
        counter.push_str("c:");
        let (kind, parameter) = match check.limit {
            Limit::FixedWindow { window, .. } => {
                counter.push_str("w:");
                ("f", duration_micros(window).to_string())
            }
            Limit::Calendar { period, .. } => {
                counter.push_str("w:");
                ("c", period.as_str()[..1].to_owned())
            }
            Limit::Rolling { window, .. } => {
                counter.push_str("r:");
                ("r", duration_micros(window).to_string())
            }
            Limit::Gcra { rate, period, .. } => {
                counter.push_str("g:");
                // Validated: at least 1 µs per unit.
                (
                    "g",
                    (duration_micros(period) / i64::try_from(rate).unwrap_or(i64::MAX)).to_string(),
                )
            }
        };
        escape_into(&mut counter, &check.name);
        (counter, kind, parameter)
    }

    /// Each check's two keys and four arguments, as `counters.lua` reads them.
    fn add_checks(&self, invocation: &mut FunctionCall<'_>, scoped: &str, checks: &[Check]) {
        for check in checks {
            let (counter, kind, parameter) = self.counter_key(scoped, check);
            // A GCRA counter keeps its state in the scope's account hash
            // when it exists (`counters.lua`); the others their own keys.
            let auxiliary = if kind == "g" {
                self.ledger_hash_of(scoped)
            } else {
                format!("{counter}:aux")
            };
            invocation
                .key(counter)
                .key(auxiliary)
                .arg(kind)
                .arg(check.limit.capacity())
                .arg(check.amount)
                .arg(parameter);
        }
    }

    /// Runs the ledger's one write script: `settlements`, then the
    /// admission `request` when given, all of `account`, in one round trip.
    async fn write_ledger(
        &self,
        operation: &'static str,
        account: &str,
        settlements: &[Settlement],
        renewals: Option<(&[HoldRenewal], Duration)>,
        request: Option<&AdmitRequest>,
        now: DateTime<Utc>,
    ) -> Result<Value, StoreError> {
        let scoped = self.scoped(account);
        let mut invocation = self.scripts.ledger_write.prepare_invoke();
        for name in self.account_ledger_keys(&scoped) {
            invocation.key(name);
        }
        invocation
            .arg(self.now_arg(now))
            .arg(duration_micros(SETTLEMENT_MEMORY))
            .arg(duration_micros(LAPSED_HOLD_MEMORY))
            .arg(self.slack_millis())
            .arg(account)
            .arg(settlements.len());
        for settlement in settlements {
            invocation
                .arg(&settlement.key)
                .arg(&settlement.reservation_id)
                .arg(settlement.cost_nanos)
                .arg(u8::from(settlement.byok));
            match &settlement.record {
                Some(record) => invocation
                    .arg(record.bytes.as_ref())
                    .arg(duration_micros(record.retention))
                    .arg(record.max_per_account),
                None => invocation.arg("").arg(0).arg(0),
            };
        }
        match renewals {
            Some((renewals, ttl)) => {
                invocation.arg(renewals.len()).arg(duration_micros(ttl));
                for renewal in renewals {
                    invocation.arg(&renewal.key).arg(&renewal.reservation_id);
                }
            }
            None => {
                invocation.arg(0).arg(0);
            }
        }
        let Some(request) = request else {
            return self.run(operation, &invocation).await;
        };
        invocation.arg(request.checks.len());
        self.add_checks(&mut invocation, &scoped, &request.checks);
        match request.purchase_tier {
            Some(tier) => invocation
                .arg(tier.check_index + 1)
                .arg(tier.threshold_nanos)
                .arg(tier.raised_capacity),
            None => invocation.arg(0).arg(0).arg(0),
        };
        if let Some(hold) = &request.hold {
            let (has_limit, limit_nanos, reset, include_byok) = match hold.key_limit {
                Some(limit) => (
                    1,
                    limit.limit_nanos,
                    limit.reset.map_or("n", |period| &period.as_str()[..1]),
                    limit.include_byok,
                ),
                None => (0, 0, "n", false),
            };
            invocation
                .arg(&hold.key)
                .arg(&hold.reservation_id)
                .arg(hold.amount_nanos)
                .arg(
                    hold.min_amount_nanos
                        .map(|min| min.to_string())
                        .unwrap_or_default(),
                )
                .arg(duration_micros(hold.ttl))
                .arg(has_limit)
                .arg(limit_nanos)
                .arg(reset)
                .arg(u8::from(include_byok))
                .arg(u8::from(hold.check_balance))
                .arg(u8::from(hold.covered_by_balance))
                .arg(u8::from(hold.counts_against_key_limit));
            match &hold.lapse_record {
                Some(keeping) => invocation
                    .arg(duration_micros(keeping.retention))
                    .arg(keeping.max_per_account)
                    .arg(keeping.model.as_deref().unwrap_or_default()),
                None => invocation.arg("").arg(0).arg(""),
            };
        }
        self.run(operation, &invocation).await
    }

    /// Runs `generations.lua`: one record of `account` by reservation id,
    /// or its newest.
    async fn read_generations(
        &self,
        operation: &'static str,
        account: &str,
        wanted: GenerationRead<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<Bytes>, StoreError> {
        let scoped = self.scoped(account);
        let [values, expiries] = self.generation_keys(&scoped);
        let mut invocation = self.scripts.generations.prepare_invoke();
        invocation
            .key(&values)
            .key(&expiries)
            .key(format!("{scoped}acct"))
            .arg(self.now_arg(now));
        match wanted {
            GenerationRead::One(id) => {
                invocation.arg("one").arg(id);
            }
            GenerationRead::Page(page) => {
                if let Some(key) = page.key {
                    // The key's own order.
                    invocation.key(format!("{expiries}:{key}"));
                }
                invocation.arg("page").arg(page.limit).arg(page.skip);
            }
        }
        let reply = self.run(operation, &invocation).await?;
        let Value::Array(records) = reply else {
            return Err(StoreError::corrupt(operation, "expected a list of records"));
        };
        records
            .into_iter()
            .map(|record| match record {
                Value::BulkString(bytes) => Ok(Bytes::from(bytes)),
                _ => Err(StoreError::corrupt(
                    operation,
                    "a record that is not a string",
                )),
            })
            .collect()
    }

    /// Puts `account`'s records kept before keys had orders of their own
    /// in those orders, once: a chunk a call, newest first, then the mark
    /// `genkeyed`. Records written meanwhile are put there by the ledger.
    async fn ensure_key_orders(&self, account: &str) -> Result<(), StoreError> {
        const OPERATION: &str = "generations_page";
        let known = self
            .keyed_accounts
            .lock()
            .map(|accounts| accounts.contains(account))
            .unwrap_or(false);
        if known {
            return Ok(());
        }
        let scoped = self.scoped(account);
        let [values, expiries] = self.generation_keys(&scoped);
        let mark = format!("{scoped}genkeyed");
        let mut connection = self.connection.clone();
        let command = redis::cmd("EXISTS").arg(&mark).to_owned();
        let marked: Value = self
            .bounded(OPERATION, command.query_async(&mut connection))
            .await?;
        if integer(OPERATION, &marked)? == 0 {
            let mut start = 0;
            loop {
                let mut invocation = self.scripts.generations.prepare_invoke();
                invocation
                    .key(&values)
                    .key(&expiries)
                    .key(format!("{scoped}acct"))
                    .key(&mark)
                    .arg("")
                    .arg("order")
                    .arg(KEY_ORDER_CHUNK)
                    .arg(start);
                let read = integer(OPERATION, &self.run(OPERATION, &invocation).await?)?;
                if read < KEY_ORDER_CHUNK as i64 {
                    break;
                }
                start += KEY_ORDER_CHUNK - KEY_ORDER_OVERLAP;
            }
        }
        if let Ok(mut accounts) = self.keyed_accounts.lock() {
            accounts.insert(account.to_owned());
        }
        Ok(())
    }

    /// A scope's app usage hashes for the day, week and month, in one slot.
    fn app_usage_keys(&self, scope: &str) -> [String; 3] {
        let mut tagged = String::from("apps:");
        tagged.push_str(scope);
        let scoped = self.scoped(&tagged);
        ["d", "w", "m"].map(|period| format!("{scoped}{period}"))
    }

    /// An account's generation records: values hash (reservation id ->
    /// record) and expiries zset (id -> µs), in the account's slot.
    fn generation_keys(&self, scoped: &str) -> [String; 2] {
        [format!("{scoped}gen"), format!("{scoped}genexp")]
    }

    /// A collection's keys: values hash, revisions hash, creation-order
    /// zset, sequence counter and expiries zset, all under the collection's
    /// hash tag.
    fn collection_keys(&self, collection: &str) -> [String; 5] {
        let mut scope = String::from("r:");
        scope.push_str(collection);
        let scoped = self.scoped(&scope);
        ["values", "revs", "order", "seq", "exp"].map(|name| format!("{scoped}{name}"))
    }

    fn ttl_millis(&self, lifetime: Duration) -> u64 {
        let with_slack = lifetime.saturating_add(self.config.expiry_slack);
        u64::try_from(with_slack.as_millis()).unwrap_or(u64::MAX)
    }

    /// Credits `amount_nanos` once per `purchase` (a key already escaped)
    /// of the account, remembering it for a day: `top_up.lua`, one atomic
    /// step. `now` as [`now_arg`](Self::now_arg) gives it.
    async fn credit_once(
        &self,
        account: &str,
        amount_nanos: i64,
        purchase: &str,
        now: String,
    ) -> Result<TopUpOutcome, StoreError> {
        const OPERATION: &str = "top_up";
        // `mg:{acct}:topup:<key>`: in the account's slot, beside its hash.
        let mut record = self.scoped(account);
        let account_key = format!("{record}acct");
        record.push_str("topup:");
        record.push_str(purchase);
        let memory = super::ledger::idempotency_key_ttl();
        let mut invocation = self.scripts.top_up.prepare_invoke();
        invocation
            .key(account_key)
            .key(record)
            .arg(amount_nanos)
            .arg(now)
            .arg(duration_micros(memory))
            .arg(self.ttl_millis(memory));
        let reply = self.run(OPERATION, &invocation).await?;
        if let Value::BulkString(text) = &reply
            && text.as_slice() == b"overflow"
        {
            return Err(top_up_overflow());
        }
        let reply = array(OPERATION, reply)?;
        let Some((verdict, figures)) = reply.split_first() else {
            return Err(StoreError::corrupt(OPERATION, "an empty reply"));
        };
        match (bytes(OPERATION, verdict.clone())?.as_slice(), figures) {
            (b"credited", _) => Ok(TopUpOutcome::Credited(balance_from(OPERATION, figures)?)),
            (b"repeated", _) => Ok(TopUpOutcome::Repeated(balance_from(OPERATION, figures)?)),
            (b"reused", [first]) => Ok(TopUpOutcome::KeyReused {
                first_amount_nanos: integer(OPERATION, first)?,
            }),
            _ => Err(StoreError::corrupt(OPERATION, format!("{reply:?}"))),
        }
    }
}

/// What [`RedisStore::read_generations`] reads.
enum GenerationRead<'a> {
    One(&'a str),
    Page(GenerationsPage<'a>),
}

/// A key's ledger in layouts 1 and 2, under an account's `scoped` prefix
/// (read only to migrate it): usage hash, holds zset, hold amounts hash,
/// the zset of settled and lapsed ids, and what each lapse charged.
fn key_ledger_keys(scoped: &str, key: &str) -> [String; 5] {
    let mut key_base = format!("{scoped}k:");
    escape_into(&mut key_base, key);
    ["use", "res", "resamt", "settled", "lapsed"].map(|name| format!("{key_base}:{name}"))
}

/// The reply of the ledger script to an admission.
fn admit_outcome(
    operation: &'static str,
    reply: Value,
    request: &AdmitRequest,
) -> Result<AdmitOutcome, StoreError> {
    let reply = array(operation, reply)?;
    if reply.len() != 5 + 6 * request.checks.len() {
        return Err(StoreError::corrupt(
            operation,
            format!("reply of {} values", reply.len()),
        ));
    }
    let field = |index: usize| integer(operation, &reply[index]);
    let decided_at = crate::clock::from_unix_micros(field(1)?);
    let checks = reply[5..]
        .chunks_exact(6)
        .map(|fields| {
            Ok(CheckOutcome {
                admitted: integer(operation, &fields[0])? == 1,
                used: unsigned(operation, &fields[1])?,
                remaining: unsigned(operation, &fields[2])?,
                retry_after: micros(operation, &fields[3])?,
                reset_after: micros(operation, &fields[4])?,
                limit: unsigned(operation, &fields[5])?,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let (admitted, hold) = match field(0)? {
        0 => (
            true,
            request.hold.as_ref().map(|_| -> Result<_, StoreError> {
                Ok(ReserveOutcome::Reserved {
                    used_nanos: field(2)?,
                    reserved_nanos: field(3)?,
                    held_nanos: field(4)?,
                })
            }),
        ),
        // The limit the store decided by (the key's own terms, or the
        // request's): its amount, and its reset's letter.
        1 => (
            false,
            Some(Ok(ReserveOutcome::KeyLimitReached {
                used_nanos: field(2)?,
                limit_nanos: field(3)?,
                resets_at: match bytes(operation, reply[4].clone())?.as_slice() {
                    b"d" => Some(Period::Day),
                    b"w" => Some(Period::Week),
                    b"m" => Some(Period::Month),
                    _ => None,
                }
                .map(|period| period.end_of(decided_at)),
            })),
        ),
        2 => (
            false,
            Some(Ok(ReserveOutcome::BalanceNegative {
                balance_nanos: field(2)?,
            })),
        ),
        3 => (
            false,
            Some(Ok(ReserveOutcome::BalanceInsufficient {
                balance_nanos: field(2)?,
                held_nanos: field(3)?,
            })),
        ),
        4 => (false, None),
        5 => (false, Some(Ok(ReserveOutcome::KeyRevoked))),
        6 => (
            false,
            Some(Ok(ReserveOutcome::KeyExpired {
                expired_at: crate::clock::from_unix_micros(field(2)?),
            })),
        ),
        other => {
            return Err(StoreError::corrupt(
                operation,
                format!("unknown outcome {other}"),
            ));
        }
    };
    Ok(AdmitOutcome {
        admitted,
        checks,
        hold: hold.transpose()?,
        decided_at,
    })
}

/// `TCP_NODELAY`: the redis crate leaves Nagle's algorithm on, which holds
/// each small script call back until the previous one is acknowledged
/// (40 ms with delayed ACKs) once requests overlap on the shared connection.
fn low_latency_tcp() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

/// Writes `part` so that it cannot break out of its place in a key: bytes
/// outside `[A-Za-z0-9._-]` become `%XX`, so `{`, `}` and `:` in an account
/// id can neither move the hash tag nor collide with another key. The empty
/// string becomes `%`.
fn escape_into(out: &mut String, part: &str) {
    // An empty hash tag `{}` would make Redis hash the whole key, splitting
    // one account over several slots; a lone `%` never comes from escaping.
    if part.is_empty() {
        out.push('%');
    }
    for byte in part.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-') {
            out.push(char::from(byte));
        } else {
            out.push('%');
            out.push(char::from(b"0123456789ABCDEF"[usize::from(byte >> 4)]));
            out.push(char::from(b"0123456789ABCDEF"[usize::from(byte & 0xF)]));
        }
    }
}

fn array(operation: &'static str, value: Value) -> Result<Vec<Value>, StoreError> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(StoreError::corrupt(
            operation,
            format!("expected an array, got {other:?}"),
        )),
    }
}

fn integer(operation: &'static str, value: &Value) -> Result<i64, StoreError> {
    let text = match value {
        Value::Int(number) => return Ok(*number),
        Value::Nil => return Ok(0),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok(),
        Value::SimpleString(text) => Some(text.as_str()),
        _ => None,
    };
    text.and_then(|text| text.parse().ok()).ok_or_else(|| {
        StoreError::corrupt(operation, format!("expected an integer, got {value:?}"))
    })
}

fn unsigned(operation: &'static str, value: &Value) -> Result<u64, StoreError> {
    let number = integer(operation, value)?;
    u64::try_from(number).map_err(|_| {
        StoreError::corrupt(
            operation,
            format!("expected a non-negative integer, got {number}"),
        )
    })
}

fn bytes(operation: &'static str, value: Value) -> Result<Vec<u8>, StoreError> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        other => Err(StoreError::corrupt(
            operation,
            format!("expected a string, got {other:?}"),
        )),
    }
}

fn micros(operation: &'static str, value: &Value) -> Result<Duration, StoreError> {
    Ok(micros_duration(integer(operation, value)?))
}

/// A conflict reply `{0, revision or nil, value or nil}`.
fn conflict(operation: &'static str, mut reply: Vec<Value>) -> Result<WriteOutcome, StoreError> {
    let value = reply.pop().unwrap_or(Value::Nil);
    let revision = reply.pop().unwrap_or(Value::Nil);
    let current = match (revision, value) {
        (Value::Nil, _) => None,
        (revision, value) => Some(Versioned {
            revision: unsigned(operation, &revision)?,
            value: bytes(operation, value)?,
        }),
    };
    Ok(WriteOutcome::Conflict { current })
}

fn write_outcome(operation: &'static str, reply: Value) -> Result<WriteOutcome, StoreError> {
    let reply = array(operation, reply)?;
    match reply
        .first()
        .map(|flag| integer(operation, flag))
        .transpose()?
    {
        Some(1) => Ok(WriteOutcome::Written {
            revision: unsigned(operation, reply.get(1).unwrap_or(&Value::Nil))?,
        }),
        Some(0) => conflict(operation, reply),
        _ => Err(StoreError::corrupt(
            operation,
            format!("unexpected reply {reply:?}"),
        )),
    }
}

fn expectation_args(expect: Expect) -> (&'static str, u64) {
    match expect {
        Expect::Any => ("any", 0),
        Expect::Absent => ("absent", 0),
        Expect::Revision(revision) => ("rev", revision),
    }
}

#[async_trait]
impl CounterStore for RedisStore {
    async fn ping(&self) -> Result<(), StoreError> {
        RedisStore::ping(self).await
    }

    async fn check_and_add(
        &self,
        scope: &str,
        checks: &[Check],
        now: DateTime<Utc>,
    ) -> Result<Decision, StoreError> {
        const OPERATION: &str = "check_and_add";
        validate_checks(OPERATION, checks)?;
        let scoped = self.scoped(scope);
        let mut invocation = self.scripts.check_and_add.prepare_invoke();
        invocation.arg(self.now_arg(now)).arg(self.slack_millis());
        self.add_checks(&mut invocation, &scoped, checks);
        let reply = array(OPERATION, self.run(OPERATION, &invocation).await?)?;
        if reply.len() != 2 + 5 * checks.len() {
            return Err(StoreError::corrupt(
                OPERATION,
                format!("reply of {} values", reply.len()),
            ));
        }
        let admitted = integer(OPERATION, &reply[0])? == 1;
        let outcomes = reply[2..]
            .chunks_exact(5)
            .zip(checks)
            .map(|(fields, check)| {
                Ok(CheckOutcome {
                    admitted: integer(OPERATION, &fields[0])? == 1,
                    limit: check.limit.capacity(),
                    used: unsigned(OPERATION, &fields[1])?,
                    remaining: unsigned(OPERATION, &fields[2])?,
                    retry_after: micros(OPERATION, &fields[3])?,
                    reset_after: micros(OPERATION, &fields[4])?,
                })
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(Decision { admitted, outcomes })
    }

    async fn acquire_slot(
        &self,
        scope: &str,
        name: &str,
        holder: &str,
        limit: u64,
        lease: Duration,
        now: DateTime<Utc>,
    ) -> Result<SlotOutcome, StoreError> {
        const OPERATION: &str = "acquire_slot";
        validate_slot(limit, lease, holder)?;
        let now_micros = unix_micros(now);
        let mut invocation = self.scripts.acquire_slot.prepare_invoke();
        invocation
            .key(self.slot_key(scope, name))
            .arg(now_micros)
            .arg(holder)
            .arg(limit)
            .arg(now_micros.saturating_add(duration_micros(lease)))
            .arg(u64::try_from(self.config.expiry_slack.as_millis()).unwrap_or(u64::MAX));
        let reply = array(OPERATION, self.run(OPERATION, &invocation).await?)?;
        let [acquired, held, retry_after] = reply.as_slice() else {
            return Err(StoreError::corrupt(
                OPERATION,
                format!("reply of {} values", reply.len()),
            ));
        };
        Ok(SlotOutcome {
            acquired: integer(OPERATION, acquired)? == 1,
            held: unsigned(OPERATION, held)?,
            limit,
            retry_after: micros(OPERATION, retry_after)?,
        })
    }

    async fn release_slot(&self, scope: &str, name: &str, holder: &str) -> Result<(), StoreError> {
        const OPERATION: &str = "release_slot";
        let mut connection = self.connection.clone();
        let command = redis::cmd("ZREM")
            .arg(self.slot_key(scope, name))
            .arg(holder)
            .to_owned();
        // The count removed is 0 for a slot not held (or already expired): fine.
        let _removed: i64 = self
            .bounded(OPERATION, command.query_async(&mut connection))
            .await?;
        Ok(())
    }
}

#[async_trait]
impl LedgerStore for RedisStore {
    async fn admit_after_settling(
        &self,
        settlements: &[Settlement],
        request: &AdmitRequest,
        now: DateTime<Utc>,
    ) -> Result<AdmitOutcome, StoreError> {
        const OPERATION: &str = "admit";
        validate_admit(settlements, request)?;
        let reply = self
            .write_ledger(
                OPERATION,
                &request.account,
                settlements,
                None,
                Some(request),
                now,
            )
            .await?;
        admit_outcome(OPERATION, reply, request)
    }

    async fn settle(&self, settlement: &Settlement, now: DateTime<Utc>) -> Result<(), StoreError> {
        const OPERATION: &str = "settle";
        validate_settlements(OPERATION, std::slice::from_ref(settlement), None)?;
        self.write_ledger(
            OPERATION,
            &settlement.account,
            std::slice::from_ref(settlement),
            None,
            None,
            now,
        )
        .await?;
        Ok(())
    }

    async fn settle_many(
        &self,
        settlements: &[Settlement],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        const OPERATION: &str = "settle_many";
        validate_settlements(OPERATION, settlements, None)?;
        let Some(first) = settlements.first() else {
            return Ok(());
        };
        self.write_ledger(OPERATION, &first.account, settlements, None, None, now)
            .await?;
        Ok(())
    }

    async fn renew_holds(
        &self,
        account: &str,
        holds: &[HoldRenewal],
        ttl: Duration,
        now: DateTime<Utc>,
    ) -> Result<u64, StoreError> {
        const OPERATION: &str = "renew_holds";
        validate_renewals(ttl)?;
        if holds.is_empty() {
            return Ok(0);
        }
        let reply = self
            .write_ledger(OPERATION, account, &[], Some((holds, ttl)), None, now)
            .await?;
        match array(OPERATION, reply)?.as_slice() {
            [_, renewed] => unsigned(OPERATION, renewed),
            other => Err(StoreError::corrupt(
                OPERATION,
                format!("reply of {} values", other.len()),
            )),
        }
    }

    fn batches_settlements(&self) -> bool {
        true
    }

    async fn key_usage(
        &self,
        account: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<KeyUsage, StoreError> {
        const OPERATION: &str = "key_usage";
        let scoped = self.scoped(account);
        let mut invocation = self.scripts.key_usage.prepare_invoke();
        for name in self.account_ledger_keys(&scoped) {
            invocation.key(name);
        }
        invocation
            .arg(self.now_arg(now))
            .arg(duration_micros(LAPSED_HOLD_MEMORY))
            .arg(self.slack_millis())
            .arg(account)
            .arg(key);
        let reply = array(OPERATION, self.run(OPERATION, &invocation).await?)?;
        if reply.len() != 9 {
            return Err(StoreError::corrupt(
                OPERATION,
                format!("reply of {} values", reply.len()),
            ));
        }
        let field = |index: usize| integer(OPERATION, &reply[index]);
        Ok(KeyUsage {
            total_nanos: field(0)?,
            byok_total_nanos: field(1)?,
            day_nanos: field(2)?,
            byok_day_nanos: field(3)?,
            week_nanos: field(4)?,
            byok_week_nanos: field(5)?,
            month_nanos: field(6)?,
            byok_month_nanos: field(7)?,
            reserved_nanos: field(8)?,
        })
    }

    async fn top_up(&self, account: &str, amount_nanos: i64) -> Result<AccountBalance, StoreError> {
        const OPERATION: &str = "top_up";
        validate_amount(OPERATION, amount_nanos)?;
        // A key of its own (128 random bits), so that the same call sent
        // twice (a resend after a lost reply) is credited once. `~` keeps it
        // apart from callers' keys, whose escaped form never has one.
        let purchase = format!("~{:032x}", crate::random::u128());
        // Redis's clock: the key is this call's alone, so no caller's time
        // need agree with it.
        match self
            .credit_once(account, amount_nanos, &purchase, String::new())
            .await?
        {
            TopUpOutcome::Credited(balance) | TopUpOutcome::Repeated(balance) => Ok(balance),
            TopUpOutcome::KeyReused { .. } => Err(StoreError::corrupt(
                OPERATION,
                "a fresh purchase key was found used for another amount",
            )),
        }
    }

    async fn top_up_once(
        &self,
        account: &str,
        amount_nanos: i64,
        idempotency_key: &str,
        now: DateTime<Utc>,
    ) -> Result<TopUpOutcome, StoreError> {
        validate_top_up_once(amount_nanos, idempotency_key)?;
        let mut purchase = String::with_capacity(idempotency_key.len());
        escape_into(&mut purchase, idempotency_key);
        self.credit_once(account, amount_nanos, &purchase, self.now_arg(now))
            .await
    }

    async fn set_key_terms(
        &self,
        account: &str,
        key: &str,
        terms: &KeyTerms,
    ) -> Result<(), StoreError> {
        const OPERATION: &str = "set_key_terms";
        validate_key_terms(terms)?;
        // In the account's ledger hash, which every admission of the key
        // reads in the same script: `t:<key>` = 'limit:reset:byok:expiry'
        // (limit '-' for none, reset n/d/w/m, BYOK counted 0/1, expiry µs
        // or '' for never).
        let (limit, reset, include_byok) = match terms.limit {
            Some(limit) => (
                limit.limit_nanos.to_string(),
                limit.reset.map_or("n", |period| &period.as_str()[..1]),
                limit.include_byok,
            ),
            None => ("-".to_owned(), "n", false),
        };
        let expiry = terms
            .expires_at
            .map(|at| unix_micros(at).to_string())
            .unwrap_or_default();
        let mut connection = self.connection.clone();
        let command = redis::cmd("HSET")
            .arg(self.ledger_hash(account))
            .arg(format!("t:{key}"))
            .arg(format!(
                "{limit}:{reset}:{}:{expiry}",
                u8::from(include_byok)
            ))
            .to_owned();
        let _added: i64 = self
            .bounded(OPERATION, command.query_async(&mut connection))
            .await?;
        Ok(())
    }

    async fn revoke_key(
        &self,
        account: &str,
        key: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        const OPERATION: &str = "revoke_key";
        // `r:<key>` in the account's ledger hash, where every admission of
        // the key reads it in the same script.
        let mut connection = self.connection.clone();
        let command = redis::cmd("HSET")
            .arg(self.ledger_hash(account))
            .arg(format!("r:{key}"))
            .arg(unix_micros(now))
            .to_owned();
        let _added: i64 = self
            .bounded(OPERATION, command.query_async(&mut connection))
            .await?;
        Ok(())
    }

    async fn generation(
        &self,
        account: &str,
        reservation_id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Bytes>, StoreError> {
        let mut records = self
            .read_generations(
                "generation",
                account,
                GenerationRead::One(reservation_id),
                now,
            )
            .await?;
        Ok(records.pop())
    }

    async fn generations_page(
        &self,
        account: &str,
        page: GenerationsPage<'_>,
        now: DateTime<Utc>,
    ) -> Result<Vec<Bytes>, StoreError> {
        if page.limit == 0 {
            return Ok(Vec::new());
        }
        if page.key.is_some() {
            self.ensure_key_orders(account).await?;
        }
        self.read_generations("generations_page", account, GenerationRead::Page(page), now)
            .await
    }

    async fn account_balance(&self, account: &str) -> Result<AccountBalance, StoreError> {
        const OPERATION: &str = "account_balance";
        let mut connection = self.connection.clone();
        let command = redis::cmd("HMGET")
            .arg(self.ledger_hash(account))
            .arg("purchased")
            .arg("balance")
            .to_owned();
        let reply: Value = self
            .bounded(OPERATION, command.query_async(&mut connection))
            .await?;
        balance_from(OPERATION, &array(OPERATION, reply)?)
    }
}

fn balance_from(operation: &'static str, reply: &[Value]) -> Result<AccountBalance, StoreError> {
    match reply {
        [purchased, balance] => Ok(AccountBalance {
            purchased_nanos: integer(operation, purchased)?,
            balance_nanos: integer(operation, balance)?,
        }),
        _ => Err(StoreError::corrupt(
            operation,
            format!("reply of {} values", reply.len()),
        )),
    }
}

#[async_trait]
impl AppUsageStore for RedisStore {
    async fn add_app_usage(
        &self,
        scope: &str,
        rows: &[AppUsage],
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        validate_app_usage(rows)?;
        if rows.is_empty() {
            return Ok(());
        }
        let mut invocation = self.scripts.app_usage_add.prepare_invoke();
        for key in self.app_usage_keys(scope) {
            invocation.key(key);
        }
        invocation
            .arg(self.now_arg(now))
            .arg(MAX_APP_USAGE_ROWS)
            .arg(self.slack_millis())
            .arg(rows.len());
        for row in rows {
            invocation
                .arg(&row.app)
                .arg(&row.details)
                .arg(&row.model)
                .arg(row.requests)
                .arg(row.tokens);
        }
        self.run("add_app_usage", &invocation).await?;
        Ok(())
    }

    async fn app_usage(
        &self,
        scope: &str,
        period: Period,
        now: DateTime<Utc>,
    ) -> Result<Vec<AppUsage>, StoreError> {
        const OPERATION: &str = "app_usage";
        let [day, week, month] = self.app_usage_keys(scope);
        let key = match period {
            Period::Day => day,
            Period::Week => week,
            Period::Month => month,
        };
        let mut invocation = self.scripts.app_usage_read.prepare_invoke();
        invocation
            .key(key)
            .arg(self.now_arg(now))
            .arg(&period.as_str()[..1]);
        let reply = self.run(OPERATION, &invocation).await?;
        app_usage_rows(OPERATION, reply)
    }
}

/// The rows of an app usage hash as `app_usage_read.lua` returns it
/// (field, value, …).
fn app_usage_rows(operation: &'static str, reply: Value) -> Result<Vec<AppUsage>, StoreError> {
    let corrupt = || StoreError::corrupt(operation, "an app usage hash that does not parse");
    let Value::Array(items) = reply else {
        return Err(corrupt());
    };
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).map_err(|_| corrupt()),
        _ => Err(corrupt()),
    };
    let mut details = std::collections::HashMap::new();
    let mut counts: std::collections::HashMap<(String, String), (u64, u64)> =
        std::collections::HashMap::new();
    for pair in items.chunks(2) {
        let [field, value] = pair else {
            return Err(corrupt());
        };
        let (field, value) = (text(field)?, text(value)?);
        let mut parts = field.splitn(3, FIELD_SEPARATOR);
        match (parts.next(), parts.next(), parts.next()) {
            (Some("a"), Some(app), None) => {
                details.insert(app.to_owned(), value);
            }
            (Some(kind @ ("r" | "t")), Some(app), Some(model)) => {
                let count: u64 = value.parse().map_err(|_| corrupt())?;
                let entry = counts
                    .entry((app.to_owned(), model.to_owned()))
                    .or_default();
                if kind == "r" {
                    entry.0 = count;
                } else {
                    entry.1 = count;
                }
            }
            // The period's start and the row count.
            _ => {}
        }
    }
    Ok(counts
        .into_iter()
        .map(|((app, model), (requests, tokens))| AppUsage {
            details: details.get(&app).cloned().unwrap_or_default(),
            app,
            model,
            requests,
            tokens,
        })
        .collect())
}

#[async_trait]
impl RecordStore for RedisStore {
    async fn get_record_at(
        &self,
        collection: &str,
        id: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<Versioned<Vec<u8>>>, StoreError> {
        const OPERATION: &str = "get_record";
        let [values, revisions, _, _, expiries] = self.collection_keys(collection);
        let mut invocation = self.scripts.get_record.prepare_invoke();
        invocation
            .key(values)
            .key(revisions)
            .key(expiries)
            .arg(id)
            .arg(self.now_arg(now));
        let mut reply = array(OPERATION, self.run(OPERATION, &invocation).await?)?;
        let revision = reply.pop().unwrap_or(Value::Nil);
        match (reply.pop().unwrap_or(Value::Nil), revision) {
            (Value::Nil, _) => Ok(None),
            (value, revision) => Ok(Some(Versioned {
                value: bytes(OPERATION, value)?,
                revision: unsigned(OPERATION, &revision)?,
            })),
        }
    }

    async fn put_record_at(
        &self,
        collection: &str,
        id: &str,
        value: &[u8],
        expect: Expect,
        options: PutOptions,
        now: DateTime<Utc>,
    ) -> Result<PutOutcome, StoreError> {
        const OPERATION: &str = "put_record";
        validate_put(&options)?;
        let (expectation, revision) = expectation_args(expect);
        let mut invocation = self.scripts.put_record.prepare_invoke();
        for key in self.collection_keys(collection) {
            invocation.key(key);
        }
        invocation
            .arg(id)
            .arg(value)
            .arg(expectation)
            .arg(revision)
            .arg(self.now_arg(now))
            .arg(
                options
                    .ttl
                    .map_or(String::new(), |ttl| duration_micros(ttl).to_string()),
            )
            .arg(
                options
                    .max_records
                    .map_or(String::new(), |max| max.to_string()),
            )
            .arg(self.slack_millis());
        let reply = self.run(OPERATION, &invocation).await?;
        if let Value::Array(fields) = &reply
            && let [Value::Int(2), records] = fields.as_slice()
        {
            return Ok(PutOutcome::Full {
                records: unsigned(OPERATION, records)?,
            });
        }
        write_outcome(OPERATION, reply).map(PutOutcome::Write)
    }

    async fn delete_record_at(
        &self,
        collection: &str,
        id: &str,
        expect: Expect,
        now: DateTime<Utc>,
    ) -> Result<WriteOutcome, StoreError> {
        const OPERATION: &str = "delete_record";
        let (expectation, revision) = expectation_args(expect);
        let mut invocation = self.scripts.delete_record.prepare_invoke();
        for key in self.collection_keys(collection) {
            invocation.key(key);
        }
        invocation
            .arg(id)
            .arg(expectation)
            .arg(revision)
            .arg(self.now_arg(now))
            .arg(self.slack_millis());
        write_outcome(OPERATION, self.run(OPERATION, &invocation).await?)
    }

    async fn list_records_at(
        &self,
        collection: &str,
        offset: usize,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Vec<(String, Versioned<Vec<u8>>)>, StoreError> {
        const OPERATION: &str = "list_records";
        // Ranks are worked out here, in integers: Lua would round them.
        let Ok(first) = i64::try_from(offset) else {
            return Ok(Vec::new());
        };
        let count = i64::try_from(limit).unwrap_or(i64::MAX);
        if count == 0 {
            return Ok(Vec::new());
        }
        let last = first.saturating_add(count - 1);
        let mut invocation = self.scripts.list_records.prepare_invoke();
        for key in self.collection_keys(collection) {
            invocation.key(key);
        }
        invocation.arg(first).arg(last).arg(self.now_arg(now));
        let reply = array(OPERATION, self.run(OPERATION, &invocation).await?)?;
        if reply.len() % 3 != 0 {
            return Err(StoreError::corrupt(
                OPERATION,
                format!("reply of {} values", reply.len()),
            ));
        }
        let mut records = Vec::with_capacity(reply.len() / 3);
        let mut fields = reply.into_iter();
        while let (Some(id), Some(value), Some(revision)) =
            (fields.next(), fields.next(), fields.next())
        {
            let id = String::from_utf8(bytes(OPERATION, id)?)
                .map_err(|error| StoreError::corrupt(OPERATION, error))?;
            records.push((
                id,
                Versioned {
                    value: bytes(OPERATION, value)?,
                    revision: unsigned(OPERATION, &revision)?,
                },
            ));
        }
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(part: &str) -> String {
        let mut out = String::new();
        escape_into(&mut out, part);
        out
    }

    #[test]
    fn the_library_is_named_after_its_lua_and_registers_every_operation_once() {
        let library = &*LIBRARY;
        let hash = library.name.strip_prefix("mg_").unwrap();
        assert_eq!(hash.len(), 12);
        assert!(hash.bytes().all(|byte| byte.is_ascii_hexdigit()));
        assert!(
            library
                .text
                .starts_with(&format!("#!lua name={}\n", library.name))
        );
        // The name covers everything but itself.
        assert_eq!(Library::new().name, library.name);
        assert_eq!(
            Library::text(&library.name).replace(&library.name, "mg"),
            Library::text("mg")
        );
        for (operation, _) in OPERATIONS {
            let registration = format!("redis.register_function('{}_{operation}',", library.name);
            assert_eq!(
                library.text.matches(&registration).count(),
                1,
                "{operation}"
            );
        }
        assert_eq!(
            library.text.matches("redis.register_function(").count(),
            OPERATIONS.len()
        );
        for shared in SHARED_LUA {
            assert_eq!(library.text.matches(shared).count(), 1);
        }
        let scripts = Scripts::new(library);
        assert_eq!(
            scripts.ledger_write.name,
            format!("{}_ledger_write", library.name)
        );
        let mut call = scripts.top_up.prepare_invoke();
        call.key("k1").arg("a1").key("k2").arg(2);
        let packed = call.command().get_packed_command();
        let expected = redis::cmd("FCALL")
            .arg(&scripts.top_up.name)
            .arg(2)
            .arg("k1")
            .arg("k2")
            .arg("a1")
            .arg(2)
            .get_packed_command();
        assert_eq!(packed, expected);
    }

    #[test]
    fn escaping_keeps_hash_tags_and_separators_unambiguous() {
        assert_eq!(escaped("acct-1_a.b"), "acct-1_a.b");
        assert_eq!(escaped("a}b{c:d"), "a%7Db%7Bc%3Ad");
        assert_eq!(escaped("ü"), "%C3%BC");
        assert_eq!(escaped(""), "%");
    }

    proptest::proptest! {
        #[test]
        fn escaped_parts_never_contain_key_syntax(part in ".*") {
            let out = escaped(&part);
            let key_syntax = ['{', '}', ':'];
            proptest::prop_assert!(!out.contains(key_syntax), "{}", out);
            proptest::prop_assert!(out.is_ascii());
        }

        #[test]
        fn escaping_is_injective(a in ".{0,8}", b in ".{0,8}") {
            if a != b {
                proptest::prop_assert_ne!(escaped(&a), escaped(&b));
            }
        }
    }
}
