//! API keys and accounts: the records ([`KeyRecord`], [`AccountRecord`]),
//! the [`KeyDirectory`] that reads and writes them, and the accounts' own
//! provider keys ([`ByokDirectory`]). The JSON API that manages them over
//! HTTP is `KeyRoutes` in `modelgate::api`; this module serves it and
//! knows nothing of its routes.
//!
//! There are two kinds of management key. The **operator's** (the proxy's
//! `MODELGATE_ADMIN_KEY`, or one made with [`KeyDirectory::create_key`])
//! manages every account. It belongs to no tenant account: it is recorded
//! on [`OPERATOR_ACCOUNT`], an id no account can take
//! ([`KeyDirectory::move_operator_keys`] moves those an older store keeps
//! on `default`). An **account's** management key
//! ([`KeyRecord::scoped_to_account`]) manages that account only. Neither
//! kind can call models. Inference keys read only themselves.
//!
//! Each key records `last_used_at` (written at most once a minute) and
//! `leak` (when, where and by whom it was reported leaked). Credits are
//! nano-credits in the store, JSON numbers (`12.5`) outside it. Usage
//! periods are UTC: the day, the week from Monday, the month. A key
//! deleted or disabled through one instance is refused at once there and
//! within the directory's cache time (default 1 s) everywhere else; a key
//! reported leaked is revoked in the ledger, which every chat admission
//! reads, and other routes read a live key afresh
//! ([`KeyDirectory::lookup_live`]).
//!
//! Each account's keys are indexed ([`account_keys`]), so listing an
//! account's keys reads that account's keys only; a store made before the
//! index gets it once ([`KeyDirectory::build_key_index`]).
//!
//! A service that starts many times on a durable store provisions its
//! keys, accounts and grants with [`KeyDirectory::ensure_key`],
//! [`KeyDirectory::ensure_named_account`] and [`KeyDirectory::grant_once`]:
//! made once, however often it starts (see [`EnsuredKey`]).
//!
//! ```
//! use std::sync::Arc;
//! use modelgate::keys::{KeyDirectory, KeyState, NewKey, SharedStore};
//! use modelgate::store::MemoryStore;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store: SharedStore = Arc::new(MemoryStore::new());
//! let directory = KeyDirectory::new(store);
//! let (key, record) = directory.create_key(NewKey::named("ci")).await.unwrap();
//! assert_eq!(record.name, "ci");
//! let found = directory.lookup(&key.hash()).await.unwrap();
//! assert!(matches!(found, KeyState::Active(_)));
//! # }
//! ```

pub mod byok;
pub(crate) mod credits;
mod directory;
mod import;
mod index;
pub mod input;
mod key;
mod leak;
mod lookup_cache;
mod provision;
mod record;

pub use byok::{
    ByokCredential, ByokDirectory, ByokDirectoryBuilder, ByokEntry, ByokError, ByokProviders,
};
pub use credits::{InvalidCredits, MAX_CREDITS, credits_from_nanos, nanos_from_credits};
pub use directory::{KeyDirectory, KeyDirectoryBuilder, KeyState, LeakOutcome, RotateOutcome};
pub use index::{KEY_INDEX_BUILT, KEY_INDEX_BUILT_ID, account_keys};
pub use key::{ApiKey, KeyFormatError, KeyHash, looks_like_key};
pub(crate) use key::{check_shape, checksum_matches};
pub use provision::{EnsuredKey, grants, provisioned_keys};
// Where the layers' examples have always found it.
pub use crate::store::SharedStore;
pub(crate) use leak::{LeakNotifier, MODELGATE_TOKEN_TYPE, report_leak};
pub use record::{
    AccountRecord, DEFAULT_ACCOUNT, DELETED_KEYS, DeletedKey, KeyRateLimit, KeyRecord, KeyUpdate,
    LeakReport, MAX_ACCOUNT_ID_CHARS, MAX_ALLOWED_MODELS, MAX_KEY_NAME_CHARS, NewAccount, NewKey,
    OPERATOR_ACCOUNT, OPERATOR_KEY_MINTED, is_valid_account_id,
};
